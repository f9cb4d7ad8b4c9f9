#if canImport(CoreML)
import CoreML
import Foundation
import TrainerCore

/// Runs a Core ML export of the training step (`programs[].target == "coreml"`): an ML program whose
/// LoRA state lives in Core ML states (iOS 18 `MLState`), one function per train method when the
/// package is multifunction (LCSB). The manifest's program entry lists the package's `inputs`,
/// `outputs` and `states`; the states, in order, hold the flat state of `manifest.state` (Core ML
/// states are float16, so get/set convert). Not run on a device yet: see docs/ios.md.
@available(iOS 18.0, macOS 15.0, *)
final class CoreMLRuntime: TrainingRuntime {
    let backendName = "coreml"
    private let compiledURL: URL
    private let program: ProgramManifest.Program
    private let manifest: ProgramManifest
    private let computeUnits: MLComputeUnits
    private var models: [String: MLModel] = [:]
    private var state: MLState?

    /// Compile the package (once; the compiled model is cached next to it) and prepare the backend.
    static func make(programDirectory: URL, manifest: ProgramManifest,
                     computeUnits: MLComputeUnits = .cpuAndNeuralEngine) async throws -> CoreMLRuntime {
        guard let program = manifest.program(target: "coreml") else {
            throw TrainerError.badInput("this program has no Core ML export; export it with --target coreml")
        }
        guard let states = program.states, !states.isEmpty, program.inputs != nil, program.outputs != nil else {
            throw TrainerError.badInput("the manifest's coreml entry lists no inputs/outputs/states; re-export the program")
        }
        guard states.reduce(0, { $0 + $1.count }) == manifest.state.numel else {
            throw TrainerError.badInput("the Core ML states do not add up to the \(manifest.state.numel) state values")
        }
        let source = programDirectory.appendingPathComponent(program.file)
        let compiled: URL
        if source.pathExtension == "mlmodelc" {
            compiled = source
        } else {
            let cached = source.deletingPathExtension().appendingPathExtension("mlmodelc")
            if FileManager.default.fileExists(atPath: cached.path) {
                compiled = cached
            } else {
                let tmp = try await MLModel.compileModel(at: source)
                try FileManager.default.moveItem(at: tmp, to: cached)
                compiled = cached
            }
        }
        return CoreMLRuntime(compiledURL: compiled, program: program, manifest: manifest, computeUnits: computeUnits)
    }

    private init(compiledURL: URL, program: ProgramManifest.Program, manifest: ProgramManifest, computeUnits: MLComputeUnits) {
        (self.compiledURL, self.program, self.manifest, self.computeUnits) = (compiledURL, program, manifest, computeUnits)
    }

    /// One MLModel per train method (function), all predicting with one shared MLState. get_state and
    /// set_state are not Core ML functions: the backend reads and writes the states directly.
    func load(methods: [String]) throws {
        let trainMethods = manifest.trainMethodNames.filter(methods.contains)
        for name in trainMethods {
            let config = MLModelConfiguration()
            config.computeUnits = computeUnits
            if trainMethods.count > 1 || name != "train_step" { config.functionName = name }
            models[name] = try MLModel(contentsOf: compiledURL, configuration: config)
        }
        guard let first = trainMethods.first, let model = models[first] else {
            throw TrainerError.runtime("no train method to load")
        }
        state = model.makeState()
    }

    func trainStep(method: String, inputIds: [Int64], labels: [Int64], lr: Float) throws -> Float {
        guard let model = models[method], let state else { throw TrainerError.runtime("\(method) was not loaded") }
        let specs = program.inputs ?? []
        guard specs.count == 3 else { throw TrainerError.badInput("the Core ML step must take 3 inputs") }
        let features = try MLDictionaryFeatureProvider(dictionary: [
            specs[0].name: MLFeatureValue(multiArray: try Self.array(inputIds.map(Double.init), spec: specs[0])),
            specs[1].name: MLFeatureValue(multiArray: try Self.array(labels.map(Double.init), spec: specs[1])),
            specs[2].name: MLFeatureValue(multiArray: try Self.array([Double(lr)], spec: specs[2])),
        ])
        let out = try model.prediction(from: features, using: state)
        guard let name = program.outputs?.first?.name, let loss = out.featureValue(for: name)?.multiArrayValue else {
            throw TrainerError.runtime("\(method) returned no loss")
        }
        return loss[0].floatValue
    }

    /// An MLMultiArray of the spec's dtype (Core ML takes int32, not int64, token ids).
    static func array(_ values: [Double], spec: ProgramManifest.TensorSpec) throws -> MLMultiArray {
        let type: MLMultiArrayDataType
        switch spec.dtype {
        case "int32": type = .int32
        case "float16": type = .float16
        case "float32": type = .float32
        default: throw TrainerError.badInput("Core ML input \(spec.name) has dtype \(spec.dtype); expected int32/float16/float32")
        }
        let array = try MLMultiArray(shape: spec.shape.map { NSNumber(value: $0) }, dataType: type)
        guard array.count == values.count else {
            throw TrainerError.badInput("Core ML input \(spec.name) takes \(array.count) values, got \(values.count)")
        }
        for (i, v) in values.enumerated() { array[i] = NSNumber(value: v) }
        return array
    }

    func getState() throws -> [Float] {
        guard let state else { throw TrainerError.runtime("get_state before load") }
        var flat: [Float] = []
        flat.reserveCapacity(manifest.state.numel)
        for spec in program.states ?? [] {
            state.withMultiArray(for: spec.name) { array in
                for i in 0..<array.count { flat.append(array[i].floatValue) }
            }
        }
        return flat
    }

    func setState(_ values: [Float]) throws {
        guard let state else { throw TrainerError.runtime("set_state before load") }
        guard values.count == manifest.state.numel else {
            throw TrainerError.runtime("set_state takes \(manifest.state.numel) values, got \(values.count)")
        }
        var offset = 0
        for spec in program.states ?? [] {
            state.withMultiArray(for: spec.name) { array in
                for i in 0..<array.count { array[i] = NSNumber(value: values[offset + i]) }
            }
            offset += spec.count
        }
    }
}
#endif
