package org.onphonellm.trainer.core

import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertThrows
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import java.io.File
import java.io.RandomAccessFile
import java.nio.ByteBuffer
import java.nio.channels.FileChannel

/**
 * The v3 layer loop against a real exported program, replayed (shared_schemas/traces/README.md): the
 * host ran shared_schemas/traces/v3_tiny/program on ExecuTorch through its own loop
 * (scripts/record_v3_trace.py) and recorded every call. The Kotlin LayerLoop runs the same steps (full
 * backprop, LCSB with layers chosen at run time, eval, greedy generation) on that program's manifest,
 * mapped weights and state_init.bin, against a runtime that checks each call's method and the sha256 of
 * every input it receives, in order, then answers with the recorded outputs. Every input must be built
 * bit for bit and the final state must equal the host's. traces/v3_tiny_groups is the same program and steps
 * with checkpoint groups (`layers_per_checkpoint` 2: the forward keeps fewer layer inputs, the backward
 * reruns block_forward to rebuild the others), replayed by the same harness.
 */
class ReplayV3Test {
    private val traceDir = File(Fixtures.schemas, "traces/v3_tiny")
    private val groupsDir = File(Fixtures.schemas, "traces/v3_tiny_groups")

    private class Trace(dir: File) {
        val doc = Fields.of(Json.parse(File(dir, "trace.json").readText()), "trace.json")
        val calls = doc.arr("calls").map { Fields.of(it, "call") }
        val blob: ByteBuffer = RandomAccessFile(File(dir, doc.string("outputs_file")), "r").use {
            it.channel.map(FileChannel.MapMode.READ_ONLY, 0, it.length())
        }
        val program = File(dir, doc.string("program"))
    }

    /** Checks each call against the trace; answers with its recorded outputs (views of outputs.bin). */
    private class ReplayRuntime(val trace: Trace, val program: ProgramV3, var next: Int = 0) : ProgramRuntime {
        var layerOf: (() -> Int?)? = null
        override fun execute(method: String, inputs: List<NdBuffer>): List<NdBuffer> {
            val k = next++
            check(k < trace.calls.size) { "call $k ($method): the host made only ${trace.calls.size} calls" }
            val c = trace.calls[k]
            assertEquals(c.string("method"), method, "call $k: method")
            val want = c.arr("inputs").map { Fields.of(it, "input") }
            assertEquals(want.size, inputs.size, "call $k $method: input count")
            val spec = program.method(method)
            for ((j, w) in want.withIndex()) {
                val got = inputs[j]
                val what = "call $k $method (layer ${c.optInt("layer")}) input ${w.string("name")}"
                assertEquals(w.string("name"), spec.inputs[j].name, "$what: manifest order")
                assertEquals(w.string("dtype"), got.dtype.manifestName, "$what: dtype")
                assertEquals(w.ints("shape"), got.shape, "$what: shape")
                assertEquals(w.string("sha256"), got.sha256(), "$what: bytes differ from the host's")
                if (spec.inputs[j].bind == "weight" || spec.inputs[j].bind == "state")
                    assertTrue(got.data.isDirect, "$what: a view the runtime can read in place")
            }
            return c.arr("outputs").map { o ->
                val f = Fields.of(o, "output")
                val dtype = ElemType.of(f.string("dtype"), f.where)
                NdBuffer(f.string("name"), dtype, f.ints("shape"), trace.blob.window(f.int("offset"), f.int("nbytes")))
            }
        }
    }

    private fun rows(trace: Trace, key: String): List<Pair<List<Long>, List<Long>>> = trace.doc.arr(key).map {
        val f = Fields.of(it, key)
        Pair(f.arr("input_ids").map { (it as Json.Num).asLongOrNull!! }, f.arr("labels").map { (it as Json.Num).asLongOrNull!! })
    }

    /** Replays [dir]'s trace with its layers_per_checkpoint (or [groupsOverride]); returns the activation buffers allocated. */
    private fun replay(lrOverride: Float? = null, selectOverride: ((List<Int>) -> Set<Int>)? = null, dir: File = traceDir,
                       groupsOverride: Int? = null, beforeGenerate: ((LayerLoop, ReplayRuntime, Fields) -> Unit)? = null): Int {
        val trace = Trace(dir)
        val perCheckpoint = groupsOverride ?: trace.doc.optInt("layers_per_checkpoint") ?: 1
        val program = ProgramV3.read(trace.program)
        val weights = MappedWeights.map(File(trace.program, program.weightsFile))
        val runtime = ReplayRuntime(trace, program)
        val loop = LayerLoop(program, weights, runtime)
        loop.state.loadInit()
        assertEquals(trace.doc.string("initial_state_sha256"), loop.state.sha256(), "state_init.bin")
        val train = rows(trace, "rows")
        val lr = lrOverride ?: trace.doc.double("lr").toFloat()
        val losses = ArrayList<Double>()
        var warm = -1
        for (s in trace.doc.arr("steps").map { Fields.of(it, "step") }) {
            val calls = s.ints("calls")
            when (s.string("kind")) {
                "train" -> {
                    val (ids, labels) = train[s.int("row")]
                    val (i, l) = loop.pad(ids, labels)
                    val sel = s.ints("selected")
                    val loss = loop.trainStep(i, l, lr, selectOverride?.invoke(sel) ?: sel.toSet(), perCheckpoint)
                    val m = sel.size
                    assertTrue(loop.peakCheckpoints <= (m + perCheckpoint - 1) / perCheckpoint + perCheckpoint - 1 && loop.peakCheckpoints <= m,
                        "step ${s.int("step")}: ${loop.peakCheckpoints} layer inputs alive, $m selected, groups of $perCheckpoint")
                    losses.add(loss.toDouble())
                    assertEquals(s.double("loss"), loss.toDouble(), "step ${s.int("step")} loss")
                    assertEquals(s.string("state_sha256"), loop.state.sha256(), "state after step ${s.int("step")}")
                    // Activations come from the loop's pool: after the first (full) step no step allocates.
                    if (warm < 0) warm = loop.allocatedBuffers
                    else assertEquals(warm, loop.allocatedBuffers, "buffers allocated by step ${s.int("step")}")
                }
                "eval" -> {
                    val ev = loop.evaluate(rows(trace, "eval_rows"))
                    assertEquals(s.double("loss"), ev.loss, "eval loss")
                    assertEquals(s.int("tokens"), ev.tokens, "eval target tokens")
                }
                "generate" -> {
                    // Variants first (each from the step's first call, on this state; generation only reads it), then the step itself.
                    beforeGenerate?.invoke(loop, runtime, s)
                    runtime.next = calls[0]
                    val streamed = ArrayList<Int>()
                    val g = loop.generateStream(s.ints("prompt_ids"), s.int("max_new_tokens"), s.ints("stop_ids").toSet(), GenerationControl()) { streamed.add(it) }
                    assertEquals(s.ints("output_ids"), g.ids, "generated ids")
                    assertEquals(g.ids, streamed, "the ids streamed, in order, are the result's")
                    assertEquals(StopReason.MAX_NEW_TOKENS, g.stopReason)
                }
                else -> error("unknown step kind ${s.string("kind")}")
            }
            assertEquals(calls[1], runtime.next, "calls of ${s.string("kind")} step")
        }
        assertEquals(trace.calls.size, runtime.next, "every recorded call made")
        assertEquals(trace.doc.arr("losses").map { (it as Json.Num).asDouble }, losses)
        assertEquals(trace.doc.string("final_state_sha256"), loop.state.sha256(), "final state")
        return loop.allocatedBuffers
    }

    @Test fun `replays the host's train, LCSB, eval and generate calls bit for bit`() { replay() }

    /** Calls of a prefill (embed, per layer block_kv + block_forward, head_logits) and of one decode step (embed_token, per layer block_decode, head_logits). */
    private fun prefillCalls(layers: Int) = 2 + 2 * layers
    private fun decodeCalls(layers: Int) = 2 + layers

    @Test fun `streamed generation - the ids in order, cancel after k tokens, cancel before the start, cancel in the prefill`() {
        var checked = 0
        replay(beforeGenerate = { loop, runtime, s ->
            val start = s.ints("calls")[0]
            val want = s.ints("output_ids")
            val prompt = s.ints("prompt_ids")
            val max = s.int("max_new_tokens")
            val layers = loop.layers
            assertEquals(s.ints("calls")[1] - start, prefillCalls(layers) + (max - 1) * decodeCalls(layers), "the trace's generation calls")
            // Cancelled before it starts: no program call, no token.
            runtime.next = start
            val none = loop.generateStream(prompt, max, emptySet(), GenerationControl().also { it.cancel() }) { error("no token expected") }
            assertEquals(Generation(emptyList(), StopReason.CANCELLED).toString(), none.toString())
            assertEquals(start, runtime.next, "calls made by a generation cancelled before its start")
            // Cancelled while token k is reported: exactly k tokens (the host's first k), and no call after the k-th token's logits.
            for (k in 1 until max) {
                runtime.next = start
                val control = GenerationControl()
                val seen = ArrayList<Int>()
                val g = loop.generateStream(prompt, max, emptySet(), control) { seen.add(it); if (seen.size == k) control.cancel() }
                assertEquals(StopReason.CANCELLED, g.stopReason, "cancel after $k")
                assertEquals(want.take(k), g.ids, "cancel after $k")
                assertEquals(g.ids, seen)
                assertEquals(start + prefillCalls(layers) + (k - 1) * decodeCalls(layers), runtime.next, "calls made, cancel after $k")
            }
            // A cancel with the last token: the generation was complete, it says so.
            runtime.next = start
            val control = GenerationControl()
            var n = 0
            val full = loop.generateStream(prompt, max, emptySet(), control) { if (++n == max) control.cancel() }
            assertEquals(StopReason.MAX_NEW_TOKENS, full.stopReason)
            assertEquals(want, full.ids)
            // A stop id ends it, included (the host's "eos").
            runtime.next = start
            val eos = loop.generateStream(prompt, max, setOf(want[1]))
            assertEquals(Generation(want.take(2), StopReason.EOS).toString(), eos.toString())
            // A cancel from another thread during the prefill: seen before the next layer's calls.
            runtime.next = start
            val c2 = GenerationControl()
            var made = 0
            val cancelling = LayerLoop(loop.program, loop.weights, object : ProgramRuntime {
                override fun execute(method: String, inputs: List<NdBuffer>) = runtime.execute(method, inputs).also { if (++made == 2) c2.cancel() }
            }, loop.state)
            val pre = cancelling.generateStream(prompt, max, emptySet(), c2) { error("no token expected") }
            assertEquals(StopReason.CANCELLED, pre.stopReason)
            assertEquals(emptyList<Int>(), pre.ids)
            assertEquals(3, made, "embed, block_kv and block_forward of layer 0, then the cancel is seen")
            checked++
        })
        assertEquals(1, checked)
    }

    @Test fun `a snapshot of the params alone generates the host's ids, bit for bit`() {
        var checked = 0
        replay(beforeGenerate = { loop, runtime, s ->
            val p = loop.program
            val entries = LayerLoop.generationStateEntries(p)
            assertEquals(p.stateEntries.filter { it.role == "param" }.map { it.name }.toSet(), entries, "generation reads the LoRA params only")
            val snap = StateBuffer(p, entries).also { it.copyFrom(loop.state) }
            assertTrue(snap.numel < p.stateNumel, "${snap.numel} of ${p.stateNumel} values")
            val gen = LayerLoop(p, loop.weights, runtime, snap)
            runtime.next = s.ints("calls")[0]
            assertEquals(s.ints("output_ids"), gen.generate(s.ints("prompt_ids"), s.int("max_new_tokens")))
            assertEquals(s.ints("calls")[1], runtime.next)
            // The same from state_init.bin's ranges would be the initial adapter; here: a snapshot read from a file equals the copy.
            val file = File.createTempFile("state", ".bin").also { it.deleteOnExit() }
            file.writeBytes(ByteArray(4 * p.stateNumel).also { loop.state.buffer.duplicate().apply { position(0) }.get(it) })
            val fromFile = StateBuffer(p, entries).also { it.load(file) }
            assertEquals(snap.sha256(), fromFile.sha256())
            assertThrows(ContractError::class.java) { snap.view(p.stateEntries.first { it.role != "param" }.name) }
            assertThrows(IllegalStateException::class.java) { V3Checkpoints.writeAdapter(Fixtures.tempDir(), snap) }
            checked++
        })
        assertEquals(1, checked)
    }

    @Test fun `replays the host's checkpoint groups bit for bit - reruns, same losses and state, fewer buffers`() {
        val groups = Trace(groupsDir)
        assertEquals(2, groups.doc.int("layers_per_checkpoint"))
        val plain = Trace(traceDir)
        // The same steps as v3_tiny: the same losses and states, with the reruns' block_forward calls in between.
        assertEquals(plain.doc.arr("losses").map { (it as Json.Num).asDouble }, groups.doc.arr("losses").map { (it as Json.Num).asDouble })
        assertEquals(plain.doc.string("final_state_sha256"), groups.doc.string("final_state_sha256"))
        assertTrue(groups.calls.size > plain.calls.size)
        val withGroups = replay(dir = groupsDir)
        val without = replay()
        // Fewer [T, d] buffers alive at once, so the pool (which only grows to the peak) holds fewer.
        assertTrue(withGroups < without, "buffers with groups $withGroups, without $without")
    }

    @Test fun `the groups trace needs the groups - replayed with s = 1 it fails at the first rerun`() {
        val e = assertThrows(Throwable::class.java) { replay(dir = groupsDir, groupsOverride = 1) }
        assertTrue("call" in e.message!!, e.message)
    }

    @Test fun `killed after step 2, resumed from its checkpoint, the run ends in the host's state`() = resume(traceDir)

    @Test fun `killed after step 2 and resumed, with checkpoint groups`() = resume(groupsDir)

    private fun resume(traceDir: File) {
        val trace = Trace(traceDir)
        val layersPerCheckpoint = trace.doc.optInt("layers_per_checkpoint") ?: 1
        val program = ProgramV3.read(trace.program)
        val weights = MappedWeights.map(File(trace.program, program.weightsFile))
        val train = rows(trace, "rows")
        val steps = trace.doc.arr("steps").map { Fields.of(it, "step") }.filter { it.string("kind") == "train" }
        val lr = trace.doc.double("lr").toFloat()
        val dir = kotlin.io.path.createTempDirectory("v3resume").toFile()
        try {
            val store = CheckpointStore(File(dir, "checkpoint.safetensors"))
            fun run(loop: LayerLoop, from: Int, to: Int) {
                for (s in steps.subList(from, to)) {
                    val (ids, labels) = train[s.int("row")]
                    val (i, l) = loop.pad(ids, labels)
                    loop.trainStep(i, l, lr, s.ints("selected").toSet(), layersPerCheckpoint)
                }
            }
            val first = LayerLoop(program, weights, ReplayRuntime(trace, program)).also { it.state.loadInit() }
            run(first, 0, 2)
            V3Checkpoints.save(store, first.state, step = 2, runId = "r", seq = 7, losses = listOf(1.0, 2.0))
            // A new process: fresh buffers, no state_init.bin read; the runtime resumes at step 2's first call.
            val resumed = LayerLoop(program, weights, ReplayRuntime(trace, program, next = steps[2].ints("calls")[0]))
            val c = V3Checkpoints.restore(store, resumed.state)
            assertEquals(2L, c.step)
            assertEquals(steps[1].string("state_sha256"), resumed.state.sha256())
            run(resumed, 2, steps.size)
            assertEquals(trace.doc.string("final_state_sha256"), resumed.state.sha256())
            V3Checkpoints.writeAdapter(File(dir, "adapter"), resumed.state)
            val header = Safetensors.readHeader(File(dir, "adapter/adapter_model.safetensors"))
            assertEquals(program.stateEntries.filter { it.role == "param" }.map { it.key }.toSet(), header.entries.keys)
            assertTrue(File(dir, "adapter/adapter_config.json").readText().contains("lora"))
        } finally {
            dir.deleteRecursively()
        }
    }

    @Test fun `the plan decides the layers per step`() {
        val plan = StepPlan(3, "cyclic", 1, null, listOf(listOf(0), listOf(1), listOf(2)), listOf(2, 1, 0))
        assertEquals(listOf(setOf(2), setOf(1), setOf(0), setOf(2)), (0L..3L).map { plan.layersAt(it) })
        assertEquals(null, ProgramV3.read(Trace(traceDir).program).defaultPlan)
        val withPlan = ProgramV3.parse(File("."), Json.parse(File(Fixtures.examples, "manifest_tiny.json").readText()), "example")
        assertEquals(listOf(listOf(0, 1, 2, 3), listOf(4, 5, 6, 7)), withPlan.defaultPlan!!.phases)
    }

    @Test fun `the trace covers full backprop, LCSB with k below L, skip updates, eval and generation`() {
        val trace = Trace(traceDir)
        val steps = trace.doc.arr("steps").map { Fields.of(it, "s") }
        val layers = ProgramV3.read(trace.program).layers
        assertTrue(steps.any { it.string("kind") == "train" && it.ints("selected").size == layers })
        assertTrue(steps.any { it.string("kind") == "train" && it.ints("selected").size < layers })
        val methods = trace.calls.map { it.string("method") }.toSet()
        assertEquals(setOf("embed", "block_forward", "head_loss", "block_backward", "block_skip_update", "block_kv",
            "head_logits", "embed_token", "block_decode"), methods)
    }

    @Test fun `a different lr is caught at the first block_backward`() {
        val e = assertThrows(Throwable::class.java) { replay(lrOverride = 0.05001f) }
        assertTrue("block_backward" in e.message!! && "lr" in e.message!!, e.message)
    }

    @Test fun `a different LCSB selection is caught`() {
        val e = assertThrows(Throwable::class.java) { replay(selectOverride = { sel -> if (sel == listOf(2)) setOf(1) else sel.toSet() }) }
        assertTrue("call" in e.message!!, e.message)
    }

    @Test fun `weights are mapped views, rows slices share the file's pages`() {
        val trace = Trace(traceDir)
        val program = ProgramV3.read(trace.program)
        val w = MappedWeights.map(File(trace.program, program.weightsFile))
        val embed = w["embed"]
        assertTrue(embed.data.isDirect)
        val rows = w.rows("embed", 2, 5)
        assertEquals(listOf(3, embed.shape[1]), rows.shape)
        assertEquals(embed.float(2 * embed.shape[1]), rows.float(0))
        val q = w["layers.0.q_proj.qweight"]
        assertEquals(ElemType.UINT8, q.dtype)
    }

    @Test fun `state entries are views of the one state buffer`() {
        val program = ProgramV3.read(Trace(traceDir).program)
        val st = StateBuffer(program)
        val e = program.stateEntries[1]
        st.view(e.name).data.putFloat(0, 3.5f)
        assertEquals(3.5f, st.buffer.getFloat(4 * e.offset))
    }

    @Test fun `a v2 manifest is refused with re-export, a newer one with update the app`() {
        val v2 = Json.parse(File(Fixtures.examples, "manifest_v2_tiny.json").readText())
        val e = assertThrows(ContractError::class.java) { ProgramV3.parse(File("."), v2, "v2") }
        assertTrue("re-export" in e.message!!, e.message)
        val v3 = File(Fixtures.examples, "manifest_tiny.json").readText().replace("\"schema_version\": 3", "\"schema_version\": 4")
        val e4 = assertThrows(ContractError::class.java) { ProgramV3.parse(File("."), Json.parse(v3), "v4") }
        assertTrue("update the app" in e4.message!!, e4.message)
    }
}
