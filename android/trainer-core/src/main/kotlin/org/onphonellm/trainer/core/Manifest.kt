package org.onphonellm.trainer.core

import java.io.File
import java.security.MessageDigest

/**
 * manifest.json of an exported program directory (shared_schemas/manifest.schema.json, schema_version
 * 2: functional state), reduced to what an app needs to drive the program, and checked for the
 * consistency the app relies on: every LCSB phase has its method; each method takes input_ids,
 * labels, lr and then every state entry in order, and returns the loss and then a subset of the
 * entries in order, shaped as the entries; entries lie inside the state; the initial state file is
 * listed with its checksum.
 */
class Manifest(
    val modelSource: String,
    val layers: Int,
    val vocab: Int,
    val rank: Int,
    val targets: List<String>,
    val seqLen: Int,
    val quant: String,
    val optimizer: String,
    val defaultLr: Double?,
    val lcsb: Lcsb?,
    val programFile: String,
    val methods: List<MethodSpec>,
    val stateNumel: Int,
    val stateEntries: List<StateEntry>,
    val stateInitFile: String,
    val plannedArenaBytes: Map<String, Long>,
    val loraStateBytes: Long,
    val peakEstimateBytes: Long?,
    val padTokenId: Int,
    val adapterConfig: Json.Obj,
    val adapterInitDir: String,
    val files: Map<String, String>,
) {
    data class Lcsb(val policy: String, val k: Int?, val phases: List<List<Int>>, val schedule: List<Int>)
    data class TensorSpec(val name: String, val dtype: String, val shape: List<Int>) {
        val numel: Int get() = shape.fold(1) { a, b -> a * b }
    }
    data class MethodSpec(val name: String, val kind: String, val phase: Int?, val backwardLayers: List<Int>,
                          val inputs: List<TensorSpec>, val outputs: List<TensorSpec>) {
        /** Names of the state entries the method returns (every output after the loss). */
        val updatedEntries: List<String> get() = outputs.drop(1).map { it.name }
    }
    data class StateEntry(val name: String, val key: String, val role: String, val shape: List<Int>, val offset: Int) {
        val numel: Int get() = shape.fold(1) { a, b -> a * b }
    }

    /** Names of every method, in manifest order: the app loads all of them before the first call. */
    val methodNames: List<String> get() = methods.map { it.name }

    private val methodByName: Map<String, MethodSpec> by lazy { methods.associateBy { it.name } }
    private val entryByName: Map<String, StateEntry> by lazy { stateEntries.associateBy { it.name } }

    fun method(name: String): MethodSpec = methodByName[name] ?: throw ContractError("the program has no method '$name'; re-export the program")

    fun entry(name: String): StateEntry? = entryByName[name]

    /**
     * Bytes a step may add on top of the memory resident after loading the program and the state
     * array: the largest planned arena of a train method (activations and the method's outputs; pages
     * not yet touched become resident on its first call) plus one copy of the state (the runtime's
     * input buffers: ExecuTorch's JNI reads inputs from direct memory, not from the Java array).
     * `peak_estimate_bytes`, when the exporter records it, replaces the arena term.
     */
    fun predictedStepBytes(): Long {
        val arena = peakEstimateBytes ?: methods.filter { it.kind == "train_step" }
            .maxOfOrNull { plannedArenaBytes[it.name] ?: 0L } ?: 0L
        return arena + 4L * stateNumel
    }

    companion object {
        /** The contract version this app drives. */
        const val SCHEMA_VERSION = 2

        fun load(file: File): Manifest = parse(file.readText(), file.name)

        fun parse(text: String, where: String = "manifest.json"): Manifest {
            val f = Fields.of(Json.parse(text), where)
            when (val v = f.int("schema_version")) {
                SCHEMA_VERSION -> Unit
                1 -> throw ContractError("$where: schema_version 1 (state inside the program, get_state/set_state) is retired; " +
                    "this app runs version $SCHEMA_VERSION (functional state): re-export the program with the current toolchain")
                else -> throw ContractError("$where: schema_version $v is not $SCHEMA_VERSION; " +
                    if (v > SCHEMA_VERSION) "update the app" else "re-export the program with the current toolchain")
            }
            val arch = f.obj("model").obj("arch")
            val lora = f.obj("lora")
            val lcsb = if (f.has("lcsb")) f.obj("lcsb").let { l ->
                Lcsb(l.string("policy"), l.optInt("k"), l.arr("phases").mapIndexed { i, p ->
                    (p as? Json.Arr)?.items?.map { (it as? Json.Num)?.asLongOrNull?.toInt() ?: throw ContractError("$where: lcsb.phases[$i] must hold integers") }
                        ?: throw ContractError("$where: lcsb.phases[$i] must be an array")
                }, l.ints("schedule"))
            } else null
            val methods = f.arr("methods").mapIndexed { i, m ->
                val mf = Fields.of(m, "$where.methods[$i]")
                fun io(key: String) = mf.arr(key).mapIndexed { j, t ->
                    val tf = Fields.of(t, "${mf.where}.$key[$j]")
                    TensorSpec(tf.string("name"), tf.string("dtype"), tf.ints("shape"))
                }
                MethodSpec(mf.string("name"), mf.string("kind"), mf.optInt("phase"), if (mf.has("backward_layers")) mf.ints("backward_layers") else emptyList(),
                    io("inputs"), io("outputs"))
            }
            val state = f.obj("state")
            val entries = state.arr("entries").mapIndexed { i, e ->
                val ef = Fields.of(e, "$where.state.entries[$i]")
                StateEntry(ef.string("name"), ef.string("key"), ef.string("role"), ef.ints("shape"), ef.int("offset"))
            }
            val plan = f.obj("memory_plan")
            val arenas = plan.obj("planned_arena_bytes").let { a -> a.obj.fields.keys.associateWith { a.long(it) } }
            val programs = f.arr("programs").map { Fields.of(it, "$where.programs[]") }
            val et = programs.firstOrNull { it.string("target") == "executorch" }
                ?: throw ContractError("$where: no executorch program in 'programs'; export with --target executorch")
            val tok = f.obj("tokenizer")
            val adapter = f.obj("adapter")
            val files = f.obj("files").let { fl -> fl.obj.fields.keys.associateWith { fl.string(it) } }
            return Manifest(
                modelSource = f.obj("model").string("source"), layers = arch.int("layers"), vocab = tok.int("vocab"),
                rank = lora.int("rank"), targets = lora.strings("targets"), seqLen = f.int("seq_len"),
                quant = f.obj("quant").string("kind"), optimizer = f.obj("optimizer").string("kind"),
                defaultLr = f.obj("optimizer").optDouble("default_lr"), lcsb = lcsb, programFile = et.string("file"),
                methods = methods, stateNumel = state.int("numel"), stateEntries = entries, stateInitFile = state.string("init_file"),
                plannedArenaBytes = arenas,
                loraStateBytes = plan.long("lora_state_bytes"), peakEstimateBytes = plan.optLong("peak_estimate_bytes"),
                padTokenId = tok.int("pad_token_id"), adapterConfig = adapter.obj("config").obj,
                adapterInitDir = adapter.string("init_dir"), files = files,
            ).also { it.check(where) }
        }
    }

    private fun check(where: String) {
        fun fail(why: String): Nothing = throw ContractError("$where: $why; re-export the program")
        if (seqLen < 2) fail("seq_len $seqLen < 2")
        if (padTokenId !in 0 until vocab) fail("pad_token_id $padTokenId is outside the vocabulary of $vocab")
        val byName = methods.associateBy { it.name }
        if (byName.size != methods.size) fail("method names repeat")
        methods.forEach { if (it.kind != "train_step") fail("method ${it.name} has kind '${it.kind}'; version $SCHEMA_VERSION has only train_step methods") }
        val l = lcsb
        if (l == null) {
            if (byName["train_step"]?.kind != "train_step") fail("lcsb is null but there is no 'train_step' method")
        } else {
            if (l.phases.isEmpty() || l.schedule.isEmpty()) fail("lcsb needs at least one phase and one schedule entry")
            l.schedule.forEach { if (it !in l.phases.indices) fail("lcsb.schedule names phase $it of ${l.phases.size}") }
            l.phases.forEachIndexed { p, layersOfPhase ->
                val m = byName["train_step_p$p"] ?: fail("no method 'train_step_p$p' for LCSB phase $p")
                if (m.phase != p) fail("method ${m.name} records phase ${m.phase}, expected $p")
                if (m.backwardLayers.isNotEmpty() && m.backwardLayers.sorted() != layersOfPhase.sorted()) {
                    fail("method ${m.name} backpropagates ${m.backwardLayers}, lcsb.phases[$p] says $layersOfPhase")
                }
                layersOfPhase.forEach { if (it !in 0 until layers) fail("lcsb.phases[$p] names layer $it of $layers") }
            }
        }
        var end = 0
        for (e in stateEntries.sortedBy { it.offset }) {
            if (e.offset < end) fail("state entry ${e.name} overlaps the previous one")
            end = e.offset + e.numel
            if (end > stateNumel) fail("state entry ${e.name} ends at $end, past state.numel $stateNumel")
        }
        if (stateEntries.none { it.role == "param" }) fail("state has no 'param' entries")
        if (stateEntries.map { it.name }.toSet().size != stateEntries.size) fail("state entry names repeat")
        if (stateInitFile !in files) fail("state.init_file '$stateInitFile' is not listed in files (no checksum)")
        methods.forEach { checkSignature(it, ::fail) }
    }

    /** Inputs: input_ids, labels, lr, every state entry in order; outputs: loss, then entries in order. */
    private fun checkSignature(m: MethodSpec, fail: (String) -> Nothing) {
        val fixed = listOf(TensorSpec("input_ids", "int64", listOf(seqLen)), TensorSpec("labels", "int64", listOf(seqLen)),
            TensorSpec("lr", "float32", listOf(1)))
        val state = stateEntries.map { TensorSpec(it.name, "float32", it.shape) }
        val want = fixed + state
        if (m.inputs.size != want.size) fail("method ${m.name} takes ${m.inputs.size} inputs, the contract ${want.size} (input_ids, labels, lr, ${state.size} state entries)")
        m.inputs.zip(want).forEachIndexed { i, (got, exp) ->
            if (got != exp) fail("input $i of method ${m.name} is ${got.name} ${got.dtype}${got.shape}, the contract says ${exp.name} ${exp.dtype}${exp.shape}")
        }
        val loss = m.outputs.firstOrNull()
        if (loss != TensorSpec("loss", "float32", listOf(1))) fail("the first output of method ${m.name} must be loss float32[1], not ${loss?.let { "${it.name} ${it.dtype}${it.shape}" }}")
        var last = -1
        for (o in m.outputs.drop(1)) {
            val k = stateEntries.indexOfFirst { it.name == o.name }
            if (k < 0) fail("output '${o.name}' of method ${m.name} is not a state entry")
            if (k <= last) fail("outputs of method ${m.name} are not in state.entries order (or repeat): '${o.name}'")
            last = k
            val e = stateEntries[k]
            if (o.dtype != "float32" || o.shape != e.shape) fail("output '${o.name}' of method ${m.name} is ${o.dtype}${o.shape}, the state entry float32${e.shape}")
        }
    }

    /**
     * Check every file listed in `files` against its sha256 (a partial `adb push` shows up here, not
     * as a crash inside the runtime). Reads the files once; a 1 GB program takes seconds on a phone.
     */
    fun verifyFiles(dir: File) {
        for ((rel, digest) in files) {
            val file = File(dir, rel)
            if (!file.isFile) throw ContractError("$dir: $rel is missing (listed in manifest.json); push the whole program directory again")
            val md = MessageDigest.getInstance("SHA-256")
            file.inputStream().use { input ->
                val buf = ByteArray(1 shl 16)
                while (true) {
                    val n = input.read(buf)
                    if (n < 0) break
                    md.update(buf, 0, n)
                }
            }
            val hex = md.digest().joinToString("") { "%02x".format(it) }
            if (hex != digest) throw ContractError("$dir: $rel does not match its sha256 in manifest.json; push it again")
        }
    }
}
