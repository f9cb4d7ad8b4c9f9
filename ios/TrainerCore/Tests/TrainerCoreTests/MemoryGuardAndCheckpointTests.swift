import Foundation
import XCTest
@testable import TrainerCore

final class MemoryGuardTests: XCTestCase {
    let mib: UInt64 = 1 << 20

    func testStopsBeforeAStepThatWouldCrossTheBudget() {
        let g = MemoryGuard(budgetBytes: 500 * mib, plannedPeakBytes: 200 * mib, availableMarginBytes: 0)
        XCTAssertEqual(g.decide(footprint: 100 * mib, available: nil, pressure: .normal), .proceed)   // plan: 200 MB peak
        g.observeStep(footprintAfter: 110 * mib, peakAfter: 250 * mib)                                 // measured growth 150 MB
        XCTAssertEqual(g.stepGrowthBytes, 150 * mib)
        XCTAssertEqual(g.decide(footprint: 340 * mib, available: nil, pressure: .normal), .proceed)   // 490 <= 500
        g.observeStep(footprintAfter: 345 * mib, peakAfter: 250 * mib)                                 // lifetime peak did not rise
        XCTAssertEqual(g.stepGrowthBytes, 150 * mib, "growth only rises")
        guard case .stop(let why) = g.decide(footprint: 360 * mib, available: nil, pressure: .normal) else {
            return XCTFail("510 MB predicted against a 500 MB budget must stop")
        }
        XCTAssertTrue(why.contains("budget"), why)
        // Before any step the manifest's planned peak is the prediction.
        let fresh = MemoryGuard(budgetBytes: 100 * mib, plannedPeakBytes: 150 * mib)
        XCTAssertNotEqual(fresh.decide(footprint: 10 * mib, available: nil, pressure: .normal), .proceed)
    }

    func testPausesOnPressureOrLowAvailableMemory() {
        let g = MemoryGuard(budgetBytes: 1 << 40, plannedPeakBytes: 100 * mib, availableMarginBytes: 64 * mib)
        if case .pause = g.decide(footprint: 50 * mib, available: 1 << 40, pressure: .critical) {} else { XCTFail("critical must pause") }
        XCTAssertEqual(g.decide(footprint: 50 * mib, available: 1 << 40, pressure: .warning), .proceed)
        // 50 MB more is predicted (plan 100 - footprint 50) + 64 MB margin = 114 MB needed.
        if case .pause = g.decide(footprint: 50 * mib, available: 100 * mib, pressure: .normal) {} else { XCTFail("low available must pause") }
        XCTAssertEqual(g.decide(footprint: 50 * mib, available: 120 * mib, pressure: .normal), .proceed)
        let strict = MemoryGuard(budgetBytes: 1 << 40, plannedPeakBytes: 0, pauseOnWarning: true)
        XCTAssertNotEqual(strict.decide(footprint: 1, available: nil, pressure: .warning), .proceed)
    }
}

final class CheckpointTests: XCTestCase {

    func testStateFileIsRawLittleEndianFloat32() throws {
        XCTAssertEqual([UInt8](StateFile.encode([1, -2, 0.5])), [0, 0, 0x80, 0x3F, 0, 0, 0, 0xC0, 0, 0, 0, 0x3F])
        let values: [Float] = [0, -0, 1e-30, .greatestFiniteMagnitude, 3.25]
        let back = try StateFile.decode(StateFile.encode(values), numel: 5, source: "s")
        XCTAssertEqual(back.map(\.bitPattern), values.map(\.bitPattern))
    }

    func testCheckpointInteropAndRefusals() throws {
        // The host runner's checkpoint (toolchain/training/checkpoint.py) reads as ours.
        let host = CheckpointStore(url: Repo.fixtures.appendingPathComponent("host_checkpoint.safetensors"))
        let (state, meta) = try host.load(expectedNumel: 10)
        XCTAssertEqual(state, (0..<10).map { Float($0) / 4 })
        XCTAssertEqual(meta.step, 2)
        XCTAssertEqual(meta.runId, "host-tiny-0001")
        XCTAssertEqual(meta.seq, 7)
        XCTAssertEqual(meta.losses, [5.5, 5.25])
        XCTAssertThrowsError(try host.load(expectedNumel: 11)) { XCTAssertTrue("\($0)".contains("another program"), "\($0)") }
        let dir = try tempDir()
        let bad = CheckpointStore(url: dir.appendingPathComponent("c.safetensors"))
        try Data("not a checkpoint".utf8).write(to: bad.url)
        XCTAssertThrowsError(try bad.load(expectedNumel: 10)) { XCTAssertTrue("\($0)".contains("delete it"), "\($0)") }
        let ours = CheckpointStore(url: dir.appendingPathComponent("d.safetensors"))
        try ours.save(state: [1, 2], meta: CheckpointMeta(step: 1, runId: "r", seq: 3, losses: [nil], stateNumel: 2, program: "p"))
        XCTAssertEqual(try ours.load(expectedNumel: 2).meta.losses, [nil])
        // A re-export (other program file) with the same state size must not be resumed.
        try ours.save(state: [1, 2], meta: CheckpointMeta(step: 1, runId: "r", seq: 3, losses: [1], stateNumel: 2,
                                                          program: "p", programSha256: "aa11"))
        XCTAssertNoThrow(try ours.load(expectedNumel: 2, programSha256: "aa11"))
        XCTAssertThrowsError(try ours.load(expectedNumel: 2, programSha256: "bb22")) {
            XCTAssertTrue("\($0)".contains("another export"), "\($0)")
        }
    }
}
