#if canImport(CoreML)
import CoreML
import Foundation
import TrainerCore

/// Runs a Core ML export (`toolchain export --target coreml`, toolchain/export/coreml.py)
/// for TrainerCore's `LayerLoop`: one ML program per method, `coreml/<method>.mlpackage`, listed in
/// the `coreml` program entry's `methods`. No package holds a weight: the frozen weights, the LoRA
/// state and the activations are inputs named as the manifest's method inputs, outputs likewise
/// (state outputs are `<entry>_out`).
///
/// **No weight is stored twice**: float32 and 8-bit inputs are `MLMultiArray(dataPointer:...)` over
/// the loop's own bytes (the memory-mapped weights file, the state array's slices, the activation
/// buffers), without a copy and without a deallocator; Core ML only reads its inputs. int4 weights
/// (uint8 nibbles) and int8 weights go in as int8 arrays over the same mapped bytes (the package reads
/// them back as unsigned where needed); int64 ids / positions are narrowed into small int32 arrays
/// (Core ML has no int64 inputs; seq_len values at most). Outputs are read in row-major order
/// whatever their strides and copied once into a Data. Compute units: `.cpuOnly` by default
/// (float32 end to end, like the host; the Neural Engine computes in float16). No MLState.
/// Not run on a device yet: see docs/ios.md.
final class CoreMLRuntime: ProgramRuntime {
    let backendName = "coreml"
    private let manifest: Manifest
    private let compiled: [String: URL]
    private let computeUnits: MLComputeUnits
    private var models: [String: MLModel] = [:]

    /// `MLMultiArrayDataType.int8` (Apple documents it for iOS 26 / macOS 26; the quantized packages
    /// target iOS 26), nil before iOS 26. Built with the iOS 26 SDK (Xcode 26, Swift 6.2) it is the
    /// SDK's `.int8`; an older SDK (Xcode 16) has no such case, so there it is spelled by its raw value,
    /// MLMultiArrayDataTypeInt8 = 0x20000 | 8 (as int32 is 0x20000 | 32). `IOS26_SDK`: ios/test.sh
    /// type-checks this branch on Linux against the stand-in's `case int8 = 131080`.
    static var int8Type: MLMultiArrayDataType? {
        #if compiler(>=6.2) || IOS26_SDK
        if #available(iOS 26, macOS 26, *) { return .int8 }
        return nil
        #else
        return MLMultiArrayDataType(rawValue: 0x20000 | 8)
        #endif
    }

    /// Compile each method's package (once; the compiled model is cached under Library/Caches,
    /// keyed by the package's checksums in the manifest, so a re-export is compiled again).
    static func make(programDirectory: URL, manifest: Manifest, computeUnits: MLComputeUnits = .cpuOnly) async throws -> CoreMLRuntime {
        guard let program = manifest.program(target: "coreml"), let methods = program.methods else {
            throw TrainerError.badInput("this program has no Core ML export; export it with --target coreml")
        }
        let caches = FileManager.default.urls(for: .cachesDirectory, in: .userDomainMask)[0]
            .appendingPathComponent("CompiledModels", isDirectory: true)
        var compiled: [String: URL] = [:]
        for (name, rel) in methods.sorted(by: { $0.key < $1.key }) {
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

    private init(manifest: Manifest, compiled: [String: URL], computeUnits: MLComputeUnits) {
        (self.manifest, self.compiled, self.computeUnits) = (manifest, compiled, computeUnits)
    }

    /// FNV-1a of the sha256 of every file of the package (manifest `files`): a new export, a new key.
    static func cacheKey(manifest: Manifest, package rel: String) -> String {
        let digests = manifest.files.filter { $0.key == rel || $0.key.hasPrefix(rel + "/") }.sorted { $0.key < $1.key }
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in digests.map({ "\($0.key)=\($0.value);" }).joined().utf8 {
            h = (h ^ UInt64(byte)) &* 0x0000_0100_0000_01b3
        }
        return String(h, radix: 16)
    }

    /// Load each method's model and check that it has every input and output the manifest names.
    func load(methods: [String]) throws {
        for name in methods where models[name] == nil {
            guard let url = compiled[name], let spec = manifest.methods.first(where: { $0.name == name }) else {
                throw TrainerError.runtime("method \(name) is not in the Core ML export; re-export the program")
            }
            let config = MLModelConfiguration()
            config.computeUnits = computeUnits
            let model: MLModel
            do { model = try MLModel(contentsOf: url, configuration: config) } catch {
                throw TrainerError.runtime("Core ML cannot load \(name) (\(error)); re-export the program")
            }
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

    func execute(method: String, layer: Int?, inputs: [LoopInput]) throws -> [Data] {
        let (model, spec, out) = try predict(method, inputs)
        return try spec.outputs.map { o in
            let values = try Self.floats(try Self.output(o, of: method, model: model, out: out), name: o.name)
            guard values.count == o.count else {
                throw TrainerError.runtime("\(method) returned \(values.count) values for \(o.name), the manifest says \(o.shape)")
            }
            return values.withUnsafeBytes { Data($0) }
        }
    }

    /// Each output read once, in row-major order, straight into the loop's buffer for it (its state
    /// slice, a pooled activation): the one copy, made after the prediction has run on every input (the
    /// inputs are wrapped without copying, and a destination may be one of them: a state entry, or the
    /// buffer of head_loss's x / block_backward's incoming d, which a training step gives the new d).
    func execute(method: String, layer: Int?, inputs: [LoopInput], into outputs: [LoopOutput]) throws {
        let (model, spec, out) = try predict(method, inputs)
        guard outputs.count == spec.outputs.count else {
            throw TrainerError.runtime("\(method) has \(spec.outputs.count) outputs, the loop expects \(outputs.count); re-export the program")
        }
        let arrays = try spec.outputs.map { try Self.output($0, of: method, model: model, out: out) }
        for (array, (o, dst)) in zip(arrays, zip(spec.outputs, outputs)) {
            let n = array.shape.map(\.intValue).reduce(1, *)
            guard n == o.count, n * 4 == dst.byteCount else {
                throw TrainerError.runtime("\(method) returned \(n) values for \(o.name), the manifest says \(o.shape)")
            }
        }
        for (array, (o, dst)) in zip(arrays, zip(spec.outputs, outputs)) {
            // Each contiguous run of the destination (all of it, or a KV-cache output's rows per head) read
            // straight from the array: the one copy.
            try dst.forEachSegment { offset, run in
                try Self.read(array, name: o.name, from: offset / 4, into: run.bindMemory(to: Float.self))
            }
        }
    }

    private static func output(_ o: IoSpec, of method: String, model: MLModel, out: MLFeatureProvider) throws -> MLMultiArray {
        guard let feature = featureName(of: o.name, in: model.modelDescription.outputDescriptionsByName),
              let array = out.featureValue(for: feature)?.multiArrayValue else {
            throw TrainerError.runtime("\(method) returned no \(o.name)")
        }
        return array
    }

    private func predict(_ method: String, _ inputs: [LoopInput]) throws -> (MLModel, MethodSpec, MLFeatureProvider) {
        guard let model = models[method], let spec = manifest.methods.first(where: { $0.name == method }) else {
            throw TrainerError.runtime("\(method) was not loaded")
        }
        var features: [String: MLFeatureValue] = [:]
        for v in inputs {
            guard let want = model.modelDescription.inputDescriptionsByName[v.name]?.multiArrayConstraint?.dataType else {
                throw TrainerError.runtime("the Core ML model of \(method) has no array input \(v.name)")
            }
            features[v.name] = MLFeatureValue(multiArray: try Self.multiArray(v, as: want))
        }
        let out: MLFeatureProvider
        do {
            out = try model.prediction(from: try MLDictionaryFeatureProvider(dictionary: features))
        } catch {
            throw TrainerError.runtime("Core ML failed in \(method): \(error)")
        }
        return (model, spec, out)
    }

    /// The exporter names state outputs `<entry>_out`; other outputs keep their names.
    static func featureName(of name: String, in outputs: [String: MLFeatureDescription]) -> String? {
        if outputs[name] != nil { return name }
        return outputs[name + "_out"] != nil ? name + "_out" : nil
    }

    static func rowMajorStrides(_ shape: [Int]) -> [NSNumber] {
        var strides = [Int](repeating: 1, count: shape.count)
        var acc = 1
        for d in stride(from: shape.count - 1, through: 0, by: -1) { strides[d] = acc; acc *= shape[d] }
        return strides.map { NSNumber(value: $0) }
    }

    /// The input as the model's array type: float32 and 8-bit inputs over the loop's bytes without a
    /// copy (`dataPointer:`, no deallocator: the loop owns the memory and keeps it for the call);
    /// int64 ids / positions narrowed into a fresh int32 array.
    static func multiArray(_ v: LoopInput, as type: MLMultiArrayDataType) throws -> MLMultiArray {
        let shape = v.shape.map { NSNumber(value: $0) }
        guard let base = v.bytes.baseAddress else { throw TrainerError.runtime("Core ML input \(v.name) is empty") }
        let pointer = UnsafeMutableRawPointer(mutating: base)
        switch (v.dtype, type) {
        case ("float32", .float32):
            return try MLMultiArray(dataPointer: pointer, shape: shape, dataType: .float32, strides: rowMajorStrides(v.shape), deallocator: nil)
        case ("uint8", _) where type == int8Type, ("int8", _) where type == int8Type:
            return try MLMultiArray(dataPointer: pointer, shape: shape, dataType: type, strides: rowMajorStrides(v.shape), deallocator: nil)
        case ("int64", .int32):
            let array = try MLMultiArray(shape: shape, dataType: .int32)
            let n = v.bytes.count / 8
            guard array.count == n else { throw TrainerError.runtime("Core ML input \(v.name) takes \(array.count) values, got \(n)") }
            array.withUnsafeMutableBytes { raw, strides in
                let p = raw.bindMemory(to: Int32.self)
                let contiguous = strides.last ?? 1
                for i in 0..<n {
                    let id = Int64(littleEndian: v.bytes.loadUnaligned(fromByteOffset: 8 * i, as: Int64.self))
                    p[i * contiguous] = Int32(truncatingIfNeeded: id)
                }
            }
            return array
        default:
            throw TrainerError.badInput("Core ML input \(v.name) is \(v.dtype) in the manifest and data type \(type.rawValue) in the model; " +
                                        "re-export the program with this app's toolchain")
        }
    }

    /// The values of an output in row-major order, whatever its strides (Core ML may pad them) and
    /// float type.
    static func floats(_ array: MLMultiArray, name: String) throws -> [Float] {
        var out = [Float](repeating: 0, count: array.shape.map(\.intValue).reduce(1, *))
        try out.withUnsafeMutableBufferPointer { try read(array, name: name, into: $0) }
        return out
    }

    /// The values of an output in row-major order into `out` (its element count), whatever the
    /// array's strides and float type.
    /// Values `first ..< first + out.count` of `array` in row-major order (its own strides) into `out`.
    static func read(_ array: MLMultiArray, name: String, from first: Int = 0, into out: UnsafeMutableBufferPointer<Float>) throws {
        let shape = array.shape.map(\.intValue), strides = array.strides.map(\.intValue)
        let read: (UnsafeRawPointer, Int) -> Float
        switch array.dataType {
        case .float32: read = { $0.load(fromByteOffset: 4 * $1, as: Float.self) }
        case .double: read = { Float($0.load(fromByteOffset: 8 * $1, as: Double.self)) }
        case .float16: read = { halfToFloat($0.load(fromByteOffset: 2 * $1, as: UInt16.self)) }
        default: throw TrainerError.runtime("Core ML output \(name) has data type \(array.dataType.rawValue), not a float")
        }
        let n = max(0, min(shape.reduce(1, *) - first, out.count))
        array.withUnsafeBytes { raw in
            guard let base = raw.baseAddress else { return }
            // the multi-index of value `first`
            var index = [Int](repeating: 0, count: shape.count)
            var rest = first
            for d in stride(from: shape.count - 1, through: 0, by: -1) where shape[d] > 0 {
                index[d] = rest % shape[d]
                rest /= shape[d]
            }
            for i in 0..<n {
                out[i] = read(base, zip(index, strides).reduce(0) { $0 + $1.0 * $1.1 })
                var d = shape.count - 1
                while d >= 0 {
                    index[d] += 1
                    if index[d] < shape[d] { break }
                    index[d] = 0
                    d -= 1
                }
            }
        }
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
#endif
