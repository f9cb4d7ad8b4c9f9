package org.onphonellm.trainer.app

import android.content.Context
import android.os.PowerManager
import android.util.Log
import org.onphonellm.trainer.core.CheckpointStore
import org.onphonellm.trainer.core.Clock
import org.onphonellm.trainer.core.ErrorReport
import org.onphonellm.trainer.core.EventLog
import org.onphonellm.trainer.core.GateDecision
import org.onphonellm.trainer.core.GenerateTarget
import org.onphonellm.trainer.core.Generation
import org.onphonellm.trainer.core.Json
import org.onphonellm.trainer.core.LayerLoop
import org.onphonellm.trainer.core.Manifest
import org.onphonellm.trainer.core.MappedWeights
import org.onphonellm.trainer.core.ProgramGeneration
import org.onphonellm.trainer.core.RunControl
import org.onphonellm.trainer.core.RunDir
import org.onphonellm.trainer.core.RunOutcome
import org.onphonellm.trainer.core.RunSpec
import org.onphonellm.trainer.core.RunStatus
import org.onphonellm.trainer.core.Runs
import org.onphonellm.trainer.core.SessionListener
import org.onphonellm.trainer.core.StartPhase
import org.onphonellm.trainer.core.TelemetryEndpoint
import org.onphonellm.trainer.core.TextTokenizer
import org.onphonellm.trainer.core.TrainingSession
import org.onphonellm.trainer.core.UploadQueue
import org.onphonellm.trainer.core.UrlConnectionPoster
import org.onphonellm.trainer.core.VerifyCache
import java.io.File

/**
 * One training (or generation-only) session on the calling thread: what the training service's "trainer"
 * thread and a charging window's worker (ChargingWorker.doWork, on WorkManager's thread) both run. It
 * resolves the run, verifies the program once per import, maps the weights, opens ExecuTorch, runs
 * trainer-core's [TrainingSession] under [control] with a partial wake lock, the memory watchdog and the
 * telemetry upload, and reports a failure (message, phase, ExecuTorch's log lines) on screen and as an `error`
 * event. The open session is offered to [LiveSessions] so a Generate request runs beside training whoever
 * runs it. [notify]: the notification's text and progress (the service's, or the worker's foreground one).
 * [decide]: called with the resolved run before anything is loaded; a non-null reason defers the start
 * (nothing trains; the reason is shown and the run stays paused).
 */
class SessionRunner(private val ctx: Context, private val notify: (String, Int, Int) -> Unit) {
    @Volatile private var currentPhase: StartPhase? = null

    private fun phase(p: StartPhase) {
        currentPhase = p
        TrainingStatus.message = p.label + " ..."
    }

    /** A Stop came during the start: it ends here, before anything trains (the run, if created, stays as it is). */
    private fun startCancelled(): RunOutcome? {
        if (TrainingStatus.start.shouldContinue()) return null
        TrainingStatus.message = "start cancelled" + (currentPhase?.let { " (while ${it.label.lowercase()})" } ?: "")
        return RunOutcome(RunStatus.CANCELLED, 0, null, TrainingStatus.message)
    }

    fun run(req: RunRequest, base: File, control: RunControl, decide: (RunDir) -> String? = { null }): RunOutcome? {
        var failedRun: RunDir? = null
        currentPhase = null
        TrainingStatus.lastError = null
        AppFeedback.init(base)  // the generations of this session offer their responses to the feedback buttons
        if (!req.generateOnly) TrainingStatus.start.beginExternal()  // the screen's Start began it already; adb, a restart, a window: now
        val pm = ctx.getSystemService(Context.POWER_SERVICE) as PowerManager
        val wakeLock = pm.newWakeLock(PowerManager.PARTIAL_WAKE_LOCK, "trainer:run").apply { acquire() }
        var uploader: Thread? = null
        var watchdog: Thread? = null
        try {
            val runs = Runs(File(base, "runs"))
            if (!req.generateOnly) startCancelled()?.let { return it }  // stopped before the request arrived: no run is created
            // Generate: the chosen program's latest run, else (no run of it yet) the program with its own adapter.
            if (req.generateOnly && req.newRun == null && req.runId == null) {
                val latest = runs.latest()
                val latestProgram = latest?.let { runCatching { RunSpec.parse(Json.parse(it.spec.readText()), it.spec.path).program }.getOrNull() }
                val target = GenerateTarget.resolve(latest, latestProgram, req.program)
                if (target is GenerateTarget.Program) return generateWithProgram(req, base, target.name)
            }
            // program + text extras (adb): create that run, unless a run of that id exists (then it resumes).
            val created = req.newRun?.takeIf { req.runId == null || runs.get(req.runId) == null }?.let { n ->
                phase(StartPhase.PREPARING)  // the text tokenized once, here (the run is created by the service, not the screen)
                val probe0 = AndroidMemoryProbe(ctx)
                RunRequest.createRun(base, n, n.text.readText(Charsets.UTF_8), probe0.totalRamBytes(), runInfo(ctx, probe0.totalRamBytes()),
                    req.runId ?: RunRequest.newRunId()).first
            }
            val runDir = (created?.let { runs.get(it) }) ?: (req.runId?.let { runs.get(it) ?: throw IllegalArgumentException("no run '$it' under ${runs.base}") } ?: runs.latest())
                ?: throw IllegalArgumentException("no run to start: prepare one in the app (or with scripts/android/start.sh)")
            decide(runDir)?.let { reason ->
                Log.i(TAG, "start of ${runDir.runId} deferred: $reason")
                TrainingStatus.message = reason
                AppState.setPaused(ctx, reason)
                return null
            }
            if (!req.generateOnly) startCancelled()?.let { return it }
            val spec = RunSpec.parse(Json.parse(runDir.spec.readText()), runDir.spec.path)
            failedRun = runDir
            val programDir = File(spec.program).let { if (it.isAbsolute) it else File(File(base, "programs"), spec.program) }
            val program = Manifest.read(programDir)
            // Verified once per import / push (keyed on the manifest's checksums and the files' sizes and times), not per start.
            if (req.verifyFiles) {
                phase(StartPhase.VERIFYING)
                VerifyCache(File(base, "verified")).verifyOnce(program) { it.startsWith(program.adapterInitDir ?: "\u0000") }
            }
            if (!req.generateOnly) startCancelled()?.let { return it }
            phase(StartPhase.MAPPING)
            // Its size, time and inode now: the session compares them at every step boundary and stops cleanly on a change.
            val weights = MappedWeights.map(File(programDir, program.weightsFile), OsFileIdentity)
            val probe = AndroidMemoryProbe(ctx)
            phase(StartPhase.LOADING)
            ExecuTorchRuntime(File(programDir, program.programFile), program).use { runtime ->
                TrainingStatus.kernels = runtime.kernelLine
                phase(StartPhase.PREPARING)
                AppPressure.reset()
                GateStatus.reason = null
                val session = TrainingSession(program, weights, runtime, runDir, probe, Clock.System, Progress(), AppPressure)
                session.nativeLog = { ExecuTorchRuntime.readLog() }
                val tok = try { TextTokenizer.forProgram(program) } catch (e: Exception) { null }
                val chat = spec.source == "chat"
                TrainingStatus.evalBefore = session.evals.before
                TrainingStatus.evalAfter = session.evals.after
                try {
                    if (req.generateOnly) {
                        session.loadState()
                        LiveSessions.goLive(LiveSessions.Live(session, tok, chat, req.maxNewTokens))
                        return null
                    }
                    val done = runCatching { CheckpointStore(runDir.checkpoint).load(program.stateNumel) }.getOrNull()
                    TrainingStatus.begin(spec.runId, spec.steps, spec.budgetBytes, done?.step ?: 0L, done?.losses ?: emptyList())
                    uploader = uploadQueue(req, runDir)?.let { q -> Thread({ uploadLoop(q) }, "telemetry-upload").also { it.start() } }
                    watchdog = Thread({ watch(probe, spec.budgetBytes) }, "memory-watchdog").also { it.isDaemon = true; it.start() }
                    // Generation requests from now on run on the session's generation thread, beside training.
                    LiveSessions.goLive(LiveSessions.Live(session, tok, chat, req.maxNewTokens))
                    phase(if (session.held.isNotEmpty() && session.evals.before == null) StartPhase.EVALUATING else StartPhase.TRAINING)
                    // A Stop during the start: nothing trains (the session's first check would see it too).
                    if (!TrainingStatus.start.running()) return startCancelled()
                    val outcome = session.run(control)
                    TrainingStatus.running = false  // training is over; a generation may still be running (drained below)
                    TrainingStatus.message = if (outcome.status == RunStatus.FAILED) ErrorReport(outcome.message, ExecuTorchRuntime.readLog()).display()
                        else "${outcome.status}: ${TrainingStatus.stopReason ?: outcome.message}"
                    TrainingStatus.evalAfter = session.evals.after
                    if (outcome.status == RunStatus.PAUSED) AppState.setPaused(ctx, outcome.message)
                    return outcome
                } finally {
                    // No new generation on this session; let the one running end (cancelled after the drain) before the runtime closes.
                    LiveSessions.close(session, GENERATION_DRAIN_MS)
                }
            }
        } catch (e: Throwable) {
            // Throwable: an OutOfMemoryError or an UnsatisfiedLinkError too. Caught here the session ends in the app's
            // hands (recorded, shown, the service stops itself), so START_REDELIVER_INTENT does not replay it.
            Log.e(TAG, "training failed", e)
            // The message with ExecuTorch's own log lines: on the screen, and as a telemetry error event of the run.
            val report = ErrorReport("${e.javaClass.simpleName}: ${e.message}", ExecuTorchRuntime.readLog(), currentPhase)
            TrainingStatus.message = report.display()
            TrainingStatus.lastError = report
            failedRun?.let { r -> try { report.record(r, Clock.System, fatal = true) } catch (t: Exception) { Log.w(TAG, "cannot record the error event", t) } }
            if (req.generateOnly) TrainingStatus.pendingPrompt = null  // not served: no retry loop
            LiveSessions.failedBeforeLive(e)
            return null
        } finally {
            watchdog?.interrupt()
            uploader?.interrupt()
            TrainingStatus.running = false
            if (!req.generateOnly) TrainingStatus.start.ended()
            wakeLock.release()
        }
    }

    /**
     * Generation with a program that has no run yet (its own adapter, state_init.bin: [ProgramGeneration]), on this
     * thread's runtime; the same phases, verification once per import and drain as a session's generation. Failures are
     * the caller's (its catch shows and reports them).
     */
    private fun generateWithProgram(req: RunRequest, base: File, name: String): RunOutcome? {
        val programDir = File(File(base, "programs"), name)
        val program = Manifest.read(programDir)
        if (req.verifyFiles) {
            phase(StartPhase.VERIFYING)
            VerifyCache(File(base, "verified")).verifyOnce(program) { it.startsWith(program.adapterInitDir ?: "\u0000") }
        }
        phase(StartPhase.MAPPING)
        val weights = MappedWeights.map(File(programDir, program.weightsFile), OsFileIdentity)
        phase(StartPhase.LOADING)
        ExecuTorchRuntime(File(programDir, program.programFile), program).use { runtime ->
            TrainingStatus.kernels = runtime.kernelLine
            val g = ProgramGeneration(program, weights, runtime)
            val tok = try { TextTokenizer.forProgram(program) } catch (e: Exception) { null }
            try {
                TrainingStatus.message = "generating with $name's own adapter (no run of it yet)"
                LiveSessions.goLive(LiveSessions.Live(g, tok, false, req.maxNewTokens))
            } finally {
                LiveSessions.close(g, GENERATION_DRAIN_MS)
            }
        }
        return null
    }

    /**
     * Polls the footprint between the session's own checks: the largest one since the last step boundary goes to the
     * session's pressure policy (over budget: a smaller working set from the next step, a stop only when none is left).
     */
    private fun watch(probe: AndroidMemoryProbe, budget: Long) {
        try {
            while (!Thread.currentThread().isInterrupted) {
                Thread.sleep(2000)
                val anon = probe.anonBytes()
                TrainingStatus.anonBytes = anon
                AppPressure.watched(anon)
            }
        } catch (e: InterruptedException) {
            // the session ended
        }
    }

    /** The request's telemetry server, else the one the run was started with (a charging-window run is told none). */
    private fun uploadQueue(req: RunRequest, runDir: RunDir): UploadQueue? {
        val endpoint = TelemetryEndpoint.resolve(runDir, req.telemetryUrl, req.telemetryToken) ?: return null
        return UploadQueue(EventLog(runDir.telemetry), runDir.uploadCursor, runDir.rejected, UrlConnectionPoster(), endpoint.url, endpoint.token)
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
            val now = android.os.SystemClock.elapsedRealtime()
            if (now - lastNotifyMs > 2000 || step + 1 == steps) {
                lastNotifyMs = now
                notify("step ${step + 1}/$steps  loss %.4f  anon %d MB / %d MB".format(loss, (anonBytes ?: 0L) shr 20, budgetBytes shr 20),
                    (step + 1).toInt(), steps.toInt())
            }
        }

        override fun onEvalRow(which: String, row: Int, rows: Int) {
            TrainingStatus.message = "held-out loss $which training: row ${row + 1} of $rows"
            if (row == 0 || row + 1 == rows || row % 4 == 0) notify(TrainingStatus.message, row + 1, rows)
        }

        override fun onEval(which: String, result: LayerLoop.EvalResult) {
            if (which == "before") TrainingStatus.evalBefore = result.loss else TrainingStatus.evalAfter = result.loss
        }

        override fun onStatus(message: String) {
            TrainingStatus.message = message
        }

        override fun onGate(decision: GateDecision) {
            GateStatus.reason = decision.reason
        }
    }

    companion object {
        private const val TAG = "Trainer"
        /** How long a session's end waits for its generation to finish by itself (then it is cancelled). */
        const val GENERATION_DRAIN_MS = 10 * 60_000L
    }
}
