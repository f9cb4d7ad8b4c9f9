package org.onphonellm.trainer.core

import java.io.File

/** Paths to the repository's shared files and small builders for the tests. */
object Fixtures {
    /** The repository root: -Drepo.root (android/test.sh sets it), else found above the working directory. */
    val repo: File by lazy {
        System.getProperty("repo.root")?.let { return@lazy File(it) }
        var d: File? = File("").absoluteFile
        while (d != null && !File(d, "shared_schemas").isDirectory) d = d.parentFile
        d ?: error("run from inside the repository or pass -Drepo.root")
    }
    val schemas: File get() = File(repo, "shared_schemas")
    val examples: File get() = File(schemas, "examples")
    val invalid: File get() = File(examples, "invalid")

    /** Real Android outputs kept outside the repository (../shared/android-samples, see its README). */
    val androidSamples: File get() = File(repo, "../shared/android-samples").canonicalFile

    fun examples(prefix: String): List<File> = examples.listFiles { f -> f.name.startsWith(prefix) && f.name.endsWith(".json") }!!.sortedBy { it.name }
    fun invalid(prefix: String): List<File> = invalid.listFiles { f -> f.name.startsWith(prefix) && f.name.endsWith(".json") }!!.sortedBy { it.name }

    val manifestExample: File get() = File(examples, "manifest_v2_tiny.json")

    /**
     * A manifest shaped like `toolchain export` writes (export/build.py, schema_version 2): [layers]
     * layers, LoRA rank 2 on q_proj (8 -> 8) and v_proj (8 -> 4), SGD or AdamW, LCSB phases of two
     * layers (or none). Methods take input_ids, labels, lr and every state entry; they return the loss
     * and the entries they change: with SGD a phase's layers' params, with AdamW every entry.
     */
    fun manifestJson(layers: Int = 4, lcsb: Boolean = true, seqLen: Int = 8, arenaBytes: Long = 1 shl 20, peakEstimate: Long? = null,
                     optimizer: String = "sgd"): String {
        val rank = 2
        val shapes = mapOf("q_proj" to (8 to 8), "v_proj" to (4 to 8))
        val entries = ArrayList<Map<String, Any?>>()
        val layerOf = ArrayList<Int?>()
        var offset = 0
        val roles = listOf("lora" to "param") + if (optimizer == "adamw") listOf("adam_m" to "exp_avg", "adam_v" to "exp_avg_sq") else emptyList()
        for ((prefix, role) in roles) for (i in 0 until layers) for ((t, io) in shapes) for (which in listOf("a", "b")) {
            val shape = if (which == "a") listOf(rank, io.second) else listOf(io.first, rank)
            entries.add(mapOf("name" to "${prefix}_${i}_${t}_$which", "key" to "base_model.model.model.layers.$i.self_attn.$t.lora_${which.uppercase()}.weight",
                "role" to role, "shape" to shape, "offset" to offset))
            layerOf.add(i)
            offset += shape[0] * shape[1]
        }
        if (optimizer == "adamw") {
            entries.add(mapOf("name" to "adam_step", "key" to "", "role" to "step", "shape" to listOf(1), "offset" to offset))
            layerOf.add(null)
            offset += 1
        }
        val phases = if (lcsb) (0 until layers).chunked(2) else null
        val stateIo = entries.map { mapOf("name" to it["name"], "dtype" to "float32", "shape" to it["shape"]) }
        val train = (phases?.indices?.map { it as Int? } ?: listOf(null)).map { k ->
            val backward = if (k == null) (0 until layers).toList() else phases!![k]
            val updated = stateIo.filterIndexed { j, _ -> optimizer == "adamw" || layerOf[j] in backward }
            mapOf("name" to (if (k == null) "train_step" else "train_step_p$k"), "kind" to "train_step", "phase" to k, "backward_layers" to backward,
                "inputs" to listOf(mapOf("name" to "input_ids", "dtype" to "int64", "shape" to listOf(seqLen)),
                    mapOf("name" to "labels", "dtype" to "int64", "shape" to listOf(seqLen), "description" to "-100 = no target"),
                    mapOf("name" to "lr", "dtype" to "float32", "shape" to listOf(1))) + stateIo,
                "outputs" to listOf(mapOf("name" to "loss", "dtype" to "float32", "shape" to listOf(1))) + updated)
        }
        val m = linkedMapOf(
            "schema_version" to 2, "toolchain_version" to "0.1.0",
            "model" to mapOf("source" to "tiny", "init" to "random", "seed" to 0, "arch" to mapOf("hidden" to 8, "layers" to layers, "heads" to 2,
                "kv_heads" to 1, "intermediate" to 16, "vocab" to 264, "max_positions" to 64, "rms_eps" to 1e-6, "rope_theta" to 1e6, "tie_embeddings" to true)),
            "lora" to mapOf("rank" to rank, "alpha" to 4.0, "scale" to 2.0, "targets" to listOf("q_proj", "v_proj")),
            "seq_len" to seqLen, "quant" to mapOf("kind" to "none", "group" to 64),
            "optimizer" to mapOf("kind" to optimizer, "weight_decay" to 0.0, "betas" to listOf(0.9, 0.999), "eps" to 1e-8, "default_lr" to 0.01),
            "lcsb" to phases?.let { mapOf("policy" to "cyclic", "k" to 2, "phases" to it, "schedule" to it.indices.toList()) },
            "programs" to listOf(mapOf("target" to "executorch", "file" to "model.pte", "delegate" to null, "bytes" to 1000)),
            "methods" to train,
            "state" to mapOf("dtype" to "float32", "numel" to offset, "init_file" to "state_init.bin", "entries" to entries),
            "memory_plan" to mapOf("planned_arena_bytes" to train.associate { it["name"] as String to arenaBytes }, "constant_bytes" to 4096,
                "lora_state_bytes" to 4 * offset, "peak_estimate_bytes" to peakEstimate).filterValues { it != null },
            "tokenizer" to mapOf("kind" to "byte", "vocab" to 264, "pad_token_id" to 258),
            "adapter" to mapOf("init_dir" to "adapter_init", "config" to mapOf("peft_type" to "LORA", "r" to rank, "lora_alpha" to 4.0,
                "target_modules" to listOf("q_proj", "v_proj"), "base_model_name_or_path" to "tiny")),
            "files" to mapOf("model.pte" to "0".repeat(64), "state_init.bin" to "1".repeat(64)),
        )
        return JsonWriter.write(Json.of(m))
    }

    fun manifest(layers: Int = 4, lcsb: Boolean = true, arenaBytes: Long = 1 shl 20, peakEstimate: Long? = null, optimizer: String = "sgd"): Manifest =
        Manifest.parse(manifestJson(layers, lcsb, arenaBytes = arenaBytes, peakEstimate = peakEstimate, optimizer = optimizer))

    /** A deterministic initial state: params small and distinct, AdamW moments and step zero (as the exporter writes them). */
    fun initState(m: Manifest): FloatArray = FloatArray(m.stateNumel).also { s ->
        for (e in m.stateEntries) if (e.role == "param") for (j in e.offset until e.offset + e.numel) s[j] = ((j * 37) % 11 - 5) / 100f
    }

    /** Raw little-endian float32, as the exporter writes state_init.bin. */
    fun leBytes(values: FloatArray): ByteArray =
        java.nio.ByteBuffer.allocate(4 * values.size).order(java.nio.ByteOrder.LITTLE_ENDIAN).also { b -> values.forEach { b.putFloat(it) } }.array()

    /** A program directory holding the manifest's state.init_file (the program file itself is the runtime's business). */
    fun programDir(m: Manifest, init: FloatArray = initState(m)): File = tempDir().also { File(it, m.stateInitFile).writeBytes(leBytes(init)) }

    /** [n] rows of 3..6 byte tokens, one with labels masking its first token. */
    fun rows(n: Int = 5): List<DataRow> = (0 until n).map { i ->
        val ids = IntArray(3 + i % 4) { 65 + (i * 7 + it * 3) % 26 }
        DataRow(ids, if (i == 0) IntArray(ids.size) { if (it == 0) -100 else ids[it] } else ids.copyOf())
    }

    fun tempDir(): File = kotlin.io.path.createTempDirectory("trainer-core-test").toFile().also { it.deleteOnExit() }
}

/** Time that moves only when the code under test sleeps or a test advances it. */
class FakeClock(var nowMs: Long = 1_767_225_600_000L) : Clock {
    val sleeps = ArrayList<Long>()
    override fun wallSeconds(): Double = nowMs / 1000.0
    override fun monoNanos(): Long = nowMs * 1_000_000
    override fun sleepMs(ms: Long) { sleeps.add(ms); nowMs += ms }
}

/** Thrown by [FakeRuntime] to play the process being killed mid-run (an Error: nothing catches it). */
class SimulatedKill : Error("simulated kill")

/**
 * The program as contract version 2 describes it, in plain Kotlin: a pure function of its inputs
 * (input_ids, labels, lr, every state entry) that returns the loss and the new value of each entry it
 * changes, worked out the way the exporter's program does (StepProgram.updated_entries): with SGD only
 * the params of the method's backward layers, with AdamW every param, both moments and adam_step
 * (unselected layers get a zero gradient and still move by momentum). The toy loss pulls params
 * toward a target that depends on the row, so the order of phases and rows shows in the final state.
 * [namedOutputs] false plays a positional runtime (ExecuTorch returns unnamed values).
 */
class FakeRuntime(private val m: Manifest, private val killAtCall: Int? = null, private val lossAt: (Int) -> Float? = { null },
                  private val namedOutputs: Boolean = true) : TrainingRuntime {
    val loaded = LinkedHashSet<String>()
    val calls = ArrayList<String>()
    val events = ArrayList<String>()
    /** Names of the entries each call returned, in call order. */
    val returned = ArrayList<List<String>>()
    private val layerOf = m.stateEntries.map { e -> Regex("layers\\.(\\d+)\\.").find(e.key)?.groupValues?.get(1)?.toInt() }
    private val adamw = m.optimizer == "adamw"

    override fun loadMethod(name: String) {
        require(name in m.methodNames) { "no method $name" }
        loaded.add(name)
        events.add("load:$name")
    }

    override fun execute(method: String, inputs: List<TensorValue>): List<TensorValue> {
        check(loaded.containsAll(m.methodNames)) { "execute before every method was loaded" }
        val spec = m.method(method)
        check(inputs.map { it.name to it.shape } == spec.inputs.map { it.name to it.shape }) { "inputs are not the manifest's: ${inputs.map { it.name }}" }
        check(inputs[0].dtype == DType.INT64 && inputs[1].dtype == DType.INT64 && inputs.drop(2).all { it.dtype == DType.FLOAT32 })
        calls.add(method)
        events.add("step:$method")
        if (killAtCall == calls.size) throw SimulatedKill()
        val labels = inputs[1].longs()
        check(inputs[0].longs().size == m.seqLen && labels.size == m.seqLen) { "inputs must be padded to seq_len" }
        val lr = inputs[2].floats()[0]
        val state = inputs.drop(3).map { it.floats() } // copies: the program never writes into its inputs
        val selected = spec.backwardLayers.toSet()
        val t = (labels.filter { it != -100L }.sum() % 7) / 10f
        val byKey = m.stateEntries.indices.groupBy { m.stateEntries[it].key }
        val step = if (adamw) state[m.stateEntries.indexOfFirst { it.role == "step" }][0] + 1f else 0f
        val new = HashMap<Int, FloatArray>()
        var loss = 0.0
        var count = 0
        m.stateEntries.forEachIndexed { k, e ->
            if (e.role != "param") return@forEachIndexed
            val p = state[k]
            val inPhase = layerOf[k] in selected
            val g = FloatArray(p.size) { j -> if (inPhase) 2 * (p[j] - t) else 0f }
            p.forEach { loss += (it - t) * (it - t); count++ }
            if (!adamw) {
                if (inPhase) new[k] = FloatArray(p.size) { j -> p[j] - lr * g[j] }
                return@forEachIndexed
            }
            val mi = byKey.getValue(e.key).first { m.stateEntries[it].role == "exp_avg" }
            val vi = byKey.getValue(e.key).first { m.stateEntries[it].role == "exp_avg_sq" }
            val mNew = FloatArray(p.size) { j -> 0.9f * state[mi][j] + 0.1f * g[j] }
            val vNew = FloatArray(p.size) { j -> 0.999f * state[vi][j] + 0.001f * g[j] * g[j] }
            val c1 = 1 - Math.pow(0.9, step.toDouble()).toFloat()
            val c2 = 1 - Math.pow(0.999, step.toDouble()).toFloat()
            new[k] = FloatArray(p.size) { j -> p[j] - lr * (mNew[j] / c1) / (Math.sqrt((vNew[j] / c2).toDouble()).toFloat() + 1e-8f) }
            new[mi] = mNew
            new[vi] = vNew
        }
        if (adamw) new[m.stateEntries.indexOfFirst { it.role == "step" }] = floatArrayOf(step)
        val order = new.keys.sorted()
        returned.add(order.map { m.stateEntries[it].name })
        val lossValue = lossAt(calls.size) ?: (loss / count).toFloat()
        fun name(n: String) = if (namedOutputs) n else ""
        return listOf<TensorValue>(TensorValue.Floats(name("loss"), listOf(1), floatArrayOf(lossValue))) +
            order.map { TensorValue.Floats(name(m.stateEntries[it].name), m.stateEntries[it].shape, new.getValue(it)) }
    }

    override fun close() {}
}

/** A probe returning scripted samples: [anon] per call (the last one repeats), plus optional pressure. */
class ScriptedProbe(private val anon: List<Long>, var lowMemory: Boolean = false, var trimLevel: Int? = null) : MemoryProbe {
    var calls = 0
    override fun sample(): List<MemorySample> {
        val a = anon[minOf(calls, anon.size - 1)]
        calls++
        return listOf(MemorySample("android_proc_status", anonBytes = a, rssBytes = a + 100_000_000, peakBytes = a + 120_000_000),
            MemorySample("android_activity_manager", availableBytes = 3_000_000_000, lowMemory = lowMemory, trimLevel = trimLevel))
    }
}

/** JUnit's Kotlin `assertThrows` is not in Debian's junit5 jar: the same, on Assertions.fail. */
inline fun <reified T : Throwable> assertThrows(message: String = "", block: () -> Unit): T {
    try {
        block()
    } catch (e: Throwable) {
        if (e is T) return e
        throw AssertionError("$message: expected ${T::class.java.simpleName}, got $e", e)
    }
    throw AssertionError("$message: expected ${T::class.java.simpleName}, nothing was thrown")
}
