package org.onphonellm.trainer.core

/**
 * An error as the app shows and reports it: its message, with the runtime's own log lines (ExecuTorch's
 * log buffer) under it on the screen, and as a telemetry `error` event (`log`: the last
 * [EventSchema.MAX_LOG_LINES] lines, each cut to [EventSchema.MAX_LOG_LINE] characters).
 */
class ErrorReport(val message: String, val logLines: List<String> = emptyList(), val phase: StartPhase? = null) {
    /** The lines kept: the last ones (the failure is at the end of the log), cut to the schema's limits. */
    val kept: List<String> = logLines.filter { it.isNotBlank() }.takeLast(EventSchema.MAX_LOG_LINES).map { it.take(EventSchema.MAX_LOG_LINE) }

    /** The status text: the message (and the phase it failed in), then the last [shownLines] log lines. */
    fun display(shownLines: Int = 8): String {
        val head = (phase?.let { "failed while ${it.label}: " } ?: "failed: ") + message
        val tail = kept.takeLast(shownLines)
        return if (tail.isEmpty()) head else head + "\nExecuTorch log:\n" + tail.joinToString("\n")
    }

    /** The fields of a telemetry `error` event (valid against the schema whatever the message and lines). */
    fun eventFields(fatal: Boolean, code: String = "runtime_error", step: Long? = null): Map<String, Any?> {
        val text = (phase?.let { "${it.name.lowercase()}: " } ?: "") + message
        val m = linkedMapOf<String, Any?>("message" to text.ifBlank { "unknown error" }.take(4096), "fatal" to fatal, "code" to code)
        step?.let { m["step"] = it }
        if (kept.isNotEmpty()) m["log"] = kept
        return m
    }

    /** Append it as an `error` event to [runDir]'s telemetry log (numbered after its last event). */
    fun record(runDir: RunDir, clock: Clock, fatal: Boolean, code: String = "runtime_error", step: Long? = null): Json.Obj {
        val log = EventLog(runDir.telemetry)
        val seq = log.lastEvent()?.let { Fields(it, "telemetry log").long("seq") + 1 } ?: 0L
        return TelemetryRecorder(runDir.runId, log, clock, seq).emit("error", eventFields(fatal, code, step))
    }
}
