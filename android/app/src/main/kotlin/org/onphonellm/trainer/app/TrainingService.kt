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
import android.os.IBinder
import android.os.PowerManager
import android.os.SystemClock
import android.util.Log
import org.onphonellm.trainer.core.Clock
import org.onphonellm.trainer.core.EventLog
import org.onphonellm.trainer.core.LayerLoop
import org.onphonellm.trainer.core.MappedWeights
import org.onphonellm.trainer.core.Prompts
import org.onphonellm.trainer.core.ProgramV3
import org.onphonellm.trainer.core.RunControl
import org.onphonellm.trainer.core.RunDir
import org.onphonellm.trainer.core.Runs
import org.onphonellm.trainer.core.SessionListener
import org.onphonellm.trainer.core.TextTokenizer
import org.onphonellm.trainer.core.TrainingSession
import org.onphonellm.trainer.core.UploadQueue
import org.onphonellm.trainer.core.UrlConnectionPoster
import java.io.File

/**
 * Runs the latest run (or the one named) in the foreground, holding a partial wake lock so training goes on
 * with the screen off; all logic is trainer-core's [TrainingSession], this class wires Android to it.
 *
 * Lifecycle: START_REDELIVER_INTENT, so after a process kill Android restarts the service and the session
 * resumes from the run's checkpoint (no run id needed: [Runs.latest]). On Android 12+ that restart happens in
 * the background, where `startForeground` may throw ForegroundServiceStartNotAllowedException: the service
 * then records the run as paused (AppState), stops itself without training and returns START_NOT_STICKY (no
 * crash loop); the Activity shows "paused" and its Resume button starts the service from the foreground.
 * Memory: the session checks the footprint after every step; a watchdog thread samples /proc/self/status
 * and ActivityManager.MemoryInfo.lowMemory every 2 s during a step and asks the session to stop at the next
 * step boundary when the footprint is over budget (onTrimMemory's RUNNING_* levels are not delivered on API
 * 34+, only UI_HIDDEN / BACKGROUND, which are not pressure on a foreground service).
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
        when (intent?.action) {
            RunRequest.ACTION_STOP -> {
                TrainingStatus.requestStop()
                if (worker?.isAlive != true) stopSelf()  // nothing running: do not linger as a started service
                return START_NOT_STICKY
            }
            RunRequest.ACTION_GENERATE -> {
                TrainingStatus.pendingPrompt = intent.getStringExtra(RunRequest.EXTRA_PROMPT)
                if (worker?.isAlive == true) return START_NOT_STICKY  // the training thread takes it between steps
            }
        }
        try {
            if (Build.VERSION.SDK_INT >= 29) startForeground(NOTIFICATION_ID, notification("starting", 0, 0), ServiceInfo.FOREGROUND_SERVICE_TYPE_SPECIAL_USE)
            else startForeground(NOTIFICATION_ID, notification("starting", 0, 0))
        } catch (e: IllegalStateException) {
            // Android 12+: a restart in the background may not start a foreground service. Record it and wait for the user.
            if (Build.VERSION.SDK_INT >= 31 && e is ForegroundServiceStartNotAllowedException) {
                AppState.setPaused(this, "Android stopped the app; tap Resume to continue the run")
                TrainingStatus.message = "paused (restart not allowed in the background): tap Resume"
                stopSelf()
                return START_NOT_STICKY
            }
            throw e
        }
        if (worker?.isAlive == true) return START_REDELIVER_INTENT
        val base = getExternalFilesDir(null) ?: filesDir
        val request = RunRequest.fromIntent(intent ?: Intent(), base)
        if (!request.generateOnly) AppState.setPaused(this, null)
        worker = Thread({ work(request, base) }, "trainer").also { it.start() }
        return if (request.generateOnly) START_NOT_STICKY else START_REDELIVER_INTENT
    }

    override fun onTrimMemory(level: Int) {
        super.onTrimMemory(level)
        TrainingStatus.onTrim(level, SystemClock.elapsedRealtime())
    }

    private fun work(req: RunRequest, base: File) {
        val pm = getSystemService(Context.POWER_SERVICE) as PowerManager
        val wakeLock = pm.newWakeLock(PowerManager.PARTIAL_WAKE_LOCK, "trainer:run").apply { acquire() }
        var uploader: Thread? = null
        var watchdog: Thread? = null
        try {
            val runs = Runs(File(base, "runs"))
            // program + text extras (adb): create that run, unless a run of that id exists (then it resumes).
            val created = req.newRun?.takeIf { req.runId == null || runs.get(req.runId) == null }?.let { n ->
                val probe0 = AndroidMemoryProbe(this)
                RunRequest.createRun(base, n, n.text.readText(Charsets.UTF_8), probe0.totalRamBytes(), runInfo(probe0.totalRamBytes()),
                    req.runId ?: RunRequest.newRunId()).first
            }
            val runDir = (created?.let { runs.get(it) }) ?: (req.runId?.let { runs.get(it) ?: throw IllegalArgumentException("no run '$it' under ${runs.base}") } ?: runs.latest())
                ?: throw IllegalArgumentException("no run to start: prepare one in the app (or with scripts/android/start.sh)")
            val spec = org.onphonellm.trainer.core.RunSpec.parse(org.onphonellm.trainer.core.Json.parse(runDir.spec.readText()), runDir.spec.path)
            val programDir = File(spec.program).let { if (it.isAbsolute) it else File(File(base, "programs"), spec.program) }
            val program = ProgramV3.read(programDir)
            if (req.verifyFiles) program.verifyFiles { it.startsWith(program.adapterInitDir ?: "\u0000") }
            val weights = MappedWeights.map(File(programDir, program.weightsFile))
            val probe = AndroidMemoryProbe(this)
            ExecuTorchRuntime(File(programDir, program.programFile), program).use { runtime ->
                val session = TrainingSession(program, weights, runtime, runDir, probe, Clock.System, Progress())
                val tok = try { TextTokenizer.forProgram(program) } catch (e: Exception) { null }
                val chat = spec.source == "chat"
                fun generate() {
                    val prompt = TrainingStatus.pendingPrompt ?: return
                    TrainingStatus.pendingPrompt = null
                    if (tok == null) { TrainingStatus.message = "the program has no tokenizer: no generation"; return }
                    TrainingStatus.generating = true
                    try {
                        val (ids, stop) = Prompts.encode(tok, prompt, chat)
                        val (before, after) = session.generateBoth(ids, req.maxNewTokens, stop)
                        TrainingStatus.generation = Pair(Prompts.decode(tok, before, stop), Prompts.decode(tok, after, stop))
                    } finally {
                        TrainingStatus.generating = false
                    }
                }
                TrainingStatus.evalBefore = session.evals.before
                TrainingStatus.evalAfter = session.evals.after
                if (req.generateOnly) {
                    session.loadState()
                    generate()
                    return@use
                }
                val done = runCatching { org.onphonellm.trainer.core.CheckpointStore(runDir.checkpoint).load(program.stateNumel) }.getOrNull()
                TrainingStatus.begin(spec.runId, spec.steps, spec.budgetBytes, done?.step ?: 0L, done?.losses ?: emptyList())
                uploader = uploadQueue(req, runDir)?.let { q -> Thread({ uploadLoop(q) }, "telemetry-upload").also { it.start() } }
                watchdog = Thread({ watch(probe, spec.budgetBytes) }, "memory-watchdog").also { it.isDaemon = true; it.start() }
                val outcome = session.run(RunControl { TrainingStatus.stopRequested() }) { generate() }
                TrainingStatus.message = "${outcome.status}: ${TrainingStatus.stopReason ?: outcome.message}"
                TrainingStatus.evalAfter = session.evals.after
                if (outcome.status == "paused") AppState.setPaused(this, outcome.message)
            }
        } catch (e: Exception) {
            Log.e(TAG, "training failed", e)
            TrainingStatus.message = "failed: ${e.message}"
        } finally {
            watchdog?.interrupt()
            uploader?.interrupt()
            TrainingStatus.running = false
            wakeLock.release()
            if (Build.VERSION.SDK_INT >= 24) stopForeground(STOP_FOREGROUND_REMOVE) else @Suppress("DEPRECATION") stopForeground(true)
            stopSelf()
        }
    }

    private fun runInfo(totalRam: Long): Map<String, Any?> = runInfo(this, totalRam)

    /** Polls the footprint between the session's own checks; over budget -> stop at the next step (checkpointed). */
    private fun watch(probe: AndroidMemoryProbe, budget: Long) {
        try {
            while (!Thread.currentThread().isInterrupted) {
                Thread.sleep(2000)
                val anon = probe.anonBytes()
                TrainingStatus.anonBytes = anon
                if (anon > budget && !TrainingStatus.stopRequested())
                    TrainingStatus.requestStop("anonymous memory ${anon shr 20} MB is over the ${budget shr 20} MB budget")
            }
        } catch (e: InterruptedException) {
            // the session ended
        }
    }

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
            // the run ended; the log keeps what was not sent (the next run's queue sends it)
        }
    }

    private inner class Progress : SessionListener {
        private var lastNotifyMs = 0L

        override fun onStep(step: Long, steps: Long, loss: Double, anonBytes: Long?, budgetBytes: Long) {
            TrainingStatus.step = step + 1
            TrainingStatus.loss = loss
            TrainingStatus.losses.add(loss)
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

        override fun onEval(which: String, result: LayerLoop.EvalResult) {
            if (which == "before") TrainingStatus.evalBefore = result.loss else TrainingStatus.evalAfter = result.loss
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

/** The run_start fields only the platform knows. */
fun runInfo(context: Context, totalRam: Long): Map<String, Any?> = linkedMapOf(
    "platform" to "android", "device_model" to Build.MODEL, "os" to "Android ${Build.VERSION.RELEASE} (API ${Build.VERSION.SDK_INT})",
    "total_ram_bytes" to totalRam, "app_version" to context.packageManager.getPackageInfo(context.packageName, 0).versionName,
)

/** What must survive the process: a run paused by the system (the Activity offers Resume). */
object AppState {
    private const val PREFS = "trainer"

    fun setPaused(context: Context, message: String?) {
        context.getSharedPreferences(PREFS, Context.MODE_PRIVATE).edit().putString("paused", message).apply()
    }

    fun paused(context: Context): String? = context.getSharedPreferences(PREFS, Context.MODE_PRIVATE).getString("paused", null)
}
