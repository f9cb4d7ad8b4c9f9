import Foundation

/// One named tensor going into or coming out of a program method. Float data is an `ArraySlice`, so
/// the trainer passes slices of its state array without copying them (note: a slice keeps its
/// parent's indices; use `withUnsafeBufferPointer`, `first` or `Array(...)`, never `[0]`).
public struct TensorValue: Equatable {
    public enum Storage: Equatable {
        case int64([Int64])
        case float32(ArraySlice<Float>)
    }

    public var name: String
    public var shape: [Int]
    public var storage: Storage

    public init(name: String, shape: [Int], storage: Storage) {
        (self.name, self.shape, self.storage) = (name, shape, storage)
    }

    public static func int64(_ name: String, _ values: [Int64], shape: [Int]? = nil) -> TensorValue {
        TensorValue(name: name, shape: shape ?? [values.count], storage: .int64(values))
    }

    public static func float32(_ name: String, _ values: ArraySlice<Float>, shape: [Int]? = nil) -> TensorValue {
        TensorValue(name: name, shape: shape ?? [values.count], storage: .float32(values))
    }

    public static func float32(_ name: String, _ values: [Float], shape: [Int]? = nil) -> TensorValue {
        float32(name, values[...], shape: shape)
    }

    /// `int64` or `float32` (the manifest's dtype names).
    public var dtype: String {
        switch storage {
        case .int64: return "int64"
        case .float32: return "float32"
        }
    }

    /// Number of values held.
    public var count: Int {
        switch storage {
        case .int64(let v): return v.count
        case .float32(let v): return v.count
        }
    }

    public var floats: ArraySlice<Float>? {
        if case .float32(let v) = storage { return v }
        return nil
    }

    public var int64s: [Int64]? {
        if case .int64(let v) = storage { return v }
        return nil
    }
}

/// What the trainer needs from an inference runtime that runs an exported training program
/// (manifest schema_version 2). Backends: ExecuTorch (`model.pte`, the stock Swift `Module`) and
/// Core ML (one compiled model per method), both in the app target; `FakeRuntime` here for tests.
/// A backend is used from one thread at a time.
///
/// The program is a pure function: the runtime holds no training state. `execute` takes the inputs
/// the manifest lists for the method (input_ids, labels, lr, then every state entry) and returns
/// its outputs in the manifest's order, each named as the manifest names it (loss, then the state
/// entries the method changed). Returned data must be the caller's own copy (a runtime may reuse
/// its output memory on the next call).
public protocol TrainingRuntime: AnyObject {
    /// `executorch` or `coreml` (the telemetry `backend` field).
    var backendName: String { get }
    /// Load (prepare) these methods before the first call, so the first step does not pay for it
    /// and a missing method fails before training starts.
    func load(methods: [String]) throws
    /// Run one method.
    func execute(method: String, inputs: [TensorValue]) throws -> [TensorValue]
}

extension ProgramManifest.Method {
    /// Name positional outputs (runtimes such as ExecuTorch return them by position) after the
    /// manifest's `outputs`, checking their number and sizes.
    public func namedOutputs(_ values: [[Float]]) throws -> [TensorValue] {
        guard values.count == outputs.count else {
            throw TrainerError.runtime("\(name) returned \(values.count) outputs, the manifest lists \(outputs.count); re-export the program")
        }
        return try zip(outputs, values).map { spec, v in
            guard v.count == spec.count else {
                throw TrainerError.runtime("\(name) returned \(v.count) values for \(spec.name), the manifest says \(spec.shape); re-export the program")
            }
            return .float32(spec.name, v, shape: spec.shape)
        }
    }
}

/// The initial state of a program: `state.init_file`, raw little-endian float32.
public enum StateFile {
    public static func loadInitial(manifest: ProgramManifest, programDirectory: URL) throws -> [Float] {
        let url = programDirectory.appendingPathComponent(manifest.state.initFile)
        return try decode(try readFile(url, what: "initial state"), numel: manifest.state.numel, source: url.path)
    }

    /// `numel` float32 values from raw little-endian bytes; any other size is refused.
    public static func decode(_ data: Data, numel: Int, source: String) throws -> [Float] {
        guard data.count == 4 * numel else {
            throw TrainerError.badInput("\(source) holds \(data.count) bytes, the manifest's state needs \(numel) float32 values " +
                                        "(\(4 * numel) bytes); re-export or re-copy the program")
        }
        return data.withUnsafeBytes { raw in
            (0..<numel).map { Float(bitPattern: UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: 4 * $0, as: UInt32.self))) }
        }
    }

    /// Raw little-endian float32 bytes (what `toolchain export` writes as state_init.bin).
    public static func encode(_ values: [Float]) -> Data {
        var data = Data(capacity: 4 * values.count)
        for v in values { withUnsafeBytes(of: v.bitPattern.littleEndian) { data.append(contentsOf: $0) } }
        return data
    }
}

/// A deterministic stand-in for a training program, for tests and UI previews, that follows the
/// contract: a pure function of its inputs (no state of its own), checking them against the
/// manifest, and returning the loss plus exactly the state entries the manifest lists as the
/// method's outputs. A toy quadratic loss pulls each LoRA parameter towards a target that depends
/// on the labels; only the layers of the method's LCSB phase get a gradient. SGD: p -= lr * g.
/// AdamW: torch's update (bias correction, decoupled weight decay), moments and step included.
public final class FakeRuntime: TrainingRuntime {
    public let backendName: String
    public private(set) var loaded: [String] = []
    public private(set) var calls: [String] = []
    /// Fail the call with this index (0-based, counted over this object's life), for error paths.
    public var failAtCall: Int?
    /// Edit a method's outputs before they are returned (tests of the trainer's checks).
    public var tamper: ((String, inout [TensorValue]) -> Void)?

    private let manifest: ProgramManifest
    private let entryLayer: [String: Int?]

    public init(manifest: ProgramManifest, backendName: String = "executorch") {
        self.manifest = manifest
        self.backendName = backendName
        var layers: [String: Int?] = [:]
        for e in manifest.state.entries { layers[e.name] = FakeRuntime.layer(ofKey: e.key) }
        entryLayer = layers
    }

    static func layer(ofKey key: String) -> Int? {
        guard let r = key.range(of: "layers.") else { return nil }
        return Int(key[r.upperBound...].prefix { $0.isNumber })
    }

    public func load(methods: [String]) throws {
        for name in methods {
            guard manifest.method(named: name) != nil else { throw TrainerError.runtime("method \(name) is not in the program") }
            loaded.append(name)
        }
    }

    public func execute(method: String, inputs: [TensorValue]) throws -> [TensorValue] {
        guard loaded.contains(method), let spec = manifest.method(named: method) else {
            throw TrainerError.runtime("method \(method) was called before it was loaded")
        }
        defer { calls.append(method) }
        if calls.count == failAtCall { throw TrainerError.runtime("injected failure in \(method)") }
        guard inputs.count == spec.inputs.count else {
            throw TrainerError.runtime("\(method) takes \(spec.inputs.count) inputs, got \(inputs.count)")
        }
        for (v, s) in zip(inputs, spec.inputs) where v.name != s.name || v.dtype != s.dtype || v.shape != s.shape || v.count != s.count {
            throw TrainerError.runtime("\(method): input \(v.name) \(v.dtype)\(v.shape) does not match \(s.name) \(s.dtype)\(s.shape)")
        }
        var state: [String: [Float]] = [:]
        for v in inputs.dropFirst(3) { state[v.name] = Array(v.floats!) }
        let labels = inputs[1].int64s!
        let lr = inputs[2].floats!.first!
        let selected = Set(spec.backwardLayers ?? [])
        let target = Float(labels.reduce(0) { $0 + ($1 < 0 ? 0 : $1 % 7) }) / Float(7 * labels.count)
        let (loss, new) = update(state: state, target: target, lr: lr, moves: { l in spec.backwardLayers == nil || l.map(selected.contains) ?? true })
        var outputs: [TensorValue] = [.float32("loss", [loss], shape: [1])]
        for o in spec.outputs.dropFirst() { outputs.append(.float32(o.name, new[o.name] ?? state[o.name]!, shape: o.shape)) }
        tamper?(method, &outputs)
        return outputs
    }

    /// The new value of every entry the toy step changes, and the loss before the step.
    private func update(state: [String: [Float]], target: Float, lr: Float, moves: (Int?) -> Bool) -> (Float, [String: [Float]]) {
        let o = manifest.optimizer
        var new: [String: [Float]] = [:]
        var loss: Double = 0
        var n = 0
        let step = (state["adam_step"]?.first ?? 0) + 1
        if o.kind == "adamw" { new["adam_step"] = [step] }
        for e in manifest.state.entries where e.role == "param" {
            let p = state[e.name]!
            let g: [Float] = p.map { moves(entryLayer[e.name] ?? nil) ? 2 * ($0 - target) : 0 }
            for x in p { loss += Double((x - target) * (x - target)); n += 1 }
            if o.kind == "adamw" {
                let names = manifest.state.entries.filter { $0.key == e.key }
                guard let mName = names.first(where: { $0.role == "exp_avg" })?.name,
                      let vName = names.first(where: { $0.role == "exp_avg_sq" })?.name else { continue }
                let (b1, b2, eps, wd) = (Float(0.9), Float(0.999), Float(1e-8), Float(o.weightDecay))
                let m = zip(state[mName]!, g).map { b1 * $0 + (1 - b1) * $1 }
                let v = zip(state[vName]!, g).map { b2 * $0 + (1 - b2) * $1 * $1 }
                let (c1, c2) = (1 - pow(b1, step), 1 - pow(b2, step))
                new[e.name] = p.indices.map { i in p[i] * (1 - lr * wd) - lr * (m[i] / c1) / ((v[i] / c2).squareRoot() + eps) }
                (new[mName], new[vName]) = (m, v)
            } else if g.contains(where: { $0 != 0 }) {
                new[e.name] = zip(p, g).map { $0 - lr * $1 }
            }
        }
        return (Float(loss / Double(max(n, 1))), new)
    }
}
