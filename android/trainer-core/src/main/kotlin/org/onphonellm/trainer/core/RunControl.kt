package org.onphonellm.trainer.core

fun interface RunControl {
    fun stopRequested(): Boolean

    /**
     * Checkpoint after every step (not only every `checkpoint_every`): the app says yes while it runs in a
     * background window the OS may end at any time (a charging run, an app in the background), so an ending
     * window loses at most the step in flight. Asked after each step.
     */
    fun checkpointEachStep(): Boolean = false
}

/**
 * Memory signals between two step boundaries that the boundary's own sample does not see: the app's watchdog's
 * largest footprint during the step, and an OS pressure event (Android onTrimMemory). Read and reset once per step.
 */
fun interface MemorySignals {
    fun sinceLastStep(): PressureSignal

    companion object {
        val NONE = MemorySignals { PressureSignal(null, false) }
    }
}

/** [peakAnonBytes]: the largest footprint seen during the step (null: none); [osSignal]: the OS reported pressure. */
data class PressureSignal(val peakAnonBytes: Long?, val osSignal: Boolean)
