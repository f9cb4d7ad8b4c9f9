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
 * The layer loop against a real exported program, replayed (shared_schemas/traces/README.md): the
 * host ran shared_schemas/traces/tiny/program on ExecuTorch through its own loop
 * (scripts/record_trace.py) and recorded every call. The Kotlin LayerLoop runs the same steps (full
 * backprop, LCSB with layers chosen at run time, eval, greedy generation) on that program's manifest,
 * mapped weights and state_init.bin, against a runtime that checks each call's method and the sha256 of
 * every input it receives, in order, then answers with the recorded outputs. Every input must be built
 * bit for bit and the final state must equal the host's. traces/tiny_groups is the same program and steps
 * with checkpoint groups (`layers_per_checkpoint` 2: the forward keeps fewer layer inputs, the backward
 * reruns block_forward to rebuild the others), replayed by the same harness. traces/tiny_qwen3 is the same
 * recording on a Qwen3-shaped program (per-head q/k norms, head_dim 16 where hidden / heads is 8, no q/k/v
 * biases): the loop reads all of it from the manifest's method specs, so the same harness replays it.
 */
class ReplayTest {
    private val traceDir = File(Fixtures.schemas, "traces/tiny")
    private val groupsDir = File(Fixtures.schemas, "traces/tiny_groups")
    private val qwen3Dir = File(Fixtures.schemas, "traces/tiny_qwen3")

    private class Trace(dir: File) {
        val doc = Fields.of(Json.parse(File(dir, "trace.json").readText()), "trace.json")
        init {
            val format = doc.string("format")
            require(format == "toolchain-trace") { "$dir/trace.json: format '$format', expected 'toolchain-trace' (scripts/record_trace.py)" }
        }
        val calls = doc.arr("calls").map { Fields.of(it, "call") }
        val blob: ByteBuffer = RandomAccessFile(File(dir, doc.string("outputs_file")), "r").use {
            it.channel.map(FileChannel.MapMode.READ_ONLY, 0, it.length())
        }
        val program = File(dir, doc.string("program"))
    }

    /**
     * Checks each call against the trace; answers with its recorded outputs (views of outputs.bin). With
     * [kernels] it claims those kernels are registered, and then expects a fused method where the trace
     * (recorded on the stock methods) has its stock one: [fusedCalls] counts them; the inputs must hash as the
     * stock call's, in order, names mapped ([stockInputName]: head_logits_fused's whole head `head_q` /
     * `head_scale` is the stock call's one chunk `head_0_q` / `head_0_scale` when the head has one chunk).
     */
    private class ReplayRuntime(val trace: Trace, val program: Manifest, var next: Int = 0, val kernels: Set<String> = emptySet()) : ProgramRuntime {
        var fusedCalls = 0
        val called = ArrayList<String>()
        private val stockOf: Map<String, String> = program.fused?.methods?.entries?.associate { (stock, f) -> f to stock } ?: emptyMap()
        override fun hasKernels(kernels: Collection<String>): Boolean = this.kernels.containsAll(kernels)

        fun stockInputName(method: String, name: String): String =
            if (method == "head_logits_fused" && (name == "head_q" || name == "head_scale")) name.replace("head_", "head_0_") else name

        override fun execute(method: String, inputs: List<TensorBuffer>): List<TensorBuffer> {
            val k = next++
            check(k < trace.calls.size) { "call $k ($method): the host made only ${trace.calls.size} calls" }
            val c = trace.calls[k]
            called.add(method)
            val stock = stockOf[method]
            if (stock != null) {
                assertTrue(hasKernels(program.method(method).kernels), "call $k: $method called on a runtime without ${program.method(method).kernels}")
                fusedCalls++
            }
            assertEquals(c.string("method"), stock ?: method, "call $k: method" + (if (stock != null) " (fused $method)" else ""))
            val want = c.arr("inputs").map { Fields.of(it, "input") }
            assertEquals(want.size, inputs.size, "call $k $method: input count")
            val spec = program.method(method)
            for ((j, w) in want.withIndex()) {
                val got = inputs[j]
                val what = "call $k $method (layer ${c.optInt("layer")}) input ${w.string("name")}"
                assertEquals(w.string("name"), if (stock != null) stockInputName(method, spec.inputs[j].name) else spec.inputs[j].name, "$what: manifest order")
                assertEquals(w.string("dtype"), got.dtype.manifestName, "$what: dtype")
                assertEquals(w.ints("shape"), got.shape, "$what: shape")
                assertEquals(w.string("sha256"), got.sha256(), "$what: bytes differ from the host's")
                if (spec.inputs[j].bind == "weight" || spec.inputs[j].bind == "state")
                    assertTrue(got.data.isDirect, "$what: a view the runtime can read in place")
            }
            return c.arr("outputs").map { o ->
                val f = Fields.of(o, "output")
                val dtype = ElemType.of(f.string("dtype"), f.where)
                TensorBuffer(f.string("name"), dtype, f.ints("shape"), trace.blob.window(f.int("offset"), f.int("nbytes")))
            }
        }
    }

    private fun rows(trace: Trace, key: String): List<Pair<List<Long>, List<Long>>> = trace.doc.arr(key).map {
        val f = Fields.of(it, key)
        Pair(f.arr("input_ids").map { (it as Json.Num).asLongOrNull!! }, f.arr("labels").map { (it as Json.Num).asLongOrNull!! })
    }

    /**
     * The pool's [T, d] buffers after each train step of each trace (with its own layers_per_checkpoint): the most
     * alive at once so far. The first step backpropagates all 3 layers: its 3 checkpoints (2 with groups of 2:
     * [0, 1] [2]) + 1, the running x or d (head_loss writes d into x's buffer, block_backward d into the incoming
     * d's, and block_forward its output into an input that is not kept; + 2 before that reuse). No later step needs
     * more: the groups trace's step 2 (layers [0, 2], one group) reruns from layer 0's input through layer 1
     * (unselected) to rebuild layer 2's, and layer 1's output goes into its input's buffer: layer 0's input, that
     * buffer and d, 3 (4 when block_forward's output had a buffer of its own).
     */
    private val rowBuffersAfterStep = mapOf(
        "tiny" to listOf(4, 4, 4, 4, 4),
        "tiny_groups" to listOf(3, 3, 3, 3, 3),
        "tiny_qwen3" to listOf(4, 4, 4, 4, 4))

    /** Replays [dir]'s trace with its layers_per_checkpoint (or [groupsOverride]); returns the activation buffers allocated. */
    private fun replay(lrOverride: Float? = null, selectOverride: ((List<Int>) -> Set<Int>)? = null, dir: File = traceDir,
                       groupsOverride: Int? = null, kernels: Set<String> = emptySet(),
                       beforeGenerate: ((LayerLoop, ReplayRuntime, Fields) -> Unit)? = null,
                       runtimeFor: (ReplayRuntime, Manifest) -> ProgramRuntime = { r, _ -> r },
                       afterTrainStep: ((LayerLoop) -> Unit)? = null, loopOut: ((LayerLoop) -> Unit)? = null): Int {
        val trace = Trace(dir)
        val perCheckpoint = groupsOverride ?: trace.doc.optInt("layers_per_checkpoint") ?: 1
        val program = Manifest.read(trace.program)
        val weights = MappedWeights.map(File(trace.program, program.weightsFile))
        val runtime = ReplayRuntime(trace, program, kernels = kernels)
        val loop = LayerLoop(program, weights, runtimeFor(runtime, program))
        loopOut?.invoke(loop)
        loop.state.loadInit()
        assertEquals(trace.doc.string("initial_state_sha256"), loop.state.sha256(), "state_init.bin")
        val train = rows(trace, "rows")
        val lr = lrOverride ?: trace.doc.double("lr").toFloat()
        val losses = ArrayList<Double>()
        var warm = -1
        val row = rowBytes(program)
        val rowsAfterStep = ArrayList<Int>()
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
                    // Activations come from the loop's pool: after the first (full) step no step allocates a buffer of
                    // any size but [T, d], and [T, d] buffers only up to the most a step holds at once (rowBuffersAfterStep).
                    val others = loop.allocatedBuffers - loop.allocatedBuffers(row)
                    if (warm < 0) warm = others
                    else assertEquals(warm, others, "buffers other than [T, d] allocated by step ${s.int("step")}")
                    rowsAfterStep.add(loop.allocatedBuffers(row))
                    afterTrainStep?.invoke(loop)
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
        if (groupsOverride == null) rowBuffersAfterStep[dir.name]?.let { assertEquals(it, rowsAfterStep, "${dir.name}: the pool's [T, d] buffers after each train step") }
        assertEquals(trace.doc.arr("losses").map { (it as Json.Num).asDouble }, losses)
        assertEquals(trace.doc.string("final_state_sha256"), loop.state.sha256(), "final state")
        return loop.allocatedBuffers
    }

    @Test fun `replays the host's train, LCSB, eval and generate calls bit for bit`() { replay() }

    /**
     * The Qwen3-shaped program (the same recording as tiny, scripts/record_trace.py --family qwen3): the
     * blocks bind q_norm / k_norm weights and no q/k/v biases, q_proj is [heads * head_dim = 64, 32] and the KV
     * cache rows are head_dim 16 wide (not hidden / heads = 8). The test reads `model.arch` to know the program
     * is of that shape; the loop never does (it reads the method specs), and replays every call bit for bit.
     */
    @Test fun `replays the host's Qwen3-shaped program bit for bit - q and k norms, head_dim != hidden over heads, no q k v biases`() {
        val trace = Trace(qwen3Dir)
        val program = Manifest.read(trace.program)
        val arch = Fields.of(Json.parse(File(trace.program, Contract.MANIFEST_NAME).readText()), "manifest").obj("model").obj("arch")
        val headDim = arch.int("head_dim")
        assertEquals(Triple(true, false, 16), Triple(arch.bool("qk_norm"), arch.bool("qkv_bias"), headDim))
        assertTrue(arch.int("hidden") / arch.int("heads") != headDim && arch.int("kv_heads") < arch.int("heads"), "GQA, head_dim != hidden / heads")
        for (m in listOf("block_forward", "block_backward", "block_prefill", "block_decode")) {
            val names = program.method(m).inputs.map { it.name }
            assertTrue("w_q_norm" in names && "w_k_norm" in names, "$m binds the q/k norms: $names")
            assertTrue(names.none { it.endsWith("_bias") }, "$m binds no biases: $names")
        }
        val weights = MappedWeights.map(File(trace.program, program.weightsFile))
        assertEquals(listOf(arch.int("heads") * headDim, arch.int("hidden") / 2), weights["layers.0.q_proj.qweight"].shape, "int4 q_proj, two per byte")
        assertEquals(listOf(headDim), weights["layers.0.q_norm"].shape)
        val cache = LayerLoop(program, weights, ReplayRuntime(trace, program)).newCache()
        assertEquals(listOf(arch.int("kv_heads"), program.seqLen, headDim), cache.getValue("k_0").shape)
        assertEquals(74, trace.calls.size)
        replay(dir = qwen3Dir)
    }

    /**
     * What ExecuTorchRuntime does, on the trace's outputs (each a view of outputs.bin, as ExecuTorch's are views of
     * the method's arena): each output copied once, into the loop's destination (state slice, pooled activation:
     * a bulk copy; a KV-cache output's rows from a float view of the output into the layer's cache, as the app does
     * from `Tensor.getRawDataBuffer()`), or, without one, into the runtime's own buffer of that output
     * ([OutputBuffers], once per method). It counts every direct buffer it allocates and every copy it makes.
     */
    private class CountingRuntime(val inner: ProgramRuntime, program: Manifest) : ProgramRuntime {
        val own = OutputBuffers(program)
        var calls = 0
        val methods = HashSet<String>()
        var copiesIntoLoop = 0
        var rowsIntoCache = 0
        var copiesIntoOwn = 0
        override fun hasKernels(kernels: Collection<String>) = inner.hasKernels(kernels)
        override fun execute(method: String, inputs: List<TensorBuffer>) = executeInto(method, inputs, emptyList(), emptyList())
        override fun executeInto(method: String, inputs: List<TensorBuffer>, into: List<TensorBuffer?>, cacheInto: List<CacheRows?>): List<TensorBuffer> {
            calls++
            methods.add(method)
            val arena = inner.execute(method, inputs)  // the method's arena: valid until its next call
            return arena.mapIndexed { i, v ->
                val rows = cacheInto.getOrNull(i)
                if (rows != null) {
                    assertEquals(v.nbytes, rows.nbytes, "$method ${v.name}: the cache rows' size")
                    rows.write(v.data.asFloatBuffer())
                    rowsIntoCache++
                    return@mapIndexed rows.cache
                }
                val dst = into.getOrNull(i)
                if (dst != null) { assertEquals(v.nbytes, dst.nbytes, "$method ${v.name}: destination size"); copiesIntoLoop++ } else copiesIntoOwn++
                val d = dst ?: own.of(method)[i]
                copyBytes(v.data, d.data, 0)
                d
            }
        }
    }

    @Test fun `every output is copied once, straight into the loop's memory - a counting fake runtime, the trace bit for bit`() = copiesOnce(traceDir)

    @Test fun `every output is copied once, straight into the loop's memory - the Qwen3-shaped program`() = copiesOnce(qwen3Dir)

    private fun copiesOnce(dir: File) {
        var counting: CountingRuntime? = null
        var stepsChecked = 0
        var warmLoop = -1  // the loop's activation buffers after the first train step
        var loop: LayerLoop? = null
        replay(dir = dir, runtimeFor = { r, p -> CountingRuntime(r, p).also { counting = it } }, loopOut = { loop = it }, afterTrainStep = { l ->
            if (warmLoop < 0) warmLoop = l.allocatedBuffers else assertEquals(warmLoop, l.allocatedBuffers, "loop buffers after train step $stepsChecked")
            stepsChecked++
        })
        val c = counting!!
        val l = loop!!
        assertTrue(stepsChecked >= 3, "train steps checked: $stepsChecked")
        assertTrue(c.calls > 2 * c.methods.size, "calls ${c.calls} of ${c.methods.size} methods")
        // Every output had a destination in the loop's memory: the runtime never needed a buffer of its own, and
        // the loop copied nothing again (state, kept activations and KV-cache rows alike).
        assertEquals(0, c.own.allocated, "runtime buffers allocated")
        assertEquals(0, c.copiesIntoOwn)
        assertEquals(0L, l.outputCopies, "copies the loop made after the runtime")
        assertTrue(c.copiesIntoLoop > 0)
        // Each prefill / decode block call's k and v rows went straight into the cache.
        val trace = Trace(dir)
        val gen = trace.doc.arr("steps").map { Fields.of(it, "s") }.single { it.string("kind") == "generate" }
        val blocks = trace.calls.subList(gen.ints("calls")[0], gen.ints("calls")[1]).count { it.string("method").startsWith("block_") }
        assertEquals(2 * blocks, c.rowsIntoCache, "k and v rows of $blocks block calls")
    }

    @Test fun `a generation allocates nothing once warm - the second allocates no buffer and returns the same ids`() {
        var checked = 0
        replay(beforeGenerate = { l, runtime, s ->
            runtime.next = s.ints("calls")[0]
            val first = l.generate(s.ints("prompt_ids"), s.int("max_new_tokens"))
            val warm = l.allocatedBuffers
            runtime.next = s.ints("calls")[0]
            assertEquals(first, l.generate(s.ints("prompt_ids"), s.int("max_new_tokens")))
            assertEquals(warm, l.allocatedBuffers, "buffers allocated by the second generation")
            assertEquals(s.ints("output_ids"), first)
            checked++
        })
        assertEquals(1, checked)
    }

    @Test fun `a runtime without executeInto - the loop copies every output exactly once`() {
        var loop: LayerLoop? = null
        replay(loopOut = { loop = it })  // ReplayRuntime: execute only, each output a view of the trace's outputs.bin
        // state slices, kept activations and KV-cache rows alike: one copy per output of every call made
        val outputs = Trace(traceDir).calls.sumOf { it.arr("outputs").size }
        assertEquals(outputs.toLong(), loop!!.outputCopies)
    }

    /**
     * Calls of a prefill of [n] tokens in chunks of [c] (per chunk embed_prefill + per layer block_prefill,
     * then head_logits) and of one decode step (embed_token, per layer block_decode, head_logits).
     */
    private fun prefillCalls(layers: Int, n: Int, c: Int) = (n + c - 1) / c * (1 + layers) + 1
    private fun decodeCalls(layers: Int) = 2 + layers

    @Test fun `the trace's generation is chunked - embed_prefill and block_prefill per chunk, the last padded, its rows at pos`() {
        val trace = Trace(traceDir)
        val program = Manifest.read(trace.program)
        val gen = trace.doc.arr("steps").map { Fields.of(it, "s") }.single { it.string("kind") == "generate" }
        val prompt = gen.ints("prompt_ids")
        val c = program.prefillChunk
        assertEquals(2, c)
        assertTrue(prompt.size % c != 0 && prompt.size > c, "a prompt of ${prompt.size} tokens: more than one chunk, the last padded")
        val calls = trace.calls.subList(gen.ints("calls")[0], gen.ints("calls")[1]).map { it.string("method") }
        val chunk = listOf("embed_prefill") + List(program.layers) { "block_prefill" }
        val decode = listOf("embed_token") + List(program.layers) { "block_decode" } + "head_logits"
        assertEquals(chunk + chunk + "head_logits" + decode + decode + decode, calls)
        assertEquals(listOf(c), program.method("embed_prefill").inputs.single { it.name == "tokens" }.shape)
        assertEquals(listOf(program.method("block_decode").inputs.single { it.name == "k_cache" }.shape[0], c,
            program.method("block_decode").inputs.single { it.name == "k_cache" }.shape[2]),
            program.method("block_prefill").outputs.single { it.name == "k_new" }.shape)
        // The KV cache is sized from the cache inputs: [kv_heads, seq_len, head_dim] per layer, k and v.
        val loop = LayerLoop(program, MappedWeights.map(File(trace.program, program.weightsFile)), ReplayRuntime(trace, program))
        val cache = loop.newCache()
        assertEquals(2 * program.layers, cache.size)
        assertEquals(listOf(2, program.seqLen, 8), cache.getValue("k_0").shape)
    }

    @Test fun `streamed generation - the ids in order, cancel after k tokens, cancel before the start, cancel in the prefill`() {
        var checked = 0
        replay(beforeGenerate = { loop, runtime, s ->
            val start = s.ints("calls")[0]
            val want = s.ints("output_ids")
            val prompt = s.ints("prompt_ids")
            val max = s.int("max_new_tokens")
            val layers = loop.layers
            val prefill = prefillCalls(layers, prompt.size, loop.program.prefillChunk)
            assertEquals(s.ints("calls")[1] - start, prefill + (max - 1) * decodeCalls(layers), "the trace's generation calls")
            // Cancelled before it starts: no program call, no token.
            runtime.next = start
            val none = loop.generateStream(prompt, max, emptySet(), GenerationControl().also { it.cancel() }) { error("no token expected") }
            assertEquals(GenerationResult(emptyList(), StopReason.CANCELLED).toString(), none.toString())
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
                assertEquals(start + prefill + (k - 1) * decodeCalls(layers), runtime.next, "calls made, cancel after $k")
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
            assertEquals(GenerationResult(want.take(want.indexOf(want[1]) + 1), StopReason.EOS).toString(), eos.toString())
            // A cancel from another thread during the prefill: seen before the next layer's call, or the next
            // chunk's, or the prompt's head_logits.
            for (at in 1..prefill - 1) {
                runtime.next = start
                val c2 = GenerationControl()
                var made = 0
                val cancelling = LayerLoop(loop.program, loop.weights, object : ProgramRuntime {
                    override fun execute(method: String, inputs: List<TensorBuffer>) = runtime.execute(method, inputs).also { if (++made == at) c2.cancel() }
                }, loop.state)
                val pre = cancelling.generateStream(prompt, max, emptySet(), c2) { error("no token expected") }
                assertEquals(StopReason.CANCELLED, pre.stopReason)
                assertEquals(emptyList<Int>(), pre.ids)
                assertEquals(at, made, "cancelled during call $at of the prefill (of $prefill): no call after it")
            }
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
            assertThrows(BadInput::class.java) { snap.view(p.stateEntries.first { it.role != "param" }.name) }
            assertThrows(IllegalStateException::class.java) { StateCheckpoints.writeAdapter(Fixtures.tempDir(), snap) }
            checked++
        })
        assertEquals(1, checked)
    }

    @Test fun `replays the host's checkpoint groups bit for bit - reruns, same losses and state, fewer buffers`() {
        val groups = Trace(groupsDir)
        assertEquals(2, groups.doc.int("layers_per_checkpoint"))
        val plain = Trace(traceDir)
        // The same steps as tiny: the same losses and states, with the reruns' block_forward calls in between.
        assertEquals(plain.doc.arr("losses").map { (it as Json.Num).asDouble }, groups.doc.arr("losses").map { (it as Json.Num).asDouble })
        assertEquals(plain.doc.string("final_state_sha256"), groups.doc.string("final_state_sha256"))
        assertTrue(groups.calls.size > plain.calls.size)
        // Fewer [T, d] buffers alive at once in a full step, so the pool (which only grows to the peak) holds fewer
        // after it: 2 checkpoints + 1 instead of 3 + 1, and over the whole trace (rowBuffersAfterStep: the rerun
        // through an unselected layer writes that layer's output into its input's buffer).
        val afterFull = ArrayList<Int>()
        val withGroups = replay(dir = groupsDir, afterTrainStep = { l -> if (afterFull.isEmpty()) afterFull.add(l.allocatedBuffers(rowBytes(l.program))) })
        val without = replay(afterTrainStep = { l -> if (afterFull.size == 1) afterFull.add(l.allocatedBuffers(rowBytes(l.program))) })
        assertEquals(listOf(3, 4), afterFull, "[T, d] buffers after the full step: groups of 2, s = 1")
        assertTrue(withGroups < without, "buffers with groups $withGroups, without $without")
    }

    /** Bytes of one [T, d] activation (head_loss's x). */
    private fun rowBytes(program: Manifest): Int = program.method("head_loss").inputs.single { it.name == "x" }.let { it.numel * it.dtype.size }

    /**
     * head_loss writes its d into the buffer of its input x, and block_backward its d into the buffer of the
     * incoming d (LayerLoop.call's into; the runtime writes outputs after the method has run): at those calls the
     * loop holds the layer inputs alive + 1 [T, d] buffer, not + 2. The pool only grows to the most buffers alive at
     * once, so its [T, d] buffers after the first (full: 3 of 3 layers) step are that peak: 3 checkpoints + 1 = 4
     * (5 before the reuse); with groups of 2 ([0, 1] [2]: 2 alive) 2 + 1 = 3 (4 before); then per step as
     * [rowBuffersAfterStep] says, and no more after the eval and the generation. Every call's inputs still hash as
     * the host's and the state ends as the host's: a reused buffer never held anything still needed.
     */
    @Test fun `a training step's d reuses its input's buffer - one T x d buffer fewer at a full step's peak, the traces bit for bit`() {
        for ((dir, want) in listOf(traceDir to 4, groupsDir to 3, qwen3Dir to 4)) {
            var row = 0
            val afterSteps = ArrayList<Int>()
            val peaks = ArrayList<Int>()
            var loop: LayerLoop? = null
            replay(dir = dir, loopOut = { loop = it; row = rowBytes(it.program) }, afterTrainStep = { l ->
                afterSteps.add(l.allocatedBuffers(row))
                peaks.add(l.peakCheckpoints)
            })
            val what = dir.name
            assertEquals(want, afterSteps[0], "$what: [T, d] buffers after the first (full) step")
            assertEquals(peaks[0] + 1, afterSteps[0], "$what: the checkpoints alive + 1")
            assertEquals(rowBuffersAfterStep.getValue(what), afterSteps, "$what: [T, d] buffers after each step")
            assertEquals(afterSteps.last(), loop!!.allocatedBuffers(row), "$what: [T, d] buffers after eval and generation")
        }
    }

    /**
     * What the reuse is, call by call (a runtime that, like ExecuTorchRuntime, reads every input, then writes each
     * output into the loop's destination): in a train step the destination of head_loss's d is its input x's buffer
     * and that of each block_backward's d its input d's; a block_forward writes into its input x's buffer where x
     * is not kept (a train step's unselected layers, every layer of an eval row); no other call's activation
     * destination is one of its inputs (a kept x, a checkpoint, eval's head_loss input).
     */
    @Test fun `a call writes an output into an input's buffer only where the loop no longer reads that input`() {
        val trace = Trace(traceDir)
        val program = Manifest.read(trace.program)
        val shared = ArrayList<String>()
        var calls = 0
        val runtimeFor: (ReplayRuntime, Manifest) -> ProgramRuntime = { r, p ->
            object : ProgramRuntime {
                override fun hasKernels(kernels: Collection<String>) = r.hasKernels(kernels)
                override fun execute(method: String, inputs: List<TensorBuffer>) = executeInto(method, inputs, emptyList(), emptyList())
                override fun executeInto(method: String, inputs: List<TensorBuffer>, into: List<TensorBuffer?>, cacheInto: List<CacheRows?>): List<TensorBuffer> {
                    val spec = p.method(method)
                    val k = calls++
                    for ((i, d) in into.withIndex()) if (d != null && spec.outputs[i].bind != "state")
                        for ((j, x) in inputs.withIndex()) if (x.data === d.data) shared.add("$k $method ${spec.inputs[j].name} -> ${spec.outputs[i].name}")
                    val arena = r.execute(method, inputs)  // every input read (and hashed against the host's) first
                    return arena.mapIndexed { i, v ->
                        val rows = cacheInto.getOrNull(i)
                        val d = into.getOrNull(i)
                        when {
                            rows != null -> { rows.write(v.data.asFloatBuffer()); rows.cache }
                            d != null -> { copyBytes(v.data, d.data, 0); d }
                            else -> v
                        }
                    }
                }
            }
        }
        replay(runtimeFor = runtimeFor)
        val want = ArrayList<String>()
        for (st in trace.doc.arr("steps").map { Fields.of(it, "s") }) {
            val kind = st.string("kind")
            if (kind != "train" && kind != "eval") continue
            val kept = if (kind == "train") st.ints("selected").toSet() else emptySet()
            val (a, b) = st.ints("calls")
            for (k in a until b) when (trace.calls[k].string("method")) {
                "block_forward" -> if (trace.calls[k].int("layer") !in kept) want.add("$k block_forward x -> x_out")
                "head_loss" -> if (kind == "train") want.add("$k head_loss x -> dx")
                "block_backward" -> want.add("$k block_backward dout -> dx")
            }
        }
        assertEquals(5 + 10 + 5 + 6, want.size, "5 train steps (3 + 1 + 2 + 1 + 3 layers backpropagated, 0 + 2 + 1 + 2 + 0 " +
                     "not kept in the forward), 2 eval rows of 3 layers")
        assertEquals(want, shared)
        assertEquals("d", program.method("head_loss").outputs.single { it.bind == "activation" }.ref)
    }

    @Test fun `a destination for an output must have its dtype and element count and name an activation output`() {
        val program = Manifest.read(Trace(traceDir).program)
        val loop = LayerLoop(program, MappedWeights.map(File(Trace(traceDir).program, program.weightsFile)), SessionTest.HashRuntime(program))
        loop.state.loadInit()
        val xSpec = program.method("head_loss").inputs.single { it.name == "x" }
        val x = TensorBuffer.floats("x", xSpec.shape, FloatArray(xSpec.numel) { it * 1e-3f })
        val (_, labels) = loop.pad(IntArray(4) { it + 1 }, IntArray(4) { it + 2 })
        val values = mapOf("x" to x, "labels" to labels)
        val short = TensorBuffer.floats("d", listOf(xSpec.shape[0] - 1, xSpec.shape[1]), FloatArray(xSpec.numel - xSpec.shape[1]))
        val ints = TensorBuffer("d", ElemType.INT32, xSpec.shape, ByteBuffer.allocateDirect(4 * xSpec.numel))
        for (bad in listOf(short, ints)) {
            val e = assertThrows<BadInput> { loop.call("head_loss", null, values, into = mapOf("d" to bad)) }
            assertTrue("head_loss" in e.message!! && "dx" in e.message!!, e.message)
        }
        val none = assertThrows<BadInput> { loop.call("head_loss", null, values, into = mapOf("dx" to x.copy())) }
        assertTrue("no activation output 'dx'" in none.message!!, none.message)  // keyed by the output's ref (d), not its name
        // A state output cannot be redirected: block_backward's d is its one activation output, its state outputs go to their slices.
        val entry = program.method("block_backward").outputs.first { it.bind == "state" }
        val lr = TensorBuffer.floats("lr", listOf(1), floatArrayOf(0.01f))
        val st = assertThrows<BadInput> {
            loop.call("block_backward", 0, mapOf("d" to x.copy(), "checkpoint" to x.copy(), "lr" to lr),
                into = mapOf(entry.ref to TensorBuffer.floats("s", entry.shape, FloatArray(entry.numel))))
        }
        assertTrue("no activation output" in st.message!!, st.message)
        // Another shape of the same element count is fine (the output takes the manifest's shape), and the value is
        // the one a pooled destination gets: the runtime's d, written after it read x.
        val plain = loop.call("head_loss", null, values).getValue("d").floats().toList()
        val flat = TensorBuffer.floats("flat", listOf(xSpec.numel), FloatArray(xSpec.numel))
        val into = loop.call("head_loss", null, values, into = mapOf("d" to flat)).getValue("d")
        assertEquals(xSpec.shape, into.shape)
        assertTrue(into.data === flat.data, "written into the buffer given")
        assertEquals(plain, flat.floats().toList())
        val xCopy = x.copy()
        val inPlace = loop.call("head_loss", null, mapOf("x" to xCopy, "labels" to labels), into = mapOf("d" to xCopy)).getValue("d")
        assertEquals(plain, inPlace.floats().toList(), "into its own input x: the same d")
    }

    @Test fun `the groups trace needs the groups - replayed with s = 1 it fails at the first rerun`() {
        val e = assertThrows(Throwable::class.java) { replay(dir = groupsDir, groupsOverride = 1) }
        assertTrue("call" in e.message!!, e.message)
    }

    @Test fun `killed after step 2, resumed from its checkpoint, the run ends in the host's state`() = resume(traceDir)

    @Test fun `killed after step 2 and resumed, with checkpoint groups`() = resume(groupsDir)

    @Test fun `killed after step 2 and resumed, the Qwen3-shaped program`() = resume(qwen3Dir)

    private fun resume(traceDir: File) {
        val trace = Trace(traceDir)
        val layersPerCheckpoint = trace.doc.optInt("layers_per_checkpoint") ?: 1
        val program = Manifest.read(trace.program)
        val weights = MappedWeights.map(File(trace.program, program.weightsFile))
        val train = rows(trace, "rows")
        val steps = trace.doc.arr("steps").map { Fields.of(it, "step") }.filter { it.string("kind") == "train" }
        val lr = trace.doc.double("lr").toFloat()
        val dir = kotlin.io.path.createTempDirectory("resume").toFile()
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
            StateCheckpoints.save(store, first.state, step = 2, runId = "r", seq = 7, losses = listOf(1.0, 2.0))
            // A new process: fresh buffers, no state_init.bin read; the runtime resumes at step 2's first call.
            val resumed = LayerLoop(program, weights, ReplayRuntime(trace, program, next = steps[2].ints("calls")[0]))
            val c = StateCheckpoints.restore(store, resumed.state)
            assertEquals(2L, c.step)
            assertEquals(steps[1].string("state_sha256"), resumed.state.sha256())
            run(resumed, 2, steps.size)
            assertEquals(trace.doc.string("final_state_sha256"), resumed.state.sha256())
            StateCheckpoints.writeAdapter(File(dir, "adapter"), resumed.state)
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
        assertEquals(null, Manifest.read(Trace(traceDir).program).defaultPlan)
        val withPlan = Manifest.parse(File("."), Json.parse(Fixtures.exampleManifest("manifest_tiny.json")), "example")
        assertEquals(listOf(listOf(0, 1, 2, 3), listOf(4, 5, 6, 7)), withPlan.defaultPlan!!.phases)
    }

    @Test fun `the trace covers full backprop, LCSB with k below L, skip updates, eval and generation`() {
        val trace = Trace(traceDir)
        val steps = trace.doc.arr("steps").map { Fields.of(it, "s") }
        val layers = Manifest.read(trace.program).layers
        assertTrue(steps.any { it.string("kind") == "train" && it.ints("selected").size == layers })
        assertTrue(steps.any { it.string("kind") == "train" && it.ints("selected").size < layers })
        val methods = trace.calls.map { it.string("method") }.toSet()
        assertEquals(setOf("embed", "block_forward", "head_loss", "block_backward", "block_skip_update", "embed_prefill",
            "block_prefill", "head_logits", "embed_token", "block_decode"), methods, "the stock methods only (recorded without the kernel)")
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
        val program = Manifest.read(trace.program)
        assertTrue(program.quantHead, "quant.head: the embedding and LM head are int4")
        val w = MappedWeights.map(File(trace.program, program.weightsFile))
        // The int4 embedding / head: uint8 [V, d/2] and its float32 scales [V, d/G]; a row view's bytes per row
        // come from the tensor's own shape and dtype (16 bytes, 8 bytes).
        val q = w["embed.qweight"]
        val sc = w["embed.scales"]
        assertEquals(Pair(ElemType.UINT8, listOf(program.vocab, 16)), Pair(q.dtype, q.shape))
        assertEquals(Pair(ElemType.FLOAT32, listOf(program.vocab, 2)), Pair(sc.dtype, sc.shape))
        assertTrue(q.data.isDirect)
        for ((t, rowBytes) in listOf(q to 16, sc to 8)) {
            val rows = w.rows(t.name, 2, 5)
            assertEquals(listOf(3) + t.shape.drop(1), rows.shape)
            assertEquals(3 * rowBytes, rows.nbytes)
            val want = ByteArray(3 * rowBytes).also { t.data.duplicate().apply { position(2 * rowBytes) }.get(it) }
            assertEquals(want.toList(), ByteArray(rows.nbytes).also { rows.data.duplicate().apply { position(0) }.get(it) }.toList())
        }
        assertThrows<BadInput> { w.rows("embed.qweight", 90, program.vocab + 1) }
        // The head's chunks are such views: head_0_q / head_0_scale of head_logits, rows [0, V).
        val head = program.method("head_logits").inputs.filter { it.bind == "weight" && it.rows != null }
        assertEquals(listOf("head_0_q" to "embed.qweight", "head_0_scale" to "embed.scales"), head.map { it.name to it.ref })
        assertTrue(head.all { it.rows == Pair(0, program.vocab) })
        assertEquals(ElemType.UINT8, w["layers.0.q_proj.qweight"].dtype)
    }

    @Test fun `a runtime with the int4 kernel calls the fused methods, with the stock calls' inputs bit for bit`() = fusedReplay(traceDir)

    @Test fun `a runtime with the int4 kernel calls the fused methods - the Qwen3-shaped program`() = fusedReplay(qwen3Dir)

    private fun fusedReplay(dir: File) {
        val program = Manifest.read(Trace(dir).program)
        val fused = program.fused!!
        assertEquals(listOf("toolchain::int4_linear_a8.out", "toolchain::attention_decode.out", "toolchain::rms_norm.out", "toolchain::lora_linear_a8.out", "toolchain::rope_heads.out", "toolchain::swiglu.out"), fused.kernels)
        assertEquals("toolchain/native/kernels.cpp", fused.source)
        assertEquals(mapOf("block_decode" to "block_decode_fused", "block_prefill" to "block_prefill_fused", "head_logits" to "head_logits_fused"), fused.methods)
        for (f in fused.methods.values) assertEquals(fused.kernels, program.method(f).kernels, "$f: methods[].kernels")
        for (m in Contract.GENERATION_ROLES) assertEquals(emptyList<String>(), program.method(m).kernels, "$m calls stock operators only")
        fun runtime(registered: Set<String>) = object : ProgramRuntime {
            override fun execute(method: String, inputs: List<TensorBuffer>): List<TensorBuffer> = error("not called")
            override fun hasKernels(kernels: Collection<String>) = registered.containsAll(kernels)
        }
        val stock = Contract.GENERATION_ROLES.associateWith { it }
        assertEquals(stock, LayerLoop.generationNames(program, runtime(emptySet())), "stock ExecuTorch: the stock names")
        assertEquals(stock, LayerLoop.generationNames(program, runtime(setOf("toolchain::other.out"))), "another kernel: the stock names")
        assertEquals(stock + fused.methods, LayerLoop.generationNames(program, runtime(fused.kernels.toSet())), "with the kernel: the fused names")
        // What an app loads: training's methods and generation's under the names it will call, no others.
        val training = Contract.TRAINING_ROLES
        // The contract's roles are the exported program's (the host's toolchain/contract wrote them, in call order).
        assertEquals(training, program.methods.values.map { it.role }.filter { it !in Contract.GENERATION_ROLES }.distinct())
        assertEquals(Contract.GENERATION_ROLES, program.methods.values.map { it.role }.filter { it !in training }.distinct())
        assertEquals(training + Contract.GENERATION_ROLES, LayerLoop.methodsCalled(program, runtime(emptySet())))
        assertEquals(training + listOf("embed_token", "embed_prefill") + listOf("block_prefill_fused", "block_decode_fused", "head_logits_fused"),
            LayerLoop.methodsCalled(program, runtime(fused.kernels.toSet())))
        // Replayed with the kernel claimed: training and eval as recorded, generation under the fused names, every
        // input of each fused call hashing as the recorded stock call's (head_logits_fused's whole head = the one chunk).
        var rt: ReplayRuntime? = null
        replay(dir = dir, kernels = fused.kernels.toSet(), beforeGenerate = { _, runtime, _ -> rt = runtime })
        val r = rt!!
        val gen = Trace(dir).doc.arr("steps").map { Fields.of(it, "s") }.single { it.string("kind") == "generate" }
        val called = r.called.subList(gen.ints("calls")[0], gen.ints("calls")[1])
        val layers = program.layers
        val chunks = (gen.ints("prompt_ids").size + program.prefillChunk - 1) / program.prefillChunk
        val max = gen.int("max_new_tokens")
        assertEquals(chunks * layers + 1 + (max - 1) * (layers + 1), r.fusedCalls, "fused calls")
        assertEquals(setOf("embed_prefill", "embed_token") + fused.methods.values, called.toSet())
        assertTrue(r.called.subList(0, gen.ints("calls")[0]).none { it.endsWith("_fused") }, "training and eval call no fused method")
        // head_logits_fused binds the whole head where head_logits binds its chunks (here one, rows [0, V)).
        assertEquals(listOf("x", "final_norm", "head_q", "head_scale"), program.method("head_logits_fused").inputs.map { it.name })
        assertEquals(listOf("x", "final_norm", "head_0_q", "head_0_scale"), program.method("head_logits").inputs.map { it.name })
    }

    @Test fun `state entries are views of the one state buffer`() {
        val program = Manifest.read(Trace(traceDir).program)
        val st = StateBuffer(program)
        val e = program.stateEntries[1]
        st.view(e.name).data.putFloat(0, 3.5f)
        assertEquals(3.5f, st.buffer.getFloat(4 * e.offset))
    }

    @Test fun `programs exported before chunked prefill or the int4 embedding and head are refused with re-export`() {
        val text = File(Trace(traceDir).program, "manifest.json").readText()
        assertTrue("\"prefill_chunk\": 2," in text && "\"head\": true," in text)
        val ok = Manifest.parse(File("."), Json.parse(text), "tiny")
        assertEquals(Triple(2, true, true), Triple(ok.prefillChunk, ok.quantHead, ok.hasGeneration))
        val noChunk = assertThrows<BadInput> { Manifest.parse(File("."), Json.parse(text.replace("\"prefill_chunk\": 2,", "")), "old") }
        assertTrue("re-export" in noChunk.message!! && "prefill_chunk" in noChunk.message!!, noChunk.message)
        val noHead = assertThrows<BadInput> { Manifest.parse(File("."), Json.parse(text.replace("\"head\": true,", "")), "old") }
        assertTrue("re-export" in noHead.message!! && "quant.head" in noHead.message!!, noHead.message)
        // Without generation at all (generate null) the program trains and cannot generate.
        val doc = Json.parse(text) as Json.Obj
        val noGen = Json.Obj(LinkedHashMap(doc.fields).also { it["generate"] = Json.Null })
        val p = Manifest.parse(File("."), noGen, "no generate")
        assertEquals(Pair(0, false), Pair(p.prefillChunk, p.hasGeneration))
        assertEquals(null, p.fused)
    }

    @Test fun `an older manifest version is refused with re-export, a newer one with update the app`() {
        val text = Fixtures.exampleManifest("manifest_tiny.json")
        assertTrue("\"schema_version\": 3" in text)
        Manifest.parse(File("."), Json.parse(text), "example")  // the example itself parses
        val v2 = text.replace("\"schema_version\": 3", "\"schema_version\": 2")
        val e = assertThrows(BadInput::class.java) { Manifest.parse(File("."), Json.parse(v2), "v2") }
        assertTrue("schema_version 2" in e.message!! && "re-export" in e.message!!, e.message)
        val v4 = text.replace("\"schema_version\": 3", "\"schema_version\": 4")
        val e4 = assertThrows(BadInput::class.java) { Manifest.parse(File("."), Json.parse(v4), "v4") }
        assertTrue("update the app" in e4.message!!, e4.message)
    }
}
