package org.onphonellm.trainer.core

/**
 * What the screen says about the native kernels (toolchain/native/kernels.cpp): whether the generation runs them, and
 * which of their run-time paths this CPU got. Pure, so the host tests every case; the apps feed it what their probe
 * found (Android: the fused methods loaded or not, and `toolchain_kernel_path()` through the JNI library; iOS: the
 * kernel registry and the same C function).
 */
object KernelPath {
    /** The path names toolchain_kernel_path() returns (x86: generic, avx2, avx_vnni, avx512_vnni; arm64: generic, neon, dotprod, i8mm). */
    val NAMES = listOf("generic", "avx2", "avx_vnni", "avx512_vnni", "neon", "dotprod", "i8mm")

    /**
     * [registered]: the runtime has the fused methods' kernels (the fused generation methods loaded). [path]: what
     * `toolchain_kernel_path()` returned; null when the runtime's kernels predate it (no such symbol), or it named
     * no path (a forced path refused). A name outside [NAMES] (a newer kernels.cpp) is shown only if it is a plain
     * identifier, else it counts as unknown. [xnnpack]: without the kernels, generation runs the program's XNNPACK
     * variant (manifest generate.xnnpack) instead of the stock methods.
     */
    fun describe(registered: Boolean, path: String?, xnnpack: Boolean = false): String = when {
        !registered && xnnpack -> "native kernels: no (XNNPACK variant)"
        !registered -> "native kernels: no (stock methods)"
        path == null || !PLAIN.matches(path) -> "native kernels: yes (path unknown)"
        else -> "native kernels: yes (path $path)"
    }

    private val PLAIN = Regex("[a-z0-9_]{1,32}")
}
