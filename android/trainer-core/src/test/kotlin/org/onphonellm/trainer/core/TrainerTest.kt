package org.onphonellm.trainer.core

import org.junit.jupiter.api.Assertions.assertArrayEquals
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertFalse
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Assumptions.assumeTrue
import org.junit.jupiter.api.Test
import java.io.File

class TrainerTest {
    private val info = mapOf("platform" to "android", "device_model" to "Pixel 8", "os" to "Android 14 (API 34)",
        "total_ram_bytes" to (8L shl 30), "app_version" to "0.1.0")

    private fun config(steps: Long = 8, every: Int = 2, budget: Long = 4L shl 30) =
        RunConfig("run-a", steps, lr = 0.05, budgetBytes = budget, runInfo = info, checkpointEvery = every, pausePollMs = 1000, maxPauseMs = 5000)

    private fun trainer(m: Manifest, rt: TrainingRuntime, dir: File, cfg: RunConfig = config(), probe: MemoryProbe = ScriptedProbe(listOf(100L shl 20)),
                        clock: FakeClock = FakeClock(), control: RunControl = RunControl { false }) =
        Trainer(m, Schedule.fromManifest(m), Fixtures.rows(), rt, probe, cfg, RunDir(dir), clock, control)

    private fun events(dir: File) = EventLog(RunDir(dir).telemetry).events()
    private fun types(dir: File) = events(dir).map { (it["type"] as Json.Str).value }

    private fun assertValidTelemetry(dir: File) {
        val ev = events(dir)
        ev.forEach { assertEquals(emptyList<String>(), EventSchema.problems(it), it.toString()) }
        assertEquals((0L until ev.size).toList(), ev.map { (it["seq"] as Json.Num).asLongOrNull }) // 0,1,2,... no gap, no repeat
    }

    @Test
    fun `a run loads every method first, follows the LCSB schedule and writes the adapter`() {
        val m = Fixtures.manifest(layers = 4)
        val rt = FakeRuntime(m)
        val dir = Fixtures.tempDir()
        val out = trainer(m, rt, dir).run()
        assertEquals(RunOutcome("completed", 8, out.finalLoss, "completed"), out)
        assertEquals(m.methodNames.map { "load:$it" }, rt.events.take(m.methodNames.size))
        assertEquals(List(4) { listOf("train_step_p0", "train_step_p1") }.flatten(), rt.calls)
        val ev = events(dir)
        assertEquals("run_start", types(dir).first())
        assertEquals("run_end", types(dir).last())
        assertEquals(8, types(dir).count { it == "step" })
        assertEquals(listOf(0L, 1L, 0L, 1L), ev.filter { it["type"] == Json.Str("step") }.take(4).map { (it["lcsb_phase"] as Json.Num).asLongOrNull })
        assertValidTelemetry(dir)
        val parsed = Safetensors.readHeader(File(RunDir(dir).adapter, "adapter_model.safetensors"))
        val e = m.stateEntries.first()
        assertArrayEquals(rt.current.copyOfRange(e.offset, e.offset + e.numel), Safetensors.readFloats(File(RunDir(dir).adapter, "adapter_model.safetensors"), parsed, e.key))
        // only the scheduled phases' layers moved: with LCSB off, every layer moves every step
        val full = Fixtures.manifest(layers = 4, lcsb = false)
        val rtFull = FakeRuntime(full)
        trainer(full, rtFull, Fixtures.tempDir()).run()
        assertEquals(List(8) { "train_step" }, rtFull.calls)
        assertFalse(rtFull.current.contentEquals(rt.current))
    }

    @Test
    fun `killed mid-run, the next run resumes from the checkpoint and ends where an uninterrupted run ends`() {
        val m = Fixtures.manifest(layers = 4)
        val reference = FakeRuntime(m).also { trainer(m, it, Fixtures.tempDir(), config(steps = 9, every = 2)).run() }
        val dir = Fixtures.tempDir()
        val first = FakeRuntime(m, killAtCall = 6) // dies inside step 5; checkpoints hold steps 0..3
        assertThrows<SimulatedKill> { trainer(m, first, dir, config(steps = 9, every = 2)).run() }
        assertEquals(4L, CheckpointStore(RunDir(dir).checkpoint).load(m.stateNumel).step)
        val second = FakeRuntime(m)
        val out = trainer(m, second, dir, config(steps = 9, every = 2)).run()
        assertEquals("completed", out.status)
        // set_state came after every method was loaded (loading resets the state on ExecuTorch)
        assertEquals(m.methodNames.map { "load:$it" }, second.events.take(m.methodNames.size))
        val firstStep = second.events.indexOfFirst { it.startsWith("step:") }
        assertEquals("set_state", second.events[firstStep - 1])
        assertTrue(second.events.indexOfLast { it.startsWith("load:") } < second.events.indexOf("set_state"))
        assertEquals(listOf("train_step_p0", "train_step_p1", "train_step_p0", "train_step_p1", "train_step_p0"), second.calls)
        assertArrayEquals(reference.current, second.current)
        assertEquals(listOf("run_start"), types(dir).filter { it == "run_start" })
        assertEquals("resumed_after_kill", events(dir).first { it["type"] == Json.Str("error") }["code"].let { (it as Json.Str).value })
        assertValidTelemetry(dir) // step 4 ran twice: two step events, distinct seqs, nothing for the server to refuse
        assertEquals(9 + 1, types(dir).count { it == "step" })
        // run again after completion: nothing to do, nothing logged
        val n = events(dir).size
        assertEquals("already complete", trainer(m, FakeRuntime(m), dir, config(steps = 9, every = 2)).run().message)
        assertEquals(n, events(dir).size)
    }

    @Test
    fun `a checkpoint of another run or program is refused, not silently overwritten`() {
        val m = Fixtures.manifest(layers = 4)
        val dir = Fixtures.tempDir()
        trainer(m, FakeRuntime(m), dir, config(steps = 2)).run()
        val other = config(steps = 4).copy(runId = "run-b")
        val e = assertThrows<ContractError> { Trainer(m, Schedule.fromManifest(m), Fixtures.rows(), FakeRuntime(m), ScriptedProbe(listOf(1L)), other, RunDir(dir)).run() }
        assertTrue(e.message!!.contains("belongs to run run-a"), e.message)
        val m6 = Fixtures.manifest(layers = 6)
        assertThrows<ContractError> { trainer(m6, FakeRuntime(m6), dir, config(steps = 4)).run() }
    }

    @Test
    fun `a runtime whose methods keep separate state (prebuilt Android Module) is refused before training`() {
        val m = Fixtures.manifest()
        // Each method with its own arena, as extension::Module does without share_memory_arenas.
        val perMethod = object : TrainingRuntime {
            val states = HashMap<String, FloatArray>()
            var steps = 0
            override fun loadMethod(name: String) { states[name] = FloatArray(m.stateNumel) }
            override fun trainStep(method: String, inputIds: LongArray, labels: LongArray, lr: Float): Float { steps++; return 1f }
            override fun getState() = states.getValue("get_state").copyOf()
            override fun setState(state: FloatArray) { states["set_state"] = state.copyOf() }
            override fun close() {}
        }
        val e = assertThrows<ContractError> { trainer(m, perMethod, Fixtures.tempDir()).run() }
        assertTrue(e.message!!.contains("does not share state"), e.message)
        assertEquals(0, perMethod.steps)
        // the shared-state fake passes the same check and is left as it was
        val shared = FakeRuntime(m).also { rt -> m.methodNames.forEach { rt.loadMethod(it) } }
        checkSharedState(shared, m.stateNumel)
        assertArrayEquals(shared.init, shared.current)
    }

    @Test
    fun `a runtime failure mid-run ends the run as failed with the error logged and the last checkpoint kept`() {
        val m = Fixtures.manifest()
        val base = FakeRuntime(m)
        val rt = object : TrainingRuntime by base {
            override fun trainStep(method: String, inputIds: LongArray, labels: LongArray, lr: Float): Float {
                if (base.calls.size == 3) throw IllegalStateException("Execution of method train_step_p1 failed with status 0x12")
                return base.trainStep(method, inputIds, labels, lr)
            }
        }
        val dir = Fixtures.tempDir()
        val out = trainer(m, rt, dir, config(steps = 8, every = 2)).run()
        assertEquals("failed", out.status)
        assertEquals(3L, out.stepsCompleted)
        assertEquals(2L, CheckpointStore(RunDir(dir).checkpoint).load(m.stateNumel).step)
        val err = events(dir).first { it["type"] == Json.Str("error") }
        assertEquals(Json.Str("runtime_error"), err["code"])
        assertTrue((err["message"] as Json.Str).value.contains("status 0x12"))
        assertEquals(Json.Str("failed"), events(dir).last()["status"])
        assertValidTelemetry(dir)
    }

    @Test
    fun `over budget before the first step, the run does not start`() {
        val m = Fixtures.manifest(arenaBytes = 900L shl 20)
        val rt = FakeRuntime(m)
        val dir = Fixtures.tempDir()
        val out = trainer(m, rt, dir, config(budget = 1L shl 30), ScriptedProbe(listOf(200L shl 20))).run()
        assertEquals("failed", out.status)
        assertEquals(0, rt.calls.size)
        val err = events(dir).first { it["type"] == Json.Str("error") }
        assertEquals(Json.Str("budget_exceeded"), err["code"])
        assertEquals(Json.Bool(true), err["fatal"])
        assertValidTelemetry(dir)
    }

    @Test
    fun `memory growing toward the budget stops the run cleanly, checkpointed and resumable`() {
        val m = Fixtures.manifest()
        val rt = FakeRuntime(m)
        val dir = Fixtures.tempDir()
        val mb = 1L shl 20
        // preflight 100 MB, then +150 MB per step against a 650 MB budget: after step 2 (550 MB) the next would pass 650.
        val probe = ScriptedProbe(listOf(100 * mb, 250 * mb, 400 * mb, 550 * mb, 700 * mb))
        val out = trainer(m, rt, dir, config(budget = 650 * mb, every = 100), probe).run()
        assertEquals("failed", out.status)
        assertEquals(3L, out.stepsCompleted)
        assertEquals(3, rt.calls.size)
        assertEquals(3L, CheckpointStore(RunDir(dir).checkpoint).load(m.stateNumel).step) // checkpointed at the stop despite every=100
        val end = events(dir).last()
        assertEquals(Json.Num((550 * mb).toString()), end["peak_bytes"])
        assertValidTelemetry(dir)
    }

    @Test
    fun `OS memory pressure pauses the run until it clears, or ends it as paused`() {
        val m = Fixtures.manifest()
        val probe = ScriptedProbe(listOf(100L shl 20))
        val clock = FakeClock()
        var stepsSeen = 0
        val rt = object : TrainingRuntime by FakeRuntime(m) {
            override fun trainStep(method: String, inputIds: LongArray, labels: LongArray, lr: Float): Float {
                stepsSeen++
                if (stepsSeen == 2) probe.trimLevel = MemoryGuard.TRIM_MEMORY_RUNNING_CRITICAL // pressure after step 1
                return 1f
            }
        }
        val dir = Fixtures.tempDir()
        // pressure clears after 3 s of waiting
        val clearing = object : MemoryProbe {
            override fun sample(): List<MemorySample> {
                if (clock.sleeps.sum() >= 3000) probe.trimLevel = null
                return probe.sample()
            }
        }
        val out = trainer(m, rt, dir, config(steps = 4), clearing, clock).run()
        assertEquals("completed", out.status)
        assertEquals(listOf(1000L, 1000L, 1000L), clock.sleeps)
        val pause = events(dir).first { it["type"] == Json.Str("error") }
        assertEquals(Json.Str("memory_pressure"), pause["code"])
        assertEquals(Json.Bool(false), pause["fatal"])
        // pressure that never clears: the run ends as 'paused' after maxPauseMs, checkpointed
        val stuck = ScriptedProbe(listOf(100L shl 20), lowMemory = false)
        val rt2 = object : TrainingRuntime by FakeRuntime(m) {
            override fun trainStep(method: String, inputIds: LongArray, labels: LongArray, lr: Float): Float { stuck.lowMemory = true; return 1f }
        }
        val dir2 = Fixtures.tempDir()
        val out2 = trainer(m, rt2, dir2, config(steps = 4), stuck, FakeClock()).run()
        assertEquals(RunOutcome("paused", 1, 1.0, out2.message), out2)
        assertEquals(1L, CheckpointStore(RunDir(dir2).checkpoint).load(m.stateNumel).step)
        assertValidTelemetry(dir2)
    }

    @Test
    fun `a stop request ends the run as cancelled with a checkpoint, a non-finite loss as failed without one`() {
        val m = Fixtures.manifest()
        val dir = Fixtures.tempDir()
        val rt = FakeRuntime(m)
        val out = trainer(m, rt, dir, config(steps = 8, every = 100), control = RunControl { rt.calls.size >= 3 }).run()
        assertEquals(RunOutcome("cancelled", 3, out.finalLoss, "stop requested"), out)
        assertEquals(3L, CheckpointStore(RunDir(dir).checkpoint).load(m.stateNumel).step)
        assertEquals(Json.Str("cancelled"), events(dir).last()["status"])
        // resume the cancelled run: it continues, with no run_start and no 'killed' error
        val out2 = trainer(m, FakeRuntime(m), dir, config(steps = 8, every = 100)).run()
        assertEquals("completed", out2.status)
        assertEquals(1, types(dir).count { it == "run_start" })
        assertEquals(0, types(dir).count { it == "error" })

        val dir2 = Fixtures.tempDir()
        val nan = FakeRuntime(m, lossAt = { call -> if (call == 4) Float.NaN else null })
        val out3 = trainer(m, nan, dir2, config(steps = 8, every = 2)).run()
        assertEquals("failed", out3.status)
        assertEquals(2L, CheckpointStore(RunDir(dir2).checkpoint).load(m.stateNumel).step) // the NaN state was not saved
        val step3 = events(dir2).first { it["type"] == Json.Str("step") && it["step"] == Json.Num("3") }
        assertEquals(Json.Null, step3["loss"])
        assertEquals(Json.Str("non_finite_loss"), events(dir2).first { it["type"] == Json.Str("error") }["code"])
        assertValidTelemetry(dir2)
    }

    @Test
    fun `the example manifest runs end to end on the fake runtime`() {
        assumeTrue(Fixtures.manifestExample.isFile, "shared_schemas/examples/manifest_tiny.json not generated yet")
        val m = Manifest.load(Fixtures.manifestExample)
        val rt = FakeRuntime(m)
        val dir = Fixtures.tempDir()
        val rows = Fixtures.rows().map { r -> DataRow(r.inputIds.map { it % m.vocab }.toIntArray().copyOf(minOf(r.inputIds.size, m.seqLen)),
            r.labels.copyOf(minOf(r.labels.size, m.seqLen))) }
        val out = Trainer(m, Schedule.fromManifest(m), rows, rt, ScriptedProbe(listOf(1L shl 20)), config(steps = 6), RunDir(dir), FakeClock()).run()
        assertEquals("completed", out.status)
        val sched = Schedule.fromManifest(m)
        assertEquals((0L until 6L).map { sched.methodForStep(it).first }, rt.calls)
        assertValidTelemetry(dir)
        val parsed = Safetensors.readHeader(File(RunDir(dir).adapter, "adapter_model.safetensors"))
        assertEquals(m.stateEntries.filter { it.role == "param" }.map { it.key }.toSet(), parsed.entries.keys)
    }
}
