package org.onphonellm.trainer.core

/** How a training run ended; [wire]: the run_end event's `status` (shared_schemas/telemetry_event.schema.json). */
enum class RunStatus(val wire: String) {
    /** Every planned step done (and the held-out loss after them, when there are held-out rows). */
    COMPLETED("completed"),
    /** Stopped by an error, the memory budget, a non-finite loss or a changed weights file; the last checkpoint is kept. */
    FAILED("failed"),
    /** A start cancelled before a session ran (the app's Stop during a start; no run_end event). */
    CANCELLED("cancelled"),
    /** Stopped at a step boundary (a stop request, the OS's memory pressure); a resume continues from the checkpoint. */
    PAUSED("paused");

    override fun toString(): String = wire
}

/** How a session ended ([status] as in the run_end event). */
data class RunOutcome(val status: RunStatus, val stepsCompleted: Long, val finalLoss: Double?, val message: String)
