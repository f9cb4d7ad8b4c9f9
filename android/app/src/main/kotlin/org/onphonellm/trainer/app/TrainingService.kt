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
import android.os.PowerManager
import android.os.SystemClock
import android.util.Log
import org.onphonellm.trainer.core.Clock
import org.onphonellm.trainer.core.ErrorReport
import org.onphonellm.trainer.core.StartPhase
import org.onphonellm.trainer.core.VerifyCache
import org.onphonellm.trainer.core.EventLog
import org.onphonellm.trainer.core.GeneratedText
import org.onphonellm.trainer.core.GenerationJob
import org.onphonellm.trainer.core.GenerationListener
import org.onphonellm.trainer.core.LayerLoop
import org.onphonellm.trainer.core.MappedWeights
import org.onphonellm.trainer.core.Prompts
import org.onphonellm.trainer.core.ProgramV3
import org.onphonellm.trainer.core.RunControl
import org.onphonellm.trainer.core.RunDir
import org.onphonellm.trainer.core.Runs
import org.onphonellm.trainer.core.SessionListener
import org.onphonellm.trainer.core.StreamedToken
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
 *
 * Generation (ACTION_GENERATE, ACTION_CANCEL_GENERATION): never on the training thread. While a worker's
 * session is open, a prompt goes to the session's own generation thread ([TrainingSession.startComparison]):
 * training goes on (the two alternate program calls), and the tokens stream into [TrainingStatus.generation]
 * as they are decoded. With no worker, a generation-only worker opens the run's latest state and does the
 * same. A new prompt cancels the generation running; a Start that arrives during a generation-only worker
 * cancels it and starts once it has ended. A worker's end waits for its generation (the user is watching it)
 * up to [GENERATION_DRAIN_MS], then cancels it, before the runtime is closed.
 */
class TrainingService : Service() {
    private var worker: Thread? = null
    /** Main thread only: a worker is running (set when it starts, cleared on the main thread once it has ended). */
    private var workerRunning = false
    private var workerGenerateOnly = false
    /** A Start that came while a generation-only worker ran: started when that worker has ended. */
    private var queuedStart: Intent? = null
    private val main = Handler(Looper.getMainLooper())
    /** Guards [live], [job] and the hand-over of [TrainingStatus.pendingPrompt]. */
    private val lock = Any()
    /** The running worker's session, once its runtime is open: generation requests go to it. */
    private var live: Live? = null
    private var job: GenerationJob? = null

    private class Live(val session: TrainingSession, val tok: TextTokenizer?, val chat: Boolean, val maxNewTokens: Int)

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
                if (!workerRunning) stopSelf()  // nothing running: do not linger as a started service
                return START_NOT_STICKY
            }
            RunRequest.ACTION_CANCEL_GENERATION -> {
                cancelGeneration()
                if (!workerRunning) stopSelf()
                return START_NOT_STICKY
            }
            RunRequest.ACTION_GENERATE -> {
                val prompt = intent.getStringExtra(RunRequest.EXTRA_PROMPT) ?: ""
                if (workerRunning) { offerPrompt(prompt); return START_NOT_STICKY }  // its session (or, once open, it) takes it
                TrainingStatus.pendingPrompt = prompt  // the generation-only worker started below takes it
            }
        }
        if (!enterForeground()) return START_NOT_STICKY
        if (workerRunning) {
            // A start during a generation-only worker: cancel that generation, start once the worker has ended.
            if (workerGenerateOnly) { queuedStart = intent; cancelGeneration() }
            return START_REDELIVER_INTENT
        }
        return launch(intent)
    }

    /** startForeground (every start command must reach it); false: Android refused it (recorded, the service stops). */
    private fun enterForeground(): Boolean {
        try {
            if (Build.VERSION.SDK_INT >= 29) startForeground(NOTIFICATION_ID, notification("starting", 0, 0), ServiceInfo.FOREGROUND_SERVICE_TYPE_SPECIAL_USE)
            else startForeground(NOTIFICATION_ID, notification("starting", 0, 0))
        } catch (e: IllegalStateException) {
            // Android 12+: a restart in the background may not start a foreground service. Record it and wait for the user.
            if (Build.VERSION.SDK_INT >= 31 && e is ForegroundServiceStartNotAllowedException) {
                AppState.setPaused(this, "Android stopped the app; tap Resume to continue the run")
                TrainingStatus.message = "paused (restart not allowed in the background): tap Resume"
                stopSelf()
                return false
            }
            throw e
        }
        return true
    }

    /** Start a worker for [intent] (no worker is running; in the foreground). */
    private fun launch(intent: Intent?): Int {
        val base = getExternalFilesDir(null) ?: filesDir
        val request = RunRequest.fromIntent(intent ?: Intent(), base)
        if (!request.generateOnly) AppState.setPaused(this, null)
        workerRunning = true
        workerGenerateOnly = request.generateOnly
        worker = Thread({ work(request, base) }, "trainer").also { it.start() }
        return if (request.generateOnly) START_NOT_STICKY else START_REDELIVER_INTENT
    }

    /** Main thread, after a worker has ended: the queued start, else a prompt that came while it was ending, else stop. */
    private fun workerEnded() {
        workerRunning = false
        worker = null
        val next = queuedStart ?: TrainingStatus.pendingPrompt?.let {
            Intent(this, TrainingService::class.java).setAction(RunRequest.ACTION_GENERATE).putExtra(RunRequest.EXTRA_PROMPT, it)
        }
        queuedStart = null
        if (next != null && enterForeground()) { launch(next); return }
        if (Build.VERSION.SDK_INT >= 24) stopForeground(STOP_FOREGROUND_REMOVE) else @Suppress("DEPRECATION") stopForeground(true)
        stopSelf()
    }

    /** A prompt to generate: to the open session's generation thread, else kept until the worker's session is open. */
    private fun offerPrompt(prompt: String) = synchronized(lock) {
        val l = live
        if (l == null) TrainingStatus.pendingPrompt = prompt else startGeneration(l, prompt)
    }

    /** The worker's session is open: generation requests go to it from now on (and a pending one starts). */
    private fun goLive(l: Live) = synchronized(lock) {
        live = l
        TrainingStatus.pendingPrompt?.let { startGeneration(l, it) }
    }

    /** Under [lock]: encode [prompt] and start the comparison on the session's generation thread (cancelling the one running). */
    private fun startGeneration(l: Live, prompt: String) {
        TrainingStatus.pendingPrompt = null
        job?.cancel()
        val status = TrainingStatus.generation
        val tok = l.tok ?: run { status.failed("the program has no tokenizer: no generation"); return }
        try {
            val (ids, stop) = Prompts.encode(tok, prompt, l.chat)
            val e = status.requested()  // this request's updates only: a superseded one's late callbacks are dropped
            job = l.session.startComparison(ids, l.maxNewTokens, stop, tok, object : GenerationListener {
                override fun onStart(which: String, stateStep: Long) = status.started(e, which, stateStep)
                override fun onToken(which: String, token: StreamedToken) = status.token(e, which, token.text)
                override fun onDone(which: String, result: GeneratedText) = status.done(e, which, result)
                override fun onError(error: Exception) {
                    Log.e(TAG, "generation failed", error)
                    status.failed("generation failed: ${error.message}", e)
                }
            })
        } catch (e: Exception) {
            status.failed("cannot generate: ${e.message}")
        }
    }

    private fun cancelGeneration() = synchronized(lock) {
        TrainingStatus.pendingPrompt = null
        val j = job
        if (j != null && !j.isDone) j.cancel() else if (TrainingStatus.generation.running) TrainingStatus.generation.failed("cancelled")
    }

    override fun onTrimMemory(level: Int) {
        super.onTrimMemory(level)
        TrainingStatus.onTrim(level, SystemClock.elapsedRealtime())
    }

    /** The phase a start is in (shown instead of "idle" while the phone verifies, loads and prepares). */
    @Volatile private var currentPhase: StartPhase? = null

    private fun phase(p: StartPhase) {
        currentPhase = p
        TrainingStatus.message = p.label + " ..."
    }

    private fun work(req: RunRequest, base: File) {
        var failedRun: RunDir? = null
        currentPhase = null
        TrainingStatus.lastError = null
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
            failedRun = runDir
            val programDir = File(spec.program).let { if (it.isAbsolute) it else File(File(base, "programs"), spec.program) }
            val program = ProgramV3.read(programDir)
            // Verified once per import / push (keyed on the manifest's checksums and the files' sizes and times), not per start.
            if (req.verifyFiles) {
                phase(StartPhase.VERIFYING)
                VerifyCache(File(base, "verified")).verifyOnce(program) { it.startsWith(program.adapterInitDir ?: "\u0000") }
            }
            phase(StartPhase.MAPPING)
            val weights = MappedWeights.map(File(programDir, program.weightsFile))
            val probe = AndroidMemoryProbe(this)
            phase(StartPhase.LOADING)
            ExecuTorchRuntime(File(programDir, program.programFile), program).use { runtime ->
                phase(StartPhase.PREPARING)
                val session = TrainingSession(program, weights, runtime, runDir, probe, Clock.System, Progress())
                session.nativeLog = { ExecuTorchRuntime.readLog() }
                val tok = try { TextTokenizer.forProgram(program) } catch (e: Exception) { null }
                val chat = spec.source == "chat"
                TrainingStatus.evalBefore = session.evals.before
                TrainingStatus.evalAfter = session.evals.after
                try {
                    if (req.generateOnly) {
                        session.loadState()
                        goLive(Live(session, tok, chat, req.maxNewTokens))
                    } else {
                        val done = runCatching { org.onphonellm.trainer.core.CheckpointStore(runDir.checkpoint).load(program.stateNumel) }.getOrNull()
                        TrainingStatus.begin(spec.runId, spec.steps, spec.budgetBytes, done?.step ?: 0L, done?.losses ?: emptyList())
                        uploader = uploadQueue(req, runDir)?.let { q -> Thread({ uploadLoop(q) }, "telemetry-upload").also { it.start() } }
                        watchdog = Thread({ watch(probe, spec.budgetBytes) }, "memory-watchdog").also { it.isDaemon = true; it.start() }
                        // Generation requests from now on run on the session's generation thread, beside training.
                        goLive(Live(session, tok, chat, req.maxNewTokens))
                        phase(if (session.held.isNotEmpty() && session.evals.before == null) StartPhase.EVALUATING else StartPhase.TRAINING)
                        val outcome = session.run(RunControl { TrainingStatus.stopRequested() })
                        TrainingStatus.running = false  // training is over; a generation may still be running (drained below)
                        TrainingStatus.message = if (outcome.status == "failed") ErrorReport(outcome.message, ExecuTorchRuntime.readLog()).display()
                            else "${outcome.status}: ${TrainingStatus.stopReason ?: outcome.message}"
                        TrainingStatus.evalAfter = session.evals.after
                        if (outcome.status == "paused") AppState.setPaused(this, outcome.message)
                    }
                } finally {
                    // No new generation on this session; let the one running end (cancelled after the drain) before the runtime closes.
                    synchronized(lock) { live = null }
                    if (!session.closeGeneration(drainMs = GENERATION_DRAIN_MS)) Log.w(TAG, "the generation did not end; closing the runtime anyway")
                    synchronized(lock) { job = null }
                }
            }
        } catch (e: Exception) {
            Log.e(TAG, "training failed", e)
            // The message with ExecuTorch's own log lines: on the screen, and as a telemetry error event of the run.
            val report = ErrorReport("${e.javaClass.simpleName}: ${e.message}", ExecuTorchRuntime.readLog(), currentPhase)
            TrainingStatus.message = report.display()
            TrainingStatus.lastError = report
            failedRun?.let { r -> try { report.record(r, Clock.System, fatal = true) } catch (t: Exception) { Log.w(TAG, "cannot record the error event", t) } }
            if (req.generateOnly) TrainingStatus.pendingPrompt = null  // not served: no retry loop
            if (TrainingStatus.generation.running && synchronized(lock) { job == null }) TrainingStatus.generation.failed("failed: ${e.message}")
        } finally {
            watchdog?.interrupt()
            uploader?.interrupt()
            TrainingStatus.running = false
            wakeLock.release()
            main.post { workerEnded() }
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
        /** How long a worker's end waits for its generation to finish by itself (then it is cancelled). */
        private const val GENERATION_DRAIN_MS = 10 * 60_000L
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
