import Foundation
import XCTest
@testable import TrainerCore

final class BudgetGuardTests: XCTestCase {
    let mib: UInt64 = 1 << 20

    func testStopsBeforeAStepThatWouldCrossTheBudget() {
        let g = BudgetGuard(budgetBytes: 500 * mib, plannedPeakBytes: 200 * mib, availableMarginBytes: 0)
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
        let fresh = BudgetGuard(budgetBytes: 100 * mib, plannedPeakBytes: 150 * mib)
        XCTAssertNotEqual(fresh.decide(footprint: 10 * mib, available: nil, pressure: .normal), .proceed)
    }

    func testPausesOnPressureOrLowAvailableMemory() {
        let g = BudgetGuard(budgetBytes: 1 << 40, plannedPeakBytes: 100 * mib, availableMarginBytes: 64 * mib)
        if case .pause = g.decide(footprint: 50 * mib, available: 1 << 40, pressure: .critical) {} else { XCTFail("critical must pause") }
        XCTAssertEqual(g.decide(footprint: 50 * mib, available: 1 << 40, pressure: .warning), .proceed)
        // 50 MB more is predicted (plan 100 - footprint 50) + 64 MB margin = 114 MB needed.
        if case .pause = g.decide(footprint: 50 * mib, available: 100 * mib, pressure: .normal) {} else { XCTFail("low available must pause") }
        XCTAssertEqual(g.decide(footprint: 50 * mib, available: 120 * mib, pressure: .normal), .proceed)
        let strict = BudgetGuard(budgetBytes: 1 << 40, plannedPeakBytes: 0, pauseOnWarning: true)
        XCTAssertNotEqual(strict.decide(footprint: 1, available: nil, pressure: .warning), .proceed)
    }
}

/// A runtime that records the inputs of every call and answers from a script (outputs built from
/// the inputs), to test what the trainer sends and how it applies what comes back.
final class ScriptedRuntime: TrainingRuntime {
    let backendName = "executorch"
    var inputs: [[TensorValue]] = []
    var answer: (String, [TensorValue]) throws -> [TensorValue]
    init(answer: @escaping (String, [TensorValue]) throws -> [TensorValue]) { self.answer = answer }
    func load(methods: [String]) throws {}
    func execute(method: String, inputs: [TensorValue]) throws -> [TensorValue] {
        self.inputs.append(inputs)
        return try answer(method, inputs)
    }
}

final class TrainerTests: XCTestCase {
    private func makeTrainer(_ m: ProgramManifest, runtime: TrainingRuntime, dir: URL?, steps: Int = 6,
                             program: URL? = nil, sinks: [TelemetrySink] = [], usedSeq: ((String) -> Int)? = nil,
                             probes: MemoryProbes = MemoryProbes(), budget: BudgetGuard? = nil) throws -> Trainer {
        let examples = try Batcher(manifest: m).padAll(tinyRows())
        let clock = TickClock()
        return try Trainer(manifest: m, programName: "tiny", programDirectory: try program ?? TinyManifest.programDirectory(m),
                           runtime: runtime, examples: examples,
                           config: RunConfig(steps: steps, lr: 0.05, checkpointEvery: 2, shuffleSeed: 3), device: testDevice,
                           checkpoint: dir.map { CheckpointStore(url: $0.appendingPathComponent("checkpoint.safetensors")) },
                           telemetry: sinks, usedSeq: usedSeq, probes: probes, budget: budget, clock: clock.read, monotonic: clock.read)
    }

    private func slice(_ state: [Float], _ e: ProgramManifest.StateEntry) -> [Float] {
        Array(state[e.offset..<(e.offset + e.count)])
    }

    func testLoadsEveryMethodFirstAndReportsAValidRun() throws {
        let m = try TinyManifest.manifest(layers: 4, lcsb: true)
        let rt = FakeRuntime(manifest: m)
        let sink = MemorySink()
        let fp = ScriptedProbe([MemorySample(probe: "ios_phys_footprint", anonBytes: 100 << 20, peakBytes: 120 << 20)])
        let av = ScriptedProbe([MemorySample(probe: "ios_os_proc_available", availableBytes: 3 << 30)])
        let t = try makeTrainer(m, runtime: rt, dir: try tempDir(), sinks: [sink],
                                probes: MemoryProbes(footprint: fp, available: av),
                                budget: BudgetGuard(budgetBytes: 2 << 30, plannedPeakBytes: m.plannedPeakBytes))
        XCTAssertFalse(try t.start(runId: "ios-run-1"))
        XCTAssertEqual(rt.loaded, ["train_step_p0", "train_step_p1"], "every train method is loaded before the first call")
        XCTAssertEqual(rt.calls, [])
        XCTAssertEqual(t.state, TinyManifest.initialState(m), "a new run starts from state.init_file")
        var losses: [Float] = []
        XCTAssertEqual(try t.run(onStep: { _, loss in losses.append(loss) }), .completed)
        XCTAssertEqual(losses.count, 6)
        XCTAssertLessThan(losses[5], losses[0], "the fake's quadratic loss must fall")
        XCTAssertEqual(rt.calls, ["train_step_p0", "train_step_p1", "train_step_p0", "train_step_p1", "train_step_p0", "train_step_p1"])
        let types = sink.events.map(\.type)
        XCTAssertEqual(types.first, "run_start")
        XCTAssertEqual(types.last, "run_end")
        XCTAssertEqual(types.filter { $0 == "step" }.count, 6)
        XCTAssertEqual(types.filter { $0 == "memory" }.count, 12)
        XCTAssertEqual(sink.events.map(\.seq), Array(0..<sink.events.count))
        for e in sink.events { XCTAssertEqual(TelemetrySchema.errors(in: e.fields), [], "\(e.fields)") }
        let start = sink.events[0].fields
        XCTAssertEqual(start["backend"], .string("executorch"))
        XCTAssertEqual(start["lcsb_k"], .int(2))
        XCTAssertEqual(sink.events.first { $0.type == "step" }?.fields["lcsb_phase"], .int(0))
        XCTAssertEqual(sink.events.last?.fields["peak_bytes"], .int(120 << 20))
        XCTAssertEqual(sink.events.last?.fields["status"], .string("completed"))
    }

    /// The inputs are (ids, labels, lr, every entry's current slice in entries order); the outputs
    /// are copied by name into their entries' slices (here returned in reverse order and for a
    /// subset), everything else is left as it was.
    func testInputsAreTheStateSlicesAndOutputsLandInTheirSlices() throws {
        let m = try TinyManifest.manifest(layers: 4, lcsb: false)
        let chosen = [m.state.entries[5], m.state.entries[0], m.state.entries[9]]
        let rt = ScriptedRuntime { _, _ in
            [TensorValue.float32("loss", [2.5], shape: [1])] + chosen.map { e in
                TensorValue.float32(e.name, (0..<e.count).map { Float(1000 * e.offset + $0) }, shape: e.shape)
            }
        }
        let t = try makeTrainer(m, runtime: rt, dir: nil, steps: 2)
        try t.start(runId: "ios-slices")
        let before = t.state
        XCTAssertEqual(try t.step(), .trained(step: 0, loss: 2.5))
        let first = rt.inputs[0]
        XCTAssertEqual(first.map(\.name), ["input_ids", "labels", "lr"] + m.state.entries.map(\.name))
        XCTAssertEqual(first[0].shape, [m.seqLen])
        XCTAssertEqual(first[2].floats.map(Array.init), [0.05])
        for (v, e) in zip(first.dropFirst(3), m.state.entries) {
            XCTAssertEqual(v.shape, e.shape)
            XCTAssertEqual(v.floats.map(Array.init), slice(before, e), "\(e.name) must be its slice of the state")
        }
        for e in m.state.entries {
            let want = chosen.contains { $0.name == e.name } ? (0..<e.count).map { Float(1000 * e.offset + $0) } : slice(before, e)
            XCTAssertEqual(slice(t.state, e), want, e.name)
        }
        _ = try t.step()                                          // the next call sees the new values
        XCTAssertEqual(rt.inputs[1][3 + 5].floats.map(Array.init), slice(t.state, chosen[0]))
    }

    /// SGD + LCSB: a phase method returns only its phase's LoRA params; the others keep their values.
    func testAPhaseReturnsASubsetAndOnlyThatSubsetMoves() throws {
        let m = try TinyManifest.manifest(layers: 4, lcsb: true)
        let p0 = m.method(named: "train_step_p0")!
        XCTAssertEqual(Set(p0.outputs.dropFirst().map(\.name)),
                       Set(m.state.entries.filter { FakeRuntime.layer(ofKey: $0.key)! < 2 }.map(\.name)))
        let t = try makeTrainer(m, runtime: FakeRuntime(manifest: m), dir: nil, steps: 2)
        try t.start(runId: "ios-phase")
        for (step, phaseLayers) in [(0, 0..<2), (1, 2..<4)] {
            let before = t.state
            guard case .trained(step, _) = try t.step() else { return XCTFail("step \(step) did not train") }
            for e in m.state.entries {
                let changed = slice(before, e) != slice(t.state, e)
                XCTAssertEqual(changed, phaseLayers.contains(FakeRuntime.layer(ofKey: e.key)!), "step \(step): \(e.name) changed=\(changed)")
            }
        }
    }

    /// An output the state has no place for (unknown name, wrong size, twice, no loss first) stops
    /// the step with a message, and the state is left exactly as it was.
    func testBadOutputsAreRefusedAndLeaveTheStateUntouched() throws {
        let m = try TinyManifest.manifest(layers: 2, lcsb: false)
        let e0 = m.state.entries[0], e1 = m.state.entries[1]
        let good: [TensorValue] = [.float32("loss", [1], shape: [1]), .float32(e1.name, [Float](repeating: 7, count: e1.count))]
        let cases: [(String, [TensorValue])] = [
            ("'lora_9_q_proj_a', which is not a state entry", good + [.float32("lora_9_q_proj_a", [Float](repeating: 0, count: e0.count))]),
            ("returned \(e0.count + 1) values for \(e0.name), the entry holds \(e0.count)",
             good + [.float32(e0.name, [Float](repeating: 0, count: e0.count + 1))]),
            ("returned \(e1.name) twice", good + [good[1]]),
            ("loss", Array(good.dropFirst())),
            ("as int64", good + [.int64(e0.name, [Int64](repeating: 0, count: e0.count))]),
        ]
        for (needle, outputs) in cases {
            let t = try makeTrainer(m, runtime: ScriptedRuntime { _, _ in outputs }, dir: try tempDir(), steps: 3)
            try t.start(runId: "ios-bad")
            let before = t.state
            XCTAssertThrowsError(try t.step()) { XCTAssertTrue("\($0)".contains(needle), "expected '\(needle)' in: \($0)") }
            XCTAssertEqual(t.state, before, "a refused output must not change the state (\(needle))")
            XCTAssertEqual(t.nextStep, 0)
        }
    }

    /// The exported tiny program's manifest (shared_schemas/examples/manifest_v2_tiny.json), the example
    /// data row, the fake runtime: a whole session, then the adapter written the PEFT way.
    func testTrainsTheExampleProgramEndToEnd() throws {
        let m = try ProgramManifest.decode(try Repo.data(Repo.examples.appendingPathComponent("manifest_v2_tiny.json")))
        let rows = try DataRow.parseJSONL(try Repo.data(Repo.examples.appendingPathComponent("data_row.json")))
        let rt = FakeRuntime(manifest: m)
        let sink = MemorySink()
        let dir = try tempDir()
        let initial = TinyManifest.initialState(m)
        let t = try Trainer(manifest: m, programName: "tiny", programDirectory: try TinyManifest.programDirectory(m, state: initial),
                            runtime: rt, examples: try Batcher(manifest: m).padAll(rows),
                            config: RunConfig(steps: 4, lr: Float(m.optimizer.defaultLr ?? 1e-4)), device: testDevice,
                            checkpoint: CheckpointStore(url: dir.appendingPathComponent("c.safetensors")), telemetry: [sink])
        try t.start(runId: "ios-example")
        XCTAssertEqual(try t.run(), .completed)
        let expected = (0..<4).map { MethodSchedule(manifest: m).method(forStep: $0).name }
        XCTAssertEqual(rt.calls, expected)
        XCTAssertNotEqual(t.state, initial, "training must move the state")
        for e in sink.events { XCTAssertEqual(TelemetrySchema.errors(in: e.fields), [], "\(e.fields)") }
        XCTAssertEqual(sink.events[0].fields["quant"], .string(m.quant.kind))
        try t.exportAdapter(to: dir.appendingPathComponent("adapter"))
        let st = try Safetensors.decode(try Data(contentsOf: dir.appendingPathComponent("adapter/adapter_model.safetensors")))
        let params = m.state.entries.filter { $0.role == "param" }
        XCTAssertEqual(Set(st.tensors.keys), Set(params.map(\.key)))
        for e in params { XCTAssertEqual(st.tensors[e.key]?.values, slice(t.state, e), e.key) }
        XCTAssertEqual(try JSONValue.parse(try Data(contentsOf: dir.appendingPathComponent("adapter/adapter_config.json"))),
                       m.adapter.config)
        // The checkpoint is the state array.
        XCTAssertEqual(try CheckpointStore(url: dir.appendingPathComponent("c.safetensors"))
            .load(expectedNumel: m.state.numel, programSha256: m.exportSha256).state, t.state)
    }

    /// A state_init.bin of the wrong size (another export's, or cut short by a copy) is refused
    /// before anything runs.
    func testInitFileOfTheWrongSizeIsRefused() throws {
        let m = try TinyManifest.manifest()
        for bad in [Data(StateFile.encode(TinyManifest.initialState(m)).dropLast(4)),
                    StateFile.encode(TinyManifest.initialState(m)) + Data([0]), Data()] {
            let program = try TinyManifest.programDirectory(m)
            try bad.write(to: program.appendingPathComponent(m.state.initFile))
            let rt = FakeRuntime(manifest: m)
            let t = try makeTrainer(m, runtime: rt, dir: nil, program: program)
            XCTAssertThrowsError(try t.start(runId: "ios-bad-init")) {
                XCTAssertTrue("\($0)".contains("holds \(bad.count) bytes") && "\($0)".contains("\(m.state.numel) float32"), "\($0)")
            }
            XCTAssertEqual(rt.loaded, [], "nothing is loaded for a bad initial state")
        }
        let missing = try makeTrainer(m, runtime: FakeRuntime(manifest: m), dir: nil, program: try tempDir())
        XCTAssertThrowsError(try missing.start()) { XCTAssertTrue("\($0)".contains("state_init.bin"), "\($0)") }
    }

    func testStateFileIsRawLittleEndianFloat32() throws {
        XCTAssertEqual([UInt8](StateFile.encode([1, -2, 0.5])), [0, 0, 0x80, 0x3F, 0, 0, 0, 0xC0, 0, 0, 0, 0x3F])
        let values: [Float] = [0, -0, 1e-30, .greatestFiniteMagnitude, 3.25]
        let back = try StateFile.decode(StateFile.encode(values), numel: 5, source: "s")
        XCTAssertEqual(back.map(\.bitPattern), values.map(\.bitPattern))
    }

    /// Kill the app after step 3 (checkpoint at step 2, a half-written checkpoint left behind), relaunch
    /// with a fresh runtime: the run ends bit-identical to an uninterrupted one, and no seq is reused.
    func testKillAndResumeMatchesAnUninterruptedRun() throws {
        let m = try TinyManifest.manifest(layers: 4, lcsb: true, adamw: true)
        let program = try TinyManifest.programDirectory(m)
        let r = try makeTrainer(m, runtime: FakeRuntime(manifest: m), dir: try tempDir(), program: program)
        try r.start(runId: "ios-ref")
        XCTAssertEqual(try r.run(), .completed)

        let dir = try tempDir()
        let queue = try TelemetryQueue(directory: dir.appendingPathComponent("telemetry"))
        let first = try makeTrainer(m, runtime: FakeRuntime(manifest: m), dir: dir, program: program, sinks: [queue],
                                    usedSeq: queue.nextSeq)
        try first.start(runId: "ios-killed")
        for _ in 0..<3 { _ = try first.step() }                 // checkpoint after step 2; step 3 is lost
        let seqBeforeKill = first.recorder!.nextSeq
        try Data("partial".utf8).write(to: dir.appendingPathComponent(".checkpoint.safetensors.tmp-dead"))

        let relaunched = try TelemetryQueue(directory: dir.appendingPathComponent("telemetry"))
        // The relaunch may use another backend: the state is the same array for every runtime.
        let second = FakeRuntime(manifest: m, backendName: "coreml")
        let resumed = try makeTrainer(m, runtime: second, dir: dir, program: program, sinks: [relaunched], usedSeq: relaunched.nextSeq)
        XCTAssertTrue(try resumed.start())
        XCTAssertEqual(resumed.nextStep, 2)
        XCTAssertEqual(resumed.recorder?.runId, "ios-killed")
        XCTAssertEqual(resumed.recorder?.nextSeq, seqBeforeKill, "continue after the last queued seq, not the checkpoint's")
        XCTAssertEqual(second.loaded, m.trainMethodNames)
        XCTAssertEqual(try resumed.run(), .completed)
        XCTAssertEqual(second.calls, ["train_step_p0", "train_step_p1", "train_step_p0", "train_step_p1"], "steps 2..5 only")
        XCTAssertEqual(resumed.state.map(\.bitPattern), r.state.map(\.bitPattern), "resumed state must equal the uninterrupted run's")
        XCTAssertNotEqual(r.state, TinyManifest.initialState(m))
        XCTAssertEqual(resumed.state.last, 6, "AdamW's step counter counts all 6 steps across the kill")
        XCTAssertEqual(resumed.losses, r.losses)
        let seqs = relaunched.pending.map(\.seq)
        XCTAssertEqual(seqs, Array(0..<seqs.count), "no seq reused or skipped across the kill")
        let leftovers = try FileManager.default.contentsOfDirectory(atPath: dir.path).filter { $0.contains(".tmp-") }
        XCTAssertEqual(leftovers, [], "temp files of a killed write are cleaned up")
    }

    /// The fake follows the contract: a pure function of its inputs, returning exactly the outputs
    /// the manifest lists (AdamW: every param, both moments, the step counter).
    func testFakeRuntimeIsAPureFunctionOfItsInputs() throws {
        let m = try TinyManifest.manifest(layers: 4, lcsb: true, adamw: true)
        let rt = FakeRuntime(manifest: m)
        try rt.load(methods: m.trainMethodNames)
        let state = TinyManifest.initialState(m)
        let inputs: [TensorValue] = [.int64("input_ids", Array(repeating: 65, count: 8)), .int64("labels", Array(repeating: 66, count: 8)),
                                     .float32("lr", [0.1])] + m.state.entries.map { .float32($0.name, state[$0.offset..<($0.offset + $0.count)], shape: $0.shape) }
        let a = try rt.execute(method: "train_step_p1", inputs: inputs)
        let b = try rt.execute(method: "train_step_p1", inputs: inputs)
        XCTAssertEqual(a, b)
        XCTAssertEqual(a.map(\.name), m.method(named: "train_step_p1")!.outputs.map(\.name))
        XCTAssertEqual(a.map(\.name), ["loss"] + m.state.entries.map(\.name))
        XCTAssertEqual(a.last?.floats.map(Array.init), [1])                     // adam_step 0 -> 1
        XCTAssertThrowsError(try rt.execute(method: "train_step_p1", inputs: Array(inputs.dropLast())))
        XCTAssertThrowsError(try FakeRuntime(manifest: m).execute(method: "train_step_p0", inputs: inputs)) {
            XCTAssertTrue("\($0)".contains("before it was loaded"), "\($0)")
        }
    }

    func testPositionalOutputsAreNamedAfterTheManifest() throws {
        let m = try TinyManifest.manifest(layers: 2, lcsb: true)
        let spec = m.method(named: "train_step_p0")!
        let values = spec.outputs.map { [Float](repeating: 1, count: $0.count) }
        XCTAssertEqual(try spec.namedOutputs(values).map(\.name), spec.outputs.map(\.name))
        XCTAssertEqual(try spec.namedOutputs(values).map(\.shape), spec.outputs.map(\.shape))
        XCTAssertThrowsError(try spec.namedOutputs(Array(values.dropLast()))) { XCTAssertTrue("\($0)".contains("outputs"), "\($0)") }
        var wrong = values
        wrong[1].append(0)
        XCTAssertThrowsError(try spec.namedOutputs(wrong)) { XCTAssertTrue("\($0)".contains(spec.outputs[1].name), "\($0)") }
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

    func testRuntimeFailureEndsTheRunAsFailedWithAFatalError() throws {
        let m = try TinyManifest.manifest()
        let rt = FakeRuntime(manifest: m)
        rt.failAtCall = 3
        let sink = MemorySink()
        let dir = try tempDir()
        let t = try makeTrainer(m, runtime: rt, dir: dir, sinks: [sink])
        try t.start(runId: "ios-fail")
        XCTAssertThrowsError(try t.run())
        let error = sink.events.first { $0.type == "error" }
        XCTAssertEqual(error?.fields["code"], .string("runtime_error"))
        XCTAssertEqual(error?.fields["fatal"], .bool(true))
        XCTAssertEqual(sink.events.last?.fields["status"], .string("failed"))
        XCTAssertEqual(sink.events.last?.fields["steps_completed"], .int(3))
        // The failed run's checkpoint holds the state after the 3 good steps.
        let saved = try CheckpointStore(url: dir.appendingPathComponent("checkpoint.safetensors")).load(expectedNumel: m.state.numel)
        XCTAssertEqual(saved.meta.step, 3)
        XCTAssertEqual(saved.state, t.state)
    }

    /// Critical pressure pauses the run with a checkpoint; the next session resumes it.
    func testPressurePausesAndTheNextSessionResumes() throws {
        let m = try TinyManifest.manifest()
        let dir = try tempDir()
        var pressure = MemoryPressure.normal
        let sink = MemorySink()
        let t = try makeTrainer(m, runtime: FakeRuntime(manifest: m), dir: dir, sinks: [sink],
                                probes: MemoryProbes(pressure: { pressure }),
                                budget: BudgetGuard(budgetBytes: 1 << 30, plannedPeakBytes: 0))
        try t.start(runId: "ios-pause")
        _ = try t.step()
        pressure = .critical
        XCTAssertEqual(try t.run(), .paused)
        XCTAssertEqual(sink.events.last?.fields["status"], .string("paused"))
        XCTAssertEqual(sink.events.last?.fields["steps_completed"], .int(1))
        let later = try makeTrainer(m, runtime: FakeRuntime(manifest: m), dir: dir, sinks: [sink], usedSeq: { _ in sink.events.count })
        XCTAssertTrue(try later.start())
        XCTAssertEqual(later.nextStep, 1)
        XCTAssertEqual(later.state, t.state, "the pause's checkpoint is the state after step 0")
        XCTAssertEqual(try later.run(), .completed)
        XCTAssertEqual(later.nextStep, 6)
        XCTAssertEqual(sink.events.map(\.seq), Array(0..<sink.events.count))
    }

    func testBudgetStopEmitsBudgetExceeded() throws {
        let m = try TinyManifest.manifest()
        let sink = MemorySink()
        let fp = ScriptedProbe([MemorySample(probe: "ios_phys_footprint", anonBytes: 900 << 20)])
        let t = try makeTrainer(m, runtime: FakeRuntime(manifest: m), dir: try tempDir(), sinks: [sink],
                                probes: MemoryProbes(footprint: fp),
                                budget: BudgetGuard(budgetBytes: 1 << 30, plannedPeakBytes: 2 << 30))
        try t.start(runId: "ios-stop")
        XCTAssertEqual(try t.run(), .failed)
        XCTAssertEqual(t.nextStep, 0)
        XCTAssertEqual(sink.events.first { $0.type == "error" }?.fields["code"], .string("budget_exceeded"))
        XCTAssertEqual(sink.events.last?.fields["status"], .string("failed"))
    }
}
