package org.onphonellm.trainer.app

import android.app.ForegroundServiceStartNotAllowedException
import android.app.Notification
import android.app.NotificationChannel
import android.app.NotificationManager
import android.app.PendingIntent
import android.app.Service
import android.content.Context
import android.content.Intent
import android.content.pm.ServiceInfo
import android.os.Build
import android.os.Handler
import android.os.IBinder
import android.os.Looper
import android.os.SystemClock
import org.onphonellm.trainer.core.ChargingRuns
import org.onphonellm.trainer.core.RestartGuard
import org.onphonellm.trainer.core.RunControl
import org.onphonellm.trainer.core.RunSlot
import org.onphonellm.trainer.core.Runs
import org.onphonellm.trainer.core.TrainingSession
import java.io.File

/**
 * Runs the latest run (or the one named) in the foreground, holding a partial wake lock so training goes on
 * with the screen off; the session itself is [SessionRunner]'s (the same code a charging window's
 * [ChargingWorker] runs inside WorkManager), all its logic trainer-core's [TrainingSession].
 *
 * Lifecycle: START_REDELIVER_INTENT, so after a process kill Android restarts the service and the session
 * resumes from the run's checkpoint (no run id needed: [Runs.latest]). On Android 12+ that restart happens in
 * the background, where `startForeground` may throw ForegroundServiceStartNotAllowedException: the service
 * then records the run as paused (AppState), stops itself without training and returns START_NOT_STICKY (no
 * crash loop); the Activity shows "paused" and its Resume button starts the service from the foreground.
 * Charging windows only: a run flagged so (ChargingRuns.isMarked: a charging window trained it, or a start
 * with `charging_window` true asked for it) is, after a restart, trained only while the phone charges and
 * stopped at a step boundary when it no longer does, else deferred to the next window
 * ([ChargingRuns.onServiceStart]); the user's own Start / Resume trains now and clears the flag.
 * One session per process ([RunSlot]): while a charging worker trains, a Start is refused with a message and
 * a Generate goes to the worker's session ([LiveSessions]).
 * Memory: the session checks the footprint after every step; a watchdog thread samples /proc/self/status
 * every 2 s during a step and hands its largest figure (and onTrimMemory RUNNING_LOW+) to the session's pressure
 * policy at the next step boundary ([AppPressure]): a smaller working set from the next step, a stop or pause only
 * at the smallest settings (onTrimMemory's RUNNING_* levels are not delivered on API 34+, only UI_HIDDEN /
 * BACKGROUND, which are not pressure on a foreground service).
 *
 * Generation (ACTION_GENERATE, ACTION_CANCEL_GENERATION): never on the training thread. While a session is
 * open, a prompt goes to its own generation thread ([TrainingSession.startComparison]): training goes on (the
 * two alternate program calls), and the tokens stream into [TrainingStatus.generation] as they are decoded.
 * With no session, a generation-only worker opens the run's latest state and does the same. A new prompt
 * cancels the generation running; a Start that arrives during a generation-only worker cancels it and starts
 * once it has ended. A session's end waits for its generation (the user is watching it) up to
 * [SessionRunner.GENERATION_DRAIN_MS], then cancels it, before the runtime is closed.
 */
class TrainingService : Service() {
    private var worker: Thread? = null
    /** Main thread only: a worker is running (set when it starts, cleared on the main thread once it has ended). */
    private var workerRunning = false
    private var workerGenerateOnly = false
    /** A Start that came while a generation-only worker ran: started when that worker has ended. */
    private var queuedStart: Intent? = null
    private val main = Handler(Looper.getMainLooper())

    override fun onBind(intent: Intent?): IBinder? = null

    override fun onCreate() {
        super.onCreate()
        val nm = getSystemService(Context.NOTIFICATION_SERVICE) as NotificationManager
        nm.createNotificationChannel(NotificationChannel(CHANNEL, "Training", NotificationManager.IMPORTANCE_LOW))
    }

    override fun onStartCommand(intent: Intent?, flags: Int, startId: Int): Int {
        when (intent?.action) {
            RunRequest.ACTION_STOP -> {
                TrainingStatus.requestStop()
                if (!workerRunning) stopSelf()  // nothing running here: do not linger as a started service
                return START_NOT_STICKY
            }
            RunRequest.ACTION_CANCEL_GENERATION -> {
                LiveSessions.cancelGeneration()
                if (!workerRunning) stopSelf()
                return START_NOT_STICKY
            }
        }
        // A charging window's worker trains in this process: no second session (RunSlot).
        if (!workerRunning && RunSlot.process.holder == RunSlot.Owner.WORKER) {
            when (RunSlot.whileWorkerTrains(intent?.action ?: RunRequest.ACTION_START, RunRequest.ACTION_START, RunRequest.ACTION_GENERATE)) {
                RunSlot.WhileWorkerTrains.TO_WORKER_SESSION -> LiveSessions.offerPrompt(intent?.getStringExtra(RunRequest.EXTRA_PROMPT) ?: "")
                RunSlot.WhileWorkerTrains.REFUSE_START -> TrainingStatus.message = "the run is training in a charging window: Stop it first, then Start or Resume"
                RunSlot.WhileWorkerTrains.AS_USUAL -> Unit
            }
            // startForegroundService (adb) must reach startForeground before the service stops.
            if (enterForeground()) { if (Build.VERSION.SDK_INT >= 24) stopForeground(STOP_FOREGROUND_REMOVE) else @Suppress("DEPRECATION") stopForeground(true) }
            stopSelf()
            return START_NOT_STICKY
        }
        if (intent?.action == RunRequest.ACTION_GENERATE) {
            val prompt = intent.getStringExtra(RunRequest.EXTRA_PROMPT) ?: ""
            if (workerRunning) { LiveSessions.offerPrompt(prompt); return START_NOT_STICKY }  // its session (or, once open, it) takes it
            TrainingStatus.pendingPrompt = prompt  // the generation-only worker started below takes it
        }
        if (!enterForeground()) return START_NOT_STICKY
        if (workerRunning) {
            // A start during a generation-only worker: cancel that generation, start once the worker has ended.
            if (workerGenerateOnly) { queuedStart = intent; LiveSessions.cancelGeneration() }
            return START_REDELIVER_INTENT
        }
        // Android restarted us (START_STICKY's null intent, START_REDELIVER_INTENT's redelivery): not the user's request.
        val restart = intent == null || (flags and (START_FLAG_REDELIVERY or START_FLAG_RETRY)) != 0
        return launch(intent, restart)
    }

    /** startForeground (every start command must reach it); false: Android refused it (recorded, the service stops). */
    private fun enterForeground(): Boolean {
        try {
            if (Build.VERSION.SDK_INT >= 29) startForeground(NOTIFICATION_ID, notification("starting", 0, 0), ServiceInfo.FOREGROUND_SERVICE_TYPE_SPECIAL_USE)
            else startForeground(NOTIFICATION_ID, notification("starting", 0, 0))
        } catch (e: IllegalStateException) {
            // Android 12+: a restart in the background may not start a foreground service. Record it and wait for the user.
            if (Build.VERSION.SDK_INT >= 31 && e is ForegroundServiceStartNotAllowedException) {
                val app = applicationContext
                Thread { AppState.setPaused(app, "Android stopped the app; tap Resume to continue the run") }.start()
                TrainingStatus.message = "paused (restart not allowed in the background): tap Resume"
                if (!workerRunning) TrainingStatus.start.ended()  // a start the screen began does not stay "starting"
                stopSelf()
                return false
            }
            throw e
        }
        return true
    }

    /** Start a worker for [intent] (no worker is running; in the foreground). */
    private fun launch(intent: Intent?, restart: Boolean): Int {
        val i = intent ?: Intent()
        val generateOnly = i.action == RunRequest.ACTION_GENERATE
        if (!RunSlot.process.tryAcquire(RunSlot.Owner.SERVICE)) {  // a charging worker took the slot meanwhile
            TrainingStatus.message = "the run is training in a charging window: Stop it first, then Start or Resume"
            if (Build.VERSION.SDK_INT >= 24) stopForeground(STOP_FOREGROUND_REMOVE) else @Suppress("DEPRECATION") stopForeground(true)
            stopSelf()
            return START_NOT_STICKY
        }
        workerRunning = true
        workerGenerateOnly = generateOnly
        worker = Thread({
            val base = getExternalFilesDir(null) ?: filesDir  // may create the directory: not on the main thread
            work(RunRequest.fromIntent(i, base), base, restart)
        }, "trainer").also { it.start() }
        return if (generateOnly) START_NOT_STICKY else START_REDELIVER_INTENT
    }

    /** Main thread, after a worker has ended: the queued start, else a prompt that came while it was ending, else stop. */
    private fun workerEnded() {
        workerRunning = false
        worker = null
        val next = queuedStart ?: TrainingStatus.pendingPrompt?.let {
            Intent(this, TrainingService::class.java).setAction(RunRequest.ACTION_GENERATE).putExtra(RunRequest.EXTRA_PROMPT, it)
        }
        queuedStart = null
        if (next != null && enterForeground()) { launch(next, restart = false); return }
        if (Build.VERSION.SDK_INT >= 24) stopForeground(STOP_FOREGROUND_REMOVE) else @Suppress("DEPRECATION") stopForeground(true)
        stopSelf()
    }

    override fun onTrimMemory(level: Int) {
        super.onTrimMemory(level)
        TrainingStatus.onTrim(level, SystemClock.elapsedRealtime())
        AppPressure.trimmed(level)  // one notch down at the next step boundary (trainer-core PressurePolicy)
    }

    /** The "trainer" thread: the charging-window decision for this start, then the session ([SessionRunner]). */
    private fun work(req: RunRequest, base: File, restart: Boolean) {
        try {
            val chargingOnly = java.util.concurrent.atomic.AtomicBoolean(false)
            val unplugged = "no longer charging: paused at a step boundary; the next charging window continues"
            val control = object : RunControl {
                override fun stopRequested(): Boolean {
                    if (chargingOnly.get() && !TrainingStatus.stopRequested() && !Battery.charging(this@TrainingService)) TrainingStatus.requestStop(unplugged)
                    return TrainingStatus.stopRequested()
                }
                // A charging window ends when the phone is unplugged or Android stops the work: a checkpoint every step.
                override fun checkpointEachStep(): Boolean = chargingOnly.get()
            }
            // A crash the app could not catch (native) is not replayed by START_REDELIVER_INTENT forever (RestartGuard).
            val guard = RestartGuard(File(base, "restart_guard"))
            SessionRunner(this) { text, p, max -> notifyProgress(text, p, max) }.run(req, base, control) { run ->
                if (req.generateOnly) return@run null
                guard.beforeStart(restart)?.let { return@run it }
                val d = ChargingRuns.onServiceStart(restart, req.chargingWindow, ChargingRuns.isMarked(run), ChargingSchedule.enabled(this),
                    Battery.charging(this), Battery.percent(this))
                when (d) {
                    is ChargingRuns.ServiceStart.Defer -> d.reason
                    is ChargingRuns.ServiceStart.Train -> {
                        chargingOnly.set(d.chargingOnly)
                        d.setMark?.let { ChargingRuns.mark(run, it) }
                        AppState.setPaused(this, null)
                        null
                    }
                }
            }
            guard.ended()  // the session ended in the app's hands (a Throwable is caught and recorded by SessionRunner)
        } finally {
            RunSlot.process.release(RunSlot.Owner.SERVICE)
            main.post { workerEnded() }
        }
    }

    private fun notifyProgress(text: String, progress: Int, max: Int) {
        (getSystemService(Context.NOTIFICATION_SERVICE) as NotificationManager).notify(NOTIFICATION_ID, notification(text, progress, max))
    }

    private fun notification(text: String, progress: Int, max: Int): Notification {
        val open = PendingIntent.getActivity(this, 0, Intent(this, MainActivity::class.java), PendingIntent.FLAG_IMMUTABLE)
        return Notification.Builder(this, CHANNEL)
            .setContentTitle("LoRA training")
            .setContentText(text)
            .setSmallIcon(android.R.drawable.stat_sys_upload)
            .setOngoing(true)
            .setOnlyAlertOnce(true)
            .setProgress(max, progress, max == 0)
            .setContentIntent(open)
            .build()
    }

    companion object {
        private const val CHANNEL = "training"
        private const val NOTIFICATION_ID = 1
    }
}

/** The run_start fields only the platform knows. */
fun runInfo(context: Context, totalRam: Long): Map<String, Any?> = linkedMapOf(
    "platform" to "android", "device_model" to Build.MODEL, "os" to "Android ${Build.VERSION.RELEASE} (API ${Build.VERSION.SDK_INT})",
    "total_ram_bytes" to totalRam, "app_version" to context.packageManager.getPackageInfo(context.packageName, 0).versionName,
)
