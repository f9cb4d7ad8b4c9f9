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

    val manifestExample: File get() = File(examples, "manifest_tiny.json")

    /**
     * A manifest shaped like `toolchain export` writes (export/build.py): [layers] layers, LoRA rank 2 on
     * q_proj (8 -> 8) and v_proj (8 -> 4), SGD, LCSB phases of two layers (or none).
     */
    fun manifestJson(layers: Int = 4, lcsb: Boolean = true, seqLen: Int = 8, arenaBytes: Long = 1 shl 20, peakEstimate: Long? = null): String {
        val rank = 2
        val shapes = mapOf("q_proj" to (8 to 8), "v_proj" to (4 to 8))
        val entries = ArrayList<Map<String, Any?>>()
        var offset = 0
        for (i in 0 until layers) for ((t, io) in shapes) for (which in listOf("a", "b")) {
            val shape = if (which == "a") listOf(rank, io.second) else listOf(io.first, rank)
            val proj = if (t == "q_proj" || t == "v_proj") "self_attn" else "mlp"
            entries.add(mapOf("name" to "lora_${i}_${t}_$which", "key" to "base_model.model.model.layers.$i.$proj.$t.lora_${which.uppercase()}.weight",
                "role" to "param", "shape" to shape, "offset" to offset))
            offset += shape[0] * shape[1]
        }
        val phases = if (lcsb) (0 until layers).chunked(2) else null
        val io = mapOf("inputs" to listOf(mapOf("name" to "input_ids", "dtype" to "int64", "shape" to listOf(seqLen)),
            mapOf("name" to "labels", "dtype" to "int64", "shape" to listOf(seqLen)), mapOf("name" to "lr", "dtype" to "float32", "shape" to listOf(1))),
            "outputs" to listOf(mapOf("name" to "loss", "dtype" to "float32", "shape" to listOf(1))))
        val train = (phases?.indices?.map { it as Int? } ?: listOf(null)).map { k ->
            mapOf("name" to (if (k == null) "train_step" else "train_step_p$k"), "kind" to "train_step", "phase" to k,
                "backward_layers" to (if (k == null) (0 until layers).toList() else phases!![k])) + io
        }
        val state = mapOf("name" to "state", "dtype" to "float32", "shape" to listOf(offset))
        val methods = train + listOf(mapOf("name" to "get_state", "kind" to "get_state", "inputs" to emptyList<Any>(), "outputs" to listOf(state)),
            mapOf("name" to "set_state", "kind" to "set_state", "inputs" to listOf(state), "outputs" to listOf(mapOf("name" to "entries", "dtype" to "float32", "shape" to listOf(1)))))
        val m = linkedMapOf(
            "schema_version" to 1, "toolchain_version" to "0.1.0",
            "model" to mapOf("source" to "tiny", "init" to "random", "seed" to 0, "arch" to mapOf("hidden" to 8, "layers" to layers, "heads" to 2,
                "kv_heads" to 1, "intermediate" to 16, "vocab" to 264, "max_positions" to 64, "rms_eps" to 1e-6, "rope_theta" to 1e6, "tie_embeddings" to true)),
            "lora" to mapOf("rank" to rank, "alpha" to 4.0, "scale" to 2.0, "targets" to listOf("q_proj", "v_proj")),
            "seq_len" to seqLen, "quant" to mapOf("kind" to "none", "group" to 64),
            "optimizer" to mapOf("kind" to "sgd", "weight_decay" to 0.0, "default_lr" to 0.01),
            "lcsb" to phases?.let { mapOf("policy" to "cyclic", "k" to 2, "phases" to it, "schedule" to it.indices.toList()) },
            "programs" to listOf(mapOf("target" to "executorch", "file" to "model.pte", "delegate" to null, "bytes" to 1000)),
            "methods" to methods,
            "state" to mapOf("dtype" to "float32", "numel" to offset, "entries" to entries),
            "memory_plan" to mapOf("planned_arena_bytes" to train.associate { it["name"] as String to arenaBytes }, "constant_bytes" to 4096,
                "lora_state_bytes" to 4 * offset, "peak_estimate_bytes" to peakEstimate).filterValues { it != null },
            "tokenizer" to mapOf("kind" to "byte", "vocab" to 264, "pad_token_id" to 258),
            "adapter" to mapOf("init_dir" to "adapter_init", "config" to mapOf("peft_type" to "LORA", "r" to rank, "lora_alpha" to 4.0,
                "target_modules" to listOf("q_proj", "v_proj"), "base_model_name_or_path" to "tiny")),
            "files" to mapOf("model.pte" to "0".repeat(64)),
        )
        return JsonWriter.write(Json.of(m))
    }

    fun manifest(layers: Int = 4, lcsb: Boolean = true, arenaBytes: Long = 1 shl 20, peakEstimate: Long? = null): Manifest =
        Manifest.parse(manifestJson(layers, lcsb, arenaBytes = arenaBytes, peakEstimate = peakEstimate))

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
 * The program as the contract describes it, in plain Kotlin: a flat state of LoRA params; loading a
 * method re-initializes the state (as the ExecuTorch runtime does); a train method moves only the
 * params of its phase's layers, by SGD on a toy loss that depends on the row, so the order of phases
 * and rows shows in the final state.
 */
class FakeRuntime(private val m: Manifest, private val killAtCall: Int? = null, private val lossAt: (Int) -> Float? = { null }) : TrainingRuntime {
    val init = FloatArray(m.stateNumel) { ((it * 37) % 11 - 5) / 100f }
    var current = init.copyOf()
    val loaded = LinkedHashSet<String>()
    val calls = ArrayList<String>()
    val events = ArrayList<String>()
    private val layerOf = m.stateEntries.map { e -> Regex("layers\\.(\\d+)\\.").find(e.key)!!.groupValues[1].toInt() }

    override fun loadMethod(name: String) {
        require(name in m.methodNames) { "no method $name" }
        loaded.add(name)
        current = init.copyOf()
        events.add("load:$name")
    }

    override fun trainStep(method: String, inputIds: LongArray, labels: LongArray, lr: Float): Float {
        check(loaded.containsAll(m.methodNames)) { "train_step before every method was loaded" }
        require(inputIds.size == m.seqLen && labels.size == m.seqLen) { "inputs must be padded to seq_len" }
        calls.add(method)
        events.add("step:$method")
        if (killAtCall == calls.size) throw SimulatedKill()
        val layers = m.methods.first { it.name == method }.backwardLayers.toSet()
        val t = (labels.filter { it != -100L }.sum() % 7) / 10f
        var loss = 0.0
        m.stateEntries.forEachIndexed { k, e ->
            for (j in e.offset until e.offset + e.numel) {
                val d = current[j] - t
                loss += d * d
                if (e.role == "param" && layerOf[k] in layers) current[j] -= lr * 2 * d
            }
        }
        return lossAt(calls.size) ?: (loss / m.stateNumel).toFloat()
    }

    override fun getState(): FloatArray = current.copyOf().also { events.add("get_state") }

    override fun setState(state: FloatArray) {
        require(state.size == m.stateNumel)
        current = state.copyOf()
        events.add("set_state")
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
