package org.onphonellm.trainer.core

import java.io.File

/** One run's files: checkpoint, telemetry log and upload state, trained adapter. */
class RunDir(val dir: File) {
    val checkpoint = File(dir, "checkpoint.safetensors")
    val telemetry = File(dir, "telemetry.jsonl")
    val uploadCursor = File(dir, "upload.cursor")
    val rejected = File(dir, "rejected.jsonl")
    val adapter = File(dir, "adapter")
}

/**
 * What to run. [runInfo] holds the run_start fields only the platform knows (platform, device_model,
 * os, total_ram_bytes, and optionally device_profile, app_version, program, config).
 */
data class RunConfig(
    val runId: String,
    val steps: Long,
    val lr: Double,
    val budgetBytes: Long,
    val runInfo: Map<String, Any?>,
    val checkpointEvery: Int = 10,
    val shuffleSeed: Long? = null,
    val pausePollMs: Long = 5_000,
    val maxPauseMs: Long = 10 * 60_000,
) {
    init {
        require(steps >= 0 && checkpointEvery >= 1 && lr > 0 && budgetBytes > 0) { "bad run config $this" }
    }
}

/** How a run ended (status as in the run_end event). */
data class RunOutcome(val status: String, val stepsCompleted: Long, val finalLoss: Double?, val message: String)

fun interface RunControl {
    fun stopRequested(): Boolean
}

interface ProgressListener {
    fun onStep(step: Long, steps: Long, loss: Double, anonBytes: Long?, budgetBytes: Long) {}
    fun onStatus(message: String) {}
}

/**
 * The training loop an app runs (the host runner, toolchain/training/program.py, does the same):
 * load every method; take the state from the checkpoint if there is one, else from the program's
 * `state.init_file`; check the memory budget; then per step pick the LCSB phase's method, pad the
 * row, call it with lr and every state entry, copy the entries it returns into the state, record loss
 * and memory, checkpoint (= write the state array) every [RunConfig.checkpointEvery] steps; at the end
 * write the adapter. Every outcome ends with a run_end event, except a kill, after which the next
 * run() resumes from the last checkpoint.
 */
class Trainer(
    private val manifest: Manifest,
    /** The exported program's directory: `state.init_file` is read from it when there is no checkpoint. */
    private val programDir: File,
    private val schedule: Schedule,
    private val rows: List<DataRow>,
    private val runtime: TrainingRuntime,
    private val probe: MemoryProbe,
    private val config: RunConfig,
    private val runDir: RunDir,
    private val clock: Clock = Clock.System,
    private val control: RunControl = RunControl { false },
    private val listener: ProgressListener = object : ProgressListener {},
    private val afterStep: () -> Unit = {},
) {
    private val log = EventLog(runDir.telemetry)
    private val store = CheckpointStore(runDir.checkpoint)
    private val guard = MemoryGuard(config.budgetBytes, manifest.predictedStepBytes())
    private val losses = ArrayList<Double?>()
    private lateinit var rec: TelemetryRecorder
    private lateinit var state: ProgramState
    private var sessionStart = 0L
    private var completed = 0L

    fun run(): RunOutcome {
        sessionStart = clock.monoNanos()
        manifest.methodNames.forEach { runtime.loadMethod(it) } // all of them first: a missing method fails before any step
        var start = 0L
        var seq = 0L
        if (store.exists()) {
            val c = store.load(manifest.stateNumel)
            if (c.runId != config.runId) throw ContractError("${store.file} belongs to run ${c.runId}, not ${config.runId}; use another run directory")
            state = ProgramState(manifest, c.state)
            start = c.step
            seq = c.seq
            losses.addAll(c.losses)
        } else {
            state = ProgramState.readInit(programDir, manifest)
        }
        val last = log.lastEvent()
        last?.let { seq = maxOf(seq, Fields(it, "telemetry log").long("seq") + 1) } // events logged after the checkpoint keep their seq
        rec = TelemetryRecorder(config.runId, log, clock, seq)
        val lastType = (last?.get("type") as? Json.Str)?.value
        when {
            last == null -> rec.emit("run_start", runStartFields())
            lastType != "run_end" -> rec.emit("error", mapOf("message" to "resumed from the checkpoint at step $start: the previous session " +
                "stopped without a run_end (killed?); steps after that checkpoint run again", "fatal" to false, "code" to "resumed_after_kill", "step" to start))
        }
        if (start >= config.steps) {
            if (lastType == "run_end") return RunOutcome("completed", start, losses.lastOrNull(), "already complete")
            return finish(start, "completed", "completed (finished after a restart)", writeAdapter = true)
        }
        completed = start
        return try {
            decide(guard.preflight(sampleMemory(null)), start) ?: loop(start)
        } catch (e: Exception) { // a runtime or I/O failure: report it, keep the last checkpoint
            val message = "${e.javaClass.simpleName}: ${e.message}".take(4000)
            rec.emit("error", mapOf("message" to message, "fatal" to true, "code" to "runtime_error", "step" to completed))
            end(completed, "failed", message)
        }
    }

    private fun loop(start: Long): RunOutcome {
        val order = DataOrder(rows.size, config.shuffleSeed)
        for (step in start until config.steps) {
            if (control.stopRequested()) return stopAt(step, "cancelled", "stop requested")
            val (method, phase) = schedule.methodForStep(step)
            val row = rows[order.rowForStep(step)]
            val (ids, labels) = row.padded(manifest.seqLen, manifest.padTokenId)
            val spec = manifest.method(method)
            val t0 = clock.monoNanos()
            val outputs = runtime.execute(method, state.inputs(ids, labels, config.lr.toFloat()))
            val loss = state.checkOutputs(spec, outputs).toDouble()
            val finite = loss.isFinite()
            if (finite) state.copyOutputs(spec, outputs) // a non-finite step leaves the state as it was
            val dt = (clock.monoNanos() - t0) / 1e9
            losses.add(if (finite) loss else null)
            rec.emit("step", mapOf("step" to step, "loss" to (if (finite) loss else Json.Null), "step_time_s" to dt,
                "tokens_per_s" to if (dt > 0) row.tokens / dt else 0.0, "tokens" to row.tokens, "lcsb_phase" to phase, "lr" to config.lr))
            if (!finite) {
                rec.emit("error", mapOf("message" to "loss is not finite at step $step; stopping (last checkpoint kept)", "fatal" to true,
                    "code" to "non_finite_loss", "step" to step))
                return end(step + 1, "failed", "stopped: non-finite loss")
            }
            completed = step + 1
            val samples = sampleMemory(step)
            listener.onStep(step, config.steps, loss, MemoryGuard.anonOf(samples), config.budgetBytes)
            val decision = guard.afterStep(samples)
            val done = step + 1
            if (done % config.checkpointEvery == 0L || done == config.steps || decision != GuardDecision.Continue) checkpoint(done)
            if (done < config.steps) decide(decision, done)?.let { return it }
            afterStep()
        }
        return finish(config.steps, "completed", "completed", writeAdapter = true)
    }

    /** Act on a guard decision before step [next]; null: go on. */
    private fun decide(d: GuardDecision, next: Long): RunOutcome? = when (d) {
        GuardDecision.Continue -> null
        is GuardDecision.Stop -> {
            rec.emit("error", mapOf("message" to d.message, "fatal" to true, "code" to d.code, "step" to next))
            listener.onStatus(d.message)
            end(next, "failed", "stopped: ${d.message}")
        }
        is GuardDecision.Pause -> pause(d, next)
    }

    /** Wait (checkpointed) for the OS pressure to clear; give up as `paused` after maxPauseMs. */
    private fun pause(d: GuardDecision.Pause, next: Long): RunOutcome? {
        rec.emit("error", mapOf("message" to "paused: ${d.message}", "fatal" to false, "code" to d.code, "step" to next))
        listener.onStatus("paused: ${d.message}")
        val since = clock.monoNanos()
        while ((clock.monoNanos() - since) / 1_000_000 < config.maxPauseMs) {
            if (control.stopRequested()) return end(next, "cancelled", "stop requested while paused")
            clock.sleepMs(config.pausePollMs)
            val samples = sampleMemory(null)
            if (guard.pressure(samples) == GuardDecision.Continue) {
                listener.onStatus("resumed")
                return null
            }
        }
        return end(next, "paused", "memory pressure did not clear in ${config.maxPauseMs / 1000} s; start again to resume")
    }

    private fun stopAt(step: Long, status: String, message: String): RunOutcome {
        checkpoint(step)
        return end(step, status, message)
    }

    private fun checkpoint(done: Long) {
        store.save(Checkpoint(state.values, done, config.runId, rec.nextSeq, losses.toList()))
    }

    private fun finish(done: Long, status: String, message: String, writeAdapter: Boolean): RunOutcome {
        if (writeAdapter) writeAdapter(runDir.adapter, manifest, state.values)
        return end(done, status, message)
    }

    private fun end(done: Long, status: String, message: String): RunOutcome {
        val finalLoss = losses.lastOrNull()
        rec.emit("run_end", mapOf("status" to status, "steps_completed" to done, "duration_s" to (clock.monoNanos() - sessionStart) / 1e9,
            "peak_bytes" to guard.peakAnon.takeIf { it > 0 }, "final_loss" to (finalLoss ?: Json.Null), "message" to message))
        listener.onStatus("$status: $message")
        return RunOutcome(status, done, finalLoss, message)
    }

    private fun sampleMemory(step: Long?): List<MemorySample> {
        val samples = probe.sample()
        samples.forEach { rec.emit("memory", it.eventFields(step)) }
        return samples
    }

    private fun runStartFields(): Map<String, Any?> {
        val lcsbK = manifest.lcsb?.let { it.k ?: it.phases.maxOf { p -> p.size } }
        return linkedMapOf<String, Any?>(
            "model" to manifest.modelSource, "method" to "mesp", "backend" to "executorch", "seq_len" to manifest.seqLen,
            "rank" to manifest.rank, "lcsb_k" to lcsbK, "targets" to manifest.targets, "optimizer" to manifest.optimizer,
            "lr" to config.lr, "quant" to manifest.quant, "steps_planned" to config.steps, "budget_bytes" to config.budgetBytes,
        ) + config.runInfo
    }
}
