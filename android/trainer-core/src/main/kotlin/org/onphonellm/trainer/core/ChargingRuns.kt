package org.onphonellm.trainer.core

import java.io.File
import java.util.concurrent.atomic.AtomicReference

/**
 * "Train while charging": which run a charging-and-idle window resumes, how long the window's worker may
 * train, the run control that stops it at a step boundary, and the per-run flag that says a run trains in
 * charging windows only (persisted in the run directory, so a restart after a process kill honours it). The
 * scheduling itself is WorkManager's (the app's ChargingWorker, constraints [REQUIRES_CHARGING] and
 * [REQUIRES_IDLE]), and the session runs inside that worker; this is the part with logic.
 */
object ChargingRuns {
    const val WORK_NAME = "train-while-charging"
    const val REQUIRES_CHARGING = true
    const val REQUIRES_IDLE = true
    /** Do not start below this battery level even on the charger (a slow charger loses against training). */
    const val MIN_BATTERY_PCT = 20.0
    /**
     * A worker that is not in the foreground runs as a JobScheduler job, which Android stops after 10 minutes:
     * such a window stops itself at the first step boundary after 9 (checkpointed) rather than be cut off.
     */
    const val BACKGROUND_WINDOW_MS = 9 * 60_000L
    /** A foreground worker trains until the window ends (WorkManager stops it), at most this long. */
    const val FOREGROUND_WINDOW_MS = 12 * 3_600_000L
    /** The persisted flag of a run that trains in charging windows only (in its run directory). */
    const val MARK_FILE = "charging_window.json"

    sealed class Decision {
        data class Resume(val runId: String) : Decision()
        data class Skip(val reason: String) : Decision()
    }

    /** Whether a run has ended for good (its log ends with a completed or failed run_end): nothing to resume. */
    fun finished(run: RunDir): Boolean {
        val last = EventLog(run.telemetry).lastEvent() ?: return false
        if ((last["type"] as? Json.Str)?.value != "run_end") return false
        return (last["status"] as? Json.Str)?.value in setOf("completed", "failed")
    }

    /** What a charging window does: resume the latest run unless it is done, the switch is off or training is running. */
    fun decide(enabled: Boolean, runs: Runs, running: Boolean, charging: Boolean, batteryPct: Double?): Decision {
        if (!enabled) return Decision.Skip("train while charging is off")
        if (running) return Decision.Skip("a run is already training")
        if (!charging) return Decision.Skip("not charging")
        lowBattery(batteryPct)?.let { return Decision.Skip(it) }
        val run = runs.latest() ?: return Decision.Skip("no run to resume: start one in the app")
        if (finished(run)) return Decision.Skip("the latest run (${run.runId}) has ended")
        return Decision.Resume(run.runId)
    }

    private fun lowBattery(pct: Double?): String? =
        if (pct != null && pct < MIN_BATTERY_PCT) "battery at ${pct.toInt()}%, below ${MIN_BATTERY_PCT.toInt()}%" else null

    /**
     * How a charging worker trains, once it has asked WorkManager to make it a foreground worker
     * (`setForegroundAsync`). Granted: until the window ends (at most [FOREGROUND_WINDOW_MS]). Refused (Android
     * 12+ may throw ForegroundServiceStartNotAllowedException to an app in the background, Android 14+ a
     * SecurityException without the service type): the session still runs, inside the worker, as the job it is,
     * and stops itself at a step boundary [BACKGROUND_WINDOW_MS] after [startMs], before JobScheduler's 10-minute
     * limit; the next window goes on from its checkpoint. No service is started in either case.
     */
    data class WindowPlan(val foreground: Boolean, val deadlineMs: Long, val note: String)

    fun windowPlan(foregroundGranted: Boolean, startMs: Long): WindowPlan =
        if (foregroundGranted) WindowPlan(true, startMs + FOREGROUND_WINDOW_MS, "training while charging (foreground worker)")
        else WindowPlan(false, startMs + BACKGROUND_WINDOW_MS,
            "training while charging for up to ${BACKGROUND_WINDOW_MS / 60_000} min (Android refused the foreground; the next window continues)")

    /**
     * The session's stop signal in a charging window: the user's Stop, the window's end (WorkManager's
     * `isStopped` once charging or idle ends, or the phone no longer charging), or the window's deadline
     * ([WindowPlan.deadlineMs] against [nowMs]). The session checks it before each step, so it stops at a step
     * boundary with a checkpoint, and the next window resumes from there. A window may also end without warning
     * (Android stops the work, kills the process): a checkpoint after every step ([RunControl.checkpointEachStep]),
     * so that loses at most the step in flight.
     */
    fun control(windowEnded: () -> Boolean, userStop: () -> Boolean, deadlineMs: Long? = null, nowMs: () -> Long = { 0L }): RunControl =
        object : RunControl {
            override fun stopRequested() = userStop() || windowEnded() || (deadlineMs != null && nowMs() >= deadlineMs)
            override fun checkpointEachStep() = true
        }

    // --- the per-run flag ----------------------------------------------------------------------------

    fun markFile(run: RunDir): File = File(run.dir, MARK_FILE)

    /** Set (a window's worker, or a start asking for charging only) or clear (the user's own start) the run's flag. */
    fun mark(run: RunDir, on: Boolean, nowMs: Long = System.currentTimeMillis()) {
        val f = markFile(run)
        if (on) AtomicFiles.writeText(f, JsonWriter.write(Json.of(linkedMapOf("charging_only" to true, "since_ms" to nowMs))) + "\n")
        else if (f.exists() && !f.delete()) throw java.io.IOException("cannot delete $f")
    }

    /** Whether [run] trains in charging windows only (an unreadable flag counts as set: the safe side). */
    fun isMarked(run: RunDir): Boolean {
        val f = markFile(run)
        if (!f.isFile) return false
        return try { (Json.parse(f.readText()) as? Json.Obj)?.get("charging_only") != Json.Bool(false) } catch (e: Exception) { true }
    }

    /**
     * What the training service does with a start. [restart]: Android restarted it (START_STICKY's null intent,
     * or START_REDELIVER_INTENT's redelivery after a process kill), not a request of the user's.
     * [chargingRequested]: the request asks for charging windows only (extra `charging_window`). [marked]: the
     * run's persisted flag ([isMarked]). [enabled]: the "train while charging" switch.
     *
     * - The user's own start or resume trains now, and clears the flag (they asked for it now).
     * - A restart of an unflagged run trains (it resumes from its checkpoint, as before).
     * - A charging-only start, or a restart of a flagged run, trains only while the phone charges (and stops at
     *   a step boundary when it no longer does), keeping the flag; off the charger, below [MIN_BATTERY_PCT], or
     *   (a restart) with the switch off, it is deferred: nothing trains, the run stays paused for the next
     *   charging window (or the user's Resume).
     */
    sealed class ServiceStart {
        /** Train; [chargingOnly]: stop when charging ends; [setMark]: write (true) / clear (false) the flag, or leave it (null). */
        data class Train(val chargingOnly: Boolean, val setMark: Boolean?) : ServiceStart()
        data class Defer(val reason: String) : ServiceStart()
    }

    fun onServiceStart(restart: Boolean, chargingRequested: Boolean, marked: Boolean, enabled: Boolean, charging: Boolean,
                       batteryPct: Double?): ServiceStart {
        val chargingOnly = chargingRequested || (restart && marked)
        if (!chargingOnly) return ServiceStart.Train(chargingOnly = false, setMark = if (restart) null else false)
        if (restart && !chargingRequested && !enabled) return ServiceStart.Defer("train while charging is off: tap Resume to train now")
        if (!charging) return ServiceStart.Defer("waiting for the next charging window (not charging)")
        lowBattery(batteryPct)?.let { return ServiceStart.Defer("waiting for the next charging window ($it)") }
        return ServiceStart.Train(chargingOnly = true, setMark = true)
    }
}

/**
 * Who trains in this process: at most one session at a time, the training service's or a charging worker's
 * (each opens the program's runtime; two would load it twice and write one run's checkpoint from two threads).
 */
class RunSlot {
    enum class Owner { SERVICE, WORKER }

    private val held = AtomicReference<Owner?>(null)

    fun tryAcquire(owner: Owner): Boolean = held.compareAndSet(null, owner)
    fun release(owner: Owner) { held.compareAndSet(owner, null) }
    val holder: Owner? get() = held.get()

    /** What the service does with a request while a charging worker trains (the service has no session of its own). */
    enum class WhileWorkerTrains {
        /** Start / resume: refused with a message (the run is training already; Stop, then start). */
        REFUSE_START,
        /** Generate: to the worker's live session, beside its training. */
        TO_WORKER_SESSION,
        /** Stop / cancel: as always (the stop flag is the worker's control too). */
        AS_USUAL,
    }

    companion object {
        /** The app process's one slot. */
        val process = RunSlot()

        fun whileWorkerTrains(action: String?, startAction: String, generateAction: String): WhileWorkerTrains = when (action) {
            generateAction -> WhileWorkerTrains.TO_WORKER_SESSION
            startAction, null -> WhileWorkerTrains.REFUSE_START
            else -> WhileWorkerTrains.AS_USUAL
        }
    }
}
