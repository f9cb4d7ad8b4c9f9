package org.onphonellm.trainer.core

import java.io.File
import java.io.RandomAccessFile
import java.nio.ByteBuffer
import java.nio.ByteOrder
import java.nio.channels.FileChannel
import java.security.MessageDigest

/** Element types of contract-v3 tensors (manifest names; safetensors names). */
enum class ElemType(val manifestName: String, val safetensorsName: String, val size: Int) {
    FLOAT32("float32", "F32", 4), INT64("int64", "I64", 8), INT32("int32", "I32", 4),
    UINT8("uint8", "U8", 1), INT8("int8", "I8", 1);

    companion object {
        fun of(name: String, where: String): ElemType =
            values().firstOrNull { it.manifestName == name } ?: throw BadInput("$where: dtype '$name' is not one of ${values().map { it.manifestName }}")
        fun ofSafetensors(name: String, where: String): ElemType =
            values().firstOrNull { it.safetensorsName == name } ?: throw BadInput("$where: safetensors dtype '$name' is not supported")
    }
}

/**
 * A tensor of contract v3: a window of a little-endian buffer (the mapped weights file, the state array,
 * an activation the app keeps, or the runtime's output memory), never copied to be passed on. [data] has
 * position 0 and exactly [nbytes] remaining. A runtime's output may be valid only until its next call.
 */
class TensorBuffer(val name: String, val dtype: ElemType, val shape: List<Int>, data: ByteBuffer) {
    val numel: Int = shape.fold(1) { a, b -> a * b }
    val nbytes: Int = numel * dtype.size
    val data: ByteBuffer = data.order(ByteOrder.LITTLE_ENDIAN)

    init {
        if (data.position() != 0 || data.remaining() != nbytes)
            throw BadInput("$name: ${data.remaining()} bytes from position ${data.position()} for $dtype$shape ($nbytes bytes)")
    }

    fun float(i: Int): Float = data.getFloat(4 * i)
    fun long(i: Int): Long = data.getLong(8 * i)
    fun floats(): FloatArray = FloatArray(numel) { data.getFloat(4 * it) }

    /** sha256 of exactly the tensor's bytes (row-major, little-endian). */
    fun sha256(): String = sha256Hex(data)

    /** A new direct buffer holding a copy (what the app keeps of a runtime output). */
    fun copy(name: String = this.name): TensorBuffer = TensorBuffer(name, dtype, shape, ByteBuffer.allocateDirect(nbytes).also { copyBytes(data, it, 0) })

    override fun toString(): String = "$name $dtype$shape"

    companion object {
        fun floats(name: String, shape: List<Int>, values: FloatArray): TensorBuffer {
            val b = ByteBuffer.allocateDirect(4 * values.size).order(ByteOrder.LITTLE_ENDIAN)
            for ((i, v) in values.withIndex()) b.putFloat(4 * i, v)
            return TensorBuffer(name, ElemType.FLOAT32, shape, b)
        }
        fun longs(name: String, shape: List<Int>, values: LongArray): TensorBuffer {
            val b = ByteBuffer.allocateDirect(8 * values.size).order(ByteOrder.LITTLE_ENDIAN)
            for ((i, v) in values.withIndex()) b.putLong(8 * i, v)
            return TensorBuffer(name, ElemType.INT64, shape, b)
        }
    }
}

/** Bytes [from, from + len) of [b] as a little-endian buffer of its own (shares the memory). */
fun ByteBuffer.window(from: Int, len: Int): ByteBuffer {
    val d = duplicate()
    d.limit(from + len)
    d.position(from)
    return d.slice().order(ByteOrder.LITTLE_ENDIAN)
}

/** Copy all of [src] (from its position 0) into [dst] at byte [at]; neither buffer's position changes. */
fun copyBytes(src: ByteBuffer, dst: ByteBuffer, at: Int) {
    val s = src.duplicate()
    s.position(0)
    val d = dst.duplicate()
    d.position(at)
    d.put(s)
}

fun sha256Hex(b: ByteBuffer): String {
    val md = MessageDigest.getInstance("SHA-256")
    val d = b.duplicate()
    d.position(0)
    md.update(d)
    return md.digest().joinToString("") { "%02x".format(it) }
}

/**
 * manifest.json of a contract-v3 program (shared_schemas/manifest.schema.json, schema_version 3): the typed
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

/** What a message about a weights file changed under its mapping tells the user to do. */
const val WEIGHTS_CHANGED_ADVICE = "re-import the program (or put its files back as they were) and resume"

/**
 * What tells that a file changed without reading it: its size, its modification time (ms) and, where the
 * platform gives it, its (device, inode) [key] (null: not known; java.io.File has no inode, the app's
 * source reads it with android.system.Os.stat).
 */
data class FileIdentity(val size: Long, val mtimeMs: Long, val key: String? = null) {
    /** Why [now] (null: the file is gone) is not the file this identity was taken of; null: the same. */
    fun changeTo(now: FileIdentity?, file: File): String? = when {
        now == null -> "$file is gone"
        key != null && now.key != null && now.key != key -> "$file was replaced by another file"
        now.size != size -> "$file changed size from $size to ${now.size} bytes"
        now.mtimeMs != mtimeMs -> "$file was modified"
        else -> null
    }
}

/** Reads a file's [FileIdentity] (null: no such file, or it cannot be read). */
fun interface FileIdentitySource {
    fun identity(file: File): FileIdentity?

    companion object {
        /** java.io.File's size and modification time (no inode: a same-size replacement within the same millisecond is not seen). */
        val JAVA = FileIdentitySource { f -> if (f.isFile) FileIdentity(f.length(), f.lastModified()) else null }
    }
}

/**
 * weights.safetensors memory-mapped: each tensor a read-only direct buffer over the file's pages
 * (`FileChannel.map`, one mapping per tensor so files over 2 GiB work), passed to the runtime as is.
 *
 * The file must not change while it is mapped: a page read past a new, shorter end is a SIGBUS, which kills
 * the process. [identity] is the file's, read (by [identities]) just before it was mapped; [checkChanged]
 * compares it with the file's now, and the training session calls it at every step boundary. Once a change
 * is seen the mapping is [stale] for good: every [LayerLoop] over it refuses to call the program again.
 */
class MappedWeights private constructor(val file: File, val tensors: Map<String, TensorBuffer>, val identity: FileIdentity,
                                        private val identities: FileIdentitySource) {
    operator fun get(key: String): TensorBuffer = tensors[key] ?: throw BadInput("$file has no tensor '$key'; re-export the program")

    /** Why the mapping is no longer trusted (the first change [checkChanged] saw), or null. */
    @Volatile var stale: String? = null
        private set

    /**
     * Why the file is not the one mapped any more (another file in its place, another size, a newer
     * modification time, gone), or null; a change, once seen, is kept ([stale]), whatever the file does next.
     */
    fun checkChanged(): String? {
        stale?.let { return it }
        val now = try { identities.identity(file) } catch (e: Exception) { null }
        val why = identity.changeTo(now, file) ?: return null
        synchronized(this) { if (stale == null) stale = why }
        return stale
    }

    /** Rows [a, b) of [key] (a view of the mapped rows, no copy). */
    fun rows(key: String, a: Int, b: Int): TensorBuffer {
        val t = get(key)
        if (t.shape.isEmpty() || b > t.shape[0]) throw BadInput("$file: rows [$a, $b) of $key ${t.shape}")
        val rowBytes = t.nbytes / t.shape[0]
        return TensorBuffer(key, t.dtype, listOf(b - a) + t.shape.drop(1), t.data.window(a * rowBytes, (b - a) * rowBytes))
    }

    companion object {
        /** Map [file]; its identity is read by [identities] first (a change between the two is seen at the first check). */
        fun map(file: File, identities: FileIdentitySource = FileIdentitySource.JAVA): MappedWeights {
            val identity = try { identities.identity(file) } catch (e: Exception) { null }
                ?: throw BadInput("cannot read the size and time of $file; re-import the program")
            return mapFile(file, identity, identities)
        }

        private fun mapFile(file: File, identity: FileIdentity, identities: FileIdentitySource): MappedWeights = RandomAccessFile(file, "r").use { raf ->
            val size = raf.length()
            if (size < 8) throw BadInput("$file is not a safetensors file (${size} bytes)")
            val head = ByteBuffer.allocate(8).order(ByteOrder.LITTLE_ENDIAN)
            raf.channel.read(head, 0)
            val n = head.getLong(0)
            if (n <= 0 || 8 + n > size || n > 100_000_000) throw BadInput("$file: bad safetensors header length $n")
            val hb = ByteArray(n.toInt())
            raf.seek(8)
            raf.readFully(hb)
            val header = Fields.of(Json.parse(String(hb, Charsets.UTF_8)), "$file header")
            val start = 8 + n
            val out = LinkedHashMap<String, TensorBuffer>()
            for ((key, v) in header.obj.fields) {
                if (key == "__metadata__" || key.startsWith("__pad_")) continue
                val f = Fields.of(v, "$file $key")
                val dtype = ElemType.ofSafetensors(f.string("dtype"), f.where)
                val off = f.arr("data_offsets").map { (it as Json.Num).asLongOrNull ?: throw BadInput("${f.where}: bad data_offsets") }
                val begin = start + off[0]
                val len = off[1] - off[0]
                if (off[0] < 0 || len < 0 || start + off[1] > size) throw BadInput("${f.where}: data_offsets $off outside the file")
                val buf = if (len == 0L) ByteBuffer.allocateDirect(0) else raf.channel.map(FileChannel.MapMode.READ_ONLY, begin, len)
                out[key] = TensorBuffer(key, dtype, f.ints("shape"), buf)
            }
            MappedWeights(file, out, identity, identities)
        }
    }
}

/**
 * The app's flat float32 state: one direct, little-endian buffer; each entry a view of it. With [only], a
 * snapshot of those entries alone, packed in manifest order (what a generation beside training reads:
 * [LayerLoop.generationStateEntries], the LoRA params without the optimizer's moments); a snapshot's
 * [buffer] is not the state array (no checkpoint or adapter is made of it), and a view of another entry is
 * an error.
 */
class StateBuffer(val program: Manifest, only: Collection<String>? = null) {
    /** The entries held: every one, or [only]'s. */
    val entries: List<StateEntry> = if (only == null) program.stateEntries else {
        val names = only.toSet()
        val unknown = names - program.stateEntries.map { it.name }.toSet()
        if (unknown.isNotEmpty()) throw BadInput("the state has no entry ${unknown.sorted().take(3).joinToString()}; re-export the program")
        program.stateEntries.filter { it.name in names }
    }
    val isSnapshot: Boolean = only != null
    /** float32 values held: the manifest's state numel, or a snapshot's entries'. */
    val numel: Int = if (only == null) program.stateNumel else entries.sumOf { it.numel }
    val buffer: ByteBuffer = ByteBuffer.allocateDirect(4 * numel).order(ByteOrder.LITTLE_ENDIAN)
    private val views: Map<String, TensorBuffer> = run {
        var at = 0
        entries.associate { e ->
            val offset = if (only == null) e.offset else at.also { at += e.numel }
            e.name to TensorBuffer(e.name, ElemType.FLOAT32, e.shape, buffer.window(4 * offset, 4 * e.numel))
        }
    }

    fun view(name: String): TensorBuffer = views[name] ?: throw BadInput(
        if (isSnapshot) "state entry '$name' is not in this snapshot of ${entries.size} entries (the generation methods read it?)"
        else "the state has no entry '$name'; re-export the program")
    fun sha256(): String = sha256Hex(buffer)

    /** A checkpoint, a restore or an adapter needs the whole state, not a snapshot. */
    fun requireWhole(what: String) {
        if (isSnapshot) throw IllegalStateException("$what needs the whole state, not a snapshot of ${entries.size} entries")
    }

    /** Read state.init_file (raw little-endian float32, exactly numel values). */
    fun loadInit() = load(File(program.dir, program.stateInitFile))

    /** [file]: a whole state (numel values); a snapshot reads only its entries' ranges of it. */
    fun load(file: File) {
        if (file.length() != 4L * program.stateNumel)
            throw BadInput("$file holds ${file.length() / 4} values, the manifest says ${program.stateNumel}; re-export the program")
        if (!isSnapshot) {
            // Straight from the file into the state buffer (no heap copy: the state is held once).
            RandomAccessFile(file, "r").use { raf ->
                val d = buffer.duplicate()
                d.position(0)
                var at = 0L
                while (d.hasRemaining()) {
                    val n = raf.channel.read(d, at)
                    if (n < 0) throw BadInput("$file ends after $at bytes of the state")
                    at += n
                }
            }
            return
        }
        RandomAccessFile(file, "r").use { raf ->
            for (e in entries) {
                val dst = views.getValue(e.name).data.duplicate()
                dst.position(0)
                var at = 4L * e.offset
                while (dst.hasRemaining()) {
                    val n = raf.channel.read(dst, at)
                    if (n < 0) throw BadInput("$file ends inside state entry ${e.name}")
                    at += n
                }
            }
        }
    }

    /** Copy each entry held here from [src] (the live state, for a snapshot; or another state). */
    fun copyFrom(src: StateBuffer) {
        for (e in entries) copyBytes(src.view(e.name).data, views.getValue(e.name).data, 0)
    }

    fun toFloatArray(): FloatArray = FloatArray(numel) { buffer.getFloat(4 * it) }
}
