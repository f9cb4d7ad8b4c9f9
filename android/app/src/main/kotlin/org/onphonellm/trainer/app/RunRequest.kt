package org.onphonellm.trainer.app

import android.content.Intent
import android.os.Bundle
import org.onphonellm.trainer.core.LayerLoop
import org.onphonellm.trainer.core.PreparedData
import org.onphonellm.trainer.core.Manifest
import org.onphonellm.trainer.core.RunSpec
import org.onphonellm.trainer.core.Runs
import org.onphonellm.trainer.core.TextTokenizer
import java.io.File
import java.util.UUID

/**
 * What the service is asked to do, from intent extras (the Activity, or scripts/android/start.sh with `am`).
 * Without `run_id` the service resumes the latest run. With `program` and `text` (a plain-text or chat
 * JSONL file) it first creates a new run from them, exactly as the Activity does. Relative paths are under
 * the app's external files directory, where `adb push` puts them: files/programs/NAME, files/data/FILE.
 *
 * Extras (numbers may be strings): run_id, program, text, chat (true/false; default: guessed), steps, lr (both default to
 * the program's manifest `defaults`),
 * budget_mb, checkpoint_every, shuffle_seed, held_out, held_out_seed, lcsb (full|cyclic|strided|last|random), k,
 * lcsb_seed, lcsb_period (random only), layers_per_checkpoint (an integer >= 1, or "auto": round(sqrt(layers per
 * step)); default 1), max_new_tokens, telemetry_url, telemetry_token, verify (true/false), device_profile, charging_window (true/false).
 */
data class RunRequest(
    val runId: String?,
    val newRun: NewRun?,
    val maxNewTokens: Int,
    val telemetryUrl: String?,
    val telemetryToken: String?,
    val verifyFiles: Boolean,
    val generateOnly: Boolean,
    /** Train only while the phone charges (extra [EXTRA_CHARGING_WINDOW]; persisted as the run's flag, ChargingRuns.mark). */
    val chargingWindow: Boolean = false,
    /** A generate request's program (extra `program`, the screen's choice): its latest run, else the program alone ([GenerateTarget]). */
    val program: String? = null,
) {
    /** A run to create: program directory name, data file, and the run's parameters. */
    data class NewRun(val program: String, val text: File, val chat: Boolean?, val steps: Long?, val lr: Double?, val budgetMb: Long?,
                      val checkpointEvery: Int, val shuffleSeed: Long?, val heldOut: Double, val heldOutSeed: Long,
                      val lcsb: String?, val k: Int?, val deviceProfile: String?,
                      val lcsbSeed: Long? = null, val lcsbPeriod: Int? = null,
                      /** Checkpoint groups of the layer loop; [AUTO_LAYERS_PER_CHECKPOINT]: round(sqrt(most layers per step)). */
                      val layersPerCheckpoint: Int = 1,
                      /** Full-backprop steps before the LCSB plan (RunSpec.lcsbWarmup); null: none, or the program's default plan's. */
                      val lcsbWarmup: Long? = null)

    companion object {
        const val ACTION_START = "org.onphonellm.trainer.action.START"
        const val ACTION_STOP = "org.onphonellm.trainer.action.STOP"
        const val ACTION_GENERATE = "org.onphonellm.trainer.action.GENERATE"
        /** Cancel the running before / after generation (it stops within one decode step). */
        const val ACTION_CANCEL_GENERATION = "org.onphonellm.trainer.action.CANCEL_GENERATION"
        const val EXTRA_PROMPT = "prompt"
        /** `true`: the run trains only while the phone charges, also after a restart (ChargingRuns.onServiceStart). */
        const val EXTRA_CHARGING_WINDOW = "charging_window"
        /** NewRun.layersPerCheckpoint: choose round(sqrt(m)) for the plan's m layers per step ("Recompute more, use less memory"). */
        const val AUTO_LAYERS_PER_CHECKPOINT = 0

        fun fromExtras(extras: Bundle?, base: File, action: String?): RunRequest {
            fun str(key: String): String? = extras?.get(key)?.toString()?.takeIf { it.isNotBlank() }
            val program = str("program")
            val text = str("text")
            val newRun = if (program != null && text != null) NewRun(
                program = program, text = if (text.startsWith("/")) File(text) else File(File(base, "data"), text),
                chat = str("chat")?.toBoolean(), steps = str("steps")?.toLong(), lr = str("lr")?.toDouble(),
                budgetMb = str("budget_mb")?.toLong(), checkpointEvery = str("checkpoint_every")?.toInt() ?: 10,
                shuffleSeed = str("shuffle_seed")?.toLong() ?: 0L, heldOut = str("held_out")?.toDouble() ?: 0.1,
                heldOutSeed = str("held_out_seed")?.toLong() ?: 0L, lcsb = str("lcsb"), k = str("k")?.toInt(),
                deviceProfile = str("device_profile"), lcsbSeed = str("lcsb_seed")?.toLong(), lcsbPeriod = str("lcsb_period")?.toInt(),
                layersPerCheckpoint = str("layers_per_checkpoint")?.let { if (it == "auto") AUTO_LAYERS_PER_CHECKPOINT else it.toInt() } ?: 1,
                lcsbWarmup = str("lcsb_warmup")?.toLong(),
            ) else null
            return RunRequest(
                runId = str("run_id"), newRun = newRun, maxNewTokens = str("max_new_tokens")?.toInt() ?: 32,
                telemetryUrl = str("telemetry_url"), telemetryToken = str("telemetry_token"),
                verifyFiles = str("verify")?.toBoolean() ?: true, generateOnly = action == ACTION_GENERATE,
                chargingWindow = str(EXTRA_CHARGING_WINDOW)?.toBoolean() ?: false,
                program = if (action == ACTION_GENERATE) program else null,
            )
        }

        fun fromIntent(intent: Intent, base: File): RunRequest = fromExtras(intent.extras, base, intent.action)

        fun newRunId(): String = "run-" + UUID.randomUUID().toString().replace("-", "").take(12)

        /**
         * Create a run (rows made on the phone from [text], held-out split) under [base]/runs; what the Activity's
         * Start and an adb `text` extra both do. [runInfo]: the platform's run_start fields.
         */
        fun createRun(base: File, n: NewRun, textContent: String, totalRam: Long, runInfo: Map<String, Any?>, runId: String = newRunId()): Pair<String, PreparedData> {
            val programDir = File(File(base, "programs"), n.program)
            val program = Manifest.read(programDir)
            val data = PreparedData.prepare(textContent, TextTokenizer.forProgram(program), program.seqLen, program.vocab, n.heldOut, n.heldOutSeed,
                chat = n.chat, name = n.text.name)
            val budget = n.budgetMb?.let { it shl 20 } ?: (totalRam / 4)  // no budget given: a quarter of RAM
            // No steps or lr given (the screen's empty fields, an adb start without them): the program's (manifest
            // defaults, what toolchain export measured and recorded; Manifest.runSteps / runLr).
            val asked = RunSpec(runId, n.program, program.runSteps(n.steps), program.runLr(n.lr), budget, n.checkpointEvery, n.shuffleSeed,
                n.lcsb, n.k, n.heldOut, n.heldOutSeed, if (data.chat) "chat" else "text", runInfo + mapOf("device_profile" to n.deviceProfile),
                lcsbSeed = n.lcsbSeed, lcsbPeriod = n.lcsbPeriod, lcsbWarmup = n.lcsbWarmup)
            val plan = asked.plan(program)  // a bad policy, k, seed, period or warm-up is refused before the run exists
            val perStep = plan?.maxLayers ?: program.layers  // a warm-up step backpropagates every layer
            val spec = asked.copy(layersPerCheckpoint = if (n.layersPerCheckpoint == AUTO_LAYERS_PER_CHECKPOINT)
                LayerLoop.sqrtLayersPerCheckpoint(perStep) else n.layersPerCheckpoint)
            Runs(File(base, "runs")).create(spec, data)
            return Pair(runId, data)
        }
    }
}
