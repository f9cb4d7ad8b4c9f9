package org.onphonellm.trainer.core

import java.nio.ByteBuffer
import java.nio.ByteOrder
import java.nio.FloatBuffer
import java.util.concurrent.locks.ReentrantLock
import kotlin.concurrent.withLock

/**
 * Where a KV-cache output goes (toolchain/runtime/loop.py `call_method`; Swift's `LoopOutput.CacheRows`): the
 * output [Hk, C, D] float32 of a prefill chunk (C rows) or of a decode step (1 row) is stored at rows
 * [pos] .. pos + [kept] - 1 of each kv head of the layer's [cache] [Hk, S, D]; rows at or past S (the padding of
 * a last chunk that reaches the end of the cache) are dropped. [write] is the one copy, Hk strided runs.
 */
class CacheRows(val cache: TensorBuffer, val heads: Int, val rows: Int, val dim: Int, val pos: Int, what: String) {
    /** S, the rows of the cache. */
    val cacheRows: Int = if (cache.shape.size == 3) cache.shape[1] else 0
    /** The rows stored (the others lie past the end of the cache). */
    val kept: Int = minOf(rows, cacheRows - pos)

    init {
        if (cache.shape.size != 3 || cache.dtype != ElemType.FLOAT32 || cache.shape[0] != heads || cache.shape[2] != dim || heads < 1 || dim < 1)
            throw BadInput("$what [$heads, $rows, $dim] does not fit the KV cache ${cache.dtype}${cache.shape}; re-export the program")
        if (pos < 0 || kept < 1) throw BadInput("$what: rows from $pos lie outside the KV cache of $cacheRows rows")
    }

    /** The output's bytes: [heads, rows, dim] float32. */
    val nbytes: Int get() = 4 * heads * rows * dim

    /** The one copy: [source] (the output, little-endian [heads, rows, dim] float32 from position 0) into the cache rows. */
    fun write(source: ByteBuffer) {
        if (source.capacity() != nbytes) throw BadInput("${cache.name}: an output of ${source.capacity()} bytes for rows [$heads, $rows, $dim]")
        for (h in 0 until heads) copyBytes(source.window(4 * h * rows * dim, 4 * kept * dim), cache.data, 4 * (h * cacheRows + pos) * dim)
    }

    /**
     * The same from a float view of the output (ExecuTorch's output tensor over its method's arena,
     * `Tensor.getRawDataBuffer()`, in native order): one bulk put per kv head, no intermediate buffer.
     */
    fun write(source: FloatBuffer) {
        if (source.capacity() != nbytes / 4) throw BadInput("${cache.name}: an output of ${source.capacity()} floats for rows [$heads, $rows, $dim]")
        val dst = cache.data.duplicate().order(ByteOrder.LITTLE_ENDIAN).asFloatBuffer()
        val src = source.duplicate()
        for (h in 0 until heads) {
            src.clear()
            src.position(h * rows * dim).limit(h * rows * dim + kept * dim)
            dst.position((h * cacheRows + pos) * dim)
            dst.put(src)
        }
    }
}

/**
 * A runtime's own output memory for [ProgramRuntime.executeInto]: one direct buffer per output of each method,
 * allocated by the method's first call and reused by every next one ([allocated] stops growing once each method
 * has run). What ExecuTorchRuntime copies an output into when it is called without destinations ([ProgramRuntime.execute]);
 * the loop offers one for every output (none is allocated then).
 */
class OutputBuffers(private val program: Manifest) {
    private val byMethod = HashMap<String, List<TensorBuffer>>()

    /** Direct buffers allocated so far (one per output of each method called). */
    var allocated = 0
        private set

    fun of(method: String): List<TensorBuffer> = byMethod.getOrPut(method) {
        program.method(method).outputs.map { io ->
            allocated++
            TensorBuffer(io.name, io.dtype, io.shape, ByteBuffer.allocateDirect(io.numel * io.dtype.size).order(ByteOrder.LITTLE_ENDIAN))
        }
    }
}

/**
 * The layer loop, exactly as toolchain/runtime/loop.py `LayerLoop` (and runtime/evaluate.py,
 * runtime/generate.py) run it: every input bound from the manifest (app inputs, activations, views of the
 * mapped weights with `{layer}` refs and `rows` slices, views of the one state buffer), outputs bound to
 * state entries copied into their slices, checkpoints kept only for the selected layers (or, with checkpoint
 * groups, for every s-th of them, the others rebuilt by a rerun), LCSB layers
 * chosen per step, `block_skip_update` for unselected layers when the manifest says moves_unselected.
 *
 * Threads: one loop is used by one thread at a time (its buffer pool and KV cache are its own). Loops on
 * one [runtime] used from several threads (training and a generation beside it, [TrainingSession]) must
 * share one [runtimeLock]: every [call] holds it from building the inputs to copying the outputs out, so the
 * runtime never runs two methods at once and no call's outputs are overwritten before they are copied (on
 * ExecuTorch they live in the method's arena until its next call; the Module's own lock covers only the
 * native call). It is fair (FIFO). With a [gate] (shared by the loops of one session) a generation goes
 * first: [generateStream] runs as a [RuntimeGate.generation], and every other call of a loop with that gate
 * waits at its start while a generation is in progress (so a generation beside training waits at most for
 * the training call already running, then decodes at the idle speed).
 */
class LayerLoop(val program: Manifest, val weights: MappedWeights, val runtime: ProgramRuntime,
                val state: StateBuffer = StateBuffer(program), val runtimeLock: ReentrantLock = ReentrantLock(true),
                val gate: RuntimeGate? = null) {
    val layers: Int = program.layers
    private val ioCache = HashMap<String, TensorBuffer>()
    /** Direct buffers of activations no longer needed, by size: a step allocates nothing once warm. */
    private val free = HashMap<Int, ArrayList<ByteBuffer>>()
    private val lrBuf = TensorBuffer.floats("lr", listOf(1), floatArrayOf(0f))
    /** Generation's app inputs (a decode step's token, a chunk's tokens, the position): written before each call, never allocated per call. */
    private val tokenBuf = TensorBuffer.longs("token", listOf(1), longArrayOf(0L))
    private val posBuf = TensorBuffer.longs("pos", listOf(1), longArrayOf(0L))
    private val tokensBuf: TensorBuffer by lazy { TensorBuffer.longs("tokens", listOf(program.prefillChunk), LongArray(program.prefillChunk)) }

    /**
     * State, kept and KV-cache outputs the loop copied after the runtime returned them (0 with a runtime that
     * writes them in place, [ProgramRuntime.executeInto]; one copy each with one that does not).
     */
    var outputCopies = 0L
        private set

    /** Direct buffers allocated for activations so far, by size in bytes. */
    private val allocatedBySize = HashMap<Int, Int>()

    /** Direct buffers allocated for activations so far (constant once the loop is warm). */
    val allocatedBuffers: Int
        get() = allocatedBySize.values.sum()

    /**
     * Direct buffers of [nbytes] bytes allocated so far: with the pool only growing to the most alive at once,
     * for [T, d] (4 x seq_len x hidden) the peak of a step's activations (checkpoints, the running x or d, the
     * call's output).
     */
    fun allocatedBuffers(nbytes: Int): Int = allocatedBySize[nbytes] ?: 0

    private fun take(nbytes: Int): ByteBuffer = free[nbytes]?.let { if (it.isEmpty()) null else it.removeAt(it.size - 1) }
        ?: ByteBuffer.allocateDirect(nbytes).also { allocatedBySize[nbytes] = (allocatedBySize[nbytes] ?: 0) + 1 }

    /** Hand a buffer this loop returned back for reuse; the caller must not read it again. */
    fun recycle(t: TensorBuffer) {
        if (t.data.isDirect && !t.data.isReadOnly && t.data.capacity() == t.nbytes) free.getOrPut(t.nbytes) { ArrayList() }.add(t.data)
    }

    init {
        val missing = program.methods.values.flatMap { m -> m.inputs.filter { it.bind == "weight" }.map { it.refAt(0) } }
            .filter { it !in weights.tensors }.distinct()
        if (missing.isNotEmpty()) throw BadInput("${weights.file}: lacks ${missing.take(3).joinToString()}; re-export the program")
    }

    private fun inputs(method: MethodSpec, layer: Int?, values: Map<String, TensorBuffer>, cache: Map<String, TensorBuffer>?): List<TensorBuffer> =
        method.inputs.map { io ->
            val ref = io.refAt(layer)
            val t = when (io.bind) {
                "weight" -> io.rows?.let { (a, b) -> ioCache.getOrPut("$ref[$a:$b]") { weights.rows(ref, a, b) } } ?: weights[ref]
                "state" -> state.view(ref)
                "cache" -> cache?.get(ref) ?: throw BadInput("${method.name}: no KV cache '$ref' (generation only)")
                else -> values[ref] ?: throw BadInput("${method.name}: no value for input ${io.name} ($ref)")
            }
            if (t.shape != io.shape || t.dtype != io.dtype)
                throw BadInput("${method.name} input ${io.name} ($ref) is ${t.dtype}${t.shape}, the manifest says ${io.dtype}${io.shape}; re-export the program")
            t
        }

    /**
     * Run one method. State outputs are copied into their slices, cache outputs of C rows ([Hk, C, D]) into
     * the layer's cache at rows [pos] .. pos + C - 1 (those < seq_len; toolchain/runtime/loop.py `_call`); the
     * others are returned as copies (the app's own buffers).
     *
     * [into]: destinations for activation outputs, by the output's ref (e.g. "d"): the output is written into
     * that buffer's memory (the returned value is a view of it, with the output's name and shape) instead of a
     * pooled one (the host's `into=` of `_outputs` / `call_bound`). It must have the output's dtype and element
     * count ([BadInput] otherwise), and may be one of this call's inputs: runtimes write outputs only after
     * the method has run ([ProgramRuntime.executeInto]). The caller keeps owning it: this call never recycles it,
     * and the caller must not recycle it as the input it was either (it now holds the output).
     */
    fun call(name: String, layer: Int?, values: Map<String, TensorBuffer>, cache: Map<String, TensorBuffer>? = null, pos: Int = 0,
             into: Map<String, TensorBuffer> = emptyMap()): Map<String, TensorBuffer> {
        val g = gate
        if (g != null && !g.isGenerationThread) g.awaitTrainingTurn()
        return runtimeLock.withLock { callLocked(name, layer, values, cache, pos, into) }
    }

    private fun callLocked(name: String, layer: Int?, values: Map<String, TensorBuffer>, cache: Map<String, TensorBuffer>?, pos: Int,
                           dests: Map<String, TensorBuffer>): Map<String, TensorBuffer> {
        // The weights file changed under its mapping (MappedWeights.checkChanged): never read it again.
        weights.stale?.let { throw BadInput("$it while it was memory-mapped; the program is not run again: ${WEIGHTS_CHANGED_ADVICE}") }
        val method = program.method(name)
        val ins = inputs(method, layer, values, cache)
        for (ref in dests.keys) if (method.outputs.none { it.bind != "state" && it.bind != "cache" && it.ref == ref })
            throw BadInput("$name has no activation output '$ref' to write into the buffer given for it")
        // Where each output goes: state outputs into their slice, kept ones into the caller's destination for them
        // or a pooled buffer, cache rows into the layer's cache.
        val into = method.outputs.map { io ->
            when (io.bind) {
                "state" -> state.view(io.refAt(layer)).also { if (it.numel != io.numel) throw BadInput("$name: ${io.name} ${io.shape} does not fit state entry ${it.name} ${it.shape}") }
                "cache" -> null
                else -> dests[io.ref]?.let { d ->
                    if (d.dtype != io.dtype || d.numel != io.numel)
                        throw BadInput("$name: the buffer given for ${io.name} (${io.ref}) is ${d.dtype}${d.shape}, the manifest says ${io.dtype}${io.shape}")
                    TensorBuffer(io.name, io.dtype, io.shape, d.data)
                } ?: TensorBuffer(io.name, io.dtype, io.shape, take(io.numel * io.dtype.size))
            }
        }
        val cacheInto = method.outputs.map { io ->
            if (io.bind != "cache") null else {
                val target = cache?.get(io.refAt(layer)) ?: throw BadInput("$name: no KV cache '${io.refAt(layer)}'")
                if (io.shape.size != 3 || io.dtype != ElemType.FLOAT32) throw BadInput("$name: ${io.name} is ${io.dtype}${io.shape}, not float32 [Hk, C, D]; re-export the program")
                CacheRows(target, io.shape[0], io.shape[1], io.shape[2], pos, "$name ${io.name}")
            }
        }
        val outputs = try {
            runtime.executeInto(name, ins, into, cacheInto)
        } catch (e: Throwable) {
            // Back to the pool: the buffers this call took (not the state slices, nor the caller's destinations).
            for ((io, d) in method.outputs.zip(into)) if (d != null && io.bind != "state" && io.ref !in dests) recycle(d)
            throw e
        }
        if (outputs.size != method.outputs.size)
            throw BadInput("$name returned ${outputs.size} outputs, the manifest lists ${method.outputs.size}; re-export the program")
        val kept = HashMap<String, TensorBuffer>()
        for ((i, io) in method.outputs.withIndex()) {
            val value = outputs[i]
            val dest = into[i]
            val rows = cacheInto[i]
            if (rows != null && value === rows.cache) continue  // the runtime wrote the rows into the cache itself
            if (value.numel != io.numel || value.dtype != io.dtype)
                throw BadInput("$name returned ${value.dtype}${value.shape} for ${io.name}, the manifest says ${io.dtype}${io.shape}; re-export the program")
            val inPlace = dest != null && value === dest
            when (io.bind) {
                "state" -> if (!inPlace) { copyBytes(value.data, dest!!.data, 0); outputCopies++ }
                "cache" -> { rows!!.write(value.data); outputCopies++ }
                else -> {
                    if (!inPlace) { copyBytes(value.data, dest!!.data, 0); outputCopies++ }
                    kept[io.ref] = dest!!
                }
            }
        }
        return kept
    }

    /** embed + every block_forward; the last hidden state and the checkpoints (block inputs) of [keep]. */
    fun forward(inputIds: TensorBuffer, keep: Set<Int>): Pair<TensorBuffer, Map<Int, TensorBuffer>> {
        var x = call("embed", null, mapOf("input_ids" to inputIds)).getValue("x")
        val checkpoints = HashMap<Int, TensorBuffer>()
        for (i in 0 until layers) {
            if (i in keep) {
                checkpoints[i] = x  // x is the loop's own copy, never written while kept
                x = call("block_forward", i, mapOf("x" to x)).getValue("x")
            } else {
                // Not kept: the output goes into x's own buffer (the host's forward does the same): one [T, d]
                // besides the checkpoints, not two.
                x = call("block_forward", i, mapOf("x" to x), into = mapOf("x" to x)).getValue("x")
            }
        }
        return Pair(x, checkpoints)
    }

    /** A step's app inputs, input_ids and labels [seq_len] int64: written by [pad], never allocated per step. */
    private val idsBuf = TensorBuffer.longs("input_ids", listOf(program.seqLen), LongArray(program.seqLen))
    private val labelsBuf = TensorBuffer.longs("labels", listOf(program.seqLen), LongArray(program.seqLen))

    /**
     * A row padded to seq_len (ids with pad_token_id, labels with -100) in this loop's two input buffers: the same
     * two buffers every call, so a pair is valid until the next [pad] (the caller runs its step or eval row first).
     */
    fun pad(ids: IntArray, labels: IntArray): Pair<TensorBuffer, TensorBuffer> {
        val t = program.seqLen
        if (ids.size > t || labels.size != ids.size) throw BadInput("a row of ${ids.size} tokens (${labels.size} labels) does not fit seq_len $t")
        for (j in 0 until t) {
            idsBuf.data.putLong(8 * j, if (j < ids.size) ids[j].toLong() else program.padTokenId.toLong())
            labelsBuf.data.putLong(8 * j, if (j < labels.size) labels[j].toLong() else -100L)
        }
        return Pair(idsBuf, labelsBuf)
    }

    /** [pad] of ids and labels given as longs. */
    fun pad(ids: List<Long>, labels: List<Long>): Pair<TensorBuffer, TensorBuffer> {
        fun int(v: Long): Int = if (v in Int.MIN_VALUE..Int.MAX_VALUE) v.toInt() else throw BadInput("token id $v is outside the vocabulary")
        return pad(IntArray(ids.size) { int(ids[it]) }, IntArray(labels.size) { int(labels[it]) })
    }

    /**
     * One training step on [state] (updated in place); returns the loss (toolchain/runtime/loop.py
     * `LayerLoop.train_step`).
     * [selected]: the layers to backpropagate (LCSB, chosen by the app at run time); null: all.
     * [layersPerCheckpoint] = s: checkpoint groups (toolchain/mesp/step.py): of the selected layers ascending,
     * groups of s ([checkpointGroups]); the forward keeps only each group's first layer's input, and when the
     * walk down reaches a group's top layer it reruns `block_forward` from that input through the layers
     * below the top (unselected ones included) to rebuild the group's other inputs, before any layer of the
     * group is updated. Same calls as the host, so the same losses and state bit for bit; at most
     * ceil(m / s) + s - 1 layer inputs are alive instead of m, for one more forward through those layers.
     * Every layer input that is not kept goes back to the buffer pool at once (no buffer holds it any more).
     * head_loss writes its d into the buffer of its input x, and each block_backward its d into the buffer of
     * the incoming d ([call]'s `into`; neither input is read after its call): at those calls the loop holds the
     * layer inputs alive and one [T, d] buffer besides them, not two (input and output share it), so a step with
     * every layer selected peaks at the checkpoints alive + 1 [T, d] buffers instead of + 2.
     */
    fun trainStep(inputIds: TensorBuffer, labels: TensorBuffer, lr: Float, selected: Set<Int>? = null, layersPerCheckpoint: Int = 1): Float {
        val sel = selected ?: (0 until layers).toSet()
        if (sel.isEmpty() || sel.any { it !in 0 until layers }) throw BadInput("selected layers must be a non-empty subset of 0..${layers - 1}, got ${sel.sorted()}")
        val groups = checkpointGroups(sel.sorted(), layersPerCheckpoint)
        val groupOfTop = groups.associateBy { it.last() }
        program.stepEntry?.let { val v = state.view(it); v.data.putFloat(0, v.float(0) + 1.0f) }
        val (x, checkpoints) = forward(inputIds, groups.map { it.first() }.toSet())
        val kept = HashMap(checkpoints)  // layer -> its input; only the groups' first layers (and one group's rebuilt inputs)
        peakCheckpoints = kept.size
        // d goes into x's buffer (x is not read after head_loss; the runtime writes d after the method has run):
        // one [T, d] buffer fewer at the step's peak (the host's train_step does the same). x is not recycled: it is d.
        val out = call("head_loss", null, mapOf("x" to x, "labels" to labels), into = mapOf("d" to x))
        val lossBuf = out.getValue("loss")
        val loss = lossBuf.float(0)
        recycle(lossBuf)
        val values = HashMap<String, TensorBuffer>()
        values["d"] = out.getValue("d")
        lrBuf.data.putFloat(0, lr)
        values["lr"] = lrBuf
        for (i in layers - 1 downTo 0) {
            groupOfTop[i]?.let { g ->
                rerun(g, kept.getValue(g.first()), kept)
                peakCheckpoints = maxOf(peakCheckpoints, kept.size)
            }
            if (i in sel) {
                val checkpoint = kept.remove(i)!!
                values["checkpoint"] = checkpoint
                // The new d into the incoming d's buffer (read by this call only): not recycled, it holds the new d.
                val d = call("block_backward", i, values, into = mapOf("d" to values.getValue("d"))).getValue("d")
                recycle(checkpoint)
                values["d"] = d
            } else if (program.movesUnselected) {
                call("block_skip_update", i, values)
            }
        }
        recycle(values.getValue("d"))
        return loss
    }

    /** Layer inputs alive at once in the last [trainStep] (the selected layers' with s = 1; fewer with groups). */
    var peakCheckpoints = 0
        private set

    /**
     * The inputs of [group]'s layers, rebuilt into [into] from the first one's input [x0] (the host's
     * `LayerLoop._rerun`): block_forward through layers group[0] .. group.last() - 1; the outputs that are not
     * the input of a layer of the group go back to the pool as soon as the next layer has read them.
     */
    private fun rerun(group: List<Int>, x0: TensorBuffer, into: MutableMap<Int, TensorBuffer>) {
        var x = x0
        val members = group.toSet()
        for (j in group.first() until group.last()) {
            // An input of a layer of the group is kept (x0 is group[0]'s): the output needs its own buffer. Any
            // other input is read by this call only: the output goes into its buffer (the host's _rerun).
            x = if (j in members) call("block_forward", j, mapOf("x" to x)).getValue("x")
                else call("block_forward", j, mapOf("x" to x), into = mapOf("x" to x)).getValue("x")
            if (j + 1 in members) into[j + 1] = x
        }
    }

    class EvalResult(val loss: Double, val rows: Int, val tokens: Int, val rowMeanLoss: Double, val skippedRows: Int)

    /** A held-out pass stopped before row [row] of [rows] ([evaluate]'s cancelled). */
    class EvalCancelled(val row: Int, val rows: Int) : Exception("held-out loss stopped before row ${row + 1} of $rows")

    /**
     * Held-out loss (runtime/evaluate.py): mean next-token cross-entropy over all target tokens of the rows.
     * [cancelled] is asked before each row: true ends it with [EvalCancelled] (no result); [onRow] gets
     * (i, n) before row i (0-based) of the n, for a "row i of N" display. The caller caps the rows
     * ([Contract.HELD_OUT_EVAL_ROWS]).
     */
    fun evaluate(rows: List<Pair<List<Long>, List<Long>>>, cancelled: () -> Boolean = { false },
                 onRow: (Int, Int) -> Unit = { _, _ -> }): EvalResult {
        var total = 0.0
        var tokens = 0
        var n = 0
        var skipped = 0
        var rowSum = 0.0
        for ((index, row) in rows.withIndex()) {
            if (cancelled()) throw EvalCancelled(index, rows.size)
            onRow(index, rows.size)
            val (ids, labels) = row
            val (i, l) = pad(ids, labels)
            val targets = (1 until program.seqLen).count { l.long(it) != -100L }
            if (targets == 0) { skipped++; continue }
            val (x, _) = forward(i, emptySet())
            val out = call("head_loss", null, mapOf("x" to x, "labels" to l))
            val loss = out.getValue("loss").float(0).toDouble()
            recycle(x)
            out.values.forEach { recycle(it) }
            total += loss * targets
            tokens += targets
            n++
            rowSum += loss
        }
        if (n == 0) throw BadInput("no eval row has a target token")
        return EvalResult(total / tokens, n, tokens, rowSum / n, skipped)
    }

    /**
     * The KV cache: per layer k_{i}, v_{i} float32 zeros, shaped as block_decode's cache inputs (bind cache,
     * ref k_{layer} / v_{layer}: [kv_heads, seq_len, head_dim], GENERATE_LOOP's first step); every generation
     * method binding the cache must take that shape.
     */
    fun newCache(): Map<String, TensorBuffer> {
        val kv = program.method("block_decode").inputs.filter { it.bind == "cache" }
        if (kv.size != 2 || kv.any { it.shape.size != 3 || it.shape[1] != program.seqLen || it.dtype != ElemType.FLOAT32 })
            throw BadInput("block_decode's KV cache inputs ${kv.map { "${it.name} ${it.dtype}${it.shape}" }} are not two float32 [kv_heads, seq_len ${program.seqLen}, head_dim]; re-export the program")
        for (m in program.methods.values) for (io in m.inputs) if (io.bind == "cache") {
            val like = kv.firstOrNull { it.ref == io.ref } ?: throw BadInput("${m.name}: cache input ${io.name} (${io.ref}) is not block_decode's")
            if (like.shape != io.shape) throw BadInput("${m.name}: cache input ${io.name} ${io.shape}, block_decode's ${like.shape}; re-export the program")
        }
        val out = HashMap<String, TensorBuffer>()
        for (i in 0 until layers) for (io in kv) {
            val ref = io.refAt(i)
            out[ref] = TensorBuffer(ref, ElemType.FLOAT32, io.shape, ByteBuffer.allocateDirect(4 * io.numel))
        }
        return out
    }

    /** This loop's KV cache, allocated by its first generation and zeroed for each next one (rows >= pos are passed too). */
    private var kvCache: Map<String, TensorBuffer>? = null

    private fun zeroedCache(): Map<String, TensorBuffer> {
        val c = kvCache ?: return newCache().also { kvCache = it }
        for (t in c.values) { val b = t.data; var i = 0; while (i + 8 <= t.nbytes) { b.putLong(i, 0L); i += 8 }; while (i < t.nbytes) b.put(i++, 0) }
        return c
    }

    /** Greedy generation; the ids only (see [generateStream]). */
    fun generate(prompt: List<Int>, maxNewTokens: Int, stopIds: Set<Int> = emptySet(), onToken: ((Int) -> Unit)? = null): List<Int> =
        generateStream(prompt, maxNewTokens, stopIds, null, onToken).ids

    /**
     * The generation driver, the one place generation calls the program's methods ([Contract.GENERATION_ROLES], or
     * their fused variants where [runtime] has the kernels: [generationNames]): greedy generation with this
     * loop's [state] (read only) as toolchain/runtime/generate.py runs the manifest's generate.steps:
     * - prefill: the prompt of n tokens in chunks of C = prefill_chunk (the last padded with pad_token_id);
     *   per chunk at pos = 0, C, 2C, ..: x = embed_prefill(tokens), then per layer
     *   x, k_new, v_new = block_prefill(x, pos, cache), the chunk's rows written at pos .. pos + C - 1;
     * - logits = head_logits(row (n - 1) mod C of the last chunk's x);
     * - per new token at pos = n, n + 1, ..: embed_token, block_decode per layer (row pos), head_logits.
     *
     * Streams: [onToken] gets each id as soon as it is chosen, before the next decode step, in the order of
     * the result's ids (on the calling thread, outside [runtimeLock]). Stops after a token of [stopIds]
     * (included; [StopReason.EOS]), after [maxNewTokens] ([StopReason.MAX_NEW_TOKENS]; a stop id wins when
     * both hold, as on the host), or when [control] is cancelled ([StopReason.CANCELLED]): checked before
     * the prefill, before each chunk and each of its layers, after the prefill and before each decode step,
     * so a cancel made while token k is reported ends with exactly those k tokens and no further call, one
     * made during the prefill ends it before the next layer's call, and one made before the start makes no
     * call and returns no token.
     */
    fun generateStream(prompt: List<Int>, maxNewTokens: Int, stopIds: Set<Int> = emptySet(), control: GenerationControl? = null,
                       onToken: ((Int) -> Unit)? = null): GenerationResult =
        gate.let { g ->
            if (g == null) generateStreamGated(prompt, maxNewTokens, stopIds, control, onToken)
            else g.generation { generateStreamGated(prompt, maxNewTokens, stopIds, control, onToken) }
        }

    private fun generateStreamGated(prompt: List<Int>, maxNewTokens: Int, stopIds: Set<Int>, control: GenerationControl?,
                                    onToken: ((Int) -> Unit)?): GenerationResult {
        val n = prompt.size
        val s = program.seqLen
        if (!program.hasGeneration) throw BadInput("the program was exported without the generation methods; re-export it")
        if (n == 0 || maxNewTokens < 1 || n + maxNewTokens > s) throw BadInput("prompt $n + $maxNewTokens new tokens must fit in seq_len $s")
        prompt.firstOrNull { it < 0 || it >= program.vocab }?.let { throw BadInput("prompt token id $it is outside the vocabulary of ${program.vocab}") }
        val names = generationNames(program, runtime)
        val c = program.prefillChunk
        val out = ArrayList<Int>()
        fun cancelled() = control?.isCancelled == true
        if (cancelled()) return GenerationResult(out, StopReason.CANCELLED)
        val cache = zeroedCache()
        var x: TensorBuffer? = null
        for (start in 0 until n step c) {
            if (cancelled()) { x?.let { recycle(it) }; return GenerationResult(out, StopReason.CANCELLED) }
            for (j in 0 until c) tokensBuf.data.putLong(8 * j, if (start + j < n) prompt[start + j].toLong() else program.padTokenId.toLong())
            x?.let { recycle(it) }
            var h = call("embed_prefill", null, mapOf("tokens" to tokensBuf)).getValue("x")
            posBuf.data.putLong(0, start.toLong())
            val p = posBuf
            for (i in 0 until layers) {
                if (cancelled()) { recycle(h); return GenerationResult(out, StopReason.CANCELLED) }
                val next = call(atLayer(names.getValue("block_prefill"), i), i, mapOf("x" to h, "pos" to p), cache, start).getValue("x")
                recycle(h)
                h = next
            }
            x = h
        }
        val xs = x!!
        if (cancelled()) { recycle(xs); return GenerationResult(out, StopReason.CANCELLED) }
        val d = xs.shape[1]
        val last = (n - 1) % c  // the prompt's last row in the last chunk
        val row = TensorBuffer("x", ElemType.FLOAT32, listOf(1, d), xs.data.window(4 * last * d, 4 * d))
        var logits = call(names.getValue("head_logits"), null, mapOf("x" to row)).getValue("logits")
        recycle(xs)
        var pos = n
        while (true) {
            val token = argmax(logits)
            recycle(logits)
            out.add(token)
            if (onToken != null) { val g = gate; if (g != null) g.consumer { onToken(token) } else onToken(token) }
            if (token in stopIds) return GenerationResult(out, StopReason.EOS)
            if (out.size == maxNewTokens) return GenerationResult(out, StopReason.MAX_NEW_TOKENS)
            if (cancelled()) return GenerationResult(out, StopReason.CANCELLED)
            tokenBuf.data.putLong(0, token.toLong())
            var h = call("embed_token", null, mapOf("token" to tokenBuf)).getValue("x")
            posBuf.data.putLong(0, pos.toLong())
            val p = posBuf
            for (i in 0 until layers) {
                val next = call(atLayer(names.getValue("block_decode"), i), i, mapOf("x" to h, "pos" to p), cache, pos).getValue("x")
                recycle(h)
                h = next
            }
            logits = call(names.getValue("head_logits"), null, mapOf("x" to h)).getValue("logits")
            recycle(h)
            pos++
        }
    }

    companion object {
        /**
         * The method [generateStream] calls for each of [Contract.GENERATION_ROLES] (toolchain/runtime/generate.py
         * `generation_names`): the fused one (manifest generate.fused.methods) when [runtime] has the fused
         * kernels registered ([ProgramRuntime.hasKernels] of generate.fused.kernels and of the method's own
         * `kernels`), else the stock one. Same inputs and outputs either way (head_logits_fused binds the whole
         * head instead of its chunks), so the same ids.
         */
        fun generationNames(program: Manifest, runtime: ProgramRuntime): Map<String, String> {
            val names = LinkedHashMap<String, String>()
            for (m in Contract.GENERATION_ROLES) names[m] = m
            val fused = program.fused
            if (fused != null && runtime.hasKernels(fused.kernels)) {
                for ((stock, f) in fused.methods) {
                    val method = program.methods[f] ?: continue
                    if (stock in names && runtime.hasKernels(method.kernels)) names[stock] = f
                }
                if (names != Contract.GENERATION_ROLES.associateWith { it }) return names
            }
            // No fused kernels: the XNNPACK variant where the program has it (per-layer names keep {layer}: [atLayer]).
            program.xnnpack?.let { x -> for ((role, pattern) in x.methods) if (role in names) names[role] = pattern }
            return names
        }

        /** The method to call for [layer] under [name] (the XNNPACK variant's block methods are per layer: `{layer}` in the name). */
        fun atLayer(name: String, layer: Int): String = name.replace(Contract.LAYER, layer.toString())

        /** [names]' methods with every layer's name for a per-layer one. */
        private fun expanded(program: Manifest, names: Collection<String>): List<String> =
            names.flatMap { n -> if (Contract.LAYER in n) (0 until program.layers).map { atLayer(n, it) } else listOf(n) }

        /**
         * The methods a loop on [runtime] can call, in manifest order: training's, and generation's under the
         * names [generationNames] picks (not the stock ones a fused one replaces, nor the fused ones the
         * runtime cannot run): what an app loads up front (each method its own arena on ExecuTorch).
         */
        fun methodsCalled(program: Manifest, runtime: ProgramRuntime): List<String> {
            val skip = generationMethodNames(program).toSet() - expanded(program, generationNames(program, runtime).values).toSet()
            return program.methods.keys.filter { it !in skip }
        }

        /** Every method generation may call: the stock ones, then the fused ones of the manifest, then the XNNPACK variant's (every layer's). */
        fun generationMethodNames(program: Manifest): List<String> =
            Contract.GENERATION_ROLES + (program.fused?.methods?.values?.filter { it in program.methods } ?: emptyList()) +
                expanded(program, program.xnnpack?.methods?.values ?: emptyList()).filter { it in program.methods }

        /**
         * The state entries the generation methods read (stock and fused), every layer's (the LoRA params; not
         * the optimizer's moments): what a generation's snapshot of the state holds ([StateBuffer] with `only`).
         */
        fun generationStateEntries(program: Manifest): Set<String> {
            val out = LinkedHashSet<String>()
            for (name in generationMethodNames(program)) {
                val m = program.method(name)
                for (io in m.inputs) if (io.bind == "state") {
                    if (Contract.LAYER in io.ref) for (i in 0 until program.layers) out.add(io.refAt(i)) else out.add(io.ref)
                }
            }
            return out
        }

        /**
         * The selected layers (ascending) in groups of [every] (toolchain/mesp/step.py `checkpoint_groups`); each
         * group's first layer is the one whose input the forward keeps.
         */
        fun checkpointGroups(selected: List<Int>, every: Int): List<List<Int>> {
            if (every < 1) throw BadInput("layers_per_checkpoint must be >= 1 (1 keeps every selected layer's input), got $every")
            return selected.chunked(every)
        }

        /** round(sqrt(m)) for m selected layers (`sqrt_layers_per_checkpoint`): about the fewest inputs alive, ceil(m / s) + s - 1. */
        fun sqrtLayersPerCheckpoint(selected: Int): Int = maxOf(1, Math.round(Math.sqrt(selected.toDouble())).toInt())

        /** The first of equal maxima (torch.argmax); NaN counts as the maximum, as in torch. */
        fun argmax(t: TensorBuffer): Int {
            var best = 0
            var bv = t.float(0)
            for (i in 1 until t.numel) {
                val v = t.float(i)
                if (bv.isNaN()) break
                if (v.isNaN() || v > bv) { best = i; bv = v }
            }
            return best
        }
    }
}
