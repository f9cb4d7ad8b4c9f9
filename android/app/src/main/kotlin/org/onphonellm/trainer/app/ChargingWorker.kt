package org.onphonellm.trainer.app

import android.app.Notification
import android.app.NotificationChannel
import android.app.NotificationManager
import android.content.Context
import android.content.pm.ServiceInfo
import android.os.Build
import android.os.SystemClock
import android.util.Log
import androidx.work.ForegroundInfo
import androidx.work.WorkManager
import androidx.work.Worker
import androidx.work.WorkerParameters
import org.onphonellm.trainer.core.ChargingRuns
import org.onphonellm.trainer.core.RunSlot
import org.onphonellm.trainer.core.Runs
import java.io.File

/**
 * "Train while charging": WorkManager periodic work (every 15 min, the shortest period it allows) with the
 * constraints charging + device idle ([ChargingRuns.REQUIRES_CHARGING], [ChargingRuns.REQUIRES_IDLE]). When a
 * window opens, [ChargingRuns.decide] picks the latest unfinished run and the worker **runs the session itself**
 * ([SessionRunner], the code the training service runs), on WorkManager's thread: no service is started, so
 * Android 12+'s refusal to start a foreground service from the background
 * (ForegroundServiceStartNotAllowedException) cannot stop it. It first asks to be a long-running foreground
 * worker (setForegroundAsync, type specialUse: WorkManager's own SystemForegroundService, no 10-minute limit);
 * if Android refuses that too, it trains anyway as the job it is and stops itself at a step boundary before
 * JobScheduler's 10-minute limit ([ChargingRuns.windowPlan]). The run is flagged as a charging-window run
 * ([ChargingRuns.mark]), so a restart of the service after a kill does not train it off the charger. When the
 * window ends (unplugged, the phone in use), WorkManager stops the worker ([isStopped], [onStopped]) and the
 * session stops at the next step boundary with a checkpoint (run_end "paused"); the next window resumes from
 * there. Telemetry goes to the server the run was started with (its run directory keeps it,
 * [org.onphonellm.trainer.core.TelemetryEndpoint]). One session per process ([RunSlot]). Compiled here against
 * android/host-stubs/androidx-work.
 */
class ChargingWorker(context: Context, params: WorkerParameters) : Worker(context, params) {
    override fun doWork(): Result {
        val ctx = applicationContext
        if (!ChargingSchedule.enabled(ctx)) return Result.success()
        val base = ctx.getExternalFilesDir(null) ?: ctx.filesDir
        val runs = Runs(File(base, "runs"))
        val d = ChargingRuns.decide(true, runs, RunSlot.process.holder != null, Battery.charging(ctx), Battery.percent(ctx))
        if (d is ChargingRuns.Decision.Skip) { Log.i(TAG, "charging window: ${d.reason}"); return Result.success() }
        val runId = (d as ChargingRuns.Decision.Resume).runId
        if (!RunSlot.process.tryAcquire(RunSlot.Owner.WORKER)) { Log.i(TAG, "charging window: a run is already training"); return Result.success() }
        try {
            val foreground = try {
                setForegroundAsync(foregroundInfo(ctx, "resuming $runId", 0, 0)).get()
                true
            } catch (e: Exception) {  // ExecutionException around ForegroundServiceStartNotAllowedException / SecurityException / IllegalStateException
                Log.w(TAG, "charging window: not in the foreground ($e); training within the job's time limit")
                false
            }
            val plan = ChargingRuns.windowPlan(foreground, SystemClock.elapsedRealtime())
            runs.get(runId)?.let { ChargingRuns.mark(it, true) }
            TrainingStatus.message = plan.note
            val power = ctx.getSystemService(Context.POWER_SERVICE) as android.os.PowerManager
            val ended = "the charging window ended (unplugged, in use, or its time is up): paused at a step boundary"
            val control = ChargingRuns.control(
                // The constraints are checked here too: WorkManager may not stop foreground work when they change (charging
                // and device idle; the screen turned on is the phone in use).
                windowEnded = { (isStopped || !Battery.charging(ctx) || (ChargingRuns.REQUIRES_IDLE && power.isInteractive))
                    .also { if (it && !TrainingStatus.stopRequested()) TrainingStatus.requestStop(ended) } },
                userStop = { TrainingStatus.stopRequested() },
                deadlineMs = plan.deadlineMs, nowMs = { SystemClock.elapsedRealtime() })
            val request = RunRequest(runId = runId, newRun = null, maxNewTokens = 32, telemetryUrl = null, telemetryToken = null,
                verifyFiles = true, generateOnly = false, chargingWindow = true)
            val notify: (String, Int, Int) -> Unit = { text, p, max ->
                if (foreground) try { setForegroundAsync(foregroundInfo(ctx, text, p, max)) } catch (e: Exception) { Log.w(TAG, "notification: $e") }
            }
            val outcome = SessionRunner(ctx, notify).run(request, base, control)
            Log.i(TAG, "charging window: ${outcome?.status ?: "not trained"}: ${outcome?.message ?: TrainingStatus.message}")
        } finally {
            RunSlot.process.release(RunSlot.Owner.WORKER)
        }
        return Result.success()
    }

    override fun onStopped() {
        // Called on WorkManager's thread when charging or idle ends: stop at the next step boundary.
        if (TrainingStatus.running) TrainingStatus.requestStop("the charging window ended (unplugged or in use): paused at a step boundary")
    }

    private fun foregroundInfo(ctx: Context, text: String, progress: Int, max: Int): ForegroundInfo {
        val nm = ctx.getSystemService(Context.NOTIFICATION_SERVICE) as NotificationManager
        nm.createNotificationChannel(NotificationChannel(CHANNEL, "Training while charging", NotificationManager.IMPORTANCE_LOW))
        val n: Notification = Notification.Builder(ctx, CHANNEL).setContentTitle("LoRA training while charging").setContentText(text)
            .setSmallIcon(android.R.drawable.stat_sys_upload).setOngoing(true).setOnlyAlertOnce(true)
            .setProgress(max, progress, max == 0).build()
        return if (Build.VERSION.SDK_INT >= 29) ForegroundInfo(NOTIFICATION_ID, n, ServiceInfo.FOREGROUND_SERVICE_TYPE_SPECIAL_USE)
        else ForegroundInfo(NOTIFICATION_ID, n)
    }

    companion object {
        private const val TAG = "ChargingWorker"
        private const val CHANNEL = "charging"
        private const val NOTIFICATION_ID = 2
    }
}
