#if canImport(CoreML)
import CoreML
import Foundation
import TrainerCore

/// Runs a Core ML export (`programs[].target == "coreml"`): one ML program per train method, listed
/// in the entry's `methods` (method name -> `.mlpackage`, relative to the program directory).
/// Stateless, like every target of manifest schema_version 2: the inputs (the manifest's names:
/// input_ids, labels, lr, every state entry) and outputs (loss, the changed entries) are
/// MLMultiArrays, float32 for floats; token ids go in as the model declares them (Core ML has no
/// int64 inputs: int32). No MLState (Core ML states are float16, unsound for AdamW moments).
/// Not run on a device yet: see docs/ios.md.
final class CoreMLRuntime: TrainingRuntime {
    let backendName = "coreml"
    private let manifest: ProgramManifest
    private let compiled: [String: URL]
    private let computeUnits: MLComputeUnits
    private var models: [String: MLModel] = [:]

    /// Compile each method's package (once; the compiled model is cached under Library/Caches,
    /// keyed by the package's checksums in the manifest, so a re-export is compiled again).
    /// - Parameter computeUnits: `.cpuOnly` by default: float32 end to end, as on the host (the
    ///   Neural Engine computes in float16).
    static func make(programDirectory: URL, manifest: ProgramManifest,
                     computeUnits: MLComputeUnits = .cpuOnly) async throws -> CoreMLRuntime {
        guard let program = manifest.program(target: "coreml") else {
            throw TrainerError.badInput("this program has no Core ML export; export it with --target coreml")
        }
        let caches = FileManager.default.urls(for: .cachesDirectory, in: .userDomainMask)[0]
            .appendingPathComponent("CompiledModels", isDirectory: true)
        var compiled: [String: URL] = [:]
        for name in manifest.trainMethodNames {
            guard let rel = program.file(forMethod: name) else {
                throw TrainerError.badInput("the Core ML export lists no file for \(name); re-export the program")
            }
            let source = programDirectory.appendingPathComponent(rel)
            guard FileManager.default.fileExists(atPath: source.path) else {
                throw TrainerError.io("\(source.path) is missing; copy the whole program directory to the phone")
            }
            if source.pathExtension == "mlmodelc" {
                compiled[name] = source
                continue
            }
            let cached = caches.appendingPathComponent("\(cacheKey(manifest: manifest, package: rel))-\(name).mlmodelc")
            if !FileManager.default.fileExists(atPath: cached.path) {
                let tmp = try await MLModel.compileModel(at: source)
                try FileManager.default.createDirectory(at: caches, withIntermediateDirectories: true)
                try? FileManager.default.removeItem(at: cached)
                try FileManager.default.moveItem(at: tmp, to: cached)
            }
            compiled[name] = cached
        }
        return CoreMLRuntime(manifest: manifest, compiled: compiled, computeUnits: computeUnits)
    }

    private init(manifest: ProgramManifest, compiled: [String: URL], computeUnits: MLComputeUnits) {
        (self.manifest, self.compiled, self.computeUnits) = (manifest, compiled, computeUnits)
    }

    /// FNV-1a of the sha256 of every file of the package (manifest `files`): a new export, a new key.
    static func cacheKey(manifest: ProgramManifest, package rel: String) -> String {
        let digests = manifest.files.filter { $0.key == rel || $0.key.hasPrefix(rel + "/") }.sorted { $0.key < $1.key }
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in digests.map({ "\($0.key)=\($0.value);" }).joined().utf8 {
            h = (h ^ UInt64(byte)) &* 0x0000_0100_0000_01b3
        }
        return String(h, radix: 16)
    }

    /// Load each method's model and check that it has every input and output the manifest names.
    func load(methods: [String]) throws {
        for name in methods {
            guard let url = compiled[name], let spec = manifest.method(named: name) else {
                throw TrainerError.runtime("method \(name) is not in the Core ML export")
            }
            let config = MLModelConfiguration()
            config.computeUnits = computeUnits
            let model = try MLModel(contentsOf: url, configuration: config)
            let desc = model.modelDescription
            if let missing = spec.inputs.first(where: { desc.inputDescriptionsByName[$0.name]?.multiArrayConstraint == nil }) {
                throw TrainerError.runtime("the Core ML model of \(name) has no array input \(missing.name); re-export the program")
            }
            if let missing = spec.outputs.first(where: { Self.featureName(of: $0.name, in: desc.outputDescriptionsByName) == nil }) {
                throw TrainerError.runtime("the Core ML model of \(name) has no output \(missing.name); re-export the program")
            }
            models[name] = model
        }
    }

    func execute(method: String, inputs: [TensorValue]) throws -> [TensorValue] {
        guard let model = models[method], let spec = manifest.method(named: method) else {
            throw TrainerError.runtime("\(method) was not loaded")
        }
        var features: [String: MLFeatureValue] = [:]
        for v in inputs {
            guard let want = model.modelDescription.inputDescriptionsByName[v.name]?.multiArrayConstraint?.dataType else {
                throw TrainerError.runtime("the Core ML model of \(method) has no array input \(v.name)")
            }
            features[v.name] = MLFeatureValue(multiArray: try Self.multiArray(v, as: want))
        }
        let out = try model.prediction(from: try MLDictionaryFeatureProvider(dictionary: features))
        return try spec.outputs.map { (o) throws -> TensorValue in
            guard let feature = Self.featureName(of: o.name, in: model.modelDescription.outputDescriptionsByName),
                  let array = out.featureValue(for: feature)?.multiArrayValue else {
                throw TrainerError.runtime("\(method) returned no \(o.name)")
            }
            let values = try Self.floats(array, name: o.name)
            guard values.count == o.count else {
                throw TrainerError.runtime("\(method) returned \(values.count) values for \(o.name), the manifest says \(o.shape)")
            }
            return .float32(o.name, values, shape: o.shape)
        }
    }

    /// Core ML refuses a feature name used as both input and output, so the exporter names the
    /// output of state entry `x` `x_out` (toolchain/export/coreml.py OUTPUT_SUFFIX); `loss` keeps its name.
    static func featureName(of name: String, in outputs: [String: MLFeatureDescription]) -> String? {
        if outputs[name] != nil { return name }
        return outputs[name + "_out"] != nil ? name + "_out" : nil
    }

    /// A fresh (contiguous) MLMultiArray of the model's input type holding the value: int32 or
    /// float32 (int64 ids are narrowed; every id is below the vocabulary size).
    static func multiArray(_ v: TensorValue, as type: MLMultiArrayDataType) throws -> MLMultiArray {
        let array = try MLMultiArray(shape: v.shape.map { NSNumber(value: $0) }, dataType: type)
        guard array.count == v.count else {
            throw TrainerError.runtime("Core ML input \(v.name) takes \(array.count) values, got \(v.count)")
        }
        var contiguous = true
        array.withUnsafeMutableBytes { raw, strides in
            var expect = 1
            for (dim, stride) in zip(v.shape, strides).reversed() {
                if stride != expect { contiguous = false }
                expect *= dim
            }
            guard contiguous else { return }
            switch (v.storage, type) {
            case (.int64(let ids), .int32):
                let p = raw.bindMemory(to: Int32.self)
                for (i, id) in ids.enumerated() { p[i] = Int32(truncatingIfNeeded: id) }
            case (.float32(let values), .float32):
                values.withUnsafeBytes { raw.copyMemory(from: $0) }
            default:
                contiguous = false
            }
        }
        guard contiguous, v.storage.matches(type) else {
            throw TrainerError.badInput("Core ML input \(v.name) is \(type.rawValue) (or not contiguous); the app feeds " +
                                        "int32 token ids and float32 tensors; re-export the program")
        }
        return array
    }

    /// The values of an output in row-major order, whatever its strides (Core ML may pad them) and
    /// float type.
    static func floats(_ array: MLMultiArray, name: String) throws -> [Float] {
        let shape = array.shape.map(\.intValue), strides = array.strides.map(\.intValue)
        let read: (UnsafeRawPointer, Int) -> Float
        switch array.dataType {
        case .float32: read = { $0.load(fromByteOffset: 4 * $1, as: Float.self) }
        case .double: read = { Float($0.load(fromByteOffset: 8 * $1, as: Double.self)) }
        case .float16: read = { halfToFloat($0.load(fromByteOffset: 2 * $1, as: UInt16.self)) }
        default: throw TrainerError.runtime("Core ML output \(name) has data type \(array.dataType.rawValue), not a float")
        }
        let n = shape.reduce(1, *)
        var out = [Float]()
        out.reserveCapacity(n)
        array.withUnsafeBytes { raw in
            guard let base = raw.baseAddress else { return }
            var index = [Int](repeating: 0, count: shape.count)
            for _ in 0..<n {
                out.append(read(base, zip(index, strides).reduce(0) { $0 + $1.0 * $1.1 }))
                var d = shape.count - 1
                while d >= 0 {
                    index[d] += 1
                    if index[d] < shape[d] { break }
                    index[d] = 0
                    d -= 1
                }
            }
        }
        return out
    }
}

/// IEEE half -> float (`Float16` is not available on every Apple architecture the project builds for).
func halfToFloat(_ h: UInt16) -> Float {
    let sign = UInt32(h >> 15) << 31
    let exp = Int((h >> 10) & 0x1f), frac = UInt32(h & 0x3ff)
    if exp == 0x1f { return Float(bitPattern: sign | 0x7f80_0000 | (frac << 13)) }           // inf / nan
    if exp == 0 { return (sign != 0 ? -1 : 1) * Float(frac) * 0x1p-24 }                       // zero / subnormal
    return Float(bitPattern: sign | UInt32(exp - 15 + 127) << 23 | (frac << 13))
}

private extension TensorValue.Storage {
    func matches(_ type: MLMultiArrayDataType) -> Bool {
        switch (self, type) {
        case (.int64, .int32), (.float32, .float32): return true
        default: return false
        }
    }
}
#endif
