import Foundation
import XCTest
@testable import TrainerCore

/// The manifest's `compute` (`toolchain export --compute`): parsed, carried in run_start, and an fp16 program
/// refused where it cannot run (Core ML never; ExecuTorch without float16 GEMMs), as trainer-core's ComputeTest.
final class ComputeTests: XCTestCase {
    private func manifest(compute: Any?) throws -> Manifest {
        var obj = try JSONSerialization.jsonObject(with: try Repo.data(Repo.manifest("manifest_tiny.json"))) as! [String: Any]
        XCTAssertNil(obj["compute"], "the example is an fp32 export: no compute field")
        if let c = compute { obj["compute"] = c }
        return try Manifest.decode(try JSONSerialization.data(withJSONObject: obj), source: "manifest.json")
    }

    func testComputeAbsentIsFp32AndOnlyFp32OrFp16AreAccepted() throws {
        XCTAssertEqual(try manifest(compute: nil).computePrecision, "fp32")
        XCTAssertEqual(try manifest(compute: "fp32").computePrecision, "fp32")
        XCTAssertEqual(try manifest(compute: "fp16").computePrecision, "fp16")
        for bad: Any in ["bf16", "FP16", "", 16, ["fp16"]] {
            XCTAssertThrowsError(try manifest(compute: bad), "\(bad)") { e in
                guard case TrainerError.badInput(let m) = e else { return XCTFail("\(e)") }
                XCTAssertTrue(m.hasPrefix("manifest.json") && m.contains("compute") && m.contains("re-export"), m)
            }
        }
        XCTAssertEqual(try manifest(compute: "int8").computePrecision, "int8")
        XCTAssertThrowsError(try manifest(compute: "bf16")) { e in
            XCTAssertEqual("\(e)", "manifest.json: compute 'bf16' is not one of [\"fp32\", \"fp16\", \"int8\"]; re-export the program with this toolchain")
        }
    }

    func testFp16SupportFromTheSysctl() {
        XCTAssertEqual(Compute.fp16Support(featFP16: 1), .yes)
        XCTAssertEqual(Compute.fp16Support(featFP16: 0), .no)
        XCTAssertEqual(Compute.fp16Support(featFP16: nil), .unknown)
        XCTAssertEqual(Compute.executorchErrorCode(domain: "org.pytorch.executorch.error", code: 1), 1)
        XCTAssertNil(Compute.executorchErrorCode(domain: NSCocoaErrorDomain, code: 1))
    }

    func testAnFp16ProgramIsRefusedBeforeLoadingOnCoreMLAndWithoutFloat16Arithmetic() throws {
        let fp16 = try manifest(compute: "fp16"), fp32 = try manifest(compute: nil)
        let coreml = Compute.refusal(fp16, program: "tiny16", runtime: "coreml", support: .yes)
        XCTAssertEqual(coreml?.description, "tiny16 computes its frozen-weight matmuls in float16 (exported with --compute fp16), " +
                       "which only the ExecuTorch runtime runs, not coreml; re-export the program with --compute fp32 (or pick the ExecuTorch runtime)")
        let noHalf = Compute.refusal(fp16, program: "tiny16", runtime: "executorch", support: .no)
        XCTAssertEqual(noHalf?.description, "tiny16 computes its frozen-weight matmuls in float16 (exported with --compute fp16) and " +
                       "this device's CPU has no float16 arithmetic (ARMv8.2 FP16), so ExecuTorch's XNNPACK has no float16 kernels for " +
                       "them; re-export the program with --compute fp32")
        XCTAssertNil(Compute.refusal(fp16, program: "tiny16", runtime: "executorch", support: .yes))
        XCTAssertNil(Compute.refusal(fp16, program: "tiny16", runtime: "executorch", support: .unknown), "the load error decides")
        for rt in ["executorch", "coreml"] {
            for s: Compute.Fp16Support in [.yes, .no, .unknown] { XCTAssertNil(Compute.refusal(fp32, program: "t", runtime: rt, support: s)) }
        }
    }

    func testAMethodLoadFailureOfAnFp16ProgramIsTheFp16Message() throws {
        let fp16 = try manifest(compute: "fp16"), fp32 = try manifest(compute: nil)
        // What the ExecuTorch Swift Module throws when XNNPACK cannot build a float16 GEMM: Error::Internal (1).
        let e = Compute.loadFailure(fp16, program: "tiny16", method: "block_step", errorCode: 1, detail: "Internal error")
        XCTAssertEqual(e?.description, "tiny16 computes its frozen-weight matmuls in float16 (exported with --compute fp16) and " +
                       "this ExecuTorch runtime has no float16 kernels for them (method block_step did not load: Internal error); " +
                       "re-export the program with --compute fp32")
        for code: Int? in [0x10, 0x11, 0x30, nil] {
            XCTAssertTrue(Compute.loadFailure(fp16, program: "t", method: "m", errorCode: code, detail: "x")?.description.contains("--compute fp32") == true)
        }
        for code in [0x14, 0x21, 0x23] { XCTAssertNil(Compute.loadFailure(fp16, program: "t", method: "m", errorCode: code, detail: "x"), "\(code)") }
        for code: Int? in [1, 0x10, nil] { XCTAssertNil(Compute.loadFailure(fp32, program: "t", method: "m", errorCode: code, detail: "x")) }
    }

    func testRunStartComputeIsOptionalAndChecked() {
        var e: [String: JSONValue] = ["schema_version": .int(1), "type": .string("run_start"), "run_id": .string("r1"), "seq": .int(0),
                                      "timestamp": .double(1), "model": .string("m"), "method": .string("mesp"),
                                      "backend": .string("executorch"), "seq_len": .int(8), "rank": .int(2), "platform": .string("ios"),
                                      "device_model": .string("iPhone16,1"), "os": .string("iOS 18.1"), "total_ram_bytes": .int(1),
                                      "budget_bytes": .int(1)]
        XCTAssertEqual(TelemetrySchema.errors(in: e), [], "absent: older telemetry stays valid")
        for c in ["fp32", "fp16", "int8"] { e["compute"] = .string(c); XCTAssertEqual(TelemetrySchema.errors(in: e), []) }
        e["compute"] = .string("bf16")
        XCTAssertNotEqual(TelemetrySchema.errors(in: e), [])
    }

    // MARK: int8 programs (issue 41 item 4): the training methods call native kernels

    private let int8Kernels = ["toolchain::int4_dyw_a8.out", "toolchain::int4_linear_a8.out"]

    /// The generation example (fused methods with their kernels) as an int8 export writes it: compute "int8", and each
    /// training / held-out method listing the W4A8 kernels it calls (the stock generation methods list none).
    private func int8Manifest(compute: String = "int8") throws -> Manifest {
        var obj = try JSONSerialization.jsonObject(with: try Repo.data(Repo.manifest("manifest_tiny_generate.json"))) as! [String: Any]
        let generation = Set(Contract.generationRoles)
        obj["methods"] = (obj["methods"] as! [[String: Any]]).map { m -> [String: Any] in
            var m = m
            if !generation.contains(m["role"] as! String) && m["kernels"] == nil { m["kernels"] = int8Kernels }
            return m
        }
        obj["compute"] = compute
        return try Manifest.decode(try JSONSerialization.data(withJSONObject: obj), source: "manifest.json")
    }

    func testTheKernelsAnInt8ProgramNeedsAreItsTrainingMethodsNotTheOptionalFusedOnes() throws {
        let p = try int8Manifest()
        XCTAssertEqual(Compute.requiredKernels(p), Set(int8Kernels))
        let fp32 = try Manifest.decode(try Repo.data(Repo.manifest("manifest_tiny_generate.json")), source: "manifest.json")
        XCTAssertFalse(fp32.generate?.fused?.kernels.isEmpty ?? true, "the example has fused generation methods with kernels")
        XCTAssertEqual(Compute.requiredKernels(fp32), [], "fused generation methods are optional (stock fallback)")
        XCTAssertEqual(Compute.screenLine(p), "compute: int8 (int8 x int4 frozen-weight matmuls on the native kernels)")
        XCTAssertEqual(Compute.screenLine(try manifest(compute: "fp16")), "compute: fp16 (float16 frozen-weight matmuls on XNNPACK)")
        XCTAssertEqual(Compute.screenLine(fp32), "compute: fp32")
    }

    func testAnInt8ProgramOnARuntimeWithoutTheKernelsIsRefusedWithOneMessage() throws {
        let p = try int8Manifest()
        let advice = "build the app with the kernels"
        // The registry probe found none (an app built without TOOLCHAIN_NATIVE_KERNELS).
        let none = Compute.kernelRefusal(p, program: "tiny8", runtime: "executorch", registered: [], advice: advice)
        XCTAssertEqual(none?.description, "tiny8 computes its training matmuls in int8 (exported with --compute int8) and needs the " +
                       "toolchain's native kernels [\"toolchain::int4_dyw_a8.out\", \"toolchain::int4_linear_a8.out\"], which this app's " +
                       "ExecuTorch runtime does not have; build the app with the kernels, or re-export the program with --compute fp32")
        let one = Compute.kernelRefusal(p, program: "tiny8", runtime: "executorch", registered: ["toolchain::int4_linear_a8.out"], advice: advice)
        XCTAssertTrue(one!.description.contains("[\"toolchain::int4_dyw_a8.out\"]") && !one!.description.contains("int4_linear_a8"), one!.description)
        XCTAssertNil(Compute.kernelRefusal(p, program: "tiny8", runtime: "executorch", registered: Set(int8Kernels), advice: advice))
        XCTAssertNil(Compute.kernelRefusal(p, program: "tiny8", runtime: "executorch", registered: nil, advice: advice), "the load decides")
        XCTAssertTrue(Compute.kernelRefusal(p, program: "tiny8", runtime: "coreml", registered: Set(int8Kernels), advice: advice)!
            .description.contains("only the ExecuTorch runtime"))
        for c in [nil, "fp16"] as [String?] {
            XCTAssertNil(Compute.kernelRefusal(try manifest(compute: c), program: "t", runtime: "executorch", registered: [], advice: advice))
        }
        // A kernel method's load failing with OperatorMissing (0x14): the same message; other errors and methods stay themselves.
        let method = p.methods.first { !($0.kernels ?? []).isEmpty && !Contract.generationRoles.contains($0.role) }!.name
        let e = Compute.kernelLoadFailure(p, program: "tiny8", method: method, errorCode: 0x14, detail: "Operator missing", advice: advice)
        XCTAssertEqual(e?.description, "tiny8 computes its training matmuls in int8 (exported with --compute int8) and needs the " +
                       "toolchain's native kernels [\"toolchain::int4_dyw_a8.out\", \"toolchain::int4_linear_a8.out\"], which this app's " +
                       "ExecuTorch runtime does not have (method \(method) did not load: Operator missing); build the app with the kernels, " +
                       "or re-export the program with --compute fp32")
        XCTAssertNil(Compute.kernelLoadFailure(p, program: "t", method: method, errorCode: 0x21, detail: "x", advice: advice))
        XCTAssertNil(Compute.kernelLoadFailure(p, program: "t", method: "embed_token", errorCode: 0x14, detail: "x", advice: advice))
    }
}
