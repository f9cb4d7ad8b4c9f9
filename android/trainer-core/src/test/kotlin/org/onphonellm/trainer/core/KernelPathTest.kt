package org.onphonellm.trainer.core

import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Test

/** The on-screen line of the native kernels ([KernelPath.describe]) for every probe outcome. */
class KernelPathTest {
    @Test
    fun everyNamedPathIsShown() {
        for (p in KernelPath.NAMES) assertEquals("native kernels: yes (path $p)", KernelPath.describe(true, p))
    }

    @Test
    fun stockMethodsWhateverThePathSays() {
        // Maven's AAR: the fused methods do not load (OperatorMissing), and the JNI symbol is absent too.
        assertEquals("native kernels: no (stock methods)", KernelPath.describe(false, null))
        // kernels registered nowhere but a path reported (cannot happen with one library, must not say yes)
        assertEquals("native kernels: no (stock methods)", KernelPath.describe(false, "neon"))
        assertEquals("native kernels: no (XNNPACK variant)", KernelPath.describe(false, null, xnnpack = true))
        assertEquals("native kernels: yes (path neon)", KernelPath.describe(true, "neon", xnnpack = true))
    }

    @Test
    fun olderKernelsOrRefusedPathIsUnknown() {
        assertEquals("native kernels: yes (path unknown)", KernelPath.describe(true, null))
        assertEquals("native kernels: yes (path unknown)", KernelPath.describe(true, ""))
        assertEquals("native kernels: yes (path unknown)", KernelPath.describe(true, "neon; rm -rf"))
        assertEquals("native kernels: yes (path unknown)", KernelPath.describe(true, "x".repeat(33)))
        // a newer kernels.cpp's name, a plain identifier: shown as it is
        assertEquals("native kernels: yes (path sve2)", KernelPath.describe(true, "sve2"))
    }
}
