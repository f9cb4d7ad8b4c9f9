package org.onphonellm.trainer.app

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
    /** The native kernels line of the loaded program's runtime (ExecuTorchRuntime.kernelLine); null before a load. */
    @Volatile var kernels: String? = null
    @Volatile var evalBefore: Double? = null
    @Volatile var evalAfter: Double? = null
    /** The last failure (message, phase, ExecuTorch's log lines), shown under the status. */
    @Volatile var lastError: org.onphonellm.trainer.core.ErrorReport? = null
    /** Losses of this run so far (the chart), appended by the training thread. */
    val losses: MutableList<Double> = java.util.Collections.synchronizedList(ArrayList())

    /** Idle / starting / running / stopping, and the stop flag (a Stop during a start cancels it): the buttons follow it. */
    val start = org.onphonellm.trainer.core.RunStart()
    /** Why the watchdog asked to stop (null: the user did), reported when the session ends. */
    @Volatile var stopReason: String? = null
    @Volatile private var trimLevel = -1
    @Volatile private var trimAtMs = 0L
    /** A prompt the Activity asked to generate before the service's session was ready; the service takes it then. */
    @Volatile var pendingPrompt: String? = null
    /** The before / after generation shown by the Activity, streamed in by the service's generation thread. */
    val generation = GenerationStatus()

    fun requestStop(reason: String? = null) { stopReason = reason; start.requestStop() }
    fun stopRequested(): Boolean = start.stopRequested

    /** A session's display from its run (the stop flag is [start]'s: a Stop during the start is kept). */
    fun begin(runId: String, steps: Long, budgetBytes: Long, done: Long, losses: List<Double?>) {
        if (!start.stopRequested) stopReason = null
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
