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
    @Volatile var evalBefore: Double? = null
    @Volatile var evalAfter: Double? = null
    @Volatile var generation: Pair<String, String>? = null
    @Volatile var generating = false
    /** Losses of this run so far (the chart), appended by the training thread. */
    val losses: MutableList<Double> = java.util.Collections.synchronizedList(ArrayList())

    private val stop = AtomicBoolean(false)
    /** Why the watchdog asked to stop (null: the user did), reported when the session ends. */
    @Volatile var stopReason: String? = null
    @Volatile private var trimLevel = -1
    @Volatile private var trimAtMs = 0L
    /** A prompt the Activity asked to generate; the training thread takes it between steps. */
    @Volatile var pendingPrompt: String? = null

    fun requestStop(reason: String? = null) { stopReason = reason; stop.set(true) }
    fun stopRequested(): Boolean = stop.get()

    fun begin(runId: String, steps: Long, budgetBytes: Long, done: Long, losses: List<Double?>) {
        stop.set(false)
        stopReason = null
        running = true
        this.runId = runId
        this.steps = steps
        this.budgetBytes = budgetBytes
        step = done
        this.losses.clear()
        this.losses.addAll(losses.filterNotNull())
        loss = this.losses.lastOrNull()
        message = "starting"
    }

    /** onTrimMemory is an event: it counts as pressure for [holdMs] after it arrived. */
    fun onTrim(level: Int, nowMs: Long) {
        trimLevel = level
        trimAtMs = nowMs
    }

    fun recentTrimLevel(nowMs: Long, holdMs: Long = 30_000): Int? = if (trimLevel >= 0 && nowMs - trimAtMs <= holdMs) trimLevel else null
}
