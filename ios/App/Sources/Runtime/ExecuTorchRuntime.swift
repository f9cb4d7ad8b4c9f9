import Foundation
import TrainerCore
#if canImport(ExecuTorch)
import ExecuTorch
#endif

/// The calls the ExecuTorch backend needs, so the two ways of reaching the runtime share one backend.
protocol ExecuTorchEngine: AnyObject {
    func load(method: String) throws
    func trainStep(method: String, inputIds: [Int64], labels: [Int64], lr: Float) throws -> Float
    func getState() throws -> [Float]
    func setState(_ state: [Float]) throws
}

/// Runs `model.pte` with ExecuTorch (executorch 1.5.1, the exporter's version), memory-mapped.
final class ExecuTorchRuntime: TrainingRuntime {
    let backendName = "executorch"
    private let engine: ExecuTorchEngine

    enum Engine: String, CaseIterable, Identifiable {
        /// C++ Module with shared memory arenas (TCSharedArenaModule.mm): what multi-method training needs.
        case sharedArena
        /// The package's Swift `Module`: no shared arenas in 1.5.1, so `Trainer.start` refuses it for a
        /// multi-method program (kept for programs and future runtimes where it works).
        case swiftModule
        var id: String { rawValue }
    }

    init(programFile: URL, engine: Engine = .sharedArena) throws {
        switch engine {
        case .sharedArena:
            self.engine = try SharedArenaEngine(path: programFile.path)
        case .swiftModule:
            #if canImport(ExecuTorch)
            self.engine = try SwiftModuleEngine(path: programFile.path)
            #else
            throw TrainerError.runtime("this build has no ExecuTorch Swift package")
            #endif
        }
    }

    func load(methods: [String]) throws {
        for m in methods { try engine.load(method: m) }
    }

    func trainStep(method: String, inputIds: [Int64], labels: [Int64], lr: Float) throws -> Float {
        try engine.trainStep(method: method, inputIds: inputIds, labels: labels, lr: lr)
    }

    func getState() throws -> [Float] { try engine.getState() }

    func setState(_ state: [Float]) throws { try engine.setState(state) }
}

/// Through the Objective-C++ shim (shared memory arenas).
final class SharedArenaEngine: ExecuTorchEngine {
    private let module: SharedArenaModule

    init(path: String) throws {
        module = try SharedArenaModule(path: path)
    }

    func load(method: String) throws { try module.load(method: method) }

    func trainStep(method: String, inputIds: [Int64], labels: [Int64], lr: Float) throws -> Float {
        let ids = inputIds.withUnsafeBufferPointer { Data(buffer: $0) }
        let lab = labels.withUnsafeBufferPointer { Data(buffer: $0) }
        return try module.trainStep(method: method, inputIds: ids, labels: lab, lr: lr).floatValue
    }

    func getState() throws -> [Float] {
        let data = try module.getState()
        return data.withUnsafeBytes { Array($0.bindMemory(to: Float.self)) }
    }

    func setState(_ state: [Float]) throws {
        try module.setState(state.withUnsafeBufferPointer { Data(buffer: $0) })
    }
}

#if canImport(ExecuTorch)
/// Through the ExecuTorch Swift API: `Module(filePath:loadMode:)`, `load(_:)`, `execute(_:_:)`.
final class SwiftModuleEngine: ExecuTorchEngine {
    private let module: Module

    init(path: String) throws {
        module = Module(filePath: path, loadMode: .mmap)
        try module.load()
    }

    func load(method: String) throws { try module.load(method) }

    func trainStep(method: String, inputIds: [Int64], labels: [Int64], lr: Float) throws -> Float {
        let inputs: [ValueConvertible] = [
            Tensor<Int64>(inputIds, shape: [inputIds.count]),
            Tensor<Int64>(labels, shape: [labels.count]),
            Tensor<Float>([lr], shape: [1]),
        ]
        let outputs: [Value] = try module.execute(method, inputs)
        guard let loss: Tensor<Float> = outputs.first?.tensor() else {
            throw TrainerError.runtime("\(method) returned no float32 loss")
        }
        return loss.scalars()[0]
    }

    func getState() throws -> [Float] {
        let outputs: [Value] = try module.execute("get_state", [ValueConvertible]())
        guard let state: Tensor<Float> = outputs.first?.tensor() else {
            throw TrainerError.runtime("get_state returned no float32 tensor")
        }
        return state.scalars()     // a copy: the next call may reuse the output's memory
    }

    func setState(_ state: [Float]) throws {
        let _: [Value] = try module.execute("set_state", [Tensor<Float>(state, shape: [state.count])])
    }
}
#endif
