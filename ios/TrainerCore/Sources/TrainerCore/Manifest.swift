import Foundation

/// `manifest.json` of an exported program directory (`shared_schemas/manifest.schema.json`): what the
/// program is, how to drive it, and its memory plan. Decoded with explicit snake_case keys (a key
/// strategy would also rewrite dictionary keys such as method names in `planned_arena_bytes`).
public struct ProgramManifest: Codable, Equatable {
    public static let fileName = "manifest.json"

    public var schemaVersion: Int
    public var toolchainVersion: String
    public var model: Model
    public var lora: Lora
    public var seqLen: Int
    public var quant: Quant
    public var optimizer: Optimizer
    public var lcsb: Lcsb?
    public var programs: [Program]
    public var methods: [Method]
    public var state: State
    public var memoryPlan: MemoryPlan
    public var tokenizer: Tokenizer
    public var adapter: Adapter
    public var files: [String: String]

    enum CodingKeys: String, CodingKey {
        case schemaVersion = "schema_version", toolchainVersion = "toolchain_version", model, lora
        case seqLen = "seq_len", quant, optimizer, lcsb, programs, methods, state
        case memoryPlan = "memory_plan", tokenizer, adapter, files
    }

    public struct Model: Codable, Equatable {
        public var source: String
        public var initKind: String
        public var seed: Int?
        public var arch: Arch
        enum CodingKeys: String, CodingKey { case source, initKind = "init", seed, arch }
    }

    public struct Arch: Codable, Equatable {
        public var hidden: Int
        public var layers: Int
        public var heads: Int
        public var kvHeads: Int
        public var intermediate: Int
        public var vocab: Int
        public var maxPositions: Int
        enum CodingKeys: String, CodingKey {
            case hidden, layers, heads, kvHeads = "kv_heads", intermediate, vocab, maxPositions = "max_positions"
        }
    }

    public struct Lora: Codable, Equatable {
        public var rank: Int
        public var alpha: Double
        public var scale: Double
        public var targets: [String]
    }

    public struct Quant: Codable, Equatable {
        public var kind: String
        public var group: Int
    }

    public struct Optimizer: Codable, Equatable {
        public var kind: String
        public var weightDecay: Double
        public var defaultLr: Double?
        enum CodingKeys: String, CodingKey { case kind, weightDecay = "weight_decay", defaultLr = "default_lr" }
    }

    public struct Lcsb: Codable, Equatable {
        public var policy: String
        public var k: Int?
        public var phases: [[Int]]
        public var schedule: [Int]
    }

    /// One runnable file. Core ML entries also list the package's `inputs`, `outputs` and `states`
    /// (the manifest allows extra keys here); absent for ExecuTorch.
    public struct Program: Codable, Equatable {
        public var target: String
        public var file: String
        public var delegate: String?
        public var bytes: Int?
        public var inputs: [TensorSpec]?
        public var outputs: [TensorSpec]?
        public var states: [TensorSpec]?
    }

    public struct TensorSpec: Codable, Equatable {
        public var name: String
        public var dtype: String
        public var shape: [Int]
        public var count: Int { shape.reduce(1, *) }
    }

    public struct Method: Codable, Equatable {
        public var name: String
        public var kind: String
        public var phase: Int?
        public var backwardLayers: [Int]?
        public var inputs: [TensorSpec]
        public var outputs: [TensorSpec]
        enum CodingKeys: String, CodingKey {
            case name, kind, phase, backwardLayers = "backward_layers", inputs, outputs
        }
    }

    public struct State: Codable, Equatable {
        public var dtype: String
        public var numel: Int
        public var entries: [StateEntry]
    }

    /// A slice `[offset, offset + count)` of the flat float32 state; `key` is the PEFT key of a
    /// parameter (role "param") or of the parameter an optimizer moment belongs to.
    public struct StateEntry: Codable, Equatable {
        public var name: String
        public var key: String
        public var role: String
        public var shape: [Int]
        public var offset: Int
        public var count: Int { shape.reduce(1, *) }
    }

    public struct MemoryPlan: Codable, Equatable {
        public var plannedArenaBytes: [String: Int]
        public var constantBytes: Int
        public var loraStateBytes: Int
        public var peakEstimateBytes: Int?
        enum CodingKeys: String, CodingKey {
            case plannedArenaBytes = "planned_arena_bytes", constantBytes = "constant_bytes"
            case loraStateBytes = "lora_state_bytes", peakEstimateBytes = "peak_estimate_bytes"
        }
    }

    public struct Tokenizer: Codable, Equatable {
        public var kind: String
        public var vocab: Int
        public var padTokenId: Int
        enum CodingKeys: String, CodingKey { case kind, vocab, padTokenId = "pad_token_id" }
    }

    public struct Adapter: Codable, Equatable {
        public var initDir: String
        /// Written verbatim as `adapter_config.json` next to a trained adapter.
        public var config: JSONValue
        enum CodingKeys: String, CodingKey { case initDir = "init_dir", config }
    }
}

extension ProgramManifest {
    /// Decode and check a manifest (see `validate()`).
    public static func decode(_ data: Data, source: String = "manifest.json") throws -> ProgramManifest {
        let m: ProgramManifest
        do {
            m = try JSONDecoder().decode(ProgramManifest.self, from: data)
        } catch {
            throw TrainerError.badInput("\(source) is not a valid manifest (\(describe(error))); re-export the program")
        }
        try m.validate(source: source)
        return m
    }

    public static func load(directory: URL) throws -> ProgramManifest {
        let url = directory.appendingPathComponent(fileName)
        return try decode(try readFile(url, what: "manifest"), source: url.path)
    }

    /// The checks an app needs before it runs anything: every method the schedule uses exists with
    /// the step signature, get_state/set_state exist, and the state entries fit the flat state.
    public func validate(source: String = "manifest.json") throws {
        func fail(_ why: String) -> TrainerError { .badInput("\(source): \(why); re-export the program") }
        guard schemaVersion == 1 else { throw fail("schema_version \(schemaVersion) is not supported (this app reads 1)") }
        guard seqLen >= 2 else { throw fail("seq_len \(seqLen) is below 2") }
        guard state.dtype == "float32", state.numel > 0 else { throw fail("state must be float32 with numel > 0") }
        guard tokenizer.padTokenId >= 0, tokenizer.padTokenId < max(tokenizer.vocab, model.arch.vocab) else {
            throw fail("pad_token_id \(tokenizer.padTokenId) is outside the vocabulary")
        }
        for e in state.entries where e.offset < 0 || e.offset + e.count > state.numel {
            throw fail("state entry \(e.name) [\(e.offset), \(e.offset + e.count)) lies outside the state of \(state.numel)")
        }
        let names = Set(methods.map(\.name))
        guard names.count == methods.count else { throw fail("a method name is listed twice") }
        for kind in ["get_state", "set_state"] where methods.filter({ $0.kind == kind }).count != 1 {
            throw fail("exactly one \(kind) method is required")
        }
        if let getState = methods.first(where: { $0.kind == "get_state" }),
           getState.outputs.first?.count != state.numel {
            throw fail("get_state must return float32[\(state.numel)]")
        }
        if let lcsb {
            guard !lcsb.schedule.isEmpty, !lcsb.phases.isEmpty else { throw fail("lcsb needs phases and a schedule") }
            if let bad = lcsb.schedule.first(where: { $0 < 0 || $0 >= lcsb.phases.count }) {
                throw fail("lcsb.schedule names phase \(bad), but there are \(lcsb.phases.count) phases")
            }
        }
        for name in trainMethodNames {
            guard let m = methods.first(where: { $0.name == name }), m.kind == "train_step" else {
                throw fail("method \(name) (needed by the schedule) is missing")
            }
            try checkStepSignature(m, fail: fail)
        }
    }

    private func checkStepSignature(_ m: Method, fail: (String) -> TrainerError) throws {
        let want = [("int64", [seqLen]), ("int64", [seqLen]), ("float32", [1])]
        let got = m.inputs.map { ($0.dtype, $0.shape) }
        guard got.count == 3, zip(got, want).allSatisfy({ $0.0 == $1.0 && $0.1 == $1.1 }) else {
            throw fail("\(m.name) must take (int64[\(seqLen)], int64[\(seqLen)], float32[1]), not \(got)")
        }
        guard let out = m.outputs.first, out.dtype == "float32", out.count == 1 else {
            throw fail("\(m.name) must return the loss as float32[1]")
        }
    }

    /// Train methods in phase order: `train_step` without LCSB, else `train_step_p{k}` per phase used.
    public var trainMethodNames: [String] {
        guard let lcsb else { return ["train_step"] }
        return Array(Set(lcsb.schedule)).sorted().map { "train_step_p\($0)" }
    }

    /// Every method an app loads up front (before the first call), in manifest order.
    public var methodNames: [String] { methods.map(\.name) }

    public func program(target: String) -> Program? { programs.first { $0.target == target } }

    /// Dirty memory a step is planned to peak at: the manifest's peak estimate, else the largest
    /// planned arena plus the LoRA state (frozen weights are clean, memory-mapped pages: not counted).
    public var plannedPeakBytes: UInt64 {
        if let p = memoryPlan.peakEstimateBytes { return UInt64(p) }
        return UInt64((memoryPlan.plannedArenaBytes.values.max() ?? 0) + memoryPlan.loraStateBytes)
    }
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
