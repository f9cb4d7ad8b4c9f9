package org.onphonellm.trainer.core

import java.io.File

/**
 * The screen's run state, shared by the Activity, the service's trainer thread and the stop receiver (one
 * process): idle, starting (Start tapped; the service is creating the run, tokenizing the text, verifying,
 * mapping, loading), running (the session trains), stopping (a stop was asked; the session checkpoints and
 * ends). Start is enabled only when idle, so a second tap cannot create an orphan run; Stop is enabled while
 * starting and running, and a Stop during the start cancels it: [shouldContinue] says no at the start's next
 * phase, and a session that reaches [running] anyway sees the stop at its first check ([stopRequested]).
 * Thread-safe.
 */
class RunStart {
    enum class Phase { IDLE, STARTING, RUNNING, STOPPING }

    /** Which buttons the screen enables. */
    data class Buttons(val start: Boolean, val stop: Boolean, val resume: Boolean)

    @Volatile var phase: Phase = Phase.IDLE
        private set
    @Volatile private var stop = false

    /** Start or Resume tapped: true (now starting) if idle, else false (nothing to do: the tap is ignored). */
    @Synchronized fun begin(): Boolean {
        if (phase != Phase.IDLE) return false
        phase = Phase.STARTING
        stop = false
        return true
    }

    /** A start that did not come from this screen (adb, a restart, a charging window): starting whatever the state. */
    @Synchronized fun beginExternal() {
        if (phase == Phase.IDLE) { phase = Phase.STARTING; stop = false }
    }

    /** Stop tapped (or asked by the watchdog): a start in progress is cancelled, a run stops at its next step boundary. */
    @Synchronized fun requestStop() {
        stop = true
        if (phase == Phase.STARTING || phase == Phase.RUNNING) phase = Phase.STOPPING
    }

    val stopRequested: Boolean get() = stop

    /** Between the start's phases: false when a stop came meanwhile (the start ends there, nothing trains). */
    fun shouldContinue(): Boolean = !stop

    /** The session is about to train; false (and still stopping) when a stop came during the start. */
    @Synchronized fun running(): Boolean {
        if (stop) return false
        phase = Phase.RUNNING
        return true
    }

    /** The start or the session ended (any way). */
    @Synchronized fun ended() {
        phase = Phase.IDLE
        stop = false
    }

    fun buttons(): Buttons = when (phase) {
        Phase.IDLE -> Buttons(start = true, stop = false, resume = true)
        Phase.STARTING, Phase.RUNNING -> Buttons(start = false, stop = true, resume = false)
        Phase.STOPPING -> Buttons(start = false, stop = false, resume = false)
    }
}

/**
 * Keeps Android from replaying a crash: START_REDELIVER_INTENT restarts the service with the same request
 * after the process died, which is right after a kill by the OS (the run resumes from its checkpoint) and
 * wrong after a crash the app could not catch (a native fault in the runtime), which would crash again and
 * again. [beforeStart] counts the sessions that started and did not reach [ended]; a restart (the
 * redelivered request) after [maxUnended] such sessions in a row is refused with a reason to show (the run
 * waits for the user's Resume, which starts counting again). The count lives in [file], so it survives the
 * process.
 */
class RestartGuard(private val file: File, private val maxUnended: Int = 2) {
    private fun count(): Int = if (file.isFile) file.readText().trim().toIntOrNull() ?: 0 else 0

    /** Before a session: null (go on; counted) or why a [restart] is refused. A start the user asked for always goes on. */
    @Synchronized fun beforeStart(restart: Boolean): String? {
        val n = if (restart) count() else 0
        if (restart && n >= maxUnended)
            return "the last $n starts of this run ended the app without finishing (a crash); tap Resume to try again"
        file.parentFile?.mkdirs()
        AtomicFiles.writeText(file, "${n + 1}\n")
        return null
    }

    /** The session ended in the app's hands (completed, paused, failed and recorded): the count starts again. */
    @Synchronized fun ended() {
        file.delete()
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
