import ExecuTorch
import Foundation
import TrainerCore

/// Runs the layer-generic methods of a contract-v3 `model.pte` for TrainerCore's `LayerLoop` with the
/// stock ExecuTorch Swift `Module` (executorch 1.5.x, the exporter's version) (`Module(filePath:loadMode: .mmap)`, `load(_:)` per method,
/// `execute(_:_:)`; the call pattern ios/hostcheck runs in C++ against the recorded trace).
///
/// Inputs are wrapped **without copying** (`Tensor(bytesNoCopy:shape:)`): the memory-mapped weights
/// file's pages, the slices of the app's one state array, the loop's activation buffers. They stay
/// valid for the call (the loop holds them), and the methods never write their inputs (they are pure:
/// every new value is an output), so the read-only weights mapping is safe to pass. Outputs live in
/// the method's planned arena, which its next call overwrites: each is copied once into a Data the
/// loop copies into its state slice / activation at once.
///
/// Native kernels: the app target compiles toolchain/native/int4_linear.cpp (project.yml), whose static
/// initializer registers `toolchain::int4_linear.out` with the ExecuTorch runtime the Module runs on.
/// `registeredKernels` asks the kernel registry (ToolchainKernels.cpp, through the bridging header)
/// about every kernel the manifest's fused methods need; with all of them the loop calls the fused
/// generation methods (`generate.fused`), else the stock ones (a fused method would fail to load).
final class ExecuTorchRuntime: LoopRuntime {
    let backendName = "executorch"
    private let module: Module
    private let manifest: LoopManifest
    private let fileName: String
    /// The kernels of the manifest's fused methods that this process has registered.
    let registeredKernels: Set<String>

    init(programFile: URL, manifest: LoopManifest) throws {
        guard FileManager.default.fileExists(atPath: programFile.path) else {
            throw TrainerError.io("\(programFile.path) is missing; copy the whole program directory to the phone")
        }
        module = Module(filePath: programFile.path, loadMode: .mmap)
        self.manifest = manifest
        fileName = programFile.lastPathComponent
        registeredKernels = Self.kernelsRegistered(Set(manifest.generate?.fused?.kernels ?? []))
        do {
            try module.load()
        } catch {
            throw TrainerError.runtime("ExecuTorch cannot load \(fileName) (\(error)); re-export it with the app's executorch version")
        }
    }

    /// Load each method (planning its arena) and check its arity against the manifest.
    func load(methods: [String]) throws {
        for name in methods {
            guard let spec = manifest.methods.first(where: { $0.name == name }) else {
                throw TrainerError.runtime("method \(name) is not in the manifest")
            }
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

    func execute(method: String, layer: Int?, inputs: [LoopInput]) throws -> [Data] {
        guard let spec = manifest.methods.first(where: { $0.name == method }) else {
            throw TrainerError.runtime("method \(method) is not in the manifest")
        }
        let values: [ValueConvertible] = try inputs.map(Self.tensor)
        let outputs: [Value]
        do {
            outputs = try module.execute(method, values)
        } catch {
            throw TrainerError.runtime("ExecuTorch failed in \(method): \(error)")
        }
        guard outputs.count == spec.outputs.count else {
            throw TrainerError.runtime("\(method) returned \(outputs.count) outputs, the manifest lists \(spec.outputs.count); re-export the program")
        }
        return try zip(outputs, spec.outputs).map { value, io in
            guard io.dtype == "float32", let t: Tensor<Float> = value.tensor() else {
                throw TrainerError.runtime("\(method) output \(io.name) is not a float32 tensor; re-export the program")
            }
            return t.withUnsafeBytes { Data(buffer: $0) }
        }
    }

    /// Those of `names` the ExecuTorch kernel registry of this process has (the app's native kernels
    /// register at load; ToolchainKernels.h).
    static func kernelsRegistered(_ names: Set<String>) -> Set<String> {
        names.filter { name in name.withCString { toolchain_kernel_registered($0) } }
    }

    /// Whether the native int4 kernel is linked into this app (what the screen reports).
    static var int4KernelRegistered: Bool { !kernelsRegistered([int4Kernel]).isEmpty }
    static let int4Kernel = "toolchain::int4_linear.out"

    /// A tensor over the input's bytes, no copy.
    static func tensor(_ v: LoopInput) throws -> ValueConvertible {
        guard let base = v.bytes.baseAddress else { throw TrainerError.runtime("input \(v.name) is empty") }
        let p = UnsafeMutableRawPointer(mutating: base)
        switch v.dtype {
        case "float32": return Tensor<Float>(bytesNoCopy: p, shape: v.shape)
        case "int64": return Tensor<Int64>(bytesNoCopy: p, shape: v.shape)
        case "uint8": return Tensor<UInt8>(bytesNoCopy: p, shape: v.shape)
        case "int8": return Tensor<Int8>(bytesNoCopy: p, shape: v.shape)
        default: throw TrainerError.runtime("input \(v.name) has dtype \(v.dtype), which this runtime does not pass")
        }
    }
}
