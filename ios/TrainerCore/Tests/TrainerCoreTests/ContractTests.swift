import Foundation
import XCTest
@testable import TrainerCore

/// The host <-> phone files: manifest, step plans, data rows (shared_schemas/examples).
final class ManifestTests: XCTestCase {
    /// The manifest `toolchain export` wrote for the tiny preset (shared_schemas/examples/manifest_v2_tiny.json).
    func testExampleManifestFollowsContractVersion2() throws {
        let url = Repo.examples.appendingPathComponent("manifest_v2_tiny.json")
        let m = try ProgramManifest.decode(try Repo.data(url), source: url.path)
        XCTAssertEqual(m.schemaVersion, 2)
        XCTAssertTrue(m.methods.allSatisfy { $0.kind == "train_step" }, "only train methods in version 2")
        XCTAssertNotNil(m.files[m.state.initFile], "state.init_file is listed with its sha256")
        XCTAssertEqual(m.memoryPlan.loraStateBytes, 4 * m.state.numel)
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
        // Every train method: ids, labels, lr, then all entries; loss, then a subset of the entries.
        for method in m.methods {
            XCTAssertEqual(method.inputs.map(\.name), ["input_ids", "labels", "lr"] + m.state.entries.map(\.name))
            let returned = method.outputs.dropFirst().map(\.name)
            XCTAssertFalse(returned.isEmpty, "\(method.name) changes no state")
            XCTAssertEqual(returned, m.state.entries.map(\.name).filter(returned.contains), "\(method.name): entries order")
        }
        // The entries tile the whole state without gaps or overlap; params first, with PEFT keys.
        var next = 0
        for e in m.state.entries {
            XCTAssertEqual(e.offset, next, "\(e.name) leaves a gap or overlaps")
            next += e.count
        }
        XCTAssertEqual(next, m.state.numel)
        let params = m.state.entries.filter { $0.role == "param" }
        XCTAssertFalse(params.isEmpty)
        for e in params { XCTAssertTrue(e.key.hasPrefix("base_model.model.model.layers.") && e.key.hasSuffix(".weight"), e.key) }
        XCTAssertNotNil(m.adapter.config.objectValue?["r"], "adapter.config should be PEFT's adapter_config.json")
        XCTAssertNotNil(m.program(target: "executorch"))
        XCTAssertNotNil(m.exportSha256)
    }

    func testSyntheticManifestMatchesTheExporterLayout() throws {
        let m = try TinyManifest.manifest(layers: 4, lcsb: true)
        XCTAssertEqual(m.trainMethodNames, ["train_step_p0", "train_step_p1"])
        XCTAssertEqual(m.methodNames, ["train_step_p0", "train_step_p1"])
        XCTAssertEqual(m.state.numel, 4 * (2 * 8 + 8 * 2 + 2 * 8 + 4 * 2))
        XCTAssertEqual(m.method(named: "train_step_p0")?.inputs.count, 3 + m.state.entries.count)
        XCTAssertEqual(m.method(named: "train_step_p0")?.outputs.count, 1 + m.state.entries.count / 2, "SGD: its phase's half")
        let adamw = try TinyManifest.manifest(layers: 4, lcsb: true, adamw: true)
        XCTAssertEqual(adamw.method(named: "train_step_p1")?.outputs.count, 1 + adamw.state.entries.count, "AdamW: everything")
        // Every loaded method keeps its own arena (stock Module), plus the state and one copy of it.
        XCTAssertEqual(m.plannedPeakBytes, UInt64(2 * (1 << 20) + 2 * 4 * m.state.numel))
        XCTAssertEqual(try TinyManifest.manifest(peakEstimate: 12345).plannedPeakBytes, 12345)
        XCTAssertEqual(try TinyManifest.manifest(lcsb: false).trainMethodNames, ["train_step"])
        XCTAssertEqual(m.exportSha256, String(repeating: "0", count: 64), "the ExecuTorch program's sha256")
    }

    private func broken(_ edit: (inout [String: JSONValue]) -> Void) throws -> Data {
        var obj = TinyManifest.json().objectValue!
        edit(&obj)
        return try JSONValue.object(obj).jsonData()
    }

    /// Edit method `index` of a manifest object.
    private func editMethod(_ o: inout [String: JSONValue], _ index: Int, _ edit: (inout [String: JSONValue]) -> Void) {
        var methods = o["methods"]!.arrayValue!
        var m = methods[index].objectValue!
        edit(&m)
        methods[index] = .object(m)
        o["methods"] = .array(methods)
    }

    /// Each broken manifest is refused with a message naming what is wrong.
    func testBrokenManifestsAreRefusedWithTheReason() throws {
        let cases: [(String, Data)] = [
            ("train_step_p1", try broken { o in
                o["methods"] = .array(o["methods"]!.arrayValue!.filter { $0.objectValue?["name"] != .string("train_step_p1") }) }),
            ("takes 2 inputs", try broken { o in
                editMethod(&o, 0) { m in m["inputs"] = .array(Array(m["inputs"]!.arrayValue!.prefix(2))) } }),
            ("input lora_0_q_proj_b", try broken { o in     // a state entry missing from the inputs
                editMethod(&o, 0) { m in
                    var inputs = m["inputs"]!.arrayValue!
                    inputs.remove(at: 3)
                    inputs.append(TinyManifest.tensor("extra", "float32", [1]))
                    m["inputs"] = .array(inputs) } }),
            ("not a state entry", try broken { o in
                editMethod(&o, 1) { m in m["outputs"] = .array(m["outputs"]!.arrayValue! + [TinyManifest.tensor("lora_x", "float32", [1])]) } }),
            ("out of state.entries order", try broken { o in
                editMethod(&o, 0) { m in
                    let outs = m["outputs"]!.arrayValue!
                    m["outputs"] = .array([outs[0]] + outs.dropFirst().reversed()) } }),
            ("must return the loss", try broken { o in
                editMethod(&o, 0) { m in m["outputs"] = .array(Array(m["outputs"]!.arrayValue!.dropFirst())) } }),
            ("kind get_state", try broken { o in
                o["methods"] = .array(o["methods"]!.arrayValue! + [.object(["name": .string("get_state"), "kind": .string("get_state"),
                                                                             "inputs": .array([]), "outputs": .array([])])]) }),
            ("outside the state", try broken { o in
                var state = o["state"]!.objectValue!
                state["numel"] = .int(10)
                o["state"] = .object(state) }),
            ("overlaps", try broken { o in
                var state = o["state"]!.objectValue!
                var entries = state["entries"]!.arrayValue!
                var e = entries[1].objectValue!
                e["offset"] = .int(4)
                entries[1] = .object(e)
                state["entries"] = .array(entries)
                o["state"] = .object(state) }),
            ("missing key 'state.init_file'", try broken { o in
                var state = o["state"]!.objectValue!
                state["init_file"] = nil
                o["state"] = .object(state) }),
            ("schema_version 3", try broken { o in o["schema_version"] = .int(3) }),
            ("names phase", try broken { o in
                var lcsb = o["lcsb"]!.objectValue!
                lcsb["schedule"] = TinyManifest.ints([0, 5])
                o["lcsb"] = .object(lcsb) }),
            ("no file for method train_step_p1", try broken { o in
                o["programs"] = .array(o["programs"]!.arrayValue! + [.object([
                    "target": .string("coreml"), "file": .string("coreml"),
                    "methods": .object(["train_step_p0": .string("coreml/train_step_p0.mlpackage")])])]) }),
            ("missing key 'seq_len'", try broken { o in o["seq_len"] = nil }),
        ]
        for (needle, data) in cases {
            XCTAssertThrowsError(try ProgramManifest.decode(data)) { error in
                XCTAssertTrue("\(error)".contains(needle), "expected '\(needle)' in: \(error)")
                XCTAssertTrue("\(error)".contains("re-export"), "no way out in: \(error)")
            }
        }
    }

    /// A version 1 manifest (state inside the program, get_state/set_state, no init_file) is refused
    /// for its version, not for the first key it lacks.
    func testVersion1ManifestIsRefusedWithAClearMessage() throws {
        let v1 = try broken { o in
            o["schema_version"] = .int(1)
            var state = o["state"]!.objectValue!
            state["init_file"] = nil
            o["state"] = .object(state)
            o["methods"] = .array(o["methods"]!.arrayValue! + [
                .object(["name": .string("get_state"), "kind": .string("get_state"), "inputs": .array([]),
                         "outputs": .array([TinyManifest.tensor("state", "float32", [64])])]),
                .object(["name": .string("set_state"), "kind": .string("set_state"),
                         "inputs": .array([TinyManifest.tensor("state", "float32", [64])]), "outputs": .array([])]),
            ])
        }
        XCTAssertThrowsError(try ProgramManifest.decode(v1, source: "old/manifest.json")) { error in
            let text = "\(error)"
            XCTAssertTrue(text.hasPrefix("old/manifest.json has schema_version 1"), text)
            XCTAssertTrue(text.contains("get_state/set_state") && text.contains("re-export"), text)
            XCTAssertTrue(text.contains("schema_version 2"), text)
        }
    }

    /// Core ML (and ONNX) list one file per method; ExecuTorch one file for all.
    func testProgramFilesPerMethod() throws {
        let data = try broken { o in
            o["programs"] = .array(o["programs"]!.arrayValue! + [.object([
                "target": .string("coreml"), "file": .string("coreml"), "delegate": .null, "bytes": .int(10),
                "minimum_deployment_target": .string("iOS17"),
                "methods": .object(["train_step_p0": .string("coreml/train_step_p0.mlpackage"),
                                    "train_step_p1": .string("coreml/train_step_p1.mlpackage")])])])
        }
        let m = try ProgramManifest.decode(data)
        XCTAssertEqual(m.program(target: "coreml")?.file(forMethod: "train_step_p1"), "coreml/train_step_p1.mlpackage")
        XCTAssertNil(m.program(target: "coreml")?.file(forMethod: "train_step_p7"))
        XCTAssertEqual(m.program(target: "executorch")?.file(forMethod: "train_step_p1"), "model.pte")
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
