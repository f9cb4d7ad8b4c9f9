// The native kernels' run-time path for the Android app (org.onphonellm.trainer.app.NativeKernels.kernelPath()).
// Linked into ExecuTorch's JNI library (libexecutorch.so) with the kernels, as part of libtoolchain_kernels.a
// (CMakeLists.txt beside this file; --whole-archive via EXECUTORCH_JNI_CUSTOM_LIBRARY): that library exports only
// JNI_OnLoad and Java_* symbols (extension/android/jni/version_script.txt), so the kernels' C function
// toolchain_kernel_path() is reached through this Java_* function.
//
// toolchain_kernel_path() (toolchain/native/kernels.cpp: "generic", "avx2", "avx_vnni", "avx512_vnni", "neon",
// "dotprod", "i8mm"; nullptr for a forced path the CPU refuses) exists only in kernels built with the run-time path
// chooser: the weak definition below stands in for it in older kernels (the linker takes kernels.cpp's strong one
// when there is one), so the app still builds and says "path unknown".
#include <jni.h>

extern "C" __attribute__((weak)) const char* toolchain_kernel_path() { return nullptr; }

// The path, or nullptr (a plain C entry point too, for the host check: registration_check.cpp).
extern "C" const char* toolchain_kernel_path_for_app() { return toolchain_kernel_path(); }

extern "C" JNIEXPORT jstring JNICALL Java_org_onphonellm_trainer_app_NativeKernels_kernelPath(JNIEnv* env, jclass) {
  const char* p = toolchain_kernel_path_for_app();
  return p != nullptr ? env->NewStringUTF(p) : nullptr;
}
