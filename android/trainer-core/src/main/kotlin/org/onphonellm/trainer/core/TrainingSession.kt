package org.onphonellm.trainer.core

import java.io.File
import java.util.concurrent.locks.ReentrantLock
import kotlin.concurrent.withLock

/**
 * A training run on the phone, what the app's service drives (the host's program trainer,
 * toolchain/training/program.py, does the same): the run's rows (made on the phone from the user's text,
 * [PreparedData]), state from the run's checkpoint or state_init.bin, the held-out loss of the initial
 * adapter, then per step the row of DataOrder (shuffled per epoch as the host does), the layers of the
 * run's plan (LCSB chosen at run time), [LayerLoop.trainStep], telemetry (step, memory, eval, error,
 * run_end), the memory guard, a checkpoint every `checkpoint_every` steps; at the end the held-out loss
 * of the trained state and the PEFT adapter. A stop request checkpoints and ends the session "paused";
 * a kill leaves the last checkpoint, and the next session resumes from it.
 *
 * Generation beside training ([compare], [startComparison]): from any thread while [run] trains on its own.
 * It never runs on the training thread and never holds what training needs: it reads a snapshot of the
 * state's LoRA params (the entries the generation methods read, [LayerLoop.generationStateEntries]), copied
 * at a step boundary under the state lock (held by the training thread only while a step or a restore
 * writes the state, so the copy waits at most one step), into a loop of its own (own buffer pool and KV
 * cache). The one runtime is shared: every program call of either thread holds one fair lock from its
 * inputs to its copied outputs ([LayerLoop.runtimeLock]), so ExecuTorch never runs two methods at once, and
 * a generation goes first ([gate], [RuntimeGate]): training's calls wait while one is in progress, so a token
 * costs what it costs idle (the generation waits once, for the training call already running) and training
 * pauses mid-step for the generation's length, then goes on. A generation held by its listener longer than
 * the gate's grace lets training go on meanwhile. Listeners are called outside both locks.
 *
 * The held-out loss reads the first [Contract.HELD_OUT_EVAL_ROWS] held-out rows ([evalRows]), asks the
 * [RunControl] before each row (a stop ends the session "paused" without that eval) and reports "row i of N"
 * ([SessionListener.onEvalRow]).
 */
class TrainingSession(
    val program: Manifest,
    val weights: MappedWeights,
    private val runtime: ProgramRuntime,
    val runDir: RunDir,
    private val probe: MemoryProbe,
    private val clock: Clock = Clock.System,
    private val listener: SessionListener = object : SessionListener {},
    private val signals: MemorySignals = MemorySignals.NONE,
    /** A generation beside training goes first: training's calls wait while one is in progress ([RuntimeGate]; a test's own clock). */
    val gate: RuntimeGate = RuntimeGate(),
) : GenerationSource {
    val spec: RunSpec = RunSpec.parse(Json.parse(runDir.spec.readText()), runDir.spec.path)
    val train: List<DataRow> = RowFiles.read(runDir.train, program.vocab, program.seqLen)
    val held: List<DataRow> = RowFiles.read(runDir.held, program.vocab, program.seqLen)
    /** The rows a held-out loss reads: the first [Contract.HELD_OUT_EVAL_ROWS] of [held]. */
    val evalRows: List<DataRow> = held.take(Contract.HELD_OUT_EVAL_ROWS)
    val plan: StepPlan? = spec.plan(program)
    /** Every program call of this session's loops holds it. */
    private val runtimeLock = ReentrantLock(true)
    /** Held while the live state is written (a step, a restore) and while a generation copies it: snapshots are of whole steps. */
    private val stateLock = ReentrantLock(true)
    /** The live state (trained in place). */
    val loop = LayerLoop(program, weights, runtime, runtimeLock = runtimeLock, gate = gate)
    /** The initial adapter (state_init.bin), for the held-out loss before: made when first needed (training thread). */
    private val initLoop: LayerLoop by lazy { LayerLoop(program, weights, runtime, StateBuffer(program).also { it.loadInit() }, runtimeLock, gate) }
    /** Generation's loop over a snapshot of the params (state_init.bin's for "before", the live state's for "after"); made when first needed. */
    private val genLoop: LayerLoop by lazy {
        LayerLoop(program, weights, runtime, StateBuffer(program, LayerLoop.generationStateEntries(program)), runtimeLock, gate)
    }
    /** One comparison at a time (they share [genLoop]). */
    private val genLock = ReentrantLock()
    /** The comparisons of [startComparison], one at a time ([GenerationThread]). */
    private val genThread = GenerationThread()
    /** The step the live state is at (written with it, under [stateLock]). */
    @Volatile private var stateStep = 0L
    /** The live state was loaded (by [run], [loadState] or a comparison before them; under [stateLock]). */
    private var stateLoaded = false
    private val log = EventLog(runDir.telemetry)
    private val store = CheckpointStore(runDir.checkpoint)
    /** The step's run-time knobs, lowered under memory pressure ([PressurePolicy]); the run's own at each session start. */
    var working = WorkingSet(spec.layersPerCheckpoint, plan?.takeIf { it.policy != "full" }?.k)
        private set
    /** The layers of each step: the run's plan, a cyclic one of the lowered k after a memory_adapted on lcsb_k. */
    private var livePlan: StepPlan? = plan
    private val pressure = PressurePolicy(program.layers, spec.budgetBytes, { ws -> plannerPeak(ws) })
    private val guard = MemoryGuard(spec.budgetBytes, if (program.predictedPeakBytes > 0) plannerPeak(working) else 0L)
    /** The evaluation gate's record of this run (gate.json, gate_best.safetensors; [GateRecord]). */
    val gateRecord = GateRecord(runDir.dir, spec.checkpointEvery.toLong())  // at each checkpoint, as docs/training.md says of the apps
    private val losses = ArrayList<Double?>()
    private lateinit var rec: TelemetryRecorder
    private var sessionStart = 0L
    var completed = 0L
        private set
    var evals: EvalPair = EvalPair.read(runDir.results)
        private set
    /** The runtime's own log lines (ExecuTorch's log buffer), sent with a runtime failure's `error` event. */
    @Volatile var nativeLog: () -> List<String> = { emptyList() }

    init {
        if (train.isEmpty()) throw BadInput("${runDir.train} has no rows")
        if (plan != null && plan.layers != program.layers) throw BadInput("the plan is for ${plan.layers} layers, the program has ${program.layers}")
    }

    /** The state: the checkpoint's (same run) or state_init.bin; returns the step to start at and the next event seq. */
    private fun restore(): Pair<Long, Long> = stateLock.withLock {
        val c = loadLiveState() ?: return Pair(0L, 0L)
        losses.clear()
        losses.addAll(c.losses)
        Pair(c.step, c.seq)
    }

    /** Under [stateLock]: the live state from the run's checkpoint (returned), else state_init.bin (null). */
    private fun loadLiveState(): Checkpoint? {
        val c = if (store.exists()) StateCheckpoints.restore(store, loop.state) else { loop.state.loadInit(); null }
        if (c != null && c.runId != spec.runId) throw BadInput("${store.file} belongs to run ${c.runId}, not ${spec.runId}; use another run directory")
        stateStep = c?.step ?: 0L
        stateLoaded = true
        return c
    }

    /** Load the run's latest state (checkpoint, else state_init.bin) without training (generate or export when idle); the step it is at. */
    fun loadState(): Long = restore().first

    /** Train until the planned steps are done, a stop is requested, the budget or the OS stops it. */
    fun run(control: RunControl = RunControl { false }, betweenSteps: () -> Unit = {}): RunOutcome {
        sessionStart = clock.monoNanos()
        var (start, seq) = restore()
        val last = log.lastEvent()
        last?.let { seq = maxOf(seq, Fields(it, "telemetry log").long("seq") + 1) }
        rec = TelemetryRecorder(spec.runId, log, clock, seq)
        val lastType = (last?.get("type") as? Json.Str)?.value
        val lastStatus = (last?.get("status") as? Json.Str)?.value
        when {
            last == null -> rec.emit("run_start", runStartFields())
            lastType != "run_end" -> rec.emit("error", mapOf("message" to "resumed from the checkpoint at step $start: the previous session " +
                "stopped without a run_end (killed?); steps after that checkpoint run again", "fatal" to false, "code" to "resumed_after_kill", "step" to start))
        }
        completed = start
        if (start >= spec.steps && lastType == "run_end" && lastStatus == RunStatus.COMPLETED.wire) return RunOutcome(RunStatus.COMPLETED, start, losses.lastOrNull(), "already complete")
        return try {
            weightsChanged(start)?.let { return it }
            if (held.isNotEmpty() && evals.before == null) {
                val ev = evaluate("before", initLoop, 0, control)
                    ?: return end(start, RunStatus.PAUSED, "stopped during the held-out loss before training; resume starts it again")
                saveEvals(EvalPair(ev.loss, evals.after, evals.afterStep))
            }
            if (start >= spec.steps) return finish(start, control)
            decide(preflight(start), start) ?: loop(start, control, betweenSteps)
        } catch (e: Exception) {  // a runtime or I/O failure: report it, keep the last checkpoint
            // A program call refused because a generation beside training saw the weights file change (at a
            // boundary of this thread's steps: the state holds `completed` whole steps): the same clean stop.
            if (weights.stale != null) return weightsChanged(completed)!!
            val message = "${e.javaClass.simpleName}: ${e.message}".take(4000)
            val lines = try { nativeLog() } catch (t: Exception) { emptyList() }
            rec.emit("error", ErrorReport(message, lines).eventFields(true, "runtime_error", completed))
            end(completed, RunStatus.FAILED, message)
        }
    }

    /** The planner's step peak for [ws] ([PressurePolicy.plannerPeak] with the manifest's memory_plan). */
    private fun plannerPeak(ws: WorkingSet): Long =
        PressurePolicy.plannerPeak(ws, program.layers, program.predictedPeakBytes, program.checkpointBytes)

    /** Run the next steps with [n]'s working set: a `memory_adapted` event (its first step [next]). */
    private fun adapt(n: Notch, trigger: String, measured: Long, next: Long) {
        working = n.after
        if (n.knob == PressurePolicy.KNOB_LCSB) livePlan = StepPlan.make(program.layers, n.after.lcsbK, "cyclic")
        guard.resetGrowth()
        rec.emit("memory_adapted", linkedMapOf("step" to next, "knob" to n.knob, "from" to n.before.toJson(), "to" to n.after.toJson(),
            "measured_bytes" to maxOf(0L, measured), "budget_bytes" to spec.budgetBytes,
            "predicted_bytes" to n.predictedBytes?.takeIf { program.predictedPeakBytes > 0 }, "trigger" to trigger))
        listener.onMemoryAdapted(n, trigger)
        listener.onStatus("memory ($trigger): ${n.before.describe()} -> ${n.after.describe()}")
    }

    /** The step boundary after [done] steps: the pressure policy on the sample, the watchdog's peak and the OS's signals. */
    private fun pressureDecision(samples: List<MemorySample>, done: Long): GuardDecision {
        val sig = signals.sinceLastStep()
        val anon = listOfNotNull(MemoryGuard.anonOf(samples), sig.peakAnonBytes).maxOrNull()
        val os = sig.osSignal || samples.any { it.lowMemory == true || it.trimLevel in PressurePolicy.TRIM_PRESSURE_LEVELS }
        return when (val a = pressure.decide(working, done, anon, guard.maxGrowth, os)) {
            PressureAction.Continue -> GuardDecision.Continue
            is PressureAction.Adapt -> { adapt(a.notch, a.trigger, a.measuredBytes, done); GuardDecision.Continue }
            is PressureAction.Exhausted ->
                if (a.trigger == PressurePolicy.TRIGGER_OS) GuardDecision.Pause("memory_pressure", a.message)
                else GuardDecision.Stop("budget_exceeded", a.message)
        }
    }

    /**
     * Before the first step: a start the planner says is over the budget walks the ladder first (trigger "predicted");
     * the OS's pressure takes one notch (else the run pauses, as at a step boundary).
     */
    private fun preflight(start: Long): GuardDecision {
        val samples = sampleMemory(null)
        val pre = guard.preflight(samples)
        if (pre is GuardDecision.Pause) {  // the OS's pressure before the first step: one notch, else pause as before
            val a = pressure.decide(working, start, MemoryGuard.anonOf(samples), 0L, osSignal = true)
            if (a is PressureAction.Adapt) { adapt(a.notch, a.trigger, a.measuredBytes, start); return GuardDecision.Continue }
            return pre
        }
        if (pre !is GuardDecision.Stop || program.predictedPeakBytes <= 0) return pre
        val resident = MemoryGuard.anonOf(samples) ?: 0L
        val notches = pressure.fit(working, resident) ?: return pre
        notches.forEach { adapt(it, PressurePolicy.TRIGGER_PREDICTED, resident + plannerPeak(it.before), start) }
        return guard.pressure(samples)
    }

    private fun loop(start: Long, control: RunControl, betweenSteps: () -> Unit): RunOutcome {
        if (gateRecord.decision != null && start < spec.steps) gateRecord.reset()  // training goes on after a decision: a new gate
        val order = DataOrder(train.size, spec.shuffleSeed)
        val all = (0 until program.layers).toSet()
        for (step in start until spec.steps) {
            weightsChanged(step)?.let { return it }
            if (control.stopRequested()) {
                checkpoint(step)
                StateCheckpoints.writeAdapter(runDir.adapter, loop.state)  // the adapter so far, for export
                return end(step, RunStatus.PAUSED, "stopped at step $step; resume continues from there")
            }
            val row = train[order.rowForStep(step)]
            val selected = livePlan?.layersAt(step) ?: all
            val (ids, labels) = loop.pad(row.inputIds, row.labels)
            val t0 = clock.monoNanos()
            val loss = stateLock.withLock {
                loop.trainStep(ids, labels, spec.lr.toFloat(), selected, working.layersPerCheckpoint).also { stateStep = step + 1 }
            }.toDouble()
            val dt = (clock.monoNanos() - t0) / 1e9
            val finite = loss.isFinite()
            losses.add(if (finite) loss else null)
            val phase = livePlan?.phaseAt(step)  // null (no lcsb_phase): full backprop, or a warm-up step
            rec.emit("step", mapOf("step" to step, "loss" to (if (finite) loss else Json.Null), "step_time_s" to dt,
                "tokens_per_s" to if (dt > 0) row.tokens / dt else 0.0, "tokens" to row.tokens, "lcsb_phase" to phase, "lr" to spec.lr))
            if (!finite) {  // the state moved with a non-finite loss: the last checkpoint is kept, this state is not saved
                rec.emit("error", mapOf("message" to "loss is not finite at step $step; stopping (the checkpoint of step $completed is kept)",
                    "fatal" to true, "code" to "non_finite_loss", "step" to step))
                val stopped = "stopped: non-finite loss at step $step"
                // The gate: the diverged state is not kept; the best evaluated adapter below the start, else the start's.
                gateDecide(step + 1, Double.NaN)?.let { d ->
                    StateCheckpoints.writeAdapter(runDir.adapter, loop.state)
                    return end(step + 1, RunStatus.FAILED, "$stopped; ${d.reason}")
                }
                return end(completed, RunStatus.FAILED, stopped)
            }
            completed = step + 1
            val samples = sampleMemory(step)
            listener.onStep(step, spec.steps, loss, MemoryGuard.anonOf(samples), spec.budgetBytes)
            guard.afterStep(samples)  // the peak and the growth per step; the pressure policy decides
            val done = step + 1
            val decision = if (done < spec.steps) pressureDecision(samples, done) else GuardDecision.Continue
            if (done % spec.checkpointEvery == 0L || done == spec.steps || decision != GuardDecision.Continue || control.checkpointEachStep()) checkpoint(done)
            if (done < spec.steps && held.isNotEmpty() && evals.before != null && gateRecord.due(done, spec.steps)) gateEvaluate(done, control)
            if (done < spec.steps) decide(decision, done)?.let { return it }
            betweenSteps()
        }
        return finish(spec.steps, control)
    }

    /** Act on a guard decision before step [next]; null: go on. */
    private fun decide(d: GuardDecision, next: Long): RunOutcome? = when (d) {
        GuardDecision.Continue -> null
        is GuardDecision.Stop -> {
            rec.emit("error", mapOf("message" to d.message, "fatal" to true, "code" to d.code, "step" to next))
            listener.onStatus(d.message)
            end(next, RunStatus.FAILED, "stopped: ${d.message}")
        }
        is GuardDecision.Pause -> {
            // Checkpointed already; the app resumes when the pressure is gone (the next session continues here).
            rec.emit("error", mapOf("message" to "paused: ${d.message}", "fatal" to false, "code" to d.code, "step" to next))
            end(next, RunStatus.PAUSED, "paused: ${d.message}; resume to continue from step $next")
        }
    }

    private fun finish(done: Long, control: RunControl): RunOutcome {
        weightsChanged(done)?.let { return it }
        if (held.isNotEmpty()) {
            val ev = evaluate("after", loop, done, control)
            if (ev == null) {
                StateCheckpoints.writeAdapter(runDir.adapter, loop.state)
                return end(done, RunStatus.PAUSED, "stopped during the held-out loss after the last step; resume computes it")
            }
            saveEvals(EvalPair(evals.before, ev.loss, done, evals.gate))
            gateDecide(done, ev.loss)?.let { d ->
                StateCheckpoints.writeAdapter(runDir.adapter, loop.state)
                return end(done, RunStatus.COMPLETED, d.reason)
            }
        }
        StateCheckpoints.writeAdapter(runDir.adapter, loop.state)
        return end(done, RunStatus.COMPLETED, "completed")
    }

    /**
     * A held-out evaluation of the live state during the run (the gate's, after [done] steps): an `eval` event; the
     * state saved as the best so far (gate_best.safetensors) before the point is recorded, when it is. A stop during
     * it leaves the point out (the loop stops at its next check).
     */
    private fun gateEvaluate(done: Long, control: RunControl) {
        val ev = evaluate("during", loop, done, control) ?: return
        if (ev.loss.isFinite() && ev.loss <= gateRecord.bestLoss)
            StateCheckpoints.save(gateRecord.bestStore, loop.state, done, spec.runId, rec.nextSeq, losses.toList())
        gateRecord.add(done, ev.loss)
    }

    /**
     * The gate's decision after the last step ([done] steps, held-out loss [endLoss]; NaN for a diverged state): the
     * kept state made live ([GateDecision.ROLLED_BACK]: state_init.bin; [GateDecision.KEPT_BEST]: gate_best) and
     * checkpointed, a `gate` event, results.json's `gate`. Null without a start loss (no held-out rows: no gate).
     */
    private fun gateDecide(done: Long, endLoss: Double): GateDecision? {
        val start = evals.before ?: return null
        gateRecord.decision?.let { return it }  // decided before a kill: the checkpoint holds the kept state
        gateRecord.add(done, endLoss)
        val d = GateDecision.decide(0, start, gateRecord.points)
        if (d.decision != GateDecision.KEPT) {
            stateLock.withLock {
                if (d.decision == GateDecision.ROLLED_BACK) loop.state.loadInit() else StateCheckpoints.restore(gateRecord.bestStore, loop.state)
            }
            checkpoint(done)  // the kept state is what the run leaves (its step count unchanged)
        }
        rec.emit("gate", d.eventFields())
        gateRecord.decided(d)
        saveEvals(EvalPair(evals.before, evals.after, evals.afterStep, d))
        listener.onGate(d)
        return d
    }

    /**
     * Held-out loss of [which] state over [evalRows], as an eval event; null (no event) when [control] asked
     * to stop (asked before each row).
     */
    private fun evaluate(which: String, l: LayerLoop, step: Long, control: RunControl): LayerLoop.EvalResult? {
        val t0 = clock.monoNanos()
        val ev = try {
            l.evaluate(evalRows.map { r -> Pair(r.inputIds.map { it.toLong() }, r.labels.map { it.toLong() }) },
                { control.stopRequested() }, { i, n -> listener.onEvalRow(which, i, n) })
        } catch (e: LayerLoop.EvalCancelled) {
            return null
        }
        rec.emit("eval", mapOf("step" to step, "loss" to (if (ev.loss.isFinite()) ev.loss else Json.Null), "rows" to ev.rows, "tokens" to ev.tokens,
            "eval_time_s" to (clock.monoNanos() - t0) / 1e9))
        listener.onEval(which, ev)
        return ev
    }

    private fun saveEvals(e: EvalPair) {
        evals = e
        AtomicFiles.writeText(runDir.results, JsonWriter.write(e.toJson()) + "\n")
    }

    /**
     * The step boundary's check of the memory-mapped weights file ([MappedWeights.checkChanged]: size, time,
     * inode where known, against those when it was mapped), before step [next] (0-based; [next] steps are in
     * the state). Unchanged: null. Changed: the checkpoint of those [next] steps and their adapter are saved
     * (as a stop does), one `error` event (code weights_changed) is sent and the session ends "failed"; the
     * mapping is stale from then on, so no loop of this session calls the program again (eval after,
     * generation). A change during a step is only seen here, after it (see docs/android.md).
     */
    private fun weightsChanged(next: Long): RunOutcome? {
        val why = weights.checkChanged() ?: return null
        checkpoint(next)
        StateCheckpoints.writeAdapter(runDir.adapter, loop.state)
        val where = if (next < spec.steps) "before step ${next + 1}" else "after the last step, before the held-out loss"
        val message = "the weights file changed under the run ($why); stopped $where, the checkpoint of step $next is kept: $WEIGHTS_CHANGED_ADVICE".take(4000)
        rec.emit("error", mapOf("message" to message, "fatal" to true, "code" to "weights_changed", "step" to next))
        return end(next, RunStatus.FAILED, message)
    }

    private fun checkpoint(done: Long) = StateCheckpoints.save(store, loop.state, done, spec.runId, rec.nextSeq, losses.toList())

    private fun end(done: Long, status: RunStatus, message: String): RunOutcome {
        val finalLoss = losses.lastOrNull()
        rec.emit("run_end", mapOf("status" to status.wire, "steps_completed" to done, "duration_s" to (clock.monoNanos() - sessionStart) / 1e9,
            "peak_bytes" to guard.peakAnon.takeIf { it > 0 }, "final_loss" to (finalLoss ?: Json.Null), "message" to message))
        listener.onStatus("$status: $message")
        return RunOutcome(status, done, finalLoss, message)
    }

    private fun sampleMemory(step: Long?): List<MemorySample> {
        val samples = probe.sample()
        samples.forEach { rec.emit("memory", it.eventFields(step)) }
        return samples
    }

    /** Losses of the steps done so far (null: not finite), for the chart. */
    fun losses(): List<Double?> = losses.toList()

    private fun runStartFields(): Map<String, Any?> = linkedMapOf<String, Any?>(
        "model" to program.modelSource, "method" to "mesp", "backend" to "executorch", "seq_len" to program.seqLen,
        "rank" to program.rank.takeIf { it >= 1 }, "lcsb_k" to (plan?.phases?.maxOf { it.size } ?: program.layers), "targets" to program.targets,
        "optimizer" to program.optimizer.takeIf { it == "sgd" || it == "adamw" }, "lr" to spec.lr,
        "quant" to program.quant.takeIf { it in setOf("none", "int8", "int4") }, "compute" to program.compute, "steps_planned" to spec.steps, "budget_bytes" to spec.budgetBytes,
        "config" to linkedMapOf<String, Any?>("lcsb_policy" to (plan?.policy ?: "full"), "lcsb_seed" to plan?.seed, "lcsb_period" to plan?.schedule?.size,
            "layers_per_checkpoint" to spec.layersPerCheckpoint).also { c -> plan?.warmup?.takeIf { it > 0 }?.let { c["lcsb_warmup"] = it } },
    ) + spec.runInfo

    /** Greedy generation from [promptIds] with the initial adapter and with the live state: (before, after) ids ([compare]). */
    fun generateBoth(promptIds: List<Int>, maxNewTokens: Int, stopIds: Set<Int>): Pair<List<Int>, List<Int>> =
        compare(promptIds, maxNewTokens, stopIds).let { Pair(it.before.ids, it.after.ids) }

    /**
     * The same prompt generated greedily with the initial adapter ("before", state_init.bin) and then with the
     * live state ("after", a snapshot taken when it starts: the state of the last whole step), streamed to
     * [listener] token by token, text decoded incrementally with [tok] when given ([IncrementalTextDecoder]; a trailing
     * stop id adds no text). Safe from any thread while [run] trains on another (see the class comment); the
     * calling thread does the work. [control] cancels it: the side running stops within one decode step
     * ([StopReason.CANCELLED]), and "after" does not start after a cancelled "before". [maxNewTokens] is cut
     * to what seq_len leaves after the prompt.
     */
    fun compare(promptIds: List<Int>, maxNewTokens: Int, stopIds: Set<Int>, tok: TextTokenizer? = null,
                control: GenerationControl = GenerationControl(), listener: GenerationListener = object : GenerationListener {}): Comparison {
        try {
            val n = Comparisons.newTokens(program, promptIds, maxNewTokens)
            // The weights file checked as at a step boundary: now if no step is in progress (idle, or between two
            // steps); else the training thread checks it after its step, and every program call after a change refuses.
            val stale = if (stateLock.tryLock()) try { weights.checkChanged() } finally { stateLock.unlock() } else weights.stale
            stale?.let { throw BadInput("$it while it was memory-mapped; the program is not run again: $WEIGHTS_CHANGED_ADVICE") }
            return genLock.withLock {
                val before = Comparisons.side(genLoop, "before", promptIds, n, stopIds, tok, control, listener) { genLoop.state.loadInit(); 0L }
                val after = Comparisons.side(genLoop, "after", promptIds, n, stopIds, tok, control, listener) {
                    stateLock.withLock {
                        if (!stateLoaded) loadLiveState()  // asked before run() / loadState() loaded it
                        genLoop.state.copyFrom(loop.state)
                        stateStep
                    }
                }
                Comparison(before, after)
            }
        } catch (e: Exception) {
            listener.onError(e)
            throw e
        }
    }

    /**
     * [compare] on the session's generation thread ("generate", one at a time, in order): returns at once with
     * a handle to cancel or wait for it. The thread is made when first needed and ends with [closeGeneration].
     */
    override fun startComparison(promptIds: List<Int>, maxNewTokens: Int, stopIds: Set<Int>, tok: TextTokenizer?,
                                 listener: GenerationListener): GenerationJob =
        genThread.start { control -> compare(promptIds, maxNewTokens, stopIds, tok, control, listener) }

    /**
     * End the generation thread (before the runtime is closed): waits up to [drainMs] for the comparisons
     * started to end by themselves, then cancels those left (the running one stops within a decode step,
     * queued ones end without a program call) and waits up to [cancelMs]. True if the thread ended (or there
     * was none). A comparison started after this makes a new thread.
     */
    override fun closeGeneration(drainMs: Long, cancelMs: Long): Boolean = genThread.close(drainMs, cancelMs)

    /** The adapter of the live state (PEFT files), e.g. to export a run stopped before the end. */
    fun writeAdapter(dir: File) = StateCheckpoints.writeAdapter(dir, loop.state)
}
