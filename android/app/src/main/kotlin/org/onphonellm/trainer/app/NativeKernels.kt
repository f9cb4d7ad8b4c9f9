package org.onphonellm.trainer.app

/**
 * The native kernels' run-time path, from the app's ExecuTorch JNI library: android/native/kernel_path_jni.cpp,
 * linked into libexecutorch.so beside the kernels by android/native/build_executorch_aar.sh (the library exports
 * only `JNI_OnLoad` and `Java_*` symbols, so the kernels' C function `toolchain_kernel_path()` is reached through
 * this JNI function). Call only after `Module.load` (ExecuTorch has loaded libexecutorch.so by then).
 */
object NativeKernels {
    /** `toolchain_kernel_path()`, or null: kernels older than it (the JNI shim's weak default). */
    @JvmStatic private external fun kernelPath(): String?

    /**
     * The path name, or null when this runtime cannot say: Maven's AAR has no such JNI function
     * (UnsatisfiedLinkError), or the kernels predate `toolchain_kernel_path()`.
     */
    fun path(): String? = try { kernelPath() } catch (e: UnsatisfiedLinkError) { null }

    /**
     * The JNI shim is in this app's libexecutorch.so, i.e. the runtime was built with the native kernels
     * (build_executorch_aar.sh links both); false: Maven Central's AAR, which runs only stock kernels.
     */
    fun linked(): Boolean = try { kernelPath(); true } catch (e: UnsatisfiedLinkError) { false }
}
