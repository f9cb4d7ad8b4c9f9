// Host check of kernel_path_jni.cpp (android/test.sh): prints what the app would read as the kernel path and
// compares it with argv[1] ("none" for nullptr: kernels without toolchain_kernel_path()).
#include <cstdio>
#include <cstring>

extern "C" const char* toolchain_kernel_path_for_app();

int main(int argc, char** argv) {
  const char* p = toolchain_kernel_path_for_app();
  std::printf("kernel path for the app: %s\n", p ? p : "none");
  if (argc < 2) return 2;
  return std::strcmp(p ? p : "none", argv[1]) == 0 ? 0 : 1;
}
