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
        XCTAssertThrowsError(try manifest(compute: "bf16")) { e in
            XCTAssertEqual("\(e)", "manifest.json: compute 'bf16' is not one of [\"fp32\", \"fp16\"]; re-export the program with this toolchain")
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
        for c in ["fp32", "fp16"] { e["compute"] = .string(c); XCTAssertEqual(TelemetrySchema.errors(in: e), []) }
        e["compute"] = .string("bf16")
        XCTAssertNotEqual(TelemetrySchema.errors(in: e), [])
    }
}
