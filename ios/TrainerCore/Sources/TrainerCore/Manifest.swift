import Foundation

/// `manifest.json` of a program (`shared_schemas/manifest.schema.json`, schema_version 3):
/// the typed manifest of `toolchain/contract/manifest.py` (`Manifest`, its sections under the same
/// names: `ModelSection`, `GenerateSection`, `MethodSpec`, `IoSpec`, `StateEntry`, ...), written by
/// `toolchain export` through `contract/read.py`'s `write_manifest`: layer-generic methods whose every input
/// is bound (`input`, `activation`, `weight` of the weights file, `state` entry), and the loop the app
/// drives (`toolchain/runtime/loop.py` is the reference). Only what the app needs is decoded; other
/// keys are ignored.
public struct Manifest: Decodable, Equatable {
    public var schemaVersion: Int
    public var seqLen: Int
    public var model: ModelSection
    public var optimizer: OptimizerSection
    public var lcsb: LcsbSection?
    public var methods: [MethodSpec]
    public var loop: LoopSection
    public var state: StateSection
    public var weights: WeightsSection
    public var files: [String: String]
    public var programs: [ProgramEntry]
    public var tokenizer: TokenizerSection?
    public var adapter: AdapterSection?
    public var lora: LoraSection?
    public var quant: QuantSection?
    public var memoryPlan: MemoryPlan?
    public var generate: GenerateSection?
    /// `compute` as written: "fp16" / "int8" for `toolchain export --compute`, absent (nil) for fp32 (`Compute`).
    public var compute: String?
    /// The run defaults `toolchain export` measured and recorded (lr, steps; `SessionConfig.resolvingDefaults`);
    /// nil in older programs.
    public var defaults: DefaultsSection?

    enum CodingKeys: String, CodingKey {
        case schemaVersion = "schema_version", seqLen = "seq_len", model, optimizer, lcsb, methods, loop, state
        case weights, files, programs, tokenizer, adapter, lora, quant, memoryPlan = "memory_plan", generate, compute, defaults
    }

    /// The frozen-weight matmuls' precision: "fp32" (compute absent) or "fp16" (checked by `validate`).
    public var computePrecision: String { compute ?? Compute.fp32 }

    static func elementSize(_ dtype: String) -> Int? {
        switch dtype {
        case "float32", "int32": return 4
        case "int64": return 8
        case "uint8", "int8": return 1
        case "float16", "bfloat16": return 2
        default: return nil
        }
    }

    private struct VersionOnly: Decodable {
        let schemaVersion: Int?
        enum CodingKeys: String, CodingKey { case schemaVersion = "schema_version" }
    }

    public static func decode(_ data: Data, source: String = "manifest.json") throws -> Manifest {
        let version = (try? JSONDecoder().decode(VersionOnly.self, from: data))?.schemaVersion
        guard version == Contract.manifestSchemaVersion else {
            let what = version.map { "schema_version \($0)" } ?? "no schema_version"
            throw TrainerError.badInput("\(source) has \(what); this app runs schema_version 3 only; re-export the program")
        }
        let m: Manifest
        do {
            m = try JSONDecoder().decode(Manifest.self, from: data)
        } catch {
            throw TrainerError.badInput("\(source) is not a valid manifest (\(describe(error))); re-export the program")
        }
        if let gen = m.generate, gen.prefillChunk == nil {
            throw TrainerError.badInput("\(source) was exported before chunked prefill (its generation methods prefill the whole " +
                                        "seq_len with block_kv); re-export the program with this toolchain")
        }
        try m.validate(source: source)
        return m
    }

    public static func load(directory: URL) throws -> Manifest {
        let url = directory.appendingPathComponent(Contract.manifestName)
        return try decode(try readFile(url, what: "manifest"), source: url.path)
    }

    /// The first method of `role` in the manifest's order: the stock one (a fused variant shares its
    /// role and is listed after it; `generationMethods(registeredKernels:)` picks between them).
    public func method(role: String) -> MethodSpec? { methods.first { $0.role == role } }

    public func method(named name: String) -> MethodSpec? { methods.first { $0.name == name } }

    /// The method generation calls for each of `Contract.generationRoles`: the fused variant
    /// (`generate.fused.methods`) where the runtime has all of `generate.fused.kernels` registered
    /// (`registeredKernels`, `ProgramRuntime.registeredKernels`) and the manifest lists it, else the stock
    /// one. Roles without a method are left out (`canGenerate` is false then).
    public func generationMethods(registeredKernels: Set<String>) -> [String: MethodSpec] {
        var out: [String: MethodSpec] = [:]
        let fused = generate?.fused
        let useFused = fused.map { !$0.kernels.isEmpty && Set($0.kernels).isSubset(of: registeredKernels) } ?? false
        for role in Contract.generationRoles {
            guard let stock = method(role: role) else { continue }
            if useFused, let name = fused?.methods[stock.name], let f = method(named: name), f.role == stock.role {
                out[role] = f
            } else {
                out[role] = stock
            }
        }
        return out
    }

    /// Tokens per `embed_prefill` / `block_prefill` call (`generate.prefill_chunk`).
    public var prefillChunk: Int? { generate?.prefillChunk }

    public func program(target: String) -> ProgramEntry? { programs.first { $0.target == target } }

    /// Identifies the export in checkpoints: the sha256 of the ExecuTorch program (else of the
    /// weights file, else of state_init.bin) from `files`; the state is the same array for every
    /// runtime, so a checkpoint made on one backend resumes on another.
    public var exportSha256: String? {
        if let pte = program(target: "executorch"), let sha = files[pte.file] { return sha }
        return files[weights.file] ?? files[state.initFile]
    }

    /// Whether the program has every method generation calls (`Contract.generationRoles`: embed_token,
    /// embed_prefill, block_prefill, block_decode, head_logits) and its prefill chunk.
    public var canGenerate: Bool {
        generate?.prefillChunk != nil && Contract.generationRoles.allSatisfy { method(role: $0) != nil }
    }

    /// Dirty memory a training step is planned to peak at on `target`: the manifest's estimate, else
    /// the planned arenas of the training methods (each loaded method keeps its own arena in the stock
    /// `Module`) + the state array + the checkpoints. The weights are clean mapped pages: not counted.
    ///
    /// The manifest counts one [T, d] checkpoint per layer (`checkpoint_bytes`); a step keeps those of
    /// its `selectedLayers` k only (nil: every layer), and with checkpoint groups of
    /// `layersPerCheckpoint` s at most `CheckpointGroups.maxAlive` = min(k, ceil(k/s) + s - 1) of them
    /// at once, so the plan counts checkpoint_bytes x that / layers instead (the host's
    /// `toolchain plan fit`, toolchain/memory/fit.py). The defaults give the manifest's figure.
    public func plannedPeakBytes(target: String = "executorch", selectedLayers: Int? = nil, layersPerCheckpoint: Int = 1) -> UInt64 {
        let all = memoryPlan?.checkpointBytes ?? 0
        let kept = plannedCheckpoints(selectedLayers: selectedLayers, layersPerCheckpoint: layersPerCheckpoint)
        let checkpoints = loop.layers > 0 ? all * kept / loop.layers : all
        if let p = memoryPlan?.peakEstimateBytes?[target] { return UInt64(max(0, p - all + checkpoints)) }
        let arenas = memoryPlan?.plannedArenaBytes?[target]?.values.reduce(0, +) ?? 0
        return UInt64(arenas + 4 * state.numel + checkpoints)
    }

    /// The layer inputs ([T, d] checkpoints) a step is planned to hold at once (see `plannedPeakBytes`).
    public func plannedCheckpoints(selectedLayers: Int? = nil, layersPerCheckpoint: Int = 1) -> Int {
        CheckpointGroups.maxAlive(selected: min(selectedLayers ?? loop.layers, loop.layers), layersPerCheckpoint: layersPerCheckpoint)
    }

    public func entry(named name: String) -> StateEntry? { entryIndex[name].map { state.entries[$0] } }

    private var entryIndex: [String: Int] {
        Dictionary(state.entries.enumerated().map { ($1.name, $0) }, uniquingKeysWith: { a, _ in a })
    }

    /// Every binding resolvable for every layer: the state refs name entries of the right shape, the
    /// activations and inputs are the ones the loop provides, the methods the loop needs exist.
    public func validate(source: String = "manifest.json") throws {
        func fail(_ why: String) -> TrainerError { .badInput("\(source): \(why); re-export the program") }
        guard seqLen >= 2 else { throw fail("seq_len \(seqLen) is below 2") }
        if let d = defaults, !(d.lr > 0 && d.lr.isFinite) || d.steps < 1 {
            throw fail("defaults must have lr > 0 and steps >= 1, got lr \(d.lr), steps \(d.steps)")
        }
        if let c = compute, !Compute.choices.contains(c) {
            throw TrainerError.badInput("\(source): compute '\(c)' is not one of \(Compute.choices); re-export the program with this toolchain")
        }
        guard loop.layers == model.arch.layers, loop.layers >= 1 else { throw fail("loop.layers \(loop.layers) is not the model's \(model.arch.layers)") }
        guard state.dtype == "float32", state.numel > 0 else { throw fail("state must be float32 with numel > 0") }
        let index = entryIndex
        guard index.count == state.entries.count else { throw fail("a state entry name is listed twice") }
        var end = 0
        for e in state.entries.sorted(by: { $0.offset < $1.offset }) {
            guard e.offset >= end, e.offset + e.count <= state.numel, !e.shape.isEmpty else {
                throw fail("state entry \(e.name) [\(e.offset), \(e.offset + e.count)) overlaps or lies outside the state of \(state.numel)")
            }
            end = e.offset + e.count
        }
        if let s = state.stepEntry { guard index[s] != nil else { throw fail("state.step_entry \(s) is not an entry") } }
        let roles = Contract.trainingRoles.filter { $0 != "block_skip_update" || loop.movesUnselected }
        for r in roles where method(role: r) == nil { throw fail("no method has role \(r)") }
        var activations: Set<String> = ["x", "d", "checkpoint"]
        var appInputs: Set<String> = ["input_ids", "labels", "lr"]
        var checked = Set(roles)
        if let gen = generate, let chunk = gen.prefillChunk {
            // generation: its roles' methods (stock and fused) bind the same way, plus the KV cache
            guard chunk >= 1, chunk <= seqLen else { throw fail("generate.prefill_chunk \(chunk) is not in 1...\(seqLen)") }
            for r in Contract.generationRoles where method(role: r) == nil { throw fail("no method has role \(r)") }
            checked.formUnion(Contract.generationRoles)
            appInputs.formUnion(["token", "tokens", "pos"])
            activations.insert("x")
            if let fused = gen.fused {
                for (stock, name) in fused.methods.sorted(by: { $0.key < $1.key }) {
                    guard let s = method(named: stock), let f = method(named: name), s.role == f.role, f.outputs == s.outputs else {
                        throw fail("generate.fused maps \(stock) to \(name), which is not a method of the same role and outputs")
                    }
                }
            }
            try validateCache(chunk: chunk, fail: fail)
        }
        for m in methods where checked.contains(m.role) {
            let layered = m.role.hasPrefix("block_")
            for io in m.inputs + m.outputs {
                guard io.elementSize > 0 else { throw fail("\(m.name) \(io.name) has dtype \(io.dtype)") }
                switch io.bind {
                case .state:
                    for layer in layered ? Array(0..<loop.layers) : [0] {
                        let ref = io.ref(layer: layered ? layer : nil, placeholder: weights.layerPlaceholder)
                        guard let i = index[ref] else { throw fail("\(m.name) \(io.name) binds state \(ref), which is not an entry") }
                        guard state.entries[i].shape == io.shape, io.dtype == "float32" else {
                            throw fail("\(m.name) \(io.name) is \(io.dtype)\(io.shape), entry \(ref) is float32\(state.entries[i].shape)")
                        }
                    }
                case .activation:
                    guard activations.contains(io.ref) else { throw fail("\(m.name) \(io.name) binds activation \(io.ref)") }
                case .input:
                    guard appInputs.contains(io.ref) else { throw fail("\(m.name) \(io.name) binds input \(io.ref)") }
                case .weight:
                    if let rows = io.rows, rows.count != 2 || rows[0] < 0 || rows[1] <= rows[0] || rows[1] - rows[0] != io.shape.first {
                        throw fail("\(m.name) \(io.name) has rows \(rows) for shape \(io.shape)")
                    }
                case .result, .cache:
                    break
                }
            }
        }
    }

    /// The KV cache of `block_prefill` / `block_decode` (bind `cache`, ref `k_{layer}` / `v_{layer}`): the
    /// inputs are the whole cache [Hk, S, D] (S = seq_len), the outputs the call's rows [Hk, C, D]
    /// (C = the prefill chunk, 1 for decode), every method the same Hk and D, and the total the
    /// manifest's `generate.cache_bytes` when given.
    private func validateCache(chunk: Int, fail: (String) -> TrainerError) throws {
        var dims: (Int, Int)? = nil
        for m in methods where m.role == "block_prefill" || m.role == "block_decode" {
            let rows = m.role == "block_prefill" ? chunk : 1
            let ins = m.inputs.filter { $0.bind == .cache }, outs = m.outputs.filter { $0.bind == .cache }
            guard Set(ins.map(\.ref)).count == 2, Set(outs.map(\.ref)) == Set(ins.map(\.ref)) else {
                throw fail("\(m.name) must take and return the k and v caches")
            }
            for io in ins + outs {
                let want = ins.contains(io) ? seqLen : rows
                guard io.dtype == "float32", io.shape.count == 3, io.shape[1] == want, io.ref.contains(weights.layerPlaceholder) else {
                    throw fail("\(m.name) \(io.name) is \(io.dtype)\(io.shape), not a float32 [kv_heads, \(want), head_dim] per-layer cache")
                }
                if let d = dims, d != (io.shape[0], io.shape[2]) { throw fail("\(m.name) \(io.name) has shape \(io.shape), other caches [\(d.0), _, \(d.1)]") }
                dims = (io.shape[0], io.shape[2])
            }
        }
        if let (hk, dh) = dims, let bytes = generate?.cacheBytes, bytes != 2 * loop.layers * hk * seqLen * dh * 4 {
            throw fail("generate.cache_bytes \(bytes) is not 2 x \(loop.layers) layers x [\(hk), \(seqLen), \(dh)] float32")
        }
        if let tokens = method(role: "embed_prefill")?.inputs.first(where: { $0.bind == .input }), tokens.shape != [chunk] {
            throw fail("embed_prefill takes \(tokens.shape) tokens, generate.prefill_chunk is \(chunk)")
        }
    }

    /// The KV cache generation keeps, from the manifest: per layer and per ref (`k_{layer}`, `v_{layer}`)
    /// the [Hk, S, D] float32 shape `block_decode` takes it in.
    public var cacheShapes: [(ref: String, shape: [Int])] {
        (method(role: "block_decode")?.inputs ?? []).filter { $0.bind == .cache }.map { ($0.ref, $0.shape) }
    }
}

public struct ModelSection: Decodable, Equatable {
    public var source: String?
    public var arch: Arch

    public struct Arch: Decodable, Equatable {
        public var hidden: Int
        public var layers: Int
        public var vocab: Int
    }
}

/// `tokenizer`: kind byte | qwen2.5 | huggingface | none, the program's tokenizer.json (`file`).
public struct TokenizerSection: Decodable, Equatable {
    public var kind: String
    public var vocab: Int
    public var padTokenId: Int
    public var eosTokenId: Int?
    public var bosTokenId: Int?
    public var file: String?
    enum CodingKeys: String, CodingKey {
        case kind, vocab, padTokenId = "pad_token_id", eosTokenId = "eos_token_id", bosTokenId = "bos_token_id", file
    }
}

/// `adapter`: the PEFT directory the program starts from and the adapter_config.json to write.
public struct AdapterSection: Decodable, Equatable {
    public var initDir: String
    public var config: JSONValue
    enum CodingKeys: String, CodingKey { case initDir = "init_dir", config }
}

public struct LoraSection: Decodable, Equatable {
    public var rank: Int
    public var alpha: Double
    public var targets: [String]
}

/// `quant`: the frozen weights' format; `head`: the embedding and LM head are stored like the layers
/// (int4: `embed.qweight` / `embed.scales`, bound as `embed_q` / `embed_scale`, head chunks
/// `head_{j}_q` / `head_{j}_scale` with `rows`). The binding is generic (`weight` + `ref` + optional
/// `rows`), so the loop needs neither; they are decoded for the screen and the tests.
public struct QuantSection: Decodable, Equatable {
    public var kind: String
    public var group: Int?
    public var head: Bool?
}

/// `memory_plan`: per target the planned arena of each method and the peak estimate.
public struct MemoryPlan: Decodable, Equatable {
    public var plannedArenaBytes: [String: [String: Int]]?
    public var loraStateBytes: Int?
    public var checkpointBytes: Int?
    public var peakEstimateBytes: [String: Int]?
    enum CodingKeys: String, CodingKey {
        case plannedArenaBytes = "planned_arena_bytes", loraStateBytes = "lora_state_bytes"
        case checkpointBytes = "checkpoint_bytes", peakEstimateBytes = "peak_estimate_bytes"
    }
}

/// `generate` (null when exported without the generation methods): the prompt goes in chunks of
/// `prefillChunk` tokens (`embed_prefill`, `block_prefill` per layer), then one token per decode
/// step (`embed_token`, `block_decode` per layer, `head_logits`); `LayerLoop.generate` runs it.
/// Programs exported before chunked prefill lack `prefill_chunk` and are refused (`decode`).
public struct GenerateSection: Decodable, Equatable {
    public var methods: [String]
    public var maxTokens: Int?
    public var cacheBytes: Int?
    public var prefillChunk: Int?
    public var fused: FusedSection?
    public var peakEstimateBytes: [String: Int]?
    enum CodingKeys: String, CodingKey {
        case methods, maxTokens = "max_tokens", cacheBytes = "cache_bytes", prefillChunk = "prefill_chunk", fused
        case peakEstimateBytes = "peak_estimate_bytes"
    }
}

/// `generate.fused` (int4 programs): variants of generation methods that call native kernels
/// (`kernels`, e.g. `toolchain::int4_linear_a8.out`, built from `source` in the toolchain repository),
/// with the same inputs and outputs as the stock method (`head_logits_fused` takes the whole head
/// instead of its chunks). A runtime that has every kernel registered calls `methods[stock]`
/// instead of `stock`; any other calls the stock one.
public struct FusedSection: Decodable, Equatable {
    public var kernels: [String]
    public var source: String?
    public var methods: [String: String]
}

/// `defaults` (toolchain/export/app_defaults.py): a run's lr and steps when the user chooses none, one source for
/// `toolchain train --program` and both apps.
public struct DefaultsSection: Decodable, Equatable {
    public var lr: Double
    public var steps: Int
}

public struct OptimizerSection: Decodable, Equatable {
    public var kind: String
    public var weightDecay: Double
    public var defaultLr: Double?
    enum CodingKeys: String, CodingKey { case kind, weightDecay = "weight_decay", defaultLr = "default_lr" }
}

/// The default LCSB plan (apps may choose other layers at run time).
public struct LcsbSection: Decodable, Equatable {
    public var policy: String
    public var k: Int?
    public var phases: [[Int]]
    public var schedule: [Int]
    /// Full-backprop warm-up steps before the plan (nil: 0).
    public var warmup: Int?
}

public struct ProgramEntry: Decodable, Equatable {
    public var target: String
    public var file: String
    public var methods: [String: String]?
}

/// One method input or output and what it is bound to.
public struct IoSpec: Decodable, Equatable {
    public enum Bind: String, Decodable { case input, activation, weight, state, result, cache }
    public var name: String
    public var bind: Bind
    public var ref: String
    public var dtype: String
    public var shape: [Int]
    /// `weight` only: the row range `[start, end)` of the weight passed (a view).
    public var rows: [Int]?
    public var count: Int { shape.reduce(1, *) }
    public var elementSize: Int { Manifest.elementSize(dtype) ?? 0 }
    public var byteCount: Int { count * elementSize }

    /// `ref` with the layer placeholder replaced (unchanged when `layer` is nil).
    public func ref(layer: Int?, placeholder: String = "{layer}") -> String {
        guard let layer else { return ref }
        return ref.replacingOccurrences(of: placeholder, with: String(layer))
    }
}

public struct MethodSpec: Decodable, Equatable {
    public var name: String
    public var role: String
    public var inputs: [IoSpec]
    public var outputs: [IoSpec]
    /// Custom kernels the method calls beyond the stock ExecuTorch runtime (the fused generation
    /// methods); nil: stock operators only.
    public var kernels: [String]?
}

public struct LoopSection: Decodable, Equatable {
    public var layers: Int
    public var movesUnselected: Bool
    enum CodingKeys: String, CodingKey { case layers, movesUnselected = "moves_unselected" }
}

public struct StateSection: Decodable, Equatable {
    public var dtype: String
    public var numel: Int
    public var initFile: String
    public var stepEntry: String?
    public var entries: [StateEntry]
    enum CodingKeys: String, CodingKey { case dtype, numel, initFile = "init_file", stepEntry = "step_entry", entries }
}

public struct StateEntry: Decodable, Equatable {
    public var name: String
    public var key: String
    public var role: String
    public var shape: [Int]
    public var offset: Int
    public var layer: Int?
    public var count: Int { shape.reduce(1, *) }
}

public struct WeightsSection: Decodable, Equatable {
    public var file: String
    public var bytes: Int?
    public var layerPlaceholder: String
    enum CodingKeys: String, CodingKey { case file, bytes, layerPlaceholder = "layer_placeholder" }
}

/// A short description of a decoding error (the path to the bad key and what was wrong).
func describe(_ error: Error) -> String {
    switch error {
    case DecodingError.keyNotFound(let key, let ctx):
        return "missing key '\(path(ctx.codingPath + [key]))'"
    case DecodingError.typeMismatch(_, let ctx), DecodingError.valueNotFound(_, let ctx):
        return "wrong type at '\(path(ctx.codingPath))'"
    case DecodingError.dataCorrupted(let ctx):
        return ctx.codingPath.isEmpty ? "not JSON" : "bad value at '\(path(ctx.codingPath))'"
    default:
        return "\(error)"
    }
}

private func path(_ keys: [CodingKey]) -> String {
    keys.map { $0.intValue.map(String.init) ?? $0.stringValue }.joined(separator: ".")
}
