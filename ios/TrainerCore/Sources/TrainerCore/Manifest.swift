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

    /// One runnable export. ExecuTorch: one `model.pte` holding every method; ONNX and Core ML: one
    /// file (or `.mlpackage`) per method in `methods` (method name -> path relative to the program
    /// directory). Extra keys of the entry (opset, ops, ...) are ignored.
    public struct Program: Codable, Equatable {
        public var target: String
        public var file: String
        public var delegate: String?
        public var bytes: Int?
        public var methods: [String: String]?

        /// The file that runs `method`: its own file when the target has one per method, else `file`.
        public func file(forMethod method: String) -> String? {
            guard let methods else { return file }
            return methods[method]
        }
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

    /// The app's flat float32 state: `numel` values, initially the raw little-endian float32 file
    /// `initFile` (relative to the program directory), split into `entries`.
    public struct State: Codable, Equatable {
        public var dtype: String
        public var numel: Int
        public var initFile: String
        public var entries: [StateEntry]
        enum CodingKeys: String, CodingKey { case dtype, numel, initFile = "init_file", entries }

        /// The entry called `name`, if any.
        public func entry(named name: String) -> StateEntry? { entries.first { $0.name == name } }
    }

    /// A slice `[offset, offset + count)` of the flat float32 state; `key` is the PEFT key of a
    /// parameter (role "param") or of the parameter an optimizer moment belongs to ("" for the AdamW
    /// step counter, role "step").
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
    /// The manifest version this app drives: functional state (the app owns the state array and
    /// passes it in and out of each train method). Version 1 (state inside the program, get_state /
    /// set_state methods) is retired.
    public static let supportedSchemaVersion = 2

    private struct VersionOnly: Decodable {
        let schemaVersion: Int?
        enum CodingKeys: String, CodingKey { case schemaVersion = "schema_version" }
    }

    /// Decode and check a manifest (see `validate()`). The version is checked first, so an old
    /// manifest gets a message about its version rather than about a key it lacks.
    public static func decode(_ data: Data, source: String = "manifest.json") throws -> ProgramManifest {
        if let version = (try? JSONDecoder().decode(VersionOnly.self, from: data))?.schemaVersion {
            try checkVersion(version, source: source)
        }
        let m: ProgramManifest
        do {
            m = try JSONDecoder().decode(ProgramManifest.self, from: data)
        } catch {
            throw TrainerError.badInput("\(source) is not a valid manifest (\(describe(error))); re-export the program")
        }
        try m.validate(source: source)
        return m
    }

    static func checkVersion(_ version: Int, source: String) throws {
        if version == 1 {
            throw TrainerError.badInput("\(source) has schema_version 1 (state inside the program, get_state/set_state), " +
                                        "which this app no longer runs; re-export the program with the current toolchain (schema_version 2)")
        }
        guard version == supportedSchemaVersion else {
            throw TrainerError.badInput("\(source): schema_version \(version) is not supported (this app reads " +
                                        "\(supportedSchemaVersion)); re-export the program or update the app")
        }
    }

    public static func load(directory: URL) throws -> ProgramManifest {
        let url = directory.appendingPathComponent(fileName)
        return try decode(try readFile(url, what: "manifest"), source: url.path)
    }

    /// The checks an app needs before it runs anything: the state entries tile part of the flat
    /// state without overlapping, every method the schedule uses exists, takes (input_ids, labels,
    /// lr, every state entry in order) and returns (loss, a subset of the entries in order).
    public func validate(source: String = "manifest.json") throws {
        func fail(_ why: String) -> TrainerError { .badInput("\(source): \(why); re-export the program") }
        try Self.checkVersion(schemaVersion, source: source)
        guard seqLen >= 2 else { throw fail("seq_len \(seqLen) is below 2") }
        guard state.dtype == "float32", state.numel > 0 else { throw fail("state must be float32 with numel > 0") }
        guard !state.initFile.isEmpty else { throw fail("state.init_file is empty") }
        guard tokenizer.padTokenId >= 0, tokenizer.padTokenId < max(tokenizer.vocab, model.arch.vocab) else {
            throw fail("pad_token_id \(tokenizer.padTokenId) is outside the vocabulary")
        }
        try checkEntries(fail: fail)
        let names = Set(methods.map(\.name))
        guard names.count == methods.count else { throw fail("a method name is listed twice") }
        if let other = methods.first(where: { $0.kind != "train_step" }) {
            throw fail("method \(other.name) has kind \(other.kind); only train_step methods exist in schema_version 2")
        }
        if let lcsb {
            guard !lcsb.schedule.isEmpty, !lcsb.phases.isEmpty else { throw fail("lcsb needs phases and a schedule") }
            if let bad = lcsb.schedule.first(where: { $0 < 0 || $0 >= lcsb.phases.count }) {
                throw fail("lcsb.schedule names phase \(bad), but there are \(lcsb.phases.count) phases")
            }
        }
        for name in trainMethodNames {
            guard let m = method(named: name) else { throw fail("method \(name) (needed by the schedule) is missing") }
            try checkStepSignature(m, fail: fail)
        }
        for p in programs where p.methods != nil {
            if let missing = trainMethodNames.first(where: { p.file(forMethod: $0) == nil }) {
                throw fail("the \(p.target) program lists no file for method \(missing)")
            }
        }
    }

    private func checkEntries(fail: (String) -> TrainerError) throws {
        guard !state.entries.isEmpty else { throw fail("state.entries is empty") }
        guard Set(state.entries.map(\.name)).count == state.entries.count else { throw fail("a state entry name is listed twice") }
        for e in state.entries where e.shape.isEmpty || e.shape.contains(where: { $0 < 1 }) {
            throw fail("state entry \(e.name) has the shape \(e.shape)")
        }
        var end = 0
        for e in state.entries.sorted(by: { $0.offset < $1.offset }) {
            guard e.offset >= 0, e.offset + e.count <= state.numel else {
                throw fail("state entry \(e.name) [\(e.offset), \(e.offset + e.count)) lies outside the state of \(state.numel)")
            }
            guard e.offset >= end else { throw fail("state entry \(e.name) overlaps the entry before it") }
            end = e.offset + e.count
        }
    }

    private func checkStepSignature(_ m: Method, fail: (String) -> TrainerError) throws {
        let want = [("input_ids", "int64", [seqLen]), ("labels", "int64", [seqLen]), ("lr", "float32", [1])]
            + state.entries.map { ($0.name, "float32", $0.shape) }
        let got = m.inputs.map { ($0.name, $0.dtype, $0.shape) }
        guard got.count == want.count else {
            throw fail("\(m.name) takes \(got.count) inputs; it must take input_ids, labels, lr and the \(state.entries.count) state entries")
        }
        for (g, w) in zip(got, want) where g.0 != w.0 || g.1 != w.1 || g.2 != w.2 {
            throw fail("\(m.name) input \(g.0) \(g.1)\(g.2) is not \(w.0) \(w.1)\(w.2) (inputs: input_ids, labels, lr, then the state entries in order)")
        }
        guard let loss = m.outputs.first, loss.name == "loss", loss.dtype == "float32", loss.count == 1 else {
            throw fail("\(m.name) must return the loss as float32[1] first")
        }
        var previous = -1
        for out in m.outputs.dropFirst() {
            guard let i = state.entries.firstIndex(where: { $0.name == out.name }) else {
                throw fail("\(m.name) returns \(out.name), which is not a state entry")
            }
            guard out.dtype == "float32", out.shape == state.entries[i].shape else {
                throw fail("\(m.name) returns \(out.name) as \(out.dtype)\(out.shape), the entry is float32\(state.entries[i].shape)")
            }
            guard i > previous else { throw fail("\(m.name) returns its state entries out of state.entries order") }
            previous = i
        }
    }

    /// Train methods in phase order: `train_step` without LCSB, else `train_step_p{k}` per phase used.
    public var trainMethodNames: [String] {
        guard let lcsb else { return ["train_step"] }
        return Array(Set(lcsb.schedule)).sorted().map { "train_step_p\($0)" }
    }

    /// Every method an app loads up front (before the first call), in manifest order.
    public var methodNames: [String] { methods.map(\.name) }

    public func method(named name: String) -> Method? { methods.first { $0.name == name } }

    public func program(target: String) -> Program? { programs.first { $0.target == target } }

    /// What identifies this export in a checkpoint: the sha256 (manifest `files`) of the ExecuTorch
    /// program if there is one, else of the initial state. Backend-neutral: the state is the same
    /// array for every runtime, so a checkpoint made with one backend resumes on another.
    public var exportSha256: String? {
        if let pte = program(target: "executorch"), let sha = files[pte.file] { return sha }
        return files[state.initFile]
    }

    /// Dirty memory a step is planned to peak at: the manifest's peak estimate, else the planned
    /// arenas of all methods (the stock ExecuTorch `Module` gives each loaded method its own arena,
    /// and the app loads them all), plus the app's state array and one transient copy of it (the
    /// runtime's input tensors). Frozen weights are clean, memory-mapped pages: not counted.
    public var plannedPeakBytes: UInt64 {
        if let p = memoryPlan.peakEstimateBytes { return UInt64(p) }
        return UInt64(memoryPlan.plannedArenaBytes.values.reduce(0, +) + 2 * memoryPlan.loraStateBytes)
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
