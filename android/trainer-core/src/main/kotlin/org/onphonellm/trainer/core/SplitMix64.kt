package org.onphonellm.trainer.core

/**
 * SplitMix64 (Steele, Lea and Flood, OOPSLA 2014), all arithmetic modulo 2^64 (Kotlin's Long wraps):
 * exactly toolchain/shuffle.py, so the host and the phone draw the same numbers. [seed] is taken modulo
 * 2^64 (a Long's two's complement bits: -1 is 2^64 - 1).
 */
class SplitMix64(seed: Long) {
    var state: Long = seed
        private set

    fun next(): Long {
        state += -0x61c8864680b583ebL  // 0x9E3779B97F4A7C15
        var z = state
        z = (z xor (z ushr 30)) * -0x40a7b892e31b1a47L  // 0xBF58476D1CE4E5B9
        z = (z xor (z ushr 27)) * -0x6b2fb644ecceee15L  // 0x94D049BB133111EB
        return z xor (z ushr 31)
    }

    companion object {
        /**
         * [z] read as an unsigned 64-bit number, modulo [d] > 0 (= java.lang.Long.remainderUnsigned, which
         * Android has only from API 24; trainer-core is checked against API 23).
         */
        fun unsignedRem(z: Long, d: Int): Int {
            require(d > 0)
            if (z >= 0) return (z % d).toInt()
            val half = (z ushr 1) % d  // z = 2 * (z >>> 1) + (z & 1)
            return ((2 * half + (z and 1L)) % d).toInt()
        }
    }
}

/** toolchain.shuffle.permutation: Fisher-Yates from the top, j = next() mod (i + 1) (unsigned). */
fun permutation(n: Int, seed: Long): IntArray {
    val p = IntArray(n) { it }
    val rng = SplitMix64(seed)
    for (i in n - 1 downTo 1) {
        val j = SplitMix64.unsignedRem(rng.next(), i + 1)
        val t = p[i]; p[i] = p[j]; p[j] = t
    }
    return p
}
