package org.onphonellm.trainer.core

/**
 * Row index of each step (toolchain/training/order.py): file order, cycling; with a seed, the rows of
 * epoch e are permutation(rows, seed + e) (SplitMix64 + Fisher-Yates, [permutation]), the host's rule,
 * so a seeded run visits the same rows on the host and on the phone. A function of the step, so a
 * resumed run sees the same rows as an uninterrupted one.
 */
class DataOrder(private val nRows: Int, private val seed: Long?) {
    private var epoch = -1L
    private var perm = IntArray(0)

    init { if (nRows < 1) throw BadInput("no training rows: the data has no example to train on") }

    fun rowForStep(step: Long): Int {
        require(step >= 0) { "step $step" }
        val e = step / nRows
        val i = (step % nRows).toInt()
        if (seed == null) return i
        if (e != epoch) {  // one permutation alive at a time
            perm = permutation(nRows, seed + e)
            epoch = e
        }
        return perm[i]
    }
}
