package org.onphonellm.trainer.core

import java.io.ByteArrayOutputStream
import java.io.File
import java.io.InputStream
import java.nio.ByteBuffer
import java.nio.charset.CharacterCodingException
import java.nio.charset.CodingErrorAction

/**
 * What the screen holds that a rotation, a config change or the process's death must not lose, as string
 * pairs (the Activity puts them into its saved-state Bundle, which Android keeps across all three). A text
 * longer than [SPILL_CHARS] (a Bundle over ~500 KB makes Android throw TransactionTooLargeException) is kept
 * in a file under the spill directory instead, and only its path is saved.
 */
data class ScreenState(
    val program: String? = null,
    val input: String = "",
    /** The picked file's text, kept as a file in the app's cache (null: the pasted text is used). */
    val pickedPath: String? = null,
    val pickedName: String = "pasted text",
    val steps: String = "",
    val heldOut: String = "",
    val lcsbK: String = "",
    val lcsbPolicy: String? = null,
    val lessMemory: Boolean = false,
    val prompt: String = "",
    val dataInfo: String = "no data yet",
    val chargingOnly: Boolean = false,
) {
    /** The pairs to save; [spillDir]: where a long pasted text goes. */
    fun save(spillDir: File): Map<String, String> {
        val out = LinkedHashMap<String, String>()
        program?.let { out["program"] = it }
        if (input.length > SPILL_CHARS) {
            spillDir.mkdirs()
            val f = File(spillDir, "screen-input.txt")
            AtomicFiles.write(f) { it.write(input.toByteArray(Charsets.UTF_8)) }
            out["input_file"] = f.path
        } else out["input"] = input
        pickedPath?.let { out["picked_path"] = it }
        out["picked_name"] = pickedName
        out["steps"] = steps
        out["held_out"] = heldOut
        out["lcsb_k"] = lcsbK
        lcsbPolicy?.let { out["lcsb_policy"] = it }
        out["less_memory"] = lessMemory.toString()
        out["prompt"] = prompt
        out["data_info"] = dataInfo
        out["charging_only"] = chargingOnly.toString()
        return out
    }

    /** The picked text, read back from its file (null: none, or the file is gone). */
    fun pickedText(): String? = pickedPath?.let { File(it) }?.takeIf { it.isFile }?.readText(Charsets.UTF_8)

    companion object {
        const val SPILL_CHARS = 64 * 1024

        /** What [save] wrote (missing keys: defaults; a spilled input whose file is gone: empty). */
        fun restore(m: Map<String, String?>): ScreenState = ScreenState(
            program = m["program"],
            input = m["input"] ?: m["input_file"]?.let { File(it) }?.takeIf { it.isFile }?.readText(Charsets.UTF_8) ?: "",
            pickedPath = m["picked_path"]?.takeIf { File(it).isFile },
            pickedName = m["picked_name"] ?: "pasted text",
            steps = m["steps"] ?: "", heldOut = m["held_out"] ?: "", lcsbK = m["lcsb_k"] ?: "",
            lcsbPolicy = m["lcsb_policy"], lessMemory = m["less_memory"] == "true", prompt = m["prompt"] ?: "",
            dataInfo = m["data_info"] ?: "no data yet", chargingOnly = m["charging_only"] == "true",
        )
    }
}

/**
 * A picked text file read off the main thread, with a size cap: above [capBytes] (from the size the picker
 * reports, or by counting while reading, for a cloud file of unknown size) it is refused with a message
 * saying so, before the whole file is read; a file that is not UTF-8 is refused too.
 */
object TextImport {
    /** 16 MiB: some 4 M tokens, far more than a personalization run trains on. */
    const val DEFAULT_CAP_BYTES = 16L shl 20

    class TooLarge(message: String) : Exception(message)

    fun tooLargeMessage(what: String, size: Long?, capBytes: Long): String =
        "$what is ${size?.let { "%.1f MB".format(it / 1048576.0) } ?: "over %.0f MB".format(capBytes / 1048576.0)}; the app reads texts " +
            "up to %.0f MB: pick a shorter part, or make rows with `toolchain data` on a computer".format(capBytes / 1048576.0)

    fun read(ins: InputStream, declaredSize: Long?, capBytes: Long = DEFAULT_CAP_BYTES, what: String = "the file"): String {
        if (declaredSize != null && declaredSize > capBytes) throw TooLarge(tooLargeMessage(what, declaredSize, capBytes))
        val out = ByteArrayOutputStream()
        val buf = ByteArray(1 shl 16)
        while (true) {
            val n = ins.read(buf)
            if (n < 0) break
            out.write(buf, 0, n)
            if (out.size() > capBytes) throw TooLarge(tooLargeMessage(what, null, capBytes))
        }
        val dec = Charsets.UTF_8.newDecoder().onMalformedInput(CodingErrorAction.REPORT).onUnmappableCharacter(CodingErrorAction.REPORT)
        return try {
            dec.decode(ByteBuffer.wrap(out.toByteArray())).toString()
        } catch (e: CharacterCodingException) {
            throw IllegalArgumentException("$what is not UTF-8 text (a binary file, or another encoding): save it as UTF-8 and pick it again")
        }
    }
}

/** The phases a start goes through before the first step, shown one by one (not "idle" while the phone works). */
enum class StartPhase(val label: String) {
    VERIFYING("verifying the program files (once per import)"),
    MAPPING("mapping the weights"),
    LOADING("loading the methods"),
    PREPARING("preparing the rows and the state"),
    EVALUATING("held-out loss before training"),
    TRAINING("training");
}

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

/**
 * What the screen shows of the latest run while nothing trains (held-out losses, whether an adapter can be
 * exported, whether it waits for a charging window): every file read the Activity needs, done in one call on a
 * background thread ([read]), so the main thread never touches the run directory. [pausedMessage] is passed
 * in (the app's preferences, read on the same thread).
 */
data class RunOverview(
    val runId: String?,
    val evals: EvalPair,
    val hasAdapter: Boolean,
    val finished: Boolean,
    val chargingOnly: Boolean,
    val pausedMessage: String?,
) {
    /** The status line's text when nothing trains (null: the service's own message). */
    fun idleMessage(): String? = when {
        pausedMessage != null -> pausedMessage
        chargingOnly && !finished -> "waiting for the next charging window (plugged in and idle)"
        else -> null
    }

    companion object {
        val EMPTY = RunOverview(null, EvalPair(null, null, null), hasAdapter = false, finished = false, chargingOnly = false, pausedMessage = null)

        fun read(runs: Runs, pausedMessage: String? = null): RunOverview {
            val run = runs.latest() ?: return EMPTY.copy(pausedMessage = pausedMessage)
            val evals = try { EvalPair.read(run.results) } catch (e: Exception) { EvalPair(null, null, null) }
            return RunOverview(run.runId, evals, File(run.adapter, StateCheckpoints.ADAPTER_WEIGHTS).isFile,
                ChargingRuns.finished(run), ChargingRuns.isMarked(run), pausedMessage)
        }
    }
}
