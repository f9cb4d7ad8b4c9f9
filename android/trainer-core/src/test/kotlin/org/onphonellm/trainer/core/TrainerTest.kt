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
                        clock: FakeClock = FakeClock(), control: RunControl = RunControl { false }, program: File = Fixtures.programDir(m)) =
        Trainer(m, program, Schedule.fromManifest(m), Fixtures.rows(), rt, probe, cfg, RunDir(dir), clock, control)

    /** The state a run left: its last checkpoint (written at the end of every completed run). */
    private fun finalState(m: Manifest, dir: File) = CheckpointStore(RunDir(dir).checkpoint).load(m.stateNumel).state

    private fun slice(m: Manifest, state: FloatArray, name: String) = m.entry(name)!!.let { state.copyOfRange(it.offset, it.offset + it.numel) }

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
        val state = finalState(m, dir)
        val adapterFile = File(RunDir(dir).adapter, "adapter_model.safetensors")
        val parsed = Safetensors.readHeader(adapterFile)
        for (e in m.stateEntries) assertArrayEquals(slice(m, state, e.name), Safetensors.readFloats(adapterFile, parsed, e.key), e.key)
        assertFalse(state.contentEquals(Fixtures.initState(m))) // it trained
        // with LCSB off every layer moves every step: another end state
        val full = Fixtures.manifest(layers = 4, lcsb = false)
        val rtFull = FakeRuntime(full)
        val fullDir = Fixtures.tempDir()
        trainer(full, rtFull, fullDir).run()
        assertEquals(List(8) { "train_step" }, rtFull.calls)
        assertFalse(finalState(full, fullDir).contentEquals(state))
    }

    @Test
    fun `each output is copied into its entry's slice and nothing else changes`() {
        val m = Fixtures.manifest(layers = 4)
        val init = Fixtures.initState(m)
        val state = ProgramState(m, init.copyOf())
        val p1 = m.method("train_step_p1")
        // outputs as a positional runtime returns them: unnamed, distinctive values per entry
        val outputs = listOf<TensorValue>(TensorValue.Floats("", listOf(1), floatArrayOf(2.5f))) + p1.outputs.drop(1).mapIndexed { k, o ->
            TensorValue.Floats("", o.shape, FloatArray(m.entry(o.name)!!.numel) { j -> 1000f * (k + 1) + j })
        }
        assertEquals(2.5f, state.checkOutputs(p1, outputs))
        state.copyOutputs(p1, outputs)
        p1.outputs.drop(1).forEachIndexed { k, o -> assertArrayEquals(FloatArray(m.entry(o.name)!!.numel) { j -> 1000f * (k + 1) + j }, state.slice(o.name), o.name) }
        for (e in m.stateEntries.filter { it.name !in p1.updatedEntries }) assertArrayEquals(slice(m, init, e.name), state.slice(e.name), e.name)
        assertEquals(m.stateEntries.filter { "layers.2." in it.key || "layers.3." in it.key }.map { it.name }, p1.updatedEntries)
        // the inputs are windows of the state array, in entries order, after input_ids, labels, lr
        val inputs = state.inputs(LongArray(8), LongArray(8), 0.5f)
        assertEquals(listOf("input_ids", "labels", "lr") + m.stateEntries.map { it.name }, inputs.map { it.name })
        inputs.drop(3).forEach { assertTrue((it as TensorValue.Floats).data === state.values) }
    }

    @Test
    fun `bad outputs fail the run clearly and leave the state untouched`() {
        val m = Fixtures.manifest(layers = 4)
        val cases = mapOf<String, (List<TensorValue>) -> List<TensorValue>>(
            "returned 2 outputs, the manifest lists 9" to { out -> out.take(2) },
            "is named 'lora_0_v_proj_a', the manifest says 'lora_0_q_proj_a'" to { out ->
                listOf(out[0], TensorValue.Floats("lora_0_v_proj_a", out[1].shape, out[1].floats())) + out.drop(2) },
            "output 'lora_0_q_proj_b' of method train_step_p0 has 3 values, its state entry 16" to { out ->
                listOf(out[0], out[1], TensorValue.Floats("", listOf(3), FloatArray(3))) + out.drop(3) },
            "is INT64, not float32" to { out -> listOf<TensorValue>(TensorValue.Longs("", listOf(1), LongArray(1))) + out.drop(1) },
        )
        for ((why, mangle) in cases) {
            val base = FakeRuntime(m)
            val rt = object : TrainingRuntime by base {
                override fun execute(method: String, inputs: List<TensorValue>) = base.execute(method, inputs).let { if (base.calls.size == 3) mangle(it) else it }
            }
            val dir = Fixtures.tempDir()
            val out = trainer(m, rt, dir, config(steps = 6, every = 2)).run()
            assertEquals("failed", out.status, why)
            assertTrue(out.message.contains(why), "expected '$why' in: ${out.message}")
            assertTrue(out.message.contains("push the program directory again or re-export"), out.message)
            assertEquals(2L, out.stepsCompleted, why)
            assertEquals(2L, CheckpointStore(RunDir(dir).checkpoint).load(m.stateNumel).step)
        }
        // a name the manifest does not have as an entry cannot reach a slice
        val state = ProgramState(m, Fixtures.initState(m))
        val bogus = m.method("train_step_p0").let { it.copy(outputs = it.outputs.take(1) + Manifest.TensorSpec("lora_9_q_proj_a", "float32", listOf(2, 8))) }
        val e = assertThrows<ContractError> { state.copyOutputs(bogus, listOf(TensorValue.Floats("", listOf(1), FloatArray(1)), TensorValue.Floats("", listOf(2, 8), FloatArray(16)))) }
        assertTrue(e.message!!.contains("'lora_9_q_proj_a' of method train_step_p0 is not a state entry"), e.message)
        assertArrayEquals(Fixtures.initState(m), state.values)
    }

    @Test
    fun `a phase method returns only the entries it changes - SGD its layers' params, AdamW everything`() {
        val sgd = Fixtures.manifest(layers = 4)
        val rt = FakeRuntime(sgd)
        val dir = Fixtures.tempDir()
        trainer(sgd, rt, dir, config(steps = 2)).run()
        val layerNames = { layers: List<Int> -> sgd.stateEntries.filter { e -> layers.any { "layers.$it." in e.key } }.map { it.name } }
        assertEquals(listOf(layerNames(listOf(0, 1)), layerNames(listOf(2, 3))), rt.returned)
        assertEquals(rt.returned, listOf("train_step_p0", "train_step_p1").map { sgd.method(it).updatedEntries })
        // after one p0 step only layers 0 and 1 moved
        val one = Fixtures.tempDir()
        trainer(sgd, FakeRuntime(sgd), one, config(steps = 1)).run()
        val after = finalState(sgd, one)
        val init = Fixtures.initState(sgd)
        for (e in sgd.stateEntries) assertEquals(e.name in layerNames(listOf(0, 1)), !slice(sgd, after, e.name).contentEquals(slice(sgd, init, e.name)), e.name)

        val adam = Fixtures.manifest(layers = 4, optimizer = "adamw")
        val rtA = FakeRuntime(adam, namedOutputs = false)
        val dirA = Fixtures.tempDir()
        assertEquals("completed", trainer(adam, rtA, dirA, config(steps = 3)).run().status)
        rtA.returned.forEach { assertEquals(adam.stateEntries.map { it.name }, it) }
        val s = finalState(adam, dirA)
        assertArrayEquals(floatArrayOf(3f), slice(adam, s, "adam_step")) // the step counter went through the app's array
        assertTrue(adam.stateEntries.filter { it.role == "exp_avg_sq" }.all { e -> slice(adam, s, e.name).any { it > 0f } })
    }

    @Test
    fun `the initial state comes from state_init_bin - raw little-endian float32 of exactly numel values`() {
        val m = Fixtures.manifest(layers = 2)
        // hand-computed bytes: 1.0f = 00 00 80 3f, -2.0f = 00 00 00 c0 (little-endian)
        val init = FloatArray(m.stateNumel) { if (it % 2 == 0) 1f else -2f }
        val bytes = ByteArray(4 * m.stateNumel) { i -> listOf(listOf(0, 0, 0x80, 0x3f), listOf(0, 0, 0, 0xc0))[(i / 4) % 2][i % 4].toByte() }
        val program = Fixtures.tempDir().also { File(it, "state_init.bin").writeBytes(bytes) }
        assertArrayEquals(init, ProgramState.readInit(program, m).values)
        // a run starts from it: the first call sees those values as its state inputs
        val seen = ArrayList<FloatArray>()
        val base = FakeRuntime(m)
        val rt = object : TrainingRuntime by base {
            override fun execute(method: String, inputs: List<TensorValue>): List<TensorValue> {
                if (seen.isEmpty()) seen.add(FloatArray(m.stateNumel).also { s -> inputs.drop(3).forEach { t -> t.copyInto(s, m.entry(t.name)!!.offset) } })
                return base.execute(method, inputs)
            }
        }
        trainer(m, rt, Fixtures.tempDir(), config(steps = 1), program = program).run()
        assertArrayEquals(init, seen.single())
        // one value short, or missing: refused before any step
        for ((why, prog) in listOf(
            "holds ${4 * m.stateNumel - 4} bytes, the manifest's ${m.stateNumel} float32 values need ${4 * m.stateNumel}" to
                Fixtures.tempDir().also { File(it, "state_init.bin").writeBytes(bytes.copyOf(bytes.size - 4)) },
            "state_init.bin is missing" to Fixtures.tempDir())) {
            val rt2 = FakeRuntime(m)
            val e = assertThrows<ContractError>(why) { trainer(m, rt2, Fixtures.tempDir(), program = prog).run() }
            assertTrue(e.message!!.contains(why), "expected '$why' in: ${e.message}")
            assertEquals(0, rt2.calls.size)
        }
    }

    @Test
    fun `killed mid-run, the next run resumes from the checkpoint and ends where an uninterrupted run ends`() {
        for (opt in listOf("adamw", "sgd")) killAndResume(opt)
    }

    private fun killAndResume(optimizer: String) {
        val m = Fixtures.manifest(layers = 4, optimizer = optimizer)
        val program = Fixtures.programDir(m)
        val refDir = Fixtures.tempDir()
        trainer(m, FakeRuntime(m), refDir, config(steps = 9, every = 2), program = program).run()
        val reference = finalState(m, refDir)
        val dir = Fixtures.tempDir()
        val first = FakeRuntime(m, killAtCall = 6) // dies inside step 5; checkpoints hold steps 0..3
        assertThrows<SimulatedKill> { trainer(m, first, dir, config(steps = 9, every = 2), program = program).run() }
        assertEquals(4L, CheckpointStore(RunDir(dir).checkpoint).load(m.stateNumel).step)
        // the resumed run starts from the checkpoint, not from state_init.bin (gone: reading it would fail)
        File(program, m.stateInitFile).delete()
        val second = FakeRuntime(m)
        val out = trainer(m, second, dir, config(steps = 9, every = 2), program = program).run()
        assertEquals("completed", out.status, optimizer)
        assertEquals(m.methodNames.map { "load:$it" }, second.events.take(m.methodNames.size)) // every method loaded before the first call
        assertEquals(listOf("train_step_p0", "train_step_p1", "train_step_p0", "train_step_p1", "train_step_p0"), second.calls)
        assertArrayEquals(reference, finalState(m, dir), optimizer)
        assertFalse(reference.contentEquals(Fixtures.initState(m)))
        assertEquals(listOf("run_start"), types(dir).filter { it == "run_start" })
        assertEquals("resumed_after_kill", events(dir).first { it["type"] == Json.Str("error") }["code"].let { (it as Json.Str).value })
        assertValidTelemetry(dir) // step 4 ran twice: two step events, distinct seqs, nothing for the server to refuse
        assertEquals(9 + 1, types(dir).count { it == "step" })
        // run again after completion: nothing to do, nothing logged
        val n = events(dir).size
        assertEquals("already complete", trainer(m, FakeRuntime(m), dir, config(steps = 9, every = 2), program = program).run().message)
        assertEquals(n, events(dir).size)
    }

    @Test
    fun `a checkpoint of another run or program is refused, not silently overwritten`() {
        val m = Fixtures.manifest(layers = 4)
        val dir = Fixtures.tempDir()
        trainer(m, FakeRuntime(m), dir, config(steps = 2)).run()
        val other = config(steps = 4).copy(runId = "run-b")
        val e = assertThrows<ContractError> { Trainer(m, Fixtures.programDir(m), Schedule.fromManifest(m), Fixtures.rows(), FakeRuntime(m), ScriptedProbe(listOf(1L)), other, RunDir(dir)).run() }
        assertTrue(e.message!!.contains("belongs to run run-a"), e.message)
        val m6 = Fixtures.manifest(layers = 6)
        assertThrows<ContractError> { trainer(m6, FakeRuntime(m6), dir, config(steps = 4)).run() }
    }

    @Test
    fun `a runtime failure mid-run ends the run as failed with the error logged and the last checkpoint kept`() {
        val m = Fixtures.manifest()
        val base = FakeRuntime(m)
        val rt = object : TrainingRuntime by base {
            override fun execute(method: String, inputs: List<TensorValue>): List<TensorValue> {
                if (base.calls.size == 3) throw IllegalStateException("Execution of method train_step_p1 failed with status 0x12")
                return base.execute(method, inputs)
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
        val base = FakeRuntime(m, lossAt = { 1f })
        val rt = object : TrainingRuntime by base {
            override fun execute(method: String, inputs: List<TensorValue>): List<TensorValue> {
                stepsSeen++
                if (stepsSeen == 2) probe.trimLevel = MemoryGuard.TRIM_MEMORY_RUNNING_CRITICAL // pressure after step 1
                return base.execute(method, inputs)
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
        val base2 = FakeRuntime(m, lossAt = { 1f })
        val rt2 = object : TrainingRuntime by base2 {
            override fun execute(method: String, inputs: List<TensorValue>): List<TensorValue> { stuck.lowMemory = true; return base2.execute(method, inputs) }
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
        assumeTrue(Fixtures.manifestExample.isFile, "shared_schemas/examples/manifest_v2_tiny.json not generated yet")
        val m = Manifest.load(Fixtures.manifestExample)
        val rt = FakeRuntime(m)
        val dir = Fixtures.tempDir()
        val rows = Fixtures.rows().map { r -> DataRow(r.inputIds.map { it % m.vocab }.toIntArray().copyOf(minOf(r.inputIds.size, m.seqLen)),
            r.labels.copyOf(minOf(r.labels.size, m.seqLen))) }
        val out = Trainer(m, Fixtures.programDir(m), Schedule.fromManifest(m), rows, rt, ScriptedProbe(listOf(1L shl 20)), config(steps = 6), RunDir(dir), FakeClock()).run()
        assertEquals("completed", out.status)
        val sched = Schedule.fromManifest(m)
        assertEquals((0L until 6L).map { sched.methodForStep(it).first }, rt.calls)
        // what the fake program returned is what the exporter's manifest says each method returns
        rt.calls.zip(rt.returned).forEach { (name, entries) -> assertEquals(m.method(name).updatedEntries, entries, name) }
        assertValidTelemetry(dir)
        val parsed = Safetensors.readHeader(File(RunDir(dir).adapter, "adapter_model.safetensors"))
        assertEquals(m.stateEntries.filter { it.role == "param" }.map { it.key }.toSet(), parsed.entries.keys)
    }
}
