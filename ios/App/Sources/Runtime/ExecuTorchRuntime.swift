import ExecuTorch
import Foundation
import TrainerCore

/// Runs the layer-generic methods of a program's `model.pte` for TrainerCore's `LayerLoop` with the
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
/// Native kernels: the app target compiles toolchain/native/kernels.cpp (project.yml), whose static
/// initializer registers `toolchain::int4_linear_a8.out` with the ExecuTorch runtime the Module runs on.
/// `registeredKernels` asks the kernel registry (ToolchainKernels.cpp, through the bridging header)
/// about every kernel the manifest's fused methods need; with all of them the loop calls the fused
/// generation methods (`generate.fused`), else the stock ones (a fused method would fail to load).
final class ExecuTorchRuntime: ProgramRuntime {
    let backendName = "executorch"
    private let module: Module
    private let manifest: Manifest
    private let fileName: String
    /// The program directory's name (what the messages call the program).
    private let programName: String
    /// The kernels of the manifest's fused methods that this process has registered.
    let registeredKernels: Set<String>

    init(programFile: URL, manifest: Manifest) throws {
        guard FileManager.default.fileExists(atPath: programFile.path) else {
            throw TrainerError.io("\(programFile.path) is missing; copy the whole program directory to the phone")
        }
        module = Module(filePath: programFile.path, loadMode: .mmap)
        self.manifest = manifest
        fileName = programFile.lastPathComponent
        programName = programFile.deletingLastPathComponent().lastPathComponent
        registeredKernels = Self.kernelsRegistered(Set(manifest.generate?.fused?.kernels ?? []))
        let mark = ExecuTorchLog.shared.mark()
        do {
            try module.load()
        } catch {
            throw RuntimeFailure(message: "ExecuTorch cannot load \(fileName) (\(error)); re-export it with the app's executorch version",
                                 code: "load_failed", log: ExecuTorchLog.shared.lines(since: mark))
        }
    }

    /// Load each method (planning its arena) and check its arity against the manifest.
    func load(methods: [String]) throws {
        for name in methods {
            guard let spec = manifest.methods.first(where: { $0.name == name }) else {
                throw TrainerError.runtime("method \(name) is not in the manifest")
            }
            let meta: MethodMetadata
            let mark = ExecuTorchLog.shared.mark()
            do {
                try module.load(name)
                meta = try module.methodMetadata(name)
            } catch {
                // An fp16 program (manifest compute) whose XNNPACK delegate cannot build its float16 GEMMs (no
                // float16 kernels here): the clear message, not the bare load error (Compute.loadFailure).
                let ns = error as NSError
                let code = Compute.executorchErrorCode(domain: ns.domain, code: ns.code)
                if let fp16 = Compute.loadFailure(manifest, program: programName, method: name, errorCode: code, detail: "\(error)") {
                    throw RuntimeFailure(message: fp16.description, code: "load_failed", log: ExecuTorchLog.shared.lines(since: mark))
                }
                // A training method of an int8 program calling a kernel this runtime lacks (an older kernels.cpp): the
                // clear message (the registry probe in TrainingController.makeRuntime refuses the common case before this).
                if let int8 = Compute.kernelLoadFailure(manifest, program: programName, method: name, errorCode: code,
                                                        detail: "\(error)", advice: Self.kernelsAdvice) {
                    throw RuntimeFailure(message: int8.description, code: "load_failed", log: ExecuTorchLog.shared.lines(since: mark))
                }
                throw RuntimeFailure(message: "ExecuTorch cannot load method \(name) of \(fileName) (\(error)); re-export the program",
                                     code: "load_failed", log: ExecuTorchLog.shared.lines(since: mark))
            }
            guard meta.inputValueTags.count == spec.inputs.count, meta.outputValueTags.count == spec.outputs.count else {
                throw TrainerError.runtime("\(fileName) method \(name) takes \(meta.inputValueTags.count) inputs and returns " +
                                           "\(meta.outputValueTags.count) outputs, the manifest says \(spec.inputs.count) and " +
                                           "\(spec.outputs.count); the program and its manifest come from different exports")
            }
        }
    }

    /// The outputs as Data (what `ProgramRuntime` requires; the loop itself calls `execute(...into:)`).
    func execute(method: String, layer: Int?, inputs: [LoopInput]) throws -> [Data] {
        try run(method, inputs).map { t in t.withUnsafeBytes { Data(buffer: $0) } }
    }

    /// Each output copied once, out of the method's planned arena into the loop's memory for it (a state
    /// entry's slice of the state array, a pooled activation buffer, the rows of the layer's KV cache):
    /// the one copy (`LoopOutput.write(from:)`, one memcpy per contiguous run). Writing into the loop's
    /// memory in place (`Module.setOutput`) would need programs exported with outputs outside the memory
    /// plan, and an output may be one of the call's inputs (block_backward's params, the cache rows, and
    /// in a training step the activation buffer of head_loss's x or of block_backward's incoming d, which
    /// the loop gives the new d), so the copy is made after `execute` returns.
    func execute(method: String, layer: Int?, inputs: [LoopInput], into outputs: [LoopOutput]) throws {
        let tensors = try run(method, inputs)
        guard tensors.count == outputs.count else {
            throw TrainerError.runtime("\(method) returned \(tensors.count) outputs, the loop expects \(outputs.count); re-export the program")
        }
        for (t, o) in zip(tensors, outputs) where t.count * 4 != o.byteCount {
            throw TrainerError.runtime("\(method) returned \(t.count * 4) bytes for \(o.name), the manifest says \(o.dtype)\(o.shape); re-export the program")
        }
        for (t, o) in zip(tensors, outputs) {
            try t.withUnsafeBytes { src in try o.write(from: UnsafeRawBufferPointer(src)) }
        }
    }

    /// Runs the method on tensors over the inputs' bytes (no copy); its float32 outputs, still in the
    /// method's arena (valid until its next call). A failure carries ExecuTorch's own log lines
    /// (`ExecuTorchLog`) so the screen and the `error` event show what the runtime said.
    private func run(_ method: String, _ inputs: [LoopInput]) throws -> [Tensor<Float>] {
        guard let spec = manifest.methods.first(where: { $0.name == method }) else {
            throw TrainerError.runtime("method \(method) is not in the manifest")
        }
        let values: [ValueConvertible] = try inputs.map(Self.tensor)
        let outputs: [Value]
        let mark = ExecuTorchLog.shared.mark()
        do {
            outputs = try module.execute(method, values)
        } catch {
            throw RuntimeFailure(message: "ExecuTorch failed in \(method): \(error)", code: "runtime_error",
                                 log: ExecuTorchLog.shared.lines(since: mark))
        }
        guard outputs.count == spec.outputs.count else {
            throw TrainerError.runtime("\(method) returned \(outputs.count) outputs, the manifest lists \(spec.outputs.count); re-export the program")
        }
        return try zip(outputs, spec.outputs).map { value, io in
            guard io.dtype == "float32", let t: Tensor<Float> = value.tensor() else {
                throw TrainerError.runtime("\(method) output \(io.name) is not a float32 tensor; re-export the program")
            }
            return t
        }
    }

    /// Those of `names` the ExecuTorch kernel registry of this process has (the app's native kernels
    /// register at load; ToolchainKernels.h).
    /// Without the native kernels compiled in (TOOLCHAIN_NATIVE_KERNELS off, Config/App.xcconfig): none.
    static func kernelsRegistered(_ names: Set<String>) -> Set<String> {
        #if TOOLCHAIN_NATIVE_KERNELS
        return names.filter { name in name.withCString { toolchain_kernel_registered($0) } }
        #else
        return []
        #endif
    }

    /// Whether the native int4 kernel is linked into this app.
    static var int4KernelRegistered: Bool { !kernelsRegistered([int4Kernel]).isEmpty }

    /// The run-time path the native kernels chose for this CPU (`toolchain_kernel_path()`, ToolchainKernels.h); nil
    /// when the linked kernels predate it.
    static var kernelPath: String? {
        #if TOOLCHAIN_NATIVE_KERNELS
        guard let p = toolchain_kernel_path_name() else { return nil }
        return String(cString: p)
        #else
        return nil
        #endif
    }

    /// What the screen shows: "native kernels: yes (path dotprod)" when every kernel of the fused methods (or of an
    /// int8 program's training methods) is registered, "... yes (path unknown)", or "... no (stock methods)"; then the
    /// program's compute on a line of its own (`Compute.screenLine`: fp16 and int8 said on screen).
    var kernelLine: String {
        let needed = Set(manifest.generate?.fused?.kernels ?? [])
        let training = Compute.requiredKernels(manifest)
        let yes = (!needed.isEmpty && registeredKernels == needed) || (!training.isEmpty && Self.kernelsRegistered(training) == training)
        return KernelPath.describe(registered: yes, path: yes ? Self.kernelPath : nil) + "\n" + Compute.screenLine(manifest)
    }
    static let int4Kernel = "toolchain::int4_linear_a8.out"
    /// How an iOS build gets the native kernels (docs/ios.md, "The int4 generation kernel").
    static let kernelsAdvice = "build the app with the native kernels (TOOLCHAIN_NATIVE_KERNELS: run ios/App/kernel_headers.sh, then xcodegen)"

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

/// ExecuTorch's own log (its `Log` sink API, `Log.shared.add(sink:)`): every line into a ring of the
/// last 256, so a failed load or call carries the lines it logged (`RuntimeFailure.log`), the screen
/// shows them under the error and the `error` telemetry event sends them (`log`). ExecuTorch calls
/// sinks on its own queue, maybe after the failing call has returned, so a failure with no line of
/// its own gets the ring's newest ones (`TrainingSession.runtimeLog`). The prebuilt frameworks log
/// only when built with ET_LOG_ENABLED (the `_debug` products); with others the ring stays empty.
final class ExecuTorchLog: NSObject, LogSink {
    static let shared = ExecuTorchLog()
    let ring = LogRing(capacity: 256)
    private let lock = NSLock()
    private var installed = false

    /// Register with ExecuTorch's log once (the app's controller does at launch).
    func install() {
        lock.lock()
        defer { lock.unlock() }
        guard !installed else { return }
        installed = true
        Log.shared.add(sink: self)
    }

    func log(level: LogLevel, timestamp: TimeInterval, filename: String, line: UInt, message: String) {
        let tag: String
        switch level {
        case .debug: tag = "D"
        case .info: tag = "I"
        case .error: tag = "E"
        case .fatal: tag = "F"
        default: tag = "?"
        }
        let file = filename.split(separator: "/").last.map(String.init) ?? filename
        ring.append("\(tag) \(String(format: "%.3f", timestamp)) \(file):\(line)] \(message)")
    }

    func mark() -> UInt64 { ring.mark() }
    func lines(since mark: UInt64) -> [String] { ring.lines(since: mark) }
}
