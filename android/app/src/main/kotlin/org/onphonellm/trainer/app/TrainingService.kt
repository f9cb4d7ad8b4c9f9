package org.onphonellm.trainer.app

import android.app.Notification
import android.app.NotificationChannel
import android.app.NotificationManager
import android.app.PendingIntent
import android.app.Service
import android.content.Context
import android.content.Intent
import android.os.Build
import android.os.IBinder
import android.os.PowerManager
import android.os.SystemClock
import android.util.Log
import org.onphonellm.trainer.core.Clock
import org.onphonellm.trainer.core.EventLog
import org.onphonellm.trainer.core.Manifest
import org.onphonellm.trainer.core.ProgressListener
import org.onphonellm.trainer.core.RunConfig
import org.onphonellm.trainer.core.RunControl
import org.onphonellm.trainer.core.RunDir
import org.onphonellm.trainer.core.Schedule
import org.onphonellm.trainer.core.StepPlan
import org.onphonellm.trainer.core.Trainer
import org.onphonellm.trainer.core.UploadQueue
import org.onphonellm.trainer.core.UrlConnectionPoster
import org.onphonellm.trainer.core.readDataset
import java.io.File

/**
 * Runs one training run in the foreground (a notification shows progress), holding a partial wake
 * lock so training goes on with the screen off. Started with START_REDELIVER_INTENT: if Android kills
 * the process, it restarts the service with the same request, and the Trainer resumes from the run's
 * checkpoint. All logic is in trainer-core; this class wires Android to it.
 */
class TrainingService : Service() {
    private var worker: Thread? = null

    override fun onBind(intent: Intent?): IBinder? = null

    override fun onCreate() {
        super.onCreate()
        val nm = getSystemService(Context.NOTIFICATION_SERVICE) as NotificationManager
        nm.createNotificationChannel(NotificationChannel(CHANNEL, "Training", NotificationManager.IMPORTANCE_LOW))
    }

    override fun onStartCommand(intent: Intent?, flags: Int, startId: Int): Int {
        if (intent?.action == RunRequest.ACTION_STOP) {
            TrainingStatus.requestStop()
            return START_NOT_STICKY
        }
        startForeground(NOTIFICATION_ID, notification("starting", 0, 0))
        if (worker?.isAlive == true) return START_REDELIVER_INTENT
        val base = getExternalFilesDir(null) ?: filesDir
        val request = try {
            RunRequest.fromIntent(intent ?: Intent(), base)
        } catch (e: IllegalArgumentException) {
            TrainingStatus.message = "bad request: ${e.message}"
            Log.e(TAG, "bad request", e)
            stopSelf()
            return START_NOT_STICKY
        }
        worker = Thread({ runTraining(request, base) }, "trainer").also { it.start() }
        return START_REDELIVER_INTENT
    }

    override fun onTrimMemory(level: Int) {
        super.onTrimMemory(level)
        TrainingStatus.onTrim(level, SystemClock.elapsedRealtime())
    }

    private fun runTraining(req: RunRequest, base: File) {
        val pm = getSystemService(Context.POWER_SERVICE) as PowerManager
        val wakeLock = pm.newWakeLock(PowerManager.PARTIAL_WAKE_LOCK, "trainer:run").apply { acquire() }
        var uploader: Thread? = null
        try {
            val manifest = Manifest.load(File(req.programDir, "manifest.json"))
            if (req.verifyFiles) manifest.verifyFiles(req.programDir)
            val schedule = req.planFile?.let { Schedule.fromPlan(manifest, StepPlan.parse(it.readText(), it.name)) }
                ?: Schedule.fromManifest(manifest)
            val rows = readDataset(req.dataFile, manifest.vocab, manifest.seqLen)
            val runDir = RunDir(File(File(base, "runs"), req.runId))
            val probe = AndroidMemoryProbe(this)
            val total = probe.totalRamBytes()
            val budget = req.budgetMb?.let { it shl 20 } ?: total / 4 // no budget given: a quarter of RAM
            val config = RunConfig(req.runId, req.steps, req.lr ?: manifest.defaultLr ?: 1e-4, budget, runInfo(req, total),
                checkpointEvery = req.checkpointEvery, shuffleSeed = req.shuffleSeed)
            TrainingStatus.begin(req.runId, req.steps, budget)
            val queue = ExecuTorchRuntime(File(req.programDir, manifest.programFile)).use { runtime ->
                val trainer = Trainer(manifest, req.programDir, schedule, rows, runtime, probe, config, runDir, Clock.System,
                    RunControl { TrainingStatus.stopRequested() }, Progress())
                val queue = uploadQueue(req, runDir)
                uploader = queue?.let { q -> Thread({ uploadLoop(q) }, "telemetry-upload").also { it.start() } }
                val outcome = trainer.run()
                TrainingStatus.message = "${outcome.status}: ${outcome.message}"
                queue
            }
            // The program is unloaded; send what is left (the pulled log has it all in any case).
            uploader?.interrupt()
            uploader?.join(2000)
            queue?.drain(Clock.System, System.currentTimeMillis() + 30_000)
        } catch (e: Exception) {
            Log.e(TAG, "training failed", e)
            TrainingStatus.message = "failed: ${e.message}"
        } finally {
            uploader?.interrupt()
            TrainingStatus.running = false
            wakeLock.release()
            @Suppress("DEPRECATION") stopForeground(true)
            stopSelf()
        }
    }

    private fun runInfo(req: RunRequest, totalRam: Long): Map<String, Any?> = linkedMapOf(
        "platform" to "android", "device_model" to Build.MODEL, "os" to "Android ${Build.VERSION.RELEASE} (API ${Build.VERSION.SDK_INT})",
        "total_ram_bytes" to totalRam, "program" to req.programDir.name, "device_profile" to req.deviceProfile,
        "app_version" to packageManager.getPackageInfo(packageName, 0).versionName,
    )

    private fun uploadQueue(req: RunRequest, runDir: RunDir): UploadQueue? {
        val url = req.telemetryUrl ?: return null
        return UploadQueue(EventLog(runDir.telemetry), runDir.uploadCursor, runDir.rejected, UrlConnectionPoster(), url, req.telemetryToken ?: "")
    }

    /** Send telemetry while training runs, off the training thread; backoff when the server is away. */
    private fun uploadLoop(queue: UploadQueue) {
        try {
            while (!Thread.currentThread().isInterrupted) {
                val now = System.currentTimeMillis()
                when (val r = queue.pump(now)) {
                    UploadQueue.Result.Idle -> Thread.sleep(2000)
                    is UploadQueue.Result.RetryAt -> Thread.sleep(maxOf(0L, r.atMs - now))
                    else -> Unit
                }
            }
        } catch (e: InterruptedException) {
            // the run ended: the service drains the rest
        }
    }

    private inner class Progress : ProgressListener {
        private var lastNotifyMs = 0L

        override fun onStep(step: Long, steps: Long, loss: Double, anonBytes: Long?, budgetBytes: Long) {
            TrainingStatus.step = step + 1
            TrainingStatus.loss = loss
            TrainingStatus.anonBytes = anonBytes
            TrainingStatus.message = "training"
            val now = SystemClock.elapsedRealtime()
            if (now - lastNotifyMs > 2000 || step + 1 == steps) {
                lastNotifyMs = now
                val text = "step ${step + 1}/$steps  loss %.4f  anon %d MB / %d MB".format(loss, (anonBytes ?: 0L) shr 20, budgetBytes shr 20)
                (getSystemService(Context.NOTIFICATION_SERVICE) as NotificationManager)
                    .notify(NOTIFICATION_ID, notification(text, (step + 1).toInt(), steps.toInt()))
            }
        }

        override fun onStatus(message: String) {
            TrainingStatus.message = message
        }
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
        private const val TAG = "Trainer"
        private const val CHANNEL = "training"
        private const val NOTIFICATION_ID = 1
    }
}
