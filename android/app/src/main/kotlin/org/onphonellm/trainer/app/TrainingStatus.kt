package org.onphonellm.trainer.app

import java.util.concurrent.atomic.AtomicBoolean

/** What the service is doing, shared with the Activity and the stop receiver (one process). */
object TrainingStatus {
    @Volatile var running = false
    @Volatile var runId: String? = null
    @Volatile var step = 0L
    @Volatile var steps = 0L
    @Volatile var loss: Double? = null
    @Volatile var anonBytes: Long? = null
    @Volatile var budgetBytes = 0L
    @Volatile var message = "idle"

    private val stop = AtomicBoolean(false)
    @Volatile private var trimLevel = -1
    @Volatile private var trimAtMs = 0L

    fun requestStop() = stop.set(true)
    fun stopRequested(): Boolean = stop.get()

    fun begin(runId: String, steps: Long, budgetBytes: Long) {
        stop.set(false)
        running = true
        this.runId = runId
        this.steps = steps
        this.budgetBytes = budgetBytes
        step = 0
        loss = null
        message = "starting"
    }

    /** onTrimMemory is an event: it counts as pressure for [holdMs] after it arrived. */
    fun onTrim(level: Int, nowMs: Long) {
        trimLevel = level
        trimAtMs = nowMs
    }

    fun recentTrimLevel(nowMs: Long, holdMs: Long = 30_000): Int? = if (trimLevel >= 0 && nowMs - trimAtMs <= holdMs) trimLevel else null
}
