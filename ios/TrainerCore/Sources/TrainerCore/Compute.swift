import Foundation

/// The manifest's `compute` (`shared_schemas/manifest.schema.json`, `toolchain export --compute`): the precision
/// of the training methods' frozen-weight matmuls, "fp32" (the exact default; the field is absent), "fp16"
/// (float16 weight chunks, operands and products; exported for ExecuTorch + XNNPACK only) or "int8" (int8
/// activations x int4 weights on the toolchain's native kernels, `int8`). The Core ML runtime
/// never runs an fp16 program; ExecuTorch runs one only where XNNPACK has float16 GEMMs, i.e. on CPUs with
/// float16 arithmetic (ARMv8.2 FP16, `hw.optional.arm.FEAT_FP16`; XNNPACK's `use_arm_neon_fp16_arith`); without
/// them the method's XNNPACK delegate fails to build and the method does not load. The app refuses such a
/// program before loading when it can tell (`refusal`) and turns the method's load error into the same
/// message when it cannot (`loadFailure`), as the host does (toolchain/runtime/program_runtime.py) and the Android
/// app (trainer-core Compute.kt).
public enum Compute {
    public static let fp32 = "fp32"
    public static let fp16 = "fp16"
    /// int8 activations x int4 weights in the training methods' frozen matmuls (`--compute int8`): those methods call
    /// the toolchain's native kernels (their manifest `kernels`, e.g. `toolchain::int4_linear_a8.out` and
    /// `toolchain::int4_dyw_a8.out`), which only an app built with toolchain/native/kernels.cpp has
    /// (`requiredKernels`, `kernelRefusal`, `kernelLoadFailure`).
    public static let int8 = "int8"
    public static let choices = [fp32, fp16, int8]
    /// executorch::runtime::Error::OperatorMissing: a method calling an unregistered operator fails to load with it.
    public static let operatorMissing = 0x14

    /// What the platform tells of XNNPACK's float16 GEMMs before a program loads.
    public enum Fp16Support: Equatable { case yes, no, unknown }

    /// executorch::runtime::Error codes of a method load whose XNNPACK delegate cannot be built (XNNCompiler
    /// returns Internal for a node or runtime XNNPACK refuses) or read.
    public static let delegateLoadErrors: Set<Int> = [0x01, 0x10, 0x11, 0x30]

    /// The ExecuTorch Swift API's errors are NSErrors of domain `ExecuTorchErrorDomain` whose code is the
    /// executorch::runtime::Error; nil for an error of another domain.
    public static let executorchErrorDomain = "org.pytorch.executorch.error"
    public static func executorchErrorCode(domain: String, code: Int) -> Int? { domain == executorchErrorDomain ? code : nil }

    /// From the value of the `hw.optional.arm.FEAT_FP16` sysctl (nil: the sysctl is absent or unreadable).
    public static func fp16Support(featFP16 value: Int?) -> Fp16Support {
        switch value {
        case .some(1): return .yes
        case .some(0): return .no
        default: return .unknown
        }
    }

    private static func what(_ program: String) -> String {
        "\(program) computes its frozen-weight matmuls in float16 (exported with --compute fp16)"
    }

    /// Refuse an fp16 program before loading it on a runtime without float16 GEMMs: `runtime` "coreml" never has
    /// them (fp16 programs are ExecuTorch-only), "executorch" when `support` is `.no`. Nil: go on.
    public static func refusal(_ manifest: Manifest, program: String, runtime: String, support: Fp16Support) -> TrainerError? {
        guard manifest.computePrecision == fp16 else { return nil }
        if runtime != "executorch" {
            return .badInput("\(what(program)), which only the ExecuTorch runtime runs, not \(runtime); " +
                             "re-export the program with --compute fp32 (or pick the ExecuTorch runtime)")
        }
        if support == .no {
            return .badInput("\(what(program)) and this device's CPU has no float16 arithmetic (ARMv8.2 FP16), so " +
                             "ExecuTorch's XNNPACK has no float16 kernels for them; re-export the program with --compute fp32")
        }
        return nil
    }

    /// A method's load failure (`errorCode`: the executorch::runtime::Error code, nil when unknown; `detail`: its
    /// message) as the fp16 message when the program is fp16 and the failure is its XNNPACK delegate's (what a
    /// runtime without float16 kernels does); nil: keep the original error.
    public static func loadFailure(_ manifest: Manifest, program: String, method: String, errorCode: Int?, detail: String) -> TrainerError? {
        guard manifest.computePrecision == fp16 else { return nil }
        if let code = errorCode, !delegateLoadErrors.contains(code) { return nil }
        return .badInput("\(what(program)) and this ExecuTorch runtime has no float16 kernels for them (method \(method) " +
                         "did not load: \(detail)); re-export the program with --compute fp32")
    }

    /// What the screen says of the program's compute (beside the native kernels line).
    public static func screenLine(_ manifest: Manifest) -> String {
        switch manifest.computePrecision {
        case fp16: return "compute: fp16 (float16 frozen-weight matmuls on XNNPACK)"
        case int8: return "compute: int8 (int8 x int4 frozen-weight matmuls on the native kernels)"
        default: return "compute: fp32"
        }
    }

    /// The native kernels the program's training and held-out methods call (the union of their manifest `kernels`): what
    /// the runtime must have before the first step. Generation's kernels are not among them: the fused generation
    /// methods are optional (the stock ones run without them). Empty: stock operators only.
    public static func requiredKernels(_ manifest: Manifest) -> Set<String> {
        let generation = Set(Contract.generationRoles)
        return Set(manifest.methods.filter { !generation.contains($0.role) }.flatMap { $0.kernels ?? [] })
    }

    private static func needs(_ manifest: Manifest, program: String, missing: Set<String>) -> String {
        let what = manifest.computePrecision == int8
            ? "\(program) computes its training matmuls in int8 (exported with --compute int8)"
            : "\(program)'s training methods call native kernels"
        return "\(what) and needs the toolchain's native kernels \(missing.sorted())"
    }

    /// Refuse, before any method loads and any step runs, a program whose training methods call native kernels
    /// (`requiredKernels`) on a runtime without them: `runtime` other than "executorch" never has them; `registered`: what
    /// the app's kernel probe found registered (nil: it cannot tell; the methods' load decides, `kernelLoadFailure`).
    /// `advice`: how this platform gets a runtime with the kernels. Nil: go on.
    public static func kernelRefusal(_ manifest: Manifest, program: String, runtime: String, registered: Set<String>?,
                                     advice: String) -> TrainerError? {
        let needed = requiredKernels(manifest)
        if needed.isEmpty { return nil }
        if runtime != "executorch" {
            return .badInput("\(needs(manifest, program: program, missing: needed)), which only the ExecuTorch runtime has, not " +
                             "\(runtime); re-export the program with --compute fp32 (or pick the ExecuTorch runtime)")
        }
        guard let registered else { return nil }
        let missing = needed.subtracting(registered)
        if missing.isEmpty { return nil }
        return .badInput("\(needs(manifest, program: program, missing: missing)), which this app's ExecuTorch runtime does not " +
                         "have; \(advice), or re-export the program with --compute fp32")
    }

    /// A method's load failure as `kernelRefusal`'s message when the method calls native kernels and the runtime says an
    /// operator is missing (`errorCode` `operatorMissing`); nil: keep the original error.
    public static func kernelLoadFailure(_ manifest: Manifest, program: String, method: String, errorCode: Int?, detail: String,
                                         advice: String) -> TrainerError? {
        guard let kernels = manifest.method(named: method)?.kernels, !kernels.isEmpty, errorCode == operatorMissing else { return nil }
        return .badInput("\(needs(manifest, program: program, missing: Set(kernels))), which this app's ExecuTorch runtime does not " +
                         "have (method \(method) did not load: \(detail)); \(advice), or re-export the program with --compute fp32")
    }
}
