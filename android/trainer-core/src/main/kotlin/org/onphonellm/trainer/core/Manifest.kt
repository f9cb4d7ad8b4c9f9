package org.onphonellm.trainer.core

import java.io.File
import java.security.MessageDigest

/**
 * manifest.json of a program (shared_schemas/manifest.schema.json, schema_version 3): the typed
 * manifest of toolchain/contract/manifest.py (`Manifest`), reduced to the fields an app needs to drive the
 * layer loop (toolchain/runtime/loop.py), flat: the methods with their bound inputs and outputs, the state
 * layout, the loop's flags, the weights / state / tokenizer files. [read] is contract/read.py's
 * `read_program_manifest` for the app (the checks the app relies on; the schema itself is the host's).
 */
class Manifest(
    val dir: File,
    val layers: Int,
    val seqLen: Int,
    val vocab: Int,
    val padTokenId: Int,
    val eosTokenId: Int?,
    val defaultLr: Double?,
    val movesUnselected: Boolean,
    val stepEntry: String?,
    val methods: Map<String, MethodSpec>,
    val stateNumel: Int,
    val stateEntries: List<StateEntry>,
    val stateInitFile: String,
    val weightsFile: String,
    val tokenizerFile: String?,
    val optimizer: String,
    val files: Map<String, String>,
    val adapterConfig: Json.Obj?,
    /** The manifest's default LCSB plan (apps may choose other layers at run time); null: full backprop. */
    val defaultPlan: StepPlan?,
    /** manifest tokenizer.kind: "byte", "qwen2.5", "huggingface" or "none". */
    val tokenizerKind: String = "none",
    /** memory_plan.peak_estimate_bytes.executorch: the exporter's estimate of a step's peak (0: none). */
    val predictedPeakBytes: Long = 0,
    /** memory_plan.checkpoint_bytes: every layer's kept input ([T, d] each) in [predictedPeakBytes] (0: none); the memory-pressure ladder's planner figure. */
    val checkpointBytes: Long = 0,
    /** The PEFT adapter of the initial state (manifest adapter.init_dir), if exported. */
    val adapterInitDir: String? = null,
    val rank: Int = 0,
    val targets: List<String> = emptyList(),
    val modelSource: String = "unknown",
    val quant: String = "none",
    /** The program file for ExecuTorch (programs[target=executorch].file, else model.pte). */
    val programFile: String = "model.pte",
    /** generate.prefill_chunk: tokens per embed_prefill / block_prefill call (C); 0 without the generation methods. */
    val prefillChunk: Int = 0,
    /** generate.fused: the generation methods that call native kernels (int4 programs); null: none. */
    val fused: FusedSection? = null,
    /** generate.xnnpack: the XNNPACK generation variant (per-layer block methods, weights inside); null: none. */
    val xnnpack: XnnpackSection? = null,
    /** quant.head: the embedding and LM head are stored int4 too (embed.qweight / embed.scales). */
    val quantHead: Boolean = false,
    /** compute: the frozen-weight matmuls' precision, "fp32" (absent), "fp16" or "int8" ([Compute]: who can run them). */
    val compute: String = Compute.FP32,
    /** defaults.steps: a run's steps when the user gives none (toolchain export); null: an older program ([runSteps]). */
    val defaultSteps: Long? = null,
) {
    /** A run's lr: the one asked for, else the manifest's (defaults.lr, else optimizer.default_lr), else [Contract.FALLBACK_LR]. */
    fun runLr(asked: Double?): Double = asked ?: defaultLr ?: Contract.FALLBACK_LR

    /** A run's steps: the ones asked for, else the manifest's defaults.steps, else [Contract.FALLBACK_STEPS]. */
    fun runSteps(asked: Long?): Long = asked ?: defaultSteps ?: Contract.FALLBACK_STEPS

    /** Check every file the manifest lists against its sha256 (catches a partial `adb push`); [skip]: files not needed. */
    fun verifyFiles(skip: (String) -> Boolean = { false }) {
        for ((name, sha) in files) {
            if (skip(name)) continue
            val f = File(dir, name)
            if (!f.isFile) throw BadInput("$f is missing; push the program directory again")
            val md = MessageDigest.getInstance("SHA-256")
            f.inputStream().use { ins -> val buf = ByteArray(1 shl 16); while (true) { val n = ins.read(buf); if (n < 0) break; md.update(buf, 0, n) } }
            val got = md.digest().joinToString("") { "%02x".format(it) }
            if (got != sha) throw BadInput("$f does not match the manifest's sha256 (a partial copy?); push the program directory again")
        }
    }

    fun method(name: String): MethodSpec = methods[name] ?: throw BadInput("the program has no method '$name'; re-export the program")
    /** The program has the stock generation methods ([Contract.GENERATION_ROLES]; checked by [parse] when it has `generate`). */
    val hasGeneration: Boolean get() = prefillChunk > 0 && Contract.GENERATION_ROLES.all { it in methods }

    companion object {
        private val BINDS = setOf("input", "result", "activation", "weight", "state", "cache")

        fun read(dir: File): Manifest {
            val f = File(dir, Contract.MANIFEST_NAME)
            if (!f.isFile) throw BadInput("$dir is not an exported program (no ${Contract.MANIFEST_NAME})")
            return parse(dir, Json.parse(f.readText(Charsets.UTF_8)), f.path)
        }

        fun parse(dir: File, doc: Json, where: String): Manifest {
            val m = Fields.of(doc, where)
            val version = m.int("schema_version")
            if (version < Contract.MANIFEST_SCHEMA_VERSION) throw BadInput("$where: schema_version $version; re-export the program with this toolchain")
            if (version > Contract.MANIFEST_SCHEMA_VERSION) throw BadInput("$where: schema_version $version is newer than this app (${Contract.MANIFEST_SCHEMA_VERSION}); update the app")
            val arch = m.obj("model").obj("arch")
            val layers = arch.int("layers")
            val loop = m.obj("loop")
            if (loop.int("layers") != layers) throw BadInput("$where: loop.layers ${loop.int("layers")} is not the model's $layers")
            val tok = m.obj("tokenizer")
            val state = m.obj("state")
            val numel = state.int("numel")
            val entries = state.arr("entries").mapIndexed { i, e ->
                val ef = Fields.of(e, "$where.state.entries[$i]")
                StateEntry(ef.string("name"), ef.optString("key") ?: "", ef.string("role"), ef.ints("shape"), ef.int("offset"), ef.optInt("layer"))
            }
            for (e in entries) if (e.offset < 0 || e.offset + e.numel > numel)
                throw BadInput("$where: state entry ${e.name} [${e.offset}, ${e.offset + e.numel}) lies outside the $numel state values")
            val byName = entries.associateBy { it.name }
            val stepEntry = state.optString("step_entry")
            if (stepEntry != null && stepEntry !in byName) throw BadInput("$where: state.step_entry '$stepEntry' is not an entry")
            val methods = LinkedHashMap<String, MethodSpec>()
            m.arr("methods").forEachIndexed { i, mj ->
                val mf = Fields.of(mj, "$where.methods[$i]")
                val name = mf.string("name")
                fun ios(key: String) = mf.arr(key).mapIndexed { j, io ->
                    val f = Fields.of(io, "$where.methods[$name].$key[$j]")
                    val bind = f.string("bind")
                    if (bind !in BINDS) throw BadInput("${f.where}: bind '$bind' is not one of $BINDS")
                    val rows = if (f.has("rows")) f.ints("rows").let { r ->
                        if (r.size != 2 || r[0] < 0 || r[1] <= r[0]) throw BadInput("${f.where}: rows $r is not [start, stop)")
                        Pair(r[0], r[1])
                    } else null
                    IoSpec(f.string("name"), ElemType.of(f.string("dtype"), f.where), f.ints("shape"), bind, f.string("ref"), rows)
                }
                val kernels = if (mf.has("kernels")) mf.strings("kernels") else emptyList()
                val method = MethodSpec(name, mf.optString("role") ?: name, ios("inputs"), ios("outputs"), kernels)
                for (io in method.inputs + method.outputs) if (io.bind == "state") {
                    val e = byName[io.refAt(0)] ?: byName[io.ref] ?: throw BadInput("$where: $name ${io.name} refers to no state entry '${io.ref}'")
                    if (e.numel != io.numel) throw BadInput("$where: $name ${io.name} has shape ${io.shape}, its entry ${e.name} ${e.shape}")
                }
                methods[name] = method
            }
            for (need in Contract.TRAINING_ROLES - "block_skip_update")  // block_skip_update: only when the loop moves unselected layers
                if (need !in methods) throw BadInput("$where: no '$need' method; re-export the program")
            val moves = loop.bool("moves_unselected")
            if (moves && "block_skip_update" !in methods) throw BadInput("$where: loop.moves_unselected without a block_skip_update method")
            val quantObj = if (m.has("quant")) m.obj("quant") else null
            val quantKind = quantObj?.optString("kind") ?: "none"
            // Same schema_version 3, older export (toolchain/contract/read.py _refuse_before_fused_generation).
            if (quantKind == "int4" && quantObj?.obj?.fields?.containsKey("head") != true)
                throw BadInput("$where: an int4 program exported before the int4 embedding and LM head (no quant.head); re-export the program with this toolchain")
            val compute = Compute.parse(m.optString("compute"), where)
            val quantHead = quantObj?.let { if (it.has("head")) it.bool("head") else false } ?: false
            var prefillChunk = 0
            var fused: FusedSection? = null
            var xnnpack: XnnpackSection? = null
            if (m.has("generate")) {
                val g = m.obj("generate")
                if (!g.has("prefill_chunk"))
                    throw BadInput("$where: the generation methods were exported before chunked prefill (no generate.prefill_chunk, block_kv over the whole seq_len); re-export the program with this toolchain")
                prefillChunk = g.int("prefill_chunk")
                if (prefillChunk < 1) throw BadInput("${g.where}: prefill_chunk $prefillChunk is not >= 1")
                for (need in Contract.GENERATION_ROLES)
                    if (need !in methods) throw BadInput("$where: generate is set but there is no '$need' method; re-export the program")
                if (g.has("fused")) {
                    val f = g.obj("fused")
                    val map = f.obj("methods").obj.fields.mapValues { (k, v) -> (v as? Json.Str)?.value ?: throw BadInput("${f.where}.methods.$k is not a string") }
                    for ((stock, name) in map) {
                        if (stock !in methods || name !in methods) throw BadInput("${f.where}: $stock -> $name names a method the program lacks; re-export the program")
                        if (methods.getValue(name).outputs.map { Triple(it.name, it.shape, it.bind) } != methods.getValue(stock).outputs.map { Triple(it.name, it.shape, it.bind) })
                            throw BadInput("${f.where}: $name does not return what $stock returns; re-export the program")
                    }
                    fused = FusedSection(f.strings("kernels"), f.string("source"), map)
                }
                if (g.has("xnnpack")) {
                    val x = g.obj("xnnpack")
                    val map = x.obj("methods").obj.fields.mapValues { (k, v) -> (v as? Json.Str)?.value ?: throw BadInput("${x.where}.methods.$k is not a string") }
                    for ((role, pattern) in map) {
                        if (role !in Contract.GENERATION_ROLES) throw BadInput("${x.where}: $role is not a generation role; re-export the program")
                        val perLayer = Contract.LAYER in pattern
                        for (i in (if (perLayer) 0 until layers else 0 until 1)) {
                            val name = if (perLayer) pattern.replace(Contract.LAYER, i.toString()) else pattern
                            val method = methods[name] ?: throw BadInput("${x.where}: $role -> $name names a method the program lacks; re-export the program")
                            if (method.outputs.map { Triple(it.name, it.shape, it.bind) } != methods.getValue(role).outputs.map { Triple(it.name, it.shape, it.bind) })
                                throw BadInput("${x.where}: $name does not return what $role returns; re-export the program")
                        }
                    }
                    xnnpack = XnnpackSection(map, x.long("weight_bytes"))
                }
            }
            val filesObj = m.obj("files").obj.fields.mapValues { (k, v) -> (v as? Json.Str)?.value ?: throw BadInput("$where: files.$k is not a string") }
            val opt = m.obj("optimizer")
            // defaults (toolchain export: the measured run defaults, one source for the host and both apps); absent: older
            val defaults = if (m.has("defaults")) m.obj("defaults") else null
            val dLr = defaults?.double("lr")
            val dSteps = defaults?.long("steps")
            if (dLr != null && !(dLr > 0.0 && dLr.isFinite())) throw BadInput("$where: defaults.lr must be > 0, got $dLr")
            if (dSteps != null && dSteps < 1) throw BadInput("$where: defaults.steps must be >= 1, got $dSteps")
            return Manifest(
                dir = dir, layers = layers, seqLen = m.int("seq_len"), vocab = arch.int("vocab"),
                padTokenId = tok.int("pad_token_id"), eosTokenId = tok.optInt("eos_token_id"),
                defaultLr = dLr ?: opt.optDouble("default_lr"), movesUnselected = moves, stepEntry = stepEntry,
                methods = methods, stateNumel = numel, stateEntries = entries, stateInitFile = state.string("init_file"),
                weightsFile = m.obj("weights").string("file"), tokenizerFile = tok.optString("file"),
                optimizer = opt.string("kind"), files = filesObj,
                adapterConfig = if (m.has("adapter")) m.obj("adapter").let { a -> if (a.has("config")) a.obj("config").obj else null } else null,
                defaultPlan = if (m.has("lcsb")) m.obj("lcsb").let { l ->
                    val phases = l.arr("phases").map { p -> (p as? Json.Arr)?.items?.map { (it as Json.Num).asLongOrNull!!.toInt() } ?: throw BadInput("${l.where}: bad phases") }
                    val schedule = l.ints("schedule")
                    if (phases.isEmpty() || schedule.any { it !in phases.indices } || phases.any { p -> p.isEmpty() || p.any { it !in 0 until layers } })
                        throw BadInput("${l.where}: phases/schedule do not fit $layers layers")
                    val warmup = l.optLong("warmup") ?: 0L
                    if (warmup < 0) throw BadInput("${l.where}: warmup must be >= 0, got $warmup")
                    StepPlan(layers, l.string("policy"), l.optInt("k") ?: layers, l.optLong("seed"), phases, schedule, warmup)
                } else null,
                tokenizerKind = tok.optString("kind") ?: "none",
                predictedPeakBytes = if (m.has("memory_plan") && m.obj("memory_plan").has("peak_estimate_bytes"))
                    m.obj("memory_plan").obj("peak_estimate_bytes").optLong("executorch") ?: 0L else 0L,
                checkpointBytes = if (m.has("memory_plan")) m.obj("memory_plan").optLong("checkpoint_bytes") ?: 0L else 0L,
                adapterInitDir = if (m.has("adapter")) m.obj("adapter").optString("init_dir") else null,
                rank = if (m.has("lora")) m.obj("lora").optInt("rank") ?: 0 else 0,
                targets = if (m.has("lora") && m.obj("lora").has("targets")) m.obj("lora").strings("targets") else emptyList(),
                modelSource = m.obj("model").optString("source") ?: "unknown",
                quant = quantKind,
                programFile = if (m.has("programs")) m.arr("programs").map { Fields.of(it, "$where.programs[]") }
                    .firstOrNull { (it.optString("target") ?: "executorch") == "executorch" }?.optString("file") ?: "model.pte" else "model.pte",
                prefillChunk = prefillChunk, fused = fused, xnnpack = xnnpack, quantHead = quantHead, compute = compute,
                defaultSteps = dSteps,
            )
        }
    }
}
