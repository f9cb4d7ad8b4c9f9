import ExecuTorch
import Foundation
import TrainerCore

/// Runs `model.pte` with the stock ExecuTorch Swift `Module` (executorch 1.5.x, the exporter's
/// version): `Module(filePath:loadMode: .mmap)`, `load(_:)` per method, `execute(_:_:)`.
///
/// The program is functional (manifest schema_version 2): every call gets the state slices as
/// inputs and returns the changed entries, so it does not matter that this `Module` gives each
/// method its own memory arenas. Inputs are not memory-planned by the exporter
/// (`alloc_graph_input=False`): ExecuTorch reads the tensors built here in place. Outputs live in
/// the method's planned arena, which its next call overwrites, so they are copied out at once.
final class ExecuTorchRuntime: TrainingRuntime {
    let backendName = "executorch"
    private let module: Module
    private let manifest: ProgramManifest
    private let fileName: String

    init(programFile: URL, manifest: ProgramManifest) throws {
        guard FileManager.default.fileExists(atPath: programFile.path) else {
            throw TrainerError.io("\(programFile.path) is missing; copy the whole program directory to the phone")
        }
        module = Module(filePath: programFile.path, loadMode: .mmap)
        self.manifest = manifest
        fileName = programFile.lastPathComponent
        do {
            try module.load()
        } catch {
            throw TrainerError.runtime("ExecuTorch cannot load \(fileName) (\(error)); re-export it with the app's executorch version")
        }
    }

    /// Load each method (planning its arena), and check that its signature is the manifest's: a
    /// model.pte from another export fails here, not in the middle of a step.
    func load(methods: [String]) throws {
        for name in methods {
            guard let spec = manifest.method(named: name) else { throw TrainerError.runtime("method \(name) is not in the manifest") }
            let meta: MethodMetadata
            do {
                try module.load(name)
                meta = try module.methodMetadata(name)
            } catch {
                throw TrainerError.runtime("ExecuTorch cannot load method \(name) of \(fileName) (\(error)); re-export the program")
            }
            guard meta.inputValueTags.count == spec.inputs.count, meta.outputValueTags.count == spec.outputs.count else {
                throw TrainerError.runtime("\(fileName) method \(name) takes \(meta.inputValueTags.count) inputs and returns " +
                                           "\(meta.outputValueTags.count) outputs, the manifest says \(spec.inputs.count) and " +
                                           "\(spec.outputs.count); the program and its manifest come from different exports")
            }
        }
    }

    func execute(method: String, inputs: [TensorValue]) throws -> [TensorValue] {
        guard let spec = manifest.method(named: method) else { throw TrainerError.runtime("method \(method) is not in the manifest") }
        let values: [ValueConvertible] = inputs.map(Self.tensor)
        let outputs: [Value]
        do {
            outputs = try module.execute(method, values)
        } catch {
            throw TrainerError.runtime("ExecuTorch failed in \(method): \(error)")
        }
        let copies: [[Float]] = try outputs.enumerated().map { i, value in
            guard let t: Tensor<Float> = value.tensor() else {
                throw TrainerError.runtime("\(method) output \(i) is not a float32 tensor; re-export the program")
            }
            return t.scalars()
        }
        return try spec.namedOutputs(copies)
    }

    /// An ExecuTorch tensor holding a copy of the value (a state slice is copied once per step; the
    /// copy lives until `execute` returns).
    static func tensor(_ v: TensorValue) -> ValueConvertible {
        switch v.storage {
        case .int64(let values):
            return Tensor<Int64>(values, shape: v.shape)
        case .float32(let values):
            return values.withUnsafeBufferPointer { Tensor<Float>(bytes: UnsafeRawPointer($0.baseAddress!), shape: v.shape) }
        }
    }
}
