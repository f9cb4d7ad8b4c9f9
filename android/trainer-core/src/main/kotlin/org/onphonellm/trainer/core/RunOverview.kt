package org.onphonellm.trainer.core

import java.io.File

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
