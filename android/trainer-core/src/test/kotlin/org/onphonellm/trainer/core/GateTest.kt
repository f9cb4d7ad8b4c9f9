package org.onphonellm.trainer.core

import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertNotEquals
import org.junit.jupiter.api.Assertions.assertNull
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import java.io.File
import java.nio.ByteBuffer
import java.nio.ByteOrder

/**
 * The evaluation gate and the memory-pressure policy: the pure decisions against the host's definitions
 * (docs/training.md, toolchain/training/gate.py, toolchain/memory/fallback.py), then sessions on the trace
 * program made to diverge (losses that grow, NaN), to improve, and to meet memory pressure.
 */
class GateTest {
    private val programDir = File(Fixtures.schemas, "traces/tiny/program")
    private val program = Manifest.read(programDir)
    private val weights = MappedWeights.map(File(programDir, program.weightsFile))

    @Test fun `the decision table of docs training md`() {
        val rolled = GateDecision.decide(0, 2.31, listOf(10L to 2.35, 20L to 2.40))
        assertEquals(GateDecision.ROLLED_BACK, rolled.decision)
        assertEquals("rolled back: held-out 2.3100 -> 2.4000", rolled.reason)
        assertEquals(0L, rolled.keptStep)
        assertEquals(2.35, rolled.bestLoss)
        val nan = GateDecision.decide(0, 2.31, listOf(10L to Double.NaN))
        assertEquals("rolled back: held-out 2.3100 -> nan", nan.reason)
        assertNull(nan.bestLoss)
        assertNull(nan.bestStep)
        val kept = GateDecision.decide(0, 2.31, listOf(20L to 2.10, 40L to 2.05))
        assertEquals(GateDecision.KEPT, kept.decision)
        assertEquals("kept: held-out 2.3100 -> 2.0500", kept.reason)
        assertEquals(40L, kept.keptStep)
        val best = GateDecision.decide(0, 2.31, listOf(20L to 2.02, 40L to 2.10))
        assertEquals(GateDecision.KEPT_BEST, best.decision)
        assertEquals("kept best: held-out 2.3100 -> 2.0200 at step 20 (last 2.1000)", best.reason)
        assertEquals(20L, best.keptStep)
        val bestNan = GateDecision.decide(0, 2.31, listOf(20L to 2.02, 40L to Double.POSITIVE_INFINITY))
        assertEquals("kept best: held-out 2.3100 -> 2.0200 at step 20 (last inf)", bestNan.reason)
        // Strictly lower: the start's own loss again is a rollback; a tie between evaluations goes to the later one.
        assertEquals(GateDecision.ROLLED_BACK, GateDecision.decide(0, 2.31, listOf(10L to 2.31)).decision)
        assertEquals(GateDecision.KEPT, GateDecision.decide(0, 2.31, listOf(10L to 2.0, 20L to 2.0)).decision)
        // A non-finite start counts as +inf: any finite loss beats it.
        assertEquals(GateDecision.KEPT, GateDecision.decide(0, Double.NaN, listOf(10L to 5.0)).decision)
        // The event validates (nulls where not finite).
        val rec = TelemetryRecorder("gate-1", EventLog(File(Fixtures.tempDir(), "t.jsonl")), FakeClock(), 0)
        listOf(rolled, nan, kept, best, bestNan).forEach { assertEquals(emptyList<String>(), EventSchema.problems(rec.emit("gate", it.eventFields()))) }
    }

    @Test fun `the gate and memory_adapted examples of the schema validate, the invalid ones are refused`() {
        for (name in listOf("telemetry_gate_rolled_back.json", "telemetry_gate_kept_no_probe.json", "telemetry_memory_adapted_host.json"))
            assertEquals(emptyMap<Int, List<String>>(), EventSchema.batchProblems(Json.parse(File(Fixtures.examples, name).readText())), name)
        for (name in listOf("telemetry_gate_unknown_decision.json", "telemetry_memory_adapted_in_mb.json"))
            assertTrue(EventSchema.batchProblems(Json.parse(File(Fixtures.invalid, name).readText())).isNotEmpty(), name)
    }

    /** The planner's figure the ladder is tested with: 1000 MB + 10 MB per layer input alive. */
    private fun policy(layers: Int, budget: Long) = PressurePolicy(layers, budget, { ws -> 1000L + 10L * PressurePolicy.maxAlive(ws.selected(layers), ws.layersPerCheckpoint) })

    @Test fun `the ladder is the host's - groups doubled while they help, then LCSB k halved`() {
        // Expected: toolchain/memory/fallback.py fallback_ladder(WorkingSet(1, None, None), 24, the same planner figure,
        // budget 0), run with this checkout's .venv: knob, layers_per_checkpoint, lcsb_k, predicted.
        val host = listOf(Triple("layers_per_checkpoint", 2, null), Triple("layers_per_checkpoint", 4, null), Triple("lcsb_k", 4, 12),
            Triple("lcsb_k", 4, 6), Triple("lcsb_k", 3, 3), Triple("lcsb_k", 1, 1))
        val hostPredicted = listOf(1130L, 1090L, 1060L, 1050L, 1030L, 1010L)
        val p = policy(24, 0)
        assertNull(p.fit(WorkingSet(1, null), 0), "nothing fits a zero budget")
        val walked = ArrayList<Notch>()
        var ws = WorkingSet(1, null)
        while (true) { val n = p.next(ws) ?: break; walked.add(n); ws = n.after }
        assertEquals(host, walked.map { Triple(it.knob, it.after.layersPerCheckpoint, it.after.lcsbK) })
        assertEquals(hostPredicted, walked.map { it.predictedBytes })
        // Budget 1095: the host stops after two notches (layers_per_checkpoint 4, predicted 1090).
        assertEquals(listOf(2, 4), policy(24, 1095).fit(WorkingSet(1, null), 0)!!.map { it.after.layersPerCheckpoint })
        assertEquals(emptyList<Notch>(), policy(24, 2000).fit(WorkingSet(1, null), 0))
    }

    @Test fun `simulated pressure signals - over budget adapts, growth predicts, an OS signal adapts once per cooldown, exhausted stops or pauses`() {
        val p = policy(24, 500)
        val ws = WorkingSet(1, null)
        assertEquals(PressureAction.Continue, p.decide(ws, 1, 400, 50, osSignal = false))
        val over = p.decide(ws, 1, 600, 0, osSignal = false) as PressureAction.Adapt
        assertEquals(PressurePolicy.TRIGGER_MEASURED, over.trigger)
        assertEquals(600L, over.measuredBytes)
        assertEquals(WorkingSet(2, null), over.notch.after)
        val grows = p.decide(ws, 1, 400, 150, osSignal = false) as PressureAction.Adapt
        assertEquals(PressurePolicy.TRIGGER_PREDICTED, grows.trigger)
        assertEquals(550L, grows.measuredBytes)
        val os = p.decide(ws, 5, 100, 0, osSignal = true) as PressureAction.Adapt
        assertEquals(PressurePolicy.TRIGGER_OS, os.trigger)
        assertEquals(PressureAction.Continue, p.decide(os.notch.after, 6, 100, 0, osSignal = true), "within the cooldown")
        assertTrue(p.decide(os.notch.after, 8, 100, 0, osSignal = true) is PressureAction.Adapt, "after it")
        val smallest = WorkingSet(1, 1)
        val stop = p.decide(smallest, 3, 600, 0, osSignal = false) as PressureAction.Exhausted
        assertEquals(PressurePolicy.TRIGGER_MEASURED, stop.trigger)
        assertTrue("smallest settings (layers_per_checkpoint 1, lcsb_k 1)" in stop.message, stop.message)
        assertEquals(PressurePolicy.TRIGGER_OS, (p.decide(smallest, 30, 100, 0, osSignal = true) as PressureAction.Exhausted).trigger)
    }

    /**
     * HashRuntime's outputs (SessionTest), with head_loss's loss scripted by the steps trained so far (block_backward
     * calls: one per step with the cyclic k = 1 plan): a training step's loss and the held-out loss alike.
     */
    private class ScriptedLoss(private val program: Manifest, private val loss: (Int) -> Float) : ProgramRuntime {
        private val hash = SessionTest.HashRuntime(program)
        var backward = 0
        override fun execute(method: String, inputs: List<TensorBuffer>): List<TensorBuffer> {
            val out = hash.execute(method, inputs)
            if (method == "block_backward") backward++
            if (method != "head_loss") return out
            return out.map { t ->
                if (t.name != "loss") t else TensorBuffer(t.name, t.dtype, t.shape,
                    ByteBuffer.allocateDirect(4).order(ByteOrder.LITTLE_ENDIAN).putFloat(0, loss(backward)))
            }
        }
    }

    private fun spec(runId: String, steps: Long, budget: Long = 1L shl 30, policy: String? = "cyclic", k: Int? = 1) =
        RunSpec(runId, "tiny", steps, 0.05, budget, checkpointEvery = 2, shuffleSeed = 7, lcsbPolicy = policy, lcsbK = k,
            heldOut = 0.25, heldOutSeed = 3, runInfo = mapOf("platform" to "android", "device_model" to "test", "os" to "Android 15 (API 35)",
                "total_ram_bytes" to 8_000_000_000L))

    private fun newRun(spec: RunSpec): RunDir {
        val all = (0 until 8).map { i -> IntArray(10 + (i % 5)) { j -> (31 + i * 7 + j * 3) % program.vocab }.let { DataRow(it, it.copyOf()) } }
        val (train, held) = TextRows.splitHeldOut(all, 0.25, 3)
        return Runs(Fixtures.tempDir()).create(spec, PreparedData(train, held, false))
    }

    private fun events(dir: RunDir, type: String) = EventLog(dir.telemetry).events().filter { (it["type"] as Json.Str).value == type }.map { Fields(it, type) }
    private val initSha: String = StateBuffer(program).also { it.loadInit() }.sha256()

    private class Gates : SessionListener {
        val seen = ArrayList<GateDecision>()
        override fun onGate(decision: GateDecision) { seen.add(decision) }
    }

    private fun runWith(dir: RunDir, loss: (Int) -> Float, listener: SessionListener = Gates()): Pair<TrainingSession, RunOutcome> {
        val s = TrainingSession(program, weights, ScriptedLoss(program, loss), dir, ScriptedProbe(listOf(50_000_000L)), FakeClock(), listener)
        return s to s.run()
    }

    private fun checkTelemetry(dir: RunDir) = EventLog(dir.telemetry).events().forEach { assertEquals(emptyList<String>(), EventSchema.problems(it), it.toString()) }

    @Test fun `a run whose held-out loss grows is rolled back to the starting adapter - event, results, adapter, screen line`() {
        val dir = newRun(spec("diverge", 6))
        val gates = Gates()
        val (s, out) = runWith(dir, { steps -> 2.0f + 0.5f * steps }, gates)
        assertEquals(RunStatus.COMPLETED, out.status)
        assertEquals("rolled back: held-out 2.0000 -> 5.0000", out.message)
        assertEquals(listOf(0L, 2L, 4L, 6L), events(dir, "eval").map { it.long("step") }, "the start, each checkpoint, the end")
        val g = events(dir, "gate").single()
        assertEquals("rolled_back", g.string("decision"))
        assertEquals(0L, g.long("kept_step"))
        assertEquals(3.0, g.double("best_loss"))
        assertEquals(initSha, s.loop.state.sha256(), "the live state is the starting adapter again")
        val restored = StateBuffer(program)
        StateCheckpoints.restore(CheckpointStore(dir.checkpoint), restored)
        assertEquals(initSha, restored.sha256(), "and so is the checkpoint the run leaves")
        assertEquals(out.message, EvalPair.read(dir.results).gate!!.reason)
        assertEquals(out.message, gates.seen.single().reason)
        assertTrue(Safetensors.readHeader(File(dir.adapter, StateCheckpoints.ADAPTER_WEIGHTS)).entries.isNotEmpty())
        checkTelemetry(dir)
        assertEquals("already complete", TrainingSession(program, weights, SessionTest.HashRuntime(program), dir, ScriptedProbe(listOf(50_000_000L)), FakeClock()).run().message)
    }

    @Test fun `a run that goes NaN keeps the best evaluated adapter below the start, or rolls back when there is none`() {
        val dir = newRun(spec("nan", 6))
        val (s, out) = runWith(dir, { steps -> if (steps >= 3) Float.NaN else 2.0f - 0.1f * steps })
        assertEquals(RunStatus.FAILED, out.status)
        assertEquals("stopped: non-finite loss at step 3; kept best: held-out 2.0000 -> 1.8000 at step 2 (last nan)", out.message)
        val g = events(dir, "gate").single()
        assertEquals("kept_best", g.string("decision"))
        assertEquals(2L, g.long("best_step"))
        assertEquals(Json.Null, g.raw("end_loss"))
        assertNotEquals(initSha, s.loop.state.sha256())
        // The kept state is the one after 2 steps: the same run stopped after 2 steps has it.
        val two = newRun(spec("nan", 2))
        val (s2, out2) = runWith(two, { steps -> 2.0f - 0.1f * steps })
        assertEquals("kept: held-out 2.0000 -> 1.8000", out2.message)
        assertEquals(s2.loop.state.sha256(), s.loop.state.sha256())
        checkTelemetry(dir)

        val none = newRun(spec("nan0", 6))
        val (s3, out3) = runWith(none, { steps -> if (steps >= 1) Float.NaN else 2.0f })
        assertEquals("stopped: non-finite loss at step 1; rolled back: held-out 2.0000 -> nan", out3.message)
        assertEquals(initSha, s3.loop.state.sha256())
        checkTelemetry(none)
    }

    @Test fun `a run that improves is kept`() {
        val dir = newRun(spec("good", 6))
        val (s, out) = runWith(dir, { steps -> 2.0f - 0.1f * steps })
        assertEquals(RunStatus.COMPLETED, out.status)
        assertEquals("kept: held-out 2.0000 -> 1.4000", out.message)
        assertEquals("kept", events(dir, "gate").single().string("decision"))
        assertNotEquals(initSha, s.loop.state.sha256())
        assertEquals(GateDecision.KEPT, EvalPair.read(dir.results).gate!!.decision)
        checkTelemetry(dir)
    }

    @Test fun `a run past its best keeps the best, even across a stop and a resume`() {
        val dir = newRun(spec("best", 6))
        val loss = { steps: Int -> if (steps <= 2) 2.0f - 0.2f * steps else 1.6f + 0.1f * (steps - 2) }
        var stop = false  // a stop once the evaluation at the checkpoint of step 2 is done
        val paused = TrainingSession(program, weights, ScriptedLoss(program, loss), dir, ScriptedProbe(listOf(50_000_000L)), FakeClock(),
            object : SessionListener { override fun onEval(which: String, result: LayerLoop.EvalResult) { if (which == "during") stop = true } })
            .run(RunControl { stop })
        assertEquals(RunStatus.PAUSED, paused.status, paused.message)
        assertEquals(2L, paused.stepsCompleted)
        // The resumed session's runtime counts steps from the checkpoint's.
        val resumed = ScriptedLoss(program) { steps -> loss(steps + 2) }
        val out = TrainingSession(program, weights, resumed, dir, ScriptedProbe(listOf(50_000_000L)), FakeClock()).run()
        assertEquals("kept best: held-out 2.0000 -> 1.6000 at step 2 (last 2.0000)", out.message)
        assertEquals(listOf(0L, 2L, 4L, 6L), events(dir, "eval").map { it.long("step") })
        val two = newRun(spec("best", 2))
        val (s2, _) = runWith(two, loss)
        val kept = StateBuffer(program)
        StateCheckpoints.restore(CheckpointStore(dir.checkpoint), kept)
        assertEquals(s2.loop.state.sha256(), kept.sha256(), "the checkpoint holds the state of step 2")
        assertTrue(!File(dir.dir, "gate_best.safetensors").exists(), "the best copy is gone once decided")
        checkTelemetry(dir)
    }

    /** A probe whose RssAnon follows [anon] per sample (the last repeats), and the app's between-step signals. */
    private class Signals(val script: MutableList<PressureSignal>) : MemorySignals {
        override fun sinceLastStep(): PressureSignal = if (script.isEmpty()) PressureSignal(null, false) else script.removeAt(0)
    }

    @Test fun `memory pressure - a run over its budget lowers LCSB k at the next boundary and completes, the smallest settings over it stop`() {
        // Full backprop on the 3-layer program: groups do not lower its 3 inputs alive, LCSB k 1 does (one notch, then none).
        val dir = newRun(spec("press", 6, budget = 200_000_000, policy = "full", k = null))
        val probe = ScriptedProbe(listOf(10_000_000L, 10_000_000L, 250_000_000L, 120_000_000L))
        val s = TrainingSession(program, weights, SessionTest.HashRuntime(program), dir, probe, FakeClock())
        val out = s.run()
        assertEquals(RunStatus.COMPLETED, out.status, out.message)
        val a = events(dir, "memory_adapted").single()
        assertEquals(2L, a.long("step"))
        assertEquals("lcsb_k", a.string("knob"))
        assertEquals(250_000_000L, a.long("measured_bytes"))
        assertEquals("measured", a.string("trigger"))
        assertEquals(Json.Null, a.obj("from").raw("lcsb_k"))
        assertEquals(1L, a.obj("to").long("lcsb_k"))
        assertEquals(WorkingSet(1, 1), s.working)
        // Steps 0-1 full backprop (no lcsb_phase), then the cyclic k = 1 plan from step 2 on.
        val phases = events(dir, "step").map { if (it.has("lcsb_phase")) it.long("lcsb_phase") else null }
        assertEquals(listOf(null, null, 2L, 0L, 1L, 2L), phases)
        checkTelemetry(dir)

        // Over the budget again with k = 1: nothing smaller, the run stops checkpointed (budget_exceeded).
        val dir2 = newRun(spec("press2", 6, budget = 200_000_000, policy = "full", k = null))
        val out2 = TrainingSession(program, weights, SessionTest.HashRuntime(program), dir2,
            ScriptedProbe(listOf(10_000_000L, 10_000_000L, 250_000_000L, 120_000_000L, 260_000_000L)), FakeClock()).run()
        assertEquals(RunStatus.FAILED, out2.status)
        assertTrue("smallest settings" in out2.message, out2.message)
        assertEquals("budget_exceeded", events(dir2, "error").last().string("code"))
        assertTrue(dir2.checkpoint.isFile)

        // The watchdog's peak during a step, and an onTrimMemory, seen at the next boundary (one notch each).
        val dir3 = newRun(spec("press3", 6, budget = 200_000_000, policy = "full", k = null))
        val sig = Signals(mutableListOf(PressureSignal(null, false), PressureSignal(230_000_000L, false)))
        val s3 = TrainingSession(program, weights, SessionTest.HashRuntime(program), dir3, ScriptedProbe(listOf(10_000_000L)), FakeClock(),
            object : SessionListener {}, sig)
        assertEquals(RunStatus.COMPLETED, s3.run().status)
        assertEquals(listOf(2L to 230_000_000L), events(dir3, "memory_adapted").map { it.long("step") to it.long("measured_bytes") })
        val dir4 = newRun(spec("press4", 6, budget = 200_000_000, policy = "full", k = null))
        val s4 = TrainingSession(program, weights, SessionTest.HashRuntime(program), dir4, ScriptedProbe(listOf(10_000_000L)), FakeClock(),
            object : SessionListener {}, Signals(mutableListOf(PressureSignal(null, true))))
        assertEquals(RunStatus.COMPLETED, s4.run().status)
        assertEquals(listOf("os_signal"), events(dir4, "memory_adapted").map { it.string("trigger") })
        checkTelemetry(dir4)
    }
}
