// Host check only (CMakeLists.txt, TOOLCHAIN_KERNELS_CHECK): a strong toolchain_kernel_path() as kernels with the
// run-time path chooser define it, to show that it, not kernel_path_jni.cpp's weak stand-in, is what the app reads.
extern "C" const char* toolchain_kernel_path() { return "dotprod"; }
