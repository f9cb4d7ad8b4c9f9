package org.onphonellm.trainer.app

import android.app.Notification
import android.app.NotificationChannel
import android.app.NotificationManager
import android.content.Context
import android.content.Intent
import android.content.pm.ServiceInfo
import android.os.BatteryManager
import android.os.Build
import android.util.Log
import androidx.work.Constraints
import androidx.work.ExistingPeriodicWorkPolicy
import androidx.work.ForegroundInfo
import androidx.work.PeriodicWorkRequest
import androidx.work.WorkManager
import androidx.work.Worker
import androidx.work.WorkerParameters
import org.onphonellm.trainer.core.ChargingRuns
import org.onphonellm.trainer.core.Runs
import java.io.File
import java.util.concurrent.TimeUnit

/**
 * "Train while charging": WorkManager periodic work (every 15 min, the shortest period it allows) with the
 * constraints charging + device idle ([ChargingRuns.REQUIRES_CHARGING], [ChargingRuns.REQUIRES_IDLE]). When a
 * window opens, [ChargingRuns.decide] picks the latest unfinished run; the worker makes itself a foreground
 * worker (setForegroundAsync: no 10-minute limit) and starts [TrainingService] with that run id, which resumes
 * it from its checkpoint. When the window ends (unplugged, the phone in use), WorkManager stops the worker
 * ([onStopped]): it asks the session to stop, which it does at the next step boundary with a checkpoint
 * (run_end "paused"); the next window resumes from there. Compiled here against android/host-stubs/androidx-work.
 */
class ChargingWorker(context: Context, params: WorkerParameters) : Worker(context, params) {
    override fun doWork(): Result {
        val ctx = applicationContext
        if (!ChargingSchedule.enabled(ctx)) return Result.success()
        val base = ctx.getExternalFilesDir(null) ?: ctx.filesDir
        val bm = ctx.getSystemService(Context.BATTERY_SERVICE) as BatteryManager
        val pct = bm.getIntProperty(BatteryManager.BATTERY_PROPERTY_CAPACITY).takeIf { it in 0..100 }?.toDouble()
        val charging = Build.VERSION.SDK_INT < 23 || bm.isCharging
        when (val d = ChargingRuns.decide(true, Runs(File(base, "runs")), TrainingStatus.running, charging, pct)) {
            is ChargingRuns.Decision.Skip -> { Log.i(TAG, "charging window: ${d.reason}"); return Result.success() }
            is ChargingRuns.Decision.Resume -> {
                try {
                    setForegroundAsync(foregroundInfo(ctx)).get()
                    ctx.startService(Intent(ctx, TrainingService::class.java).setAction(RunRequest.ACTION_START)
                        .putExtra("run_id", d.runId).putExtra(RunRequest.EXTRA_CHARGING_WINDOW, true))
                } catch (e: Exception) {  // Android refused the foreground start: the next window tries again
                    Log.w(TAG, "charging window: cannot start the run: $e")
                    return Result.retry()
                }
                // Wait while it trains; the window's end stops it at a step boundary.
                val control = ChargingRuns.control({ isStopped }, { false })
                var started = false
                for (i in 0 until MAX_POLLS) {
                    if (control.stopRequested()) break
                    if (TrainingStatus.running) started = true else if (started || i > START_POLLS) break
                    Thread.sleep(POLL_MS)
                }
                if (isStopped) TrainingStatus.requestStop("the charging window ended (unplugged or in use): paused at a step boundary")
                return Result.success()
            }
        }
    }

    override fun onStopped() {
        // Called on WorkManager's thread when charging or idle ends: stop at the next step boundary.
        if (TrainingStatus.running) TrainingStatus.requestStop("the charging window ended (unplugged or in use): paused at a step boundary")
    }

    private fun foregroundInfo(ctx: Context): ForegroundInfo {
        val nm = ctx.getSystemService(Context.NOTIFICATION_SERVICE) as NotificationManager
        nm.createNotificationChannel(NotificationChannel(CHANNEL, "Training while charging", NotificationManager.IMPORTANCE_LOW))
        val n: Notification = Notification.Builder(ctx, CHANNEL).setContentTitle("LoRA training while charging")
            .setSmallIcon(android.R.drawable.stat_sys_upload).setOngoing(true).build()
        return if (Build.VERSION.SDK_INT >= 29) ForegroundInfo(NOTIFICATION_ID, n, ServiceInfo.FOREGROUND_SERVICE_TYPE_SPECIAL_USE)
        else ForegroundInfo(NOTIFICATION_ID, n)
    }

    companion object {
        private const val TAG = "ChargingWorker"
        private const val CHANNEL = "charging"
        private const val NOTIFICATION_ID = 2
        private const val POLL_MS = 5_000L
        private const val START_POLLS = 12        // the service has a minute to begin
        private const val MAX_POLLS = 12 * 60 * 12 // 12 h
    }
}

/** The switch: stored in preferences, and the periodic work enqueued (KEEP) or cancelled with it. */
object ChargingSchedule {
    private const val PREFS = "trainer"
    private const val KEY = "train_while_charging"

    fun enabled(context: Context): Boolean = context.getSharedPreferences(PREFS, Context.MODE_PRIVATE).getBoolean(KEY, false)

    fun set(context: Context, on: Boolean) {
        context.getSharedPreferences(PREFS, Context.MODE_PRIVATE).edit().putBoolean(KEY, on).apply()
        val wm = WorkManager.getInstance(context)
        if (!on) { wm.cancelUniqueWork(ChargingRuns.WORK_NAME); return }
        val constraints = Constraints.Builder()
            .setRequiresCharging(ChargingRuns.REQUIRES_CHARGING)
            .setRequiresDeviceIdle(ChargingRuns.REQUIRES_IDLE)
            .build()
        val work = PeriodicWorkRequest.Builder(ChargingWorker::class.java, 15, TimeUnit.MINUTES).setConstraints(constraints).build()
        wm.enqueueUniquePeriodicWork(ChargingRuns.WORK_NAME, ExistingPeriodicWorkPolicy.KEEP, work)
    }
}
