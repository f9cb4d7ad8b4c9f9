import Foundation
import XCTest
@testable import TrainerCore

/// The host <-> phone files: manifest, step plans, data rows (shared_schemas/examples).
final class StepPlanTests: XCTestCase {
    func testEveryExampleStepPlanParsesAndCycles() throws {
        let files = Repo.files(Repo.examples, prefix: "step_plan_")
        XCTAssertGreaterThanOrEqual(files.count, 5)
        for url in files {
            let plan = try StepPlan.decode(try Repo.data(url), source: url.lastPathComponent)
            for step in 0..<(2 * plan.schedule.count + 1) {
                XCTAssertEqual(plan.phase(forStep: step), step < plan.warmup ? nil : plan.schedule[step % plan.schedule.count])
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
        // The host's rule: epoch e is permutation(rows, seed + e), so epoch 1 of seed 42 is epoch 0 of seed 43.
        XCTAssertEqual(a.permutation(epoch: 1), Shuffle.permutation(10, seed: UInt64(43)))
        XCTAssertEqual(DataOrder(rowCount: 4, signedSeed: -1).permutation(epoch: 1), Shuffle.permutation(4, seed: UInt64(0)))
        // SplitMix64 reference value (seed 0, first output), so every platform shuffles alike.
        var rng = SplitMix64(state: 0)
        XCTAssertEqual(rng.next(), 0xE220_A839_7B1D_CDAF)
    }
}

/// The contract's names (`Contract`, toolchain/contract) against a program the host exported with them.
final class ContractNamesTests: XCTestCase {
    func testTheRolesAndTheManifestNameAreTheExportedProgram() throws {
        let dir = ReplayTests.traceDir.appendingPathComponent("program")
        XCTAssertTrue(FileManager.default.fileExists(atPath: dir.appendingPathComponent(Contract.manifestName).path))
        let m = try Manifest.load(directory: dir)
        XCTAssertEqual(m.schemaVersion, Contract.manifestSchemaVersion)
        XCTAssertEqual(m.weights.layerPlaceholder, Contract.layer)
        // in call order, as toolchain/contract/methods.py lists them and the exporter wrote them
        var roles: [String] = []
        for r in m.methods.map(\.role) where !roles.contains(r) { roles.append(r) }
        XCTAssertEqual(roles.filter { !Contract.generationRoles.contains($0) }, Contract.trainingRoles)
        XCTAssertEqual(roles.filter { !Contract.trainingRoles.contains($0) }, Contract.generationRoles)
    }
}
