package org.onphonellm.trainer.core

/** Time as the trainer needs it, injectable so tests run without waiting. */
interface Clock {
    /** Unix time in seconds (telemetry timestamps). */
    fun wallSeconds(): Double
    /** Monotonic nanoseconds (durations). */
    fun monoNanos(): Long
    fun sleepMs(ms: Long)

    object System : Clock {
        override fun wallSeconds(): Double = java.lang.System.currentTimeMillis() / 1000.0
        override fun monoNanos(): Long = java.lang.System.nanoTime()
        override fun sleepMs(ms: Long) = Thread.sleep(ms)
    }
}
