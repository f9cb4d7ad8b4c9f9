package org.onphonellm.trainer.core

import org.junit.jupiter.api.Assertions.assertArrayEquals
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertFalse
import org.junit.jupiter.api.Assertions.assertNotNull
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import java.io.File
import java.io.RandomAccessFile
import java.nio.ByteBuffer
import java.nio.ByteOrder
import java.security.MessageDigest

/**
 * The training session (what the app's service runs) on the trace's real program (manifest, mapped
 * weights, state_init.bin, adapter_init/) with a runtime whose outputs are a pure function of the inputs'
 * bytes: any change in what the session feeds a method (row, layers, lr, state) changes every later
 * output, so "a resumed run ends in the same state as an uninterrupted one" is a real check. The loop's
 * own bit-exactness against ExecuTorch is ReplayTest's.
 */
class SessionTest {
    private val programDir = File(Fixtures.schemas, "traces/tiny/program")
    private val program = Manifest.read(programDir)
    private val weights = MappedWeights.map(File(programDir, program.weightsFile))

    /** Outputs drawn from SplitMix64 seeded by the sha256 of every input; the loss is in [1, 2). */
    class HashRuntime(private val program: Manifest, private val killAtCall: Int? = null) : ProgramRuntime {
        var calls = 0
        override fun execute(method: String, inputs: List<TensorBuffer>): List<TensorBuffer> {
            calls++
            if (calls == killAtCall) throw SimulatedKill()
            val md = MessageDigest.getInstance("SHA-256")
            md.update(method.toByteArray())
            for (x in inputs) { val d = x.data.duplicate(); d.position(0); md.update(d) }
            val rng = SplitMix64(ByteBuffer.wrap(md.digest()).long)
            return program.method(method).outputs.map { io ->
                val b = ByteBuffer.allocateDirect(io.numel * io.dtype.size).order(ByteOrder.LITTLE_ENDIAN)
                for (i in 0 until io.numel) when (io.dtype) {
                    ElemType.FLOAT32 -> b.putFloat(4 * i, (rng.next() ushr 40) / 16777216f * (if (io.name == "loss") 1f else 0.01f) + (if (io.name == "loss") 1f else 0f))
                    else -> b.putLong(8 * i, 0)
                }
                TensorBuffer(io.name, io.dtype, io.shape, b)
            }
        }
    }

    private fun rows(n: Int, seed: Int): List<DataRow> = (0 until n).map { i ->
        val ids = IntArray(10 + (i % 5)) { j -> (seed * 31 + i * 7 + j * 3) % program.vocab }
        DataRow(ids, ids.copyOf())
    }

    private fun spec(runId: String, steps: Long = 6, budget: Long = 1L shl 30) = RunSpec(runId, "tiny", steps, 0.05, budget, checkpointEvery = 2,
        shuffleSeed = 7, lcsbPolicy = "cyclic", lcsbK = 1, heldOut = 0.25, heldOutSeed = 3,
        runInfo = mapOf("platform" to "android", "device_model" to "test", "os" to "Android 15 (API 35)", "total_ram_bytes" to 8_000_000_000L))

    private fun newRun(base: File, runId: String, steps: Long = 6, budget: Long = 1L shl 30, spec: RunSpec = spec(runId, steps, budget)): RunDir {
        val all = rows(8, 1)
        val (train, held) = TextRows.splitHeldOut(all, 0.25, 3)
        return Runs(base).create(spec, PreparedData(train, held, false))
    }

    private fun session(dir: RunDir, runtime: ProgramRuntime = HashRuntime(program), probe: MemoryProbe = ScriptedProbe(listOf(50_000_000L)),
                        clock: Clock = FakeClock()) = TrainingSession(program, weights, runtime, dir, probe, clock)

    private fun types(dir: RunDir) = EventLog(dir.telemetry).events().map { (it["type"] as Json.Str).value }

    @Test fun `a run - eval before, LCSB steps chosen at run time, eval after, adapter, valid telemetry`() {
        val base = Fixtures.tempDir()
        val dir = newRun(base, "run1")
        val s = session(dir)
        assertEquals(6, s.train.size)
        assertEquals(2, s.held.size)
        val out = s.run()
        assertEquals(RunStatus.COMPLETED, out.status, out.message)
        assertEquals(6L, out.stepsCompleted)
        val events = EventLog(dir.telemetry).events()
        events.forEach { assertEquals(emptyList<String>(), EventSchema.problems(it)) }
        val t = types(dir)
        assertEquals("run_start", t.first())
        assertEquals("run_end", t.last())
        assertEquals(6, t.count { it == "step" })
        val evals = events.filter { (it["type"] as Json.Str).value == "eval" }.map { Fields(it, "eval") }
        assertEquals(listOf(0L, 2L, 4L, 6L), evals.map { it.long("step") }, "before, at each checkpoint (the gate's), after")
        assertTrue(t.indexOf("eval") < t.indexOf("step"), "the initial adapter is evaluated before the first step")
        // The plan (cyclic, k = 1 of 3 layers) drives the phases, step by step.
        val phases = events.filter { (it["type"] as Json.Str).value == "step" }.map { Fields(it, "step").long("lcsb_phase") }
        assertEquals(listOf(0L, 1L, 2L, 0L, 1L, 2L), phases)
        assertEquals((0 until events.size).map { it.toLong() }, events.map { Fields(it, "e").long("seq") })
        val r = EvalPair.read(dir.results)
        assertNotNull(r.before)
        assertNotNull(r.after)
        assertEquals(6L, r.afterStep)
        val header = Safetensors.readHeader(File(dir.adapter, StateCheckpoints.ADAPTER_WEIGHTS))
        assertEquals(program.stateEntries.filter { it.role == "param" }.map { it.key }.sorted(), header.entries.keys.toList())
        // Run again: nothing to do.
        assertEquals("already complete", session(dir).run().message)
    }

    @Test fun `train while charging - a window's end pauses at a step boundary, the next window resumes, same state as one go`() {
        val a = newRun(Fixtures.tempDir(), "one-go")
        assertEquals(RunStatus.COMPLETED, session(a).run().status)
        val base = Fixtures.tempDir()
        val b = newRun(base, "windows")
        val runs = Runs(base)
        var windows = 0
        while (true) {
            val d = ChargingRuns.decide(true, runs, running = false, charging = true, batteryPct = 90.0)
            if (d is ChargingRuns.Decision.Skip) break
            assertEquals(ChargingRuns.Decision.Resume("windows"), d)
            windows++
            assertTrue(windows <= 10, "too many windows")
            // Each window lasts two steps: the constraint ends mid-way (WorkManager's isStopped), the step in progress finishes.
            var steps = 0
            val s = session(runs.get("windows")!!)
            val out = s.run(ChargingRuns.control({ steps >= 2 }, { false })) { steps++ }
            assertTrue(out.status == RunStatus.PAUSED || out.status == RunStatus.COMPLETED, "${out.status}")
            if (out.status == RunStatus.PAUSED) assertEquals(0L, out.stepsCompleted % 2, "paused at a step boundary after whole windows")
        }
        // 6 steps in windows of 2; the third window ends with its last step, so the held-out pass after it stops before its
        // first row (a stop is honoured between rows) and a fourth window computes it and completes the run.
        assertEquals(4, windows, "6 steps in windows of 2, then the held-out loss after")
        assertEquals(4, types(b).count { it == "eval" }, "before once, at the checkpoints of steps 2 and 4 once, after once")
        val sa = session(a).also { it.loadState() }.loop.state.sha256()
        val sb = session(b).also { it.loadState() }.loop.state.sha256()
        assertEquals(sa, sb, "the windows end in the state of one uninterrupted run")
        EventLog(b.telemetry).events().forEach { assertEquals(emptyList<String>(), EventSchema.problems(it)) }
    }

    @Test fun `train while charging in the worker - a refused foreground stops at its deadline, a restart off the charger trains nothing, unplugging pauses, same state as one go`() {
        val a = newRun(Fixtures.tempDir(), "one-go")
        assertEquals(RunStatus.COMPLETED, session(a).run().status)
        val base = Fixtures.tempDir()
        val b = newRun(base, "charged")
        val runs = Runs(base)
        // Window 1, in the worker, Android refused the foreground: the session stops itself at the plan's deadline
        // (each step takes 4 minutes here: steps start at 0, 4 and 8 min, the 9-minute deadline stops the fourth).
        assertEquals(ChargingRuns.Decision.Resume("charged"), ChargingRuns.decide(true, runs, running = false, charging = true, batteryPct = 90.0))
        val plan = ChargingRuns.windowPlan(foregroundGranted = false, startMs = 0)
        ChargingRuns.mark(runs.get("charged")!!, true)
        var nowMs = 0L
        val w1 = session(runs.get("charged")!!).run(ChargingRuns.control({ false }, { false }, plan.deadlineMs, { nowMs })) { nowMs += 4 * 60_000 }
        assertEquals(RunStatus.PAUSED, w1.status)
        assertEquals(3L, w1.stepsCompleted)
        // The process is killed; Android restarts the service (START_STICKY / redelivery) off the charger: the flag,
        // read from the run directory, defers it: nothing trains, the log is untouched.
        val logBefore = b.telemetry.readBytes()
        val restartOff = ChargingRuns.onServiceStart(restart = true, chargingRequested = false, marked = ChargingRuns.isMarked(Runs(base).latest()!!),
            enabled = true, charging = false, batteryPct = 90.0)
        assertTrue(restartOff is ChargingRuns.ServiceStart.Defer, "$restartOff")
        assertArrayEquals(logBefore, b.telemetry.readBytes())
        // Restarted on the charger: trains while charging, and the unplug after one more step pauses it at a boundary.
        val restartOn = ChargingRuns.onServiceStart(restart = true, chargingRequested = false, marked = ChargingRuns.isMarked(runs.latest()!!),
            enabled = true, charging = true, batteryPct = 90.0)
        assertEquals(ChargingRuns.ServiceStart.Train(chargingOnly = true, setMark = true), restartOn)
        var charging = true
        val w2 = session(runs.latest()!!).run(RunControl { !charging }) { charging = false }
        assertEquals(RunStatus.PAUSED, w2.status)
        assertEquals(4L, w2.stepsCompleted)
        assertTrue(ChargingRuns.isMarked(runs.latest()!!), "still a charging-window run")
        // The user's Resume: trains now, clears the flag, completes.
        val user = ChargingRuns.onServiceStart(restart = false, chargingRequested = false, marked = true, enabled = true, charging = false, batteryPct = 90.0)
        assertEquals(ChargingRuns.ServiceStart.Train(chargingOnly = false, setMark = false), user)
        ChargingRuns.mark(runs.latest()!!, false)
        assertEquals(RunStatus.COMPLETED, session(runs.latest()!!).run().status)
        assertFalse(ChargingRuns.isMarked(runs.latest()!!))
        val sa = session(a).also { it.loadState() }.loop.state.sha256()
        val sb = session(b).also { it.loadState() }.loop.state.sha256()
        assertEquals(sa, sb, "the windows and the deferred restart end in the state of one uninterrupted run")
        EventLog(b.telemetry).events().forEach { assertEquals(emptyList<String>(), EventSchema.problems(it)) }
        assertEquals(listOf("paused", "paused", "completed"), EventLog(b.telemetry).events()
            .filter { (it["type"] as Json.Str).value == "run_end" }.map { (it["status"] as Json.Str).value })
    }

    @Test fun `killed mid-step, resumed without a run id, ends in the uninterrupted state`() {
        val a = newRun(Fixtures.tempDir(), "same")
        assertEquals(RunStatus.COMPLETED, session(a).run().status)
        val baseB = Fixtures.tempDir()
        val b = newRun(baseB, "same")
        // Kill during step 3 (after the checkpoint of step 2): each step makes ~11 calls, eval before ~8.
        assertThrows<SimulatedKill> { session(b, HashRuntime(program, killAtCall = 45)).run() }
        assertTrue(b.checkpoint.isFile)
        val latest = Runs(baseB).latest()!!
        assertEquals("same", latest.runId)
        val out = session(latest).run()
        assertEquals(RunStatus.COMPLETED, out.status, out.message)
        assertArrayEquals(File(a.adapter, StateCheckpoints.ADAPTER_WEIGHTS).readBytes(), File(b.adapter, StateCheckpoints.ADAPTER_WEIGHTS).readBytes())
        assertEquals(EvalPair.read(a.results).after, EvalPair.read(b.results).after)
        val events = EventLog(b.telemetry).events()
        assertTrue(events.any { (it["code"] as? Json.Str)?.value == "resumed_after_kill" })
        assertEquals(1, types(b).count { it == "run_start" })
        assertEquals(types(a).count { it == "eval" }, types(b).count { it == "eval" })  // "before" once (kept in results.json), the gate's, "after" once
        val seqs = events.map { Fields(it, "e").long("seq") }
        assertEquals(seqs.sorted().distinct(), seqs)
    }

    @Test fun `stop pauses at a checkpoint, the next session resumes and completes`() {
        val base = Fixtures.tempDir()
        val dir = newRun(base, "stopme")
        var steps = 0
        val out = session(dir).run(RunControl { steps >= 3 }) { steps++ }
        assertEquals(RunStatus.PAUSED, out.status)
        assertEquals(3L, out.stepsCompleted)
        assertEquals(3L, CheckpointStore(dir.checkpoint).load(program.stateNumel).step)
        val again = session(Runs(base).latest()!!).run()
        assertEquals(RunStatus.COMPLETED, again.status)
        assertEquals(6L, again.stepsCompleted)
        assertTrue(EventLog(dir.telemetry).events().none { (it["code"] as? Json.Str)?.value == "resumed_after_kill" })
    }

    @Test fun `the memory budget stops the run, checkpointed, OS low memory pauses it`() {
        val dir = newRun(Fixtures.tempDir(), "budget", budget = 200_000_000)
        val out = session(dir, probe = ScriptedProbe(listOf(10_000_000L, 10_000_000L, 150_000_000L, 250_000_000L))).run()
        assertEquals(RunStatus.FAILED, out.status)
        assertTrue("budget" in out.message, out.message)
        assertTrue(dir.checkpoint.isFile)
        val low = newRun(Fixtures.tempDir(), "low")
        val p = session(low, probe = ScriptedProbe(listOf(10_000_000L), lowMemory = true)).run()
        assertEquals(RunStatus.PAUSED, p.status)
    }

    @Test fun `generation before uses the initial adapter, after the live state`() {
        val dir = newRun(Fixtures.tempDir(), "gen")
        val s = session(dir)
        assertEquals(RunStatus.COMPLETED, s.run().status)
        val (before, after) = s.generateBoth(listOf(5, 7, 9), 4, emptySet())
        assertEquals(4, before.size)
        assertEquals(4, after.size)
        val fresh = LayerLoop(program, weights, HashRuntime(program)).also { it.state.loadInit() }
        assertEquals(fresh.generate(listOf(5, 7, 9), 4), before)
    }

    @Test fun `the adapter of the initial state is byte-identical to the program's adapter_init`() = adapterIsInit(programDir)

    /** ... and for the Qwen3-shaped trace program (LoRA on q, k, o and up: other PEFT keys and shapes, q_proj's B [64, r]). */
    @Test fun `the adapter of the initial state is adapter_init - the Qwen3-shaped program`() =
        adapterIsInit(File(Fixtures.schemas, "traces/tiny_qwen3/program"))

    private fun adapterIsInit(programDir: File) {
        val program = Manifest.read(programDir)
        val st = StateBuffer(program).also { it.loadInit() }
        val out = File(Fixtures.tempDir(), "adapter")
        StateCheckpoints.writeAdapter(out, st)
        val init = File(programDir, program.adapterInitDir!!)
        assertArrayEquals(File(init, StateCheckpoints.ADAPTER_WEIGHTS).readBytes(), File(out, StateCheckpoints.ADAPTER_WEIGHTS).readBytes(), "adapter_model.safetensors")
        assertEquals(File(init, StateCheckpoints.ADAPTER_CONFIG).readText(), File(out, StateCheckpoints.ADAPTER_CONFIG).readText(), "adapter_config.json")
    }

    @Test fun `plans of a policy match toolchain make_plan`() {
        assertEquals(listOf(listOf(0, 1, 2), listOf(3, 4, 5), listOf(6, 7, 8, 9)), StepPlan.make(10, 4, "cyclic").phases)
        assertEquals(listOf(listOf(0, 3, 6, 9), listOf(1, 4, 7), listOf(2, 5, 8)), StepPlan.make(10, 4, "strided").phases)
        assertEquals(listOf(listOf(6, 7, 8, 9)), StepPlan.make(10, 4, "last").phases)
        assertEquals(listOf(listOf(0, 1, 2)), StepPlan.make(3, null, "full").phases)
        // random (every make_plan case of data_corpus is DataCorpusTest's): step t = first k of permutation(L, seed + t), sorted
        val r = StepPlan.make(10, 3, "random", seed = 11)
        assertEquals(16, r.schedule.size)  // default period 4 * ceil(10 / 3)
        assertEquals(11L, r.seed)
        for (t in 0 until 16) assertEquals(permutation(10, 11L + t).take(3).sorted().toSet(), r.layersAt(t.toLong()), "step $t")
        assertEquals(r.phases.size, r.phases.toSet().size)  // equal draws share a phase
        assertEquals(0L, StepPlan.make(4, 2, "random").seed)
        // seed + t wraps modulo 2^64, as the host's SplitMix64 takes (seed + t) mod 2^64
        assertEquals(permutation(4, Long.MIN_VALUE + 1).take(2).sorted().toSet(), StepPlan.make(4, 2, "random", seed = Long.MAX_VALUE, period = 3).layersAt(2))
        assertThrows<BadInput> { StepPlan.make(4, 2, "random", period = 0) }
        assertThrows<BadInput> { StepPlan.make(4, 2, "cyclic", seed = 1) }
        assertThrows<BadInput> { StepPlan.make(4, 5, "random") }
        assertThrows<BadInput> { StepPlan.make(4, 2, "lisa") }
    }

    @Test fun `a warm-up backpropagates every layer, then the plan on the global step index`() {
        val p = StepPlan.make(10, 4, "anchored", warmup = 30)
        assertEquals(30L, p.warmup)
        assertEquals((0 until 10).toSet(), p.layersAt(0))
        assertEquals((0 until 10).toSet(), p.layersAt(29))
        assertEquals(setOf(2, 7, 8, 9), p.layersAt(30))  // 30 % 7 = 2: the schedule does not restart
        assertEquals(StepPlan.make(10, 4, "anchored").layersAt(31), p.layersAt(31))
        assertEquals(null, p.phaseAt(29)); assertEquals(2, p.phaseAt(30))
        assertEquals(10, p.maxLayers); assertEquals(4, StepPlan.make(10, 4, "anchored").maxLayers)
        assertEquals(0L, StepPlan.make(10, 4, "anchored").warmup)
        assertEquals(5L, StepPlan.make(8, 2, "random", seed = 3, period = 5, warmup = 5).warmup)
        assertThrows<BadInput> { StepPlan.make(10, 4, "anchored", warmup = -1) }
        assertThrows<BadInput> { p.copy(warmup = -1) }
        // parse: absent = 0, a value is kept, a negative one refused
        val text = """{"schema_version": 1, "layers": 3, "policy": "cyclic", "k": 1, "seed": null, "phases": [[0], [1], [2]], "schedule": [0, 1, 2]"""
        assertEquals(0L, StepPlan.parse("$text}").warmup)
        val warm = StepPlan.parse("""$text, "warmup": 2}""")
        assertEquals(2L, warm.warmup)
        assertEquals(listOf(setOf(0, 1, 2), setOf(0, 1, 2), setOf(2), setOf(0)), (0L..3L).map { warm.layersAt(it) })
        assertThrows<BadInput> { StepPlan.parse("""$text, "warmup": -1}""") }
    }

    /** The loop with checkpoint groups makes the same update calls on the same inputs (any change would change every later output). */
    @Test fun `checkpoint groups - the same losses and state as s = 1 for every selection, fewer layer inputs alive`() {
        val selections = listOf(setOf(0, 1, 2), setOf(0, 2), setOf(1), setOf(2), setOf(0), setOf(1, 2), setOf(0, 1))
        fun train(s: Int): Triple<List<Float>, String, List<Int>> {
            val loop = LayerLoop(program, weights, HashRuntime(program)).also { it.state.loadInit() }
            val peaks = ArrayList<Int>()
            val losses = selections.mapIndexed { t, sel ->
                val r = rows(4, t)[t % 4]
                val (i, l) = loop.pad(r.inputIds.map { it.toLong() }, r.labels.map { it.toLong() })
                loop.trainStep(i, l, 0.05f, sel, s).also { peaks.add(loop.peakCheckpoints) }
            }
            return Triple(losses, loop.state.sha256(), peaks)
        }
        val (losses1, state1, peaks1) = train(1)
        assertEquals(selections.map { it.size }, peaks1)
        for (s in 2..4) {
            val (losses, state, peaks) = train(s)
            assertEquals(losses1, losses, "losses, groups of $s")
            assertEquals(state1, state, "state, groups of $s")
            selections.zip(peaks).forEach { (sel, p) -> assertTrue(p <= (sel.size + s - 1) / s + s - 1 && p <= sel.size, "$sel, s = $s: $p alive") }
        }
        assertEquals(2, train(2).third[0])  // all 3 layers selected: [0, 1] [2] keeps 2 inputs, not 3
        assertThrows<BadInput> { train(0) }
        assertEquals(listOf(listOf(0, 2), listOf(5, 7), listOf(9)), LayerLoop.checkpointGroups(listOf(0, 2, 5, 7, 9), 2))
        assertEquals(listOf(1, 1, 2, 2, 2, 3, 5), listOf(1, 2, 3, 5, 6, 7, 24).map { LayerLoop.sqrtLayersPerCheckpoint(it) })
    }

    @Test fun `a session with the random plan and checkpoint groups - the groups change nothing but memory`() {
        fun runWith(s: Int): RunDir {
            val id = "rand$s"
            val dir = newRun(Fixtures.tempDir(), id, spec = spec(id).copy(lcsbPolicy = "random", lcsbK = 2, lcsbSeed = 5, layersPerCheckpoint = s))
            assertEquals(RunStatus.COMPLETED, session(dir).run().status)
            return dir
        }
        val a = runWith(1)
        val b = runWith(2)
        assertArrayEquals(File(a.adapter, StateCheckpoints.ADAPTER_WEIGHTS).readBytes(), File(b.adapter, StateCheckpoints.ADAPTER_WEIGHTS).readBytes())
        val events = EventLog(b.telemetry).events()
        events.forEach { assertEquals(emptyList<String>(), EventSchema.problems(it)) }
        val start = Fields(events.first { (it["type"] as Json.Str).value == "run_start" }, "run_start")
        assertEquals("fp32", start.string("compute"))  // the manifest has no compute: the exact float32 program
        val config = start.obj("config")
        assertEquals(2, config.int("layers_per_checkpoint"))
        assertEquals("random", config.string("lcsb_policy"))
        assertEquals(5L, config.long("lcsb_seed"))
        assertEquals(8, config.int("lcsb_period"))  // 4 * ceil(3 / 2)
        val plan = StepPlan.make(3, 2, "random", 5)
        val phases = events.filter { (it["type"] as Json.Str).value == "step" }.map { Fields(it, "step").int("lcsb_phase") }
        assertEquals((0 until 6).map { plan.schedule[it] }, phases)
        // run.json keeps the options; one written before them reads as s = 1, no seed.
        val spec = RunSpec.parse(Json.parse(b.spec.readText()), "run.json")
        assertEquals(Triple(2, 5L, null as Int?), Triple(spec.layersPerCheckpoint, spec.lcsbSeed, spec.lcsbPeriod))
        val old = Json.Obj((spec("old").toJson() as Json.Obj).fields - setOf("lcsb_seed", "lcsb_period", "layers_per_checkpoint"))
        val parsed = RunSpec.parse(old, "old run.json")
        assertEquals(1, parsed.layersPerCheckpoint)
        assertEquals(null, parsed.lcsbSeed)
        assertThrows<BadInput> { spec("x").copy(lcsbSeed = 3).plan(program) }  // a seed without the random policy
        assertThrows<BadInput> { spec("y").copy(layersPerCheckpoint = 0) }
    }

    @Test fun `a session with a warm-up - full backprop steps without lcsb_phase, then the plan`() {
        val id = "warm"
        val dir = newRun(Fixtures.tempDir(), id, spec = spec(id).copy(lcsbWarmup = 2))
        assertEquals(RunStatus.COMPLETED, session(dir).run().status)
        val events = EventLog(dir.telemetry).events()
        events.forEach { assertEquals(emptyList<String>(), EventSchema.problems(it)) }
        val steps = events.filter { (it["type"] as Json.Str).value == "step" }.map { Fields(it, "step") }
        assertEquals(listOf(false, false, true, true, true, true), steps.map { it.has("lcsb_phase") })
        assertEquals((2 until 6).map { it % 3 }, steps.drop(2).map { it.int("lcsb_phase") })  // global step index
        val start = Fields(events.first { (it["type"] as Json.Str).value == "run_start" }, "run_start")
        assertEquals(1, start.int("lcsb_k"))  // the plan's k; the warm-up is config.lcsb_warmup
        assertEquals(2L, start.obj("config").long("lcsb_warmup"))
        assertEquals(2L, RunSpec.parse(Json.parse(dir.spec.readText()), "run.json").lcsbWarmup)
        assertEquals(null, RunSpec.parse(spec("old").toJson(), "run.json").lcsbWarmup)  // absent: none
        assertThrows<BadInput> { spec("n").copy(lcsbWarmup = -1) }
        assertThrows<BadInput> { spec("f").copy(lcsbPolicy = "full", lcsbWarmup = 2).plan(program) }
    }

    /** A weights file identity the test changes between steps (the mapped file itself is left alone). */
    class ScriptedIdentity(var current: FileIdentity?) : FileIdentitySource {
        var reads = 0
        override fun identity(file: File): FileIdentity? { reads++; return current }
    }

    private val mapped = FileIdentity(4096, 1_767_225_600_000L, "64769:1042")

    private fun events(dir: RunDir, type: String) = EventLog(dir.telemetry).events().filter { (it["type"] as Json.Str).value == type }.map { Fields(it, type) }

    private fun stateAt(dir: RunDir): String = session(dir).also { it.loadState() }.loop.state.sha256()

    @Test fun `the weights file changes between steps - the next step never runs, the checkpoint is the last completed step, one error, a resume after re-import ends as one go`() {
        val oneGo = newRun(Fixtures.tempDir(), "one-go")
        assertEquals(RunStatus.COMPLETED, session(oneGo).run().status)
        val ref = newRun(Fixtures.tempDir(), "ref")  // stopped by the user after 3 steps
        var n = 0
        assertEquals(RunStatus.PAUSED, session(ref).run(RunControl { n >= 3 }) { n++ }.status)

        val base = Fixtures.tempDir()
        val dir = newRun(base, "changed")
        val ids = ScriptedIdentity(mapped)
        val w = MappedWeights.map(File(programDir, program.weightsFile), ids)
        assertEquals(mapped, w.identity)
        val rt = HashRuntime(program)
        val s = TrainingSession(program, w, rt, dir, ScriptedProbe(listOf(50_000_000L)), FakeClock())
        var steps = 0
        var callsAtChange = -1
        val out = s.run { steps++; if (steps == 3) { ids.current = mapped.copy(size = 2048); callsAtChange = rt.calls } }
        assertEquals(RunStatus.FAILED, out.status, out.message)
        assertEquals(3L, out.stepsCompleted)
        assertEquals(3, steps, "the step after the change never ran")
        assertEquals(callsAtChange, rt.calls, "no program call after the change (the mapping is not read again)")
        assertTrue("changed size from 4096 to 2048" in out.message && "re-import the program" in out.message, out.message)
        // The checkpoint is of the 3 completed steps (checkpoint_every = 2 had saved step 2 only), the state of a stop after 3.
        assertEquals(3L, CheckpointStore(dir.checkpoint).load(program.stateNumel).step)
        assertEquals(stateAt(ref), stateAt(dir))
        assertArrayEquals(File(ref.adapter, StateCheckpoints.ADAPTER_WEIGHTS).readBytes(), File(dir.adapter, StateCheckpoints.ADAPTER_WEIGHTS).readBytes())
        // Telemetry: 3 steps, one error (weights_changed, fatal, at step 3), run_end failed; every event valid.
        EventLog(dir.telemetry).events().forEach { assertEquals(emptyList<String>(), EventSchema.problems(it)) }
        assertEquals(3, events(dir, "step").size)
        val errors = events(dir, "error")
        assertEquals(1, errors.size)
        assertEquals(listOf("weights_changed", "true", "3"), errors[0].let { listOf(it.string("code"), it.bool("fatal").toString(), it.long("step").toString()) })
        assertTrue("changed under the run" in errors[0].string("message") && "re-import the program" in errors[0].string("message"), errors[0].string("message"))
        val end = events(dir, "run_end").single()
        assertEquals("failed", end.string("status"))
        assertEquals(3L, end.long("steps_completed"))
        assertEquals("run_end", types(dir).last())
        assertEquals(listOf(0L, 2L), events(dir, "eval").map { it.long("step") }, "the held-out loss after never ran (the one before, the gate's at step 2)")
        // The mapping is stale for good: a generation is refused without a program call, and so is any loop over it.
        assertEquals(w.stale, w.checkChanged())
        ids.current = mapped  // even if the file looks as it did
        assertNotNull(w.checkChanged())
        val g = assertThrows<BadInput> { s.compare(listOf(5, 7, 9), 4, emptySet()) }
        assertTrue("re-import the program" in g.message!!, g.message)
        assertThrows<BadInput> { LayerLoop(program, w, rt).also { it.state.loadInit() }.generate(listOf(5, 7), 2) }
        assertEquals(callsAtChange, rt.calls)
        assertEquals(1, events(dir, "error").size, "the error event is sent once")
        // Re-imported (a new mapping of an unchanged file): the next session resumes at step 3 and ends as one uninterrupted run.
        val again = session(Runs(base).latest()!!).run()
        assertEquals(RunStatus.COMPLETED, again.status, again.message)
        assertEquals(6L, again.stepsCompleted)
        assertEquals(stateAt(oneGo), stateAt(dir))
        assertArrayEquals(File(oneGo.adapter, StateCheckpoints.ADAPTER_WEIGHTS).readBytes(), File(dir.adapter, StateCheckpoints.ADAPTER_WEIGHTS).readBytes())
        assertEquals(6, events(dir, "step").size, "steps 0-2, then 3-5 after the resume: none twice")
        EventLog(dir.telemetry).events().forEach { assertEquals(emptyList<String>(), EventSchema.problems(it)) }
    }

    @Test fun `every kind of change stops at the boundary - replaced, modified, gone, before the first step, after the last, seen by a generation`() {
        for ((label, change) in listOf("replaced" to mapped.copy(key = "64769:2001"), "modified" to mapped.copy(mtimeMs = mapped.mtimeMs + 1),
                                       "gone" to null)) {
            val dir = newRun(Fixtures.tempDir(), "kind-$label")
            val ids = ScriptedIdentity(mapped)
            val rt = HashRuntime(program)
            val s = TrainingSession(program, MappedWeights.map(File(programDir, program.weightsFile), ids), rt, dir, ScriptedProbe(listOf(50_000_000L)), FakeClock())
            var steps = 0
            var calls = -1
            val out = s.run { if (++steps == 1) { ids.current = change; calls = rt.calls } }
            assertEquals(Pair(RunStatus.FAILED, 1L), Pair(out.status, out.stepsCompleted), label)
            assertTrue(label in out.message, "$label: ${out.message}")
            assertEquals(calls, rt.calls, label)
            assertEquals(1L, CheckpointStore(dir.checkpoint).load(program.stateNumel).step, label)
            assertEquals(listOf("weights_changed"), events(dir, "error").map { it.string("code") }, label)
        }
        // The same key with another size is a change; no key on either side compares size and time only.
        assertNotNull(mapped.changeTo(mapped.copy(size = 1), File("w")))
        assertEquals(null, mapped.copy(key = null).changeTo(mapped.copy(key = "other"), File("w")))
        assertEquals(null, mapped.changeTo(mapped.copy(), File("w")))

        // Changed between mapping and the run: nothing reads the mapping (not even the held-out loss before); step 0's checkpoint.
        val early = newRun(Fixtures.tempDir(), "early")
        val ids = ScriptedIdentity(mapped)
        val rt = HashRuntime(program)
        val s = TrainingSession(program, MappedWeights.map(File(programDir, program.weightsFile), ids), rt, early, ScriptedProbe(listOf(50_000_000L)), FakeClock())
        ids.current = mapped.copy(size = 0)
        val out = s.run()
        assertEquals(Pair(RunStatus.FAILED, 0L), Pair(out.status, out.stepsCompleted))
        assertEquals(0, rt.calls)
        assertEquals(0L, CheckpointStore(early.checkpoint).load(program.stateNumel).step)
        assertEquals(listOf(0L), events(early, "error").map { it.long("step") })
        assertTrue(types(early).none { it == "step" || it == "eval" })

        // Changed after the last step: the held-out loss after is not computed; a resume on a good mapping does it and completes.
        val late = newRun(Fixtures.tempDir(), "late")
        val lids = ScriptedIdentity(mapped)
        val lrt = HashRuntime(program)
        var k = 0
        val lout = TrainingSession(program, MappedWeights.map(File(programDir, program.weightsFile), lids), lrt, late, ScriptedProbe(listOf(50_000_000L)), FakeClock())
            .run { if (++k == 6) lids.current = mapped.copy(mtimeMs = 0) }
        assertEquals(Pair(RunStatus.FAILED, 6L), Pair(lout.status, lout.stepsCompleted))
        assertTrue("after the last step" in lout.message, lout.message)
        assertEquals(listOf(0L, 2L, 4L), events(late, "eval").map { it.long("step") }, "no eval after: before and the gate's at the checkpoints")
        assertEquals(null, EvalPair.read(late.results).after)
        assertEquals(RunStatus.COMPLETED, session(late).run().status)
        assertNotNull(EvalPair.read(late.results).after)

        // Seen first by a generation beside training (its check between two steps, here just after the session's own):
        // the step's first program call is refused, the session stops as cleanly, with the checkpoint of the steps done.
        val gen = newRun(Fixtures.tempDir(), "gen-saw")
        val gids = ScriptedIdentity(mapped)
        val gw = MappedWeights.map(File(programDir, program.weightsFile), gids)
        val grt = HashRuntime(program)
        var done = 0
        var gcalls = -1
        val gout = TrainingSession(program, gw, grt, gen, ScriptedProbe(listOf(50_000_000L)), FakeClock()).run(RunControl {
            if (done == 2 && gcalls < 0) { gids.current = mapped.copy(size = 1); assertNotNull(gw.checkChanged()); gcalls = grt.calls }
            false
        }) { done++ }
        assertEquals(Pair(RunStatus.FAILED, 2L), Pair(gout.status, gout.stepsCompleted), gout.message)
        assertEquals(gcalls, grt.calls, "the refused call never reached the runtime")
        assertEquals(2L, CheckpointStore(gen.checkpoint).load(program.stateNumel).step)
        assertEquals(listOf("weights_changed"), events(gen, "error").map { it.string("code") })
    }

    /** The real thing: the mapped file truncated under the run (a SIGBUS on any read past the new end, here and on a phone). */
    @Test fun `a weights file truncated under the run stops it at the next boundary, without reading the mapping again`() {
        val copy = File(Fixtures.tempDir(), "weights.safetensors")
        File(programDir, program.weightsFile).copyTo(copy)
        val w = MappedWeights.map(copy)  // java.io.File's size and time
        assertEquals(FileIdentity(copy.length(), copy.lastModified()), w.identity)
        assertEquals(null, w.checkChanged())
        val dir = newRun(Fixtures.tempDir(), "truncated")
        val rt = HashRuntime(program)  // hashes every input it gets, the mapped weights' bytes included
        val s = TrainingSession(program, w, rt, dir, ScriptedProbe(listOf(50_000_000L)), FakeClock())
        var steps = 0
        var calls = -1
        val out = s.run { if (++steps == 2) { RandomAccessFile(copy, "rw").use { it.setLength(it.length() / 3) }; calls = rt.calls } }
        assertEquals(Pair(RunStatus.FAILED, 2L), Pair(out.status, out.stepsCompleted), out.message)
        assertTrue("changed size from" in out.message, out.message)
        assertEquals(calls, rt.calls)
        assertEquals(2L, CheckpointStore(dir.checkpoint).load(program.stateNumel).step)
        assertThrows<BadInput> { s.compare(listOf(5, 7, 9), 4, emptySet()) }
        // java.io.File's identity of a file: size, time; gone.
        val f = File(Fixtures.tempDir(), "f").apply { writeText("abc") }
        val id = FileIdentitySource.JAVA.identity(f)!!
        f.appendText("d")
        assertTrue("from 3 to 4 bytes" in id.changeTo(FileIdentitySource.JAVA.identity(f), f)!!)
        f.setLastModified(id.mtimeMs - 10_000)
        assertTrue("was modified" in id.copy(size = 4).changeTo(FileIdentitySource.JAVA.identity(f), f)!!)
        f.delete()
        assertEquals(null, FileIdentitySource.JAVA.identity(f))
        assertTrue("is gone" in id.changeTo(null, f)!!)
    }

    /**
     * Files for the host to read (android/test.sh -Dinterop.dir, then android/interop_check.py with the
     * trace manifest): a checkpoint (state[i] = i / 1024, exact in float32) and the adapter of that state.
     */
    @Test fun `checkpoint and adapter files for the host runner`() {
        val dir = System.getProperty("interop.dir")?.takeIf { it.isNotBlank() }?.let { File(it) } ?: Fixtures.tempDir()
        val st = StateBuffer(program)
        for (i in 0 until program.stateNumel) st.buffer.putFloat(4 * i, i / 1024f)
        StateCheckpoints.save(CheckpointStore(File(dir, "checkpoint.safetensors")), st, 3, "interop", 9, listOf(1.5, null))
        StateCheckpoints.writeAdapter(File(dir, "adapter"), st)
        val back = StateBuffer(program)
        val c = StateCheckpoints.restore(CheckpointStore(File(dir, "checkpoint.safetensors")), back)
        assertEquals(st.sha256(), back.sha256())
        assertEquals(listOf(1.5, null), c.losses)
    }

    /** A run with [n] rows, half held out (more than [Contract.HELD_OUT_EVAL_ROWS] of them for n = 80). */
    private fun bigRun(base: File, runId: String, n: Int, steps: Long = 2): RunDir {
        val (train, held) = TextRows.splitHeldOut(rows(n, 2), 0.5, 3)
        return Runs(base).create(spec(runId, steps).copy(heldOut = 0.5), PreparedData(train, held, false))
    }

    /** A listener recording the held-out passes' "row i of N" reports. */
    private class EvalRows : SessionListener {
        val rows = ArrayList<String>()
        override fun onEvalRow(which: String, row: Int, rows: Int) { this.rows.add("$which $row/$rows") }
    }

    @Test fun `held-out loss - capped at HELD_OUT_EVAL_ROWS rows, row i of N reported, the loss of those rows`() {
        val dir = bigRun(Fixtures.tempDir(), "capped", 80)
        val rec = EvalRows()
        val s = TrainingSession(program, weights, HashRuntime(program), dir, ScriptedProbe(listOf(50_000_000L)), FakeClock(), rec)
        assertEquals(40, s.held.size)
        val cap = Contract.HELD_OUT_EVAL_ROWS
        assertTrue(cap < s.held.size)
        assertEquals(RunStatus.COMPLETED, s.run().status)
        val evals = EventLog(dir.telemetry).events().filter { (it["type"] as Json.Str).value == "eval" }
        assertEquals(listOf(cap.toLong(), cap.toLong()), evals.map { Fields(it, "eval").long("rows") })
        assertEquals((0 until cap).map { "before $it/$cap" } + (0 until cap).map { "after $it/$cap" }, rec.rows)
        // The loss before is that of the first `cap` held-out rows (an independent loop over them), not of all 40.
        val ref = LayerLoop(program, weights, HashRuntime(program), StateBuffer(program).also { it.loadInit() })
        fun pairs(r: List<DataRow>) = r.map { x -> Pair(x.inputIds.map { it.toLong() }, x.labels.map { it.toLong() }) }
        assertEquals(ref.evaluate(pairs(s.held.take(cap))).loss, EvalPair.read(dir.results).before)
        assertTrue(ref.evaluate(pairs(s.held)).loss != EvalPair.read(dir.results).before, "all 40 rows give another loss")
    }

    @Test fun `held-out loss - a stop between rows ends the session paused with no eval, resume evaluates again`() {
        val dir = bigRun(Fixtures.tempDir(), "cancel-eval", 80)
        val rec = EvalRows()
        val rt = HashRuntime(program)
        val s = TrainingSession(program, weights, rt, dir, ScriptedProbe(listOf(50_000_000L)), FakeClock(), rec)
        val out = s.run(RunControl { rec.rows.size >= 5 })
        assertEquals(RunStatus.PAUSED, out.status, out.message)
        assertEquals(0L, out.stepsCompleted)
        assertEquals((0 until 5).map { "before $it/${Contract.HELD_OUT_EVAL_ROWS}" }, rec.rows)
        val t = types(dir)
        assertFalse("eval" in t || "step" in t, "$t")
        assertEquals(null, EvalPair.read(dir.results).before)
        // Each of the 5 rows evaluated: embed, the layers' block_forward, head_loss; nothing after the stop.
        assertEquals(5 * (program.layers + 2), rt.calls)
        val again = session(dir).run()
        assertEquals(RunStatus.COMPLETED, again.status, again.message)
        assertEquals(2, types(dir).count { it == "eval" })
        assertNotNull(EvalPair.read(dir.results).before)
        // A stop during the pass after the last step: paused at the end, the resume only evaluates.
        val d2 = bigRun(Fixtures.tempDir(), "cancel-after", 80)
        val rec2 = EvalRows()
        val s2 = TrainingSession(program, weights, HashRuntime(program), d2, ScriptedProbe(listOf(50_000_000L)), FakeClock(), rec2)
        val o2 = s2.run(RunControl { rec2.rows.any { it.startsWith("after 3/") } })
        assertEquals(RunStatus.PAUSED, o2.status, o2.message)
        assertEquals(2L, o2.stepsCompleted)
        assertEquals(null, EvalPair.read(d2.results).after)
        assertEquals(RunStatus.COMPLETED, session(d2).run().status)
        assertEquals(listOf("eval", "step", "step", "run_end", "eval", "run_end"), types(d2).filter { it in setOf("eval", "step", "run_end") })
    }

    @Test fun `background windows - a checkpoint after every step, so a kill loses only the step in flight`() {
        // checkpoint_every 2; killed in the 4th step (after 3 whole ones): kept 2 steps normally, 3 with a checkpoint each step.
        val rt = HashRuntime(program)
        val callsAfter = ArrayList<Int>()
        val counted = newRun(Fixtures.tempDir(), "count")
        TrainingSession(program, weights, rt, counted, ScriptedProbe(listOf(50_000_000L)), FakeClock(), object : SessionListener {
            override fun onStep(step: Long, steps: Long, loss: Double, anonBytes: Long?, budgetBytes: Long) { callsAfter.add(rt.calls) }
        }).run()
        for (each in listOf(false, true)) {
            val d = newRun(Fixtures.tempDir(), "bg-$each")
            assertThrows<SimulatedKill> { session(d, HashRuntime(program, killAtCall = callsAfter[2] + 2)).run(object : RunControl {
                override fun stopRequested() = false
                override fun checkpointEachStep() = each
            }) }
            assertEquals(if (each) 3L else 2L, CheckpointStore(d.checkpoint).load(program.stateNumel).step, "checkpoint each step: $each")
        }
    }
}
