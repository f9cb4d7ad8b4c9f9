package org.onphonellm.trainer.app

import android.content.Intent
import android.os.Bundle
import java.io.File
import java.util.UUID

/**
 * A training request from intent extras (scripts/android/start.sh passes them with `am`).
 * Relative paths are under the app's external files directory, where `adb push` puts them:
 * /sdcard/Android/data/org.onphonellm.trainer/files/{programs,data,plans}/...; runs go to files/runs/RUN_ID/.
 *
 * Extras (any type `am` can send; numbers may be strings): program, data, plan, run_id, steps, lr,
 * budget_mb, checkpoint_every, shuffle_seed, telemetry_url, telemetry_token, verify (true/false), device_profile.
 */
data class RunRequest(
    val programDir: File,
    val dataFile: File,
    val planFile: File?,
    val runId: String,
    val steps: Long,
    val lr: Double?,
    val budgetMb: Long?,
    val checkpointEvery: Int,
    val shuffleSeed: Long?,
    val telemetryUrl: String?,
    val telemetryToken: String?,
    val verifyFiles: Boolean,
    val deviceProfile: String?,
) {
    companion object {
        const val ACTION_START = "org.onphonellm.trainer.action.START"
        const val ACTION_STOP = "org.onphonellm.trainer.action.STOP"

        fun fromExtras(extras: Bundle?, base: File): RunRequest {
            fun str(key: String): String? = extras?.get(key)?.toString()?.takeIf { it.isNotBlank() }
            fun file(key: String, dir: String): File? = str(key)?.let { if (it.startsWith("/")) File(it) else File(File(base, dir), it) }
            fun num(key: String): String? = str(key)
            val program = file("program", "programs") ?: throw IllegalArgumentException("extra 'program' is required (a directory under files/programs)")
            val data = file("data", "data") ?: throw IllegalArgumentException("extra 'data' is required (a JSONL file under files/data)")
            return RunRequest(
                programDir = program, dataFile = data, planFile = file("plan", "plans"),
                runId = str("run_id") ?: UUID.randomUUID().toString().replace("-", ""),
                steps = num("steps")?.toLong() ?: 100, lr = num("lr")?.toDouble(), budgetMb = num("budget_mb")?.toLong(),
                checkpointEvery = num("checkpoint_every")?.toInt() ?: 10, shuffleSeed = num("shuffle_seed")?.toLong(),
                telemetryUrl = str("telemetry_url"), telemetryToken = str("telemetry_token"),
                verifyFiles = str("verify")?.toBoolean() ?: true, deviceProfile = str("device_profile"),
            )
        }

        fun fromIntent(intent: Intent, base: File): RunRequest = fromExtras(intent.extras, base)
    }
}
