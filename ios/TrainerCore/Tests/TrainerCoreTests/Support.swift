import Foundation
import XCTest
@testable import TrainerCore

/// The repository's shared files. The root is TRAINER_REPO_ROOT if set, else the first directory
/// above this source file that holds shared_schemas/manifest.schema.json (works from any checkout
/// path, and inside the test chroot where the repository is mounted at /repo).
enum Repo {
    static let root: URL = {
        if let env = ProcessInfo.processInfo.environment["TRAINER_REPO_ROOT"], !env.isEmpty {
            return URL(fileURLWithPath: env)
        }
        var dir = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        while dir.path != "/" {
            if FileManager.default.fileExists(atPath: dir.appendingPathComponent("shared_schemas/manifest.schema.json").path) {
                return dir
            }
            dir = dir.deletingLastPathComponent()
        }
        fatalError("shared_schemas/ not found above \(#filePath); set TRAINER_REPO_ROOT")
    }()

    static var examples: URL { root.appendingPathComponent("shared_schemas/examples") }
    static var invalid: URL { examples.appendingPathComponent("invalid") }
    static var fixtures: URL { URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("Fixtures") }

    /// Files of `dir` whose name starts with `prefix` and ends in .json, sorted.
    static func files(_ dir: URL, prefix: String) -> [URL] {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: dir.path)) ?? []
        return names.filter { $0.hasPrefix(prefix) && $0.hasSuffix(".json") }.sorted().map { dir.appendingPathComponent($0) }
    }

    static func data(_ url: URL) throws -> Data { try Data(contentsOf: url) }
}

/// A manifest shaped like `toolchain export` writes it (toolchain/export/build.py `_methods`,
/// `_manifest`; program.py `state_layout`, `updated_entries`): `layers` layers, LoRA rank 2 on q_proj
/// (8 -> 8) and v_proj (8 -> 4), state per layer, per target, A then B, then AdamW moments and the
/// step counter when `adamw`. Each method takes ids, labels, lr and every entry, and returns the loss
/// and the entries it changes: SGD, only its phase's layers; AdamW, everything.
enum TinyManifest {
    static let initFile = "state_init.bin"

    struct Entry {
        let name: String, key: String, role: String, shape: [Int], offset: Int, layer: Int?
        var json: JSONValue {
            .object(["name": .string(name), "key": .string(key), "role": .string(role), "shape": ints(shape),
                     "offset": .int(Int64(offset))])
        }
        var io: JSONValue { tensor(name, "float32", shape) }
    }

    static func entries(layers: Int, adamw: Bool) -> [Entry] {
        let rank = 2
        let shapes: [(String, Int, Int)] = [("q_proj", 8, 8), ("v_proj", 4, 8)]   // (target, d_out, d_in)
        var out: [Entry] = []
        var offset = 0
        let roles: [(String, String)] = adamw ? [("lora", "param"), ("adam_m", "exp_avg"), ("adam_v", "exp_avg_sq")]
                                              : [("lora", "param")]
        for (prefix, role) in roles {
            for i in 0..<layers {
                for (t, dOut, dIn) in shapes {
                    for (which, shape) in [("a", [rank, dIn]), ("b", [dOut, rank])] {
                        out.append(Entry(name: "\(prefix)_\(i)_\(t)_\(which)",
                                         key: "base_model.model.model.layers.\(i).self_attn.\(t).lora_\(which.uppercased()).weight",
                                         role: role, shape: shape, offset: offset, layer: i))
                        offset += shape[0] * shape[1]
                    }
                }
            }
        }
        if adamw { out.append(Entry(name: "adam_step", key: "", role: "step", shape: [1], offset: offset, layer: nil)) }
        return out
    }

    static func json(layers: Int = 4, lcsb: Bool = true, seqLen: Int = 8, adamw: Bool = false,
                     peakEstimate: Int? = nil) -> JSONValue {
        let entries = entries(layers: layers, adamw: adamw)
        let numel = entries.last.map { $0.offset + $0.shape.reduce(1, *) } ?? 0
        let phases: [[Int]]? = lcsb ? stride(from: 0, to: layers, by: 2).map { Array($0..<min($0 + 2, layers)) } : nil
        var methods: [JSONValue] = []
        var arenas: [String: JSONValue] = [:]
        for k in phases.map({ Array($0.indices) }) ?? [-1] {
            let name = k < 0 ? "train_step" : "train_step_p\(k)"
            let selected = Set(k < 0 ? Array(0..<layers) : phases![k])
            let updated = entries.filter { e in e.layer.map { selected.contains($0) || adamw } ?? true }
            var m: [String: JSONValue] = [:]
            m["name"] = .string(name)
            m["kind"] = .string("train_step")
            m["phase"] = k < 0 ? .null : .int(Int64(k))
            m["backward_layers"] = ints(selected.sorted())
            m["inputs"] = .array([tensor("input_ids", "int64", [seqLen]), tensor("labels", "int64", [seqLen]),
                                  tensor("lr", "float32", [1])] + entries.map(\.io))
            m["outputs"] = .array([tensor("loss", "float32", [1])] + updated.map(\.io))
            methods.append(.object(m))
            arenas[name] = .int(1 << 20)
        }
        var plan: [String: JSONValue] = ["planned_arena_bytes": .object(arenas), "constant_bytes": .int(4096),
                                         "lora_state_bytes": .int(Int64(4 * numel))]
        if let peakEstimate { plan["peak_estimate_bytes"] = .int(Int64(peakEstimate)) }
        var optimizer: [String: JSONValue] = ["kind": .string(adamw ? "adamw" : "sgd"), "weight_decay": .double(adamw ? 0.01 : 0),
                                              "frozen_unselected": .bool(false)]
        if adamw { optimizer["betas"] = .array([.double(0.9), .double(0.999)]) }
        let arch: [String: JSONValue] = [
            "hidden": .int(8), "layers": .int(Int64(layers)), "heads": .int(2), "kv_heads": .int(1),
            "intermediate": .int(16), "vocab": .int(264), "max_positions": .int(64), "rms_eps": .double(1e-6),
            "rope_theta": .double(1e6), "tie_embeddings": .bool(true),
        ]
        let model: [String: JSONValue] = ["source": .string("tiny"), "init": .string("random"), "seed": .int(0),
                                          "arch": .object(arch)]
        let lora: [String: JSONValue] = ["rank": .int(2), "alpha": .double(4), "scale": .double(2),
                                         "targets": .array([.string("q_proj"), .string("v_proj")])]
        var lcsbValue = JSONValue.null
        if let phases {
            let lcsbObject: [String: JSONValue] = ["policy": .string("cyclic"), "k": .int(2),
                                                   "phases": .array(phases.map(ints)), "schedule": ints(Array(phases.indices))]
            lcsbValue = .object(lcsbObject)
        }
        let program: [String: JSONValue] = ["target": .string("executorch"), "file": .string("model.pte"),
                                            "delegate": .null, "bytes": .int(1000)]
        let state: [String: JSONValue] = ["dtype": .string("float32"), "numel": .int(Int64(numel)),
                                          "init_file": .string(initFile), "entries": .array(entries.map(\.json))]
        let tokenizer: [String: JSONValue] = ["kind": .string("byte"), "vocab": .int(264), "pad_token_id": .int(258)]
        let peft: [String: JSONValue] = ["peft_type": .string("LORA"), "r": .int(2), "lora_alpha": .double(4),
                                         "target_modules": .array([.string("q_proj"), .string("v_proj")]),
                                         "base_model_name_or_path": .string("tiny")]
        let adapter: [String: JSONValue] = ["init_dir": .string("adapter_init"), "config": .object(peft)]
        var top: [String: JSONValue] = [:]
        top["schema_version"] = .int(2)
        top["toolchain_version"] = .string("0.1.0")
        top["model"] = .object(model)
        top["lora"] = .object(lora)
        top["seq_len"] = .int(Int64(seqLen))
        top["quant"] = .object(["kind": .string("none"), "group": .int(64)])
        top["optimizer"] = .object(optimizer)
        top["lcsb"] = lcsbValue
        top["programs"] = .array([.object(program)])
        top["methods"] = .array(methods)
        top["state"] = .object(state)
        top["memory_plan"] = .object(plan)
        top["tokenizer"] = .object(tokenizer)
        top["adapter"] = .object(adapter)
        top["files"] = .object(["model.pte": .string(String(repeating: "0", count: 64)),
                                initFile: .string(String(repeating: "1", count: 64))])
        return .object(top)
    }

    static func manifest(layers: Int = 4, lcsb: Bool = true, seqLen: Int = 8, adamw: Bool = false,
                         peakEstimate: Int? = nil) throws -> ProgramManifest {
        try ProgramManifest.decode(try json(layers: layers, lcsb: lcsb, seqLen: seqLen, adamw: adamw,
                                            peakEstimate: peakEstimate).jsonData())
    }

    /// The initial state an export would write: LoRA params in [-1, 1) from a fixed seed, moments
    /// and the step counter zero.
    static func initialState(_ m: ProgramManifest, seed: UInt64 = 1) -> [Float] {
        var rng = SplitMix64(state: seed)
        var s = [Float](repeating: 0, count: m.state.numel)
        for e in m.state.entries where e.role == "param" {
            for j in e.offset..<(e.offset + e.count) { s[j] = Float(Double(rng.next() % 2000) / 1000.0 - 1.0) }
        }
        return s
    }

    /// A program directory holding only `state_init.bin` (all the trainer reads from it; the
    /// manifest object is passed in directly).
    static func programDirectory(_ m: ProgramManifest, state: [Float]? = nil) throws -> URL {
        let dir = try tempDir("program")
        try StateFile.encode(state ?? initialState(m)).write(to: dir.appendingPathComponent(m.state.initFile))
        return dir
    }

    static func ints(_ xs: [Int]) -> JSONValue { .array(xs.map { .int(Int64($0)) }) }
    static func tensor(_ name: String, _ dtype: String, _ shape: [Int]) -> JSONValue {
        .object(["name": .string(name), "dtype": .string(dtype), "shape": ints(shape)])
    }
}

/// Rows of 3..6 byte tokens; row 0 masks its first label.
func tinyRows(_ n: Int = 5) -> [DataRow] {
    var rows: [DataRow] = []
    for i in 0..<n {
        var ids: [Int64] = []
        for t in 0..<(3 + i % 4) {
            let id: Int = 65 + (i * 7 + t * 3) % 26
            ids.append(Int64(id))
        }
        var labels: [Int64]? = nil
        if i == 0 {
            labels = ids
            labels![0] = -100
        }
        rows.append(DataRow(inputIds: ids, labels: labels))
    }
    return rows
}

func tempDir(_ name: String = #function) throws -> URL {
    let dir = FileManager.default.temporaryDirectory
        .appendingPathComponent("trainercore-\(name.filter(\.isLetter))-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
    return dir
}

/// A probe that returns scripted samples in order (the last one repeats).
final class ScriptedProbe: MemoryProbe {
    var samples: [MemorySample]
    private var i = 0
    init(_ samples: [MemorySample]) { self.samples = samples }
    func sample() -> MemorySample? {
        defer { i += 1 }
        return samples.isEmpty ? nil : samples[min(i, samples.count - 1)]
    }
}

/// A transport that answers from a script and records every request.
final class ScriptedTransport: TelemetryTransport {
    var answers: [TransportResult]
    private(set) var requests: [TelemetryRequest] = []
    init(_ answers: [TransportResult]) { self.answers = answers }
    func post(_ request: TelemetryRequest) -> TransportResult {
        requests.append(request)
        return answers.isEmpty ? .status(200) : answers.removeFirst()
    }
}

/// Collects events in memory.
final class MemorySink: TelemetrySink {
    var events: [TelemetryEvent] = []
    func append(_ event: TelemetryEvent) throws { events.append(event) }
}

let testDevice = DeviceInfo(deviceModel: "iPhone16,1", os: "iOS 18.1", totalRamBytes: 8 << 30, budgetBytes: 2 << 30)

/// A fixed clock that advances by `tick` seconds at every reading.
final class TickClock {
    var now: Double
    let tick: Double
    init(start: Double = 1_767_225_600, tick: Double = 0.25) { (now, self.tick) = (start, tick) }
    func read() -> Double { defer { now += tick }; return now }
}
