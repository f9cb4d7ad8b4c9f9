import Foundation
import XCTest
@testable import TrainerCore

/// The host <-> phone files: manifest, step plans, data rows (shared_schemas/examples).
final class ManifestTests: XCTestCase {
    /// The manifest `toolchain export` wrote for the tiny preset (shared_schemas/examples/manifest_tiny.json).
    func testExampleManifestDecodesAndNamesEveryMethodTheScheduleUses() throws {
        let url = Repo.examples.appendingPathComponent("manifest_tiny.json")
        let m = try ProgramManifest.decode(try Repo.data(url), source: url.path)
        XCTAssertEqual(m.schemaVersion, 1)
        XCTAssertTrue(m.methodNames.contains("get_state") && m.methodNames.contains("set_state"))
        let schedule = MethodSchedule(manifest: m)
        for step in 0..<(3 * max(1, m.lcsb?.schedule.count ?? 1)) {
            let (name, phase) = schedule.method(forStep: step)
            XCTAssertTrue(m.methodNames.contains(name), "step \(step) calls \(name), which the program lacks")
            if let lcsb = m.lcsb {
                XCTAssertEqual(phase, lcsb.schedule[step % lcsb.schedule.count])
            } else {
                XCTAssertEqual(name, "train_step")
            }
        }
        // The param entries tile a prefix of the state without gaps or overlap, with PEFT keys.
        let params = m.state.entries.filter { $0.role == "param" }.sorted { $0.offset < $1.offset }
        XCTAssertFalse(params.isEmpty)
        var next = 0
        for e in params {
            XCTAssertEqual(e.offset, next, "\(e.name) leaves a gap or overlaps")
            XCTAssertTrue(e.key.hasPrefix("base_model.model.model.layers.") && e.key.hasSuffix(".weight"), e.key)
            next += e.count
        }
        XCTAssertLessThanOrEqual(next, m.state.numel)
        XCTAssertNotNil(m.adapter.config.objectValue?["r"], "adapter.config should be PEFT's adapter_config.json")
        XCTAssertNotNil(m.program(target: "executorch"))
    }

    func testSyntheticManifestMatchesTheExporterLayout() throws {
        let m = try TinyManifest.manifest(layers: 4, lcsb: true)
        XCTAssertEqual(m.trainMethodNames, ["train_step_p0", "train_step_p1"])
        XCTAssertEqual(m.methodNames, ["train_step_p0", "train_step_p1", "get_state", "set_state"])
        XCTAssertEqual(m.state.numel, 4 * (2 * 8 + 8 * 2 + 2 * 8 + 4 * 2))
        XCTAssertEqual(m.plannedPeakBytes, UInt64((1 << 20) + 4 * m.state.numel))
        XCTAssertEqual(try TinyManifest.manifest(peakEstimate: 12345).plannedPeakBytes, 12345)
        XCTAssertEqual(try TinyManifest.manifest(lcsb: false).trainMethodNames, ["train_step"])
    }

    /// Each broken manifest is refused with a message naming what is wrong.
    func testBrokenManifestsAreRefusedWithTheReason() throws {
        func broken(_ edit: (inout [String: JSONValue]) -> Void) throws -> Data {
            var obj = TinyManifest.json().objectValue!
            edit(&obj)
            return try JSONValue.object(obj).jsonData()
        }
        let cases: [(String, Data)] = [
            ("train_step_p1", try broken { o in
                o["methods"] = .array(o["methods"]!.arrayValue!.filter { $0.objectValue?["name"] != .string("train_step_p1") }) }),
            ("must take", try broken { o in
                var methods = o["methods"]!.arrayValue!
                var first = methods[0].objectValue!
                first["inputs"] = .array(Array(first["inputs"]!.arrayValue!.prefix(2)))
                methods[0] = .object(first)
                o["methods"] = .array(methods) }),
            ("outside the state", try broken { o in
                var state = o["state"]!.objectValue!
                state["numel"] = .int(10)
                o["state"] = .object(state) }),
            ("schema_version", try broken { o in o["schema_version"] = .int(2) }),
            ("names phase", try broken { o in
                var lcsb = o["lcsb"]!.objectValue!
                lcsb["schedule"] = TinyManifest.ints([0, 5])
                o["lcsb"] = .object(lcsb) }),
            ("missing key 'seq_len'", try broken { o in o["seq_len"] = nil }),
        ]
        for (needle, data) in cases {
            XCTAssertThrowsError(try ProgramManifest.decode(data)) { error in
                XCTAssertTrue("\(error)".contains(needle), "expected '\(needle)' in: \(error)")
                XCTAssertTrue("\(error)".contains("re-export"), "no way out in: \(error)")
            }
        }
    }
}

final class StepPlanTests: XCTestCase {
    func testEveryExampleStepPlanParsesAndCycles() throws {
        let files = Repo.files(Repo.examples, prefix: "step_plan_")
        XCTAssertGreaterThanOrEqual(files.count, 5)
        for url in files {
            let plan = try StepPlan.decode(try Repo.data(url), source: url.lastPathComponent)
            for step in 0..<(2 * plan.schedule.count + 1) {
                XCTAssertEqual(plan.phase(forStep: step), plan.schedule[step % plan.schedule.count])
                XCTAssertTrue(plan.layers(forStep: step).allSatisfy { $0 < plan.layers })
            }
        }
        let cyclic = try StepPlan.decode(try Repo.data(Repo.examples.appendingPathComponent("step_plan_cyclic.json")))
        XCTAssertEqual(cyclic.layers(forStep: 5), [6, 7, 8, 9, 10, 11])   // schedule [0,1,2,3]: step 5 -> phase 1
    }

    func testEveryInvalidStepPlanIsRefused() {
        let files = Repo.files(Repo.invalid, prefix: "step_plan_")
        XCTAssertGreaterThanOrEqual(files.count, 8)
        for url in files {
            XCTAssertThrowsError(try StepPlan.decode(try Repo.data(url), source: url.lastPathComponent),
                                 "\(url.lastPathComponent) was accepted")
        }
    }

    func testMethodScheduleFollowsTheManifest() throws {
        let m = try TinyManifest.manifest(layers: 6, lcsb: true)     // phases [0,1] [2,3] [4,5], schedule 0 1 2
        let s = MethodSchedule(manifest: m)
        XCTAssertEqual((0..<7).map { s.method(forStep: $0).name },
                       ["train_step_p0", "train_step_p1", "train_step_p2", "train_step_p0", "train_step_p1",
                        "train_step_p2", "train_step_p0"])
        XCTAssertEqual(s.backwardLayers(forStep: 4), [2, 3])
        let plain = MethodSchedule(manifest: try TinyManifest.manifest(lcsb: false))
        XCTAssertEqual(plain.method(forStep: 9).name, "train_step")
        XCTAssertNil(plain.method(forStep: 9).phase)
        // A plan matches the program only if its phases and schedule are the program's.
        XCTAssertNoThrow(try s.check(plan: StepPlan(layers: 6, policy: "cyclic", k: 2, phases: [[0, 1], [2, 3], [4, 5]], schedule: [0, 1, 2])))
        XCTAssertThrowsError(try s.check(plan: StepPlan(layers: 6, policy: "cyclic", k: 3, phases: [[0, 1, 2], [3, 4, 5]], schedule: [0, 1])))
        XCTAssertThrowsError(try plain.check(plan: StepPlan(layers: 6, policy: "full", k: 6, phases: [Array(0..<6)], schedule: [0])))
    }
}

final class DataTests: XCTestCase {
    let batcher = Batcher(seqLen: 8, padTokenId: 258, vocab: 264)

    func testExampleRowPadsLikeTheHostRunner() throws {
        let rows = try DataRow.parseJSONL(try Repo.data(Repo.examples.appendingPathComponent("data_row.json")))
        XCTAssertEqual(rows.count, 1)
        let ex = try batcher.pad(rows[0], where: "data_row.json")
        XCTAssertEqual(ex.inputIds, [72, 101, 108, 108, 111, 258, 258, 258])
        XCTAssertEqual(ex.labels, [-100, -100, 108, 108, 111, -100, -100, -100])
        XCTAssertEqual(ex.tokens, 3)
        // Without labels, labels are the ids.
        let plain = try batcher.pad(DataRow(inputIds: [1, 2, 3]), where: "row")
        XCTAssertEqual(plain.labels, [1, 2, 3, -100, -100, -100, -100, -100])
    }

    func testEveryInvalidDataRowIsRefused() {
        let files = Repo.files(Repo.invalid, prefix: "data_row_")
        XCTAssertGreaterThanOrEqual(files.count, 2)
        for url in files {
            XCTAssertThrowsError(try DataRow.parseJSONL(try Repo.data(url), source: url.lastPathComponent),
                                 "\(url.lastPathComponent) was accepted")
        }
    }

    func testRowsAreCheckedAgainstTheProgram() {
        let cases: [(DataRow, String)] = [
            (DataRow(inputIds: Array(repeating: 1, count: 9)), "seq_len 8"),
            (DataRow(inputIds: [1, 264, 2]), "out of range"),
            (DataRow(inputIds: [1, 2, 3], labels: [1, 2]), "labels has 2"),
            (DataRow(inputIds: [1, 2, 3], labels: [1, -5, 3]), "neither"),
            (DataRow(inputIds: [1, 2, 3], labels: [1, -100, -100]), "no token to predict"),
        ]
        for (row, needle) in cases {
            XCTAssertThrowsError(try batcher.pad(row, where: "row 1")) { XCTAssertTrue("\($0)".contains(needle), "\($0)") }
        }
    }

    func testJSONLSkipsBlankLinesAndNamesTheBadLine() throws {
        let text = "{\"input_ids\": [1, 2]}\n\n  \n{\"input_ids\": [3, 4, 5], \"labels\": [-100, 4, 5]}\n"
        XCTAssertEqual(try DataRow.parseJSONL(Data(text.utf8)).count, 2)
        let bad = "{\"input_ids\": [1, 2]}\n{\"input_ids\": [1, 2], \"tokens\": 3}\n"
        XCTAssertThrowsError(try DataRow.parseJSONL(Data(bad.utf8), source: "d.jsonl")) {
            XCTAssertTrue("\($0)".contains("d.jsonl:2") && "\($0)".contains("tokens"), "\($0)")
        }
        XCTAssertThrowsError(try DataRow.parseJSONL(Data("\n\n".utf8)))
    }

    func testDataOrderCyclesOrShufflesPerEpochDeterministically() {
        let plain = DataOrder(rowCount: 3, seed: nil)
        XCTAssertEqual((0..<7).map(plain.row(forStep:)), [0, 1, 2, 0, 1, 2, 0])
        let a = DataOrder(rowCount: 10, seed: 42), b = DataOrder(rowCount: 10, seed: 42)
        for epoch in 0..<3 {
            XCTAssertEqual(a.permutation(epoch: epoch).sorted(), Array(0..<10))
            XCTAssertEqual(a.permutation(epoch: epoch), b.permutation(epoch: epoch))
        }
        XCTAssertNotEqual(a.permutation(epoch: 0), a.permutation(epoch: 1))
        XCTAssertNotEqual(a.permutation(epoch: 0), DataOrder(rowCount: 10, seed: 43).permutation(epoch: 0))
        XCTAssertEqual(a.row(forStep: 13), a.permutation(epoch: 1)[3])
        // SplitMix64 reference value (seed 0, first output), so every platform shuffles alike.
        var rng = SplitMix64(state: 0)
        XCTAssertEqual(rng.next(), 0xE220_A839_7B1D_CDAF)
    }
}
