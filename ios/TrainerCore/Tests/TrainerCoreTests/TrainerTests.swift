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

final class TrainerTests: XCTestCase {
    private func makeTrainer(_ m: ProgramManifest, runtime: TrainingRuntime, dir: URL?, steps: Int = 6,
                             sinks: [TelemetrySink] = [], usedSeq: ((String) -> Int)? = nil,
                             probes: MemoryProbes = MemoryProbes(), budget: BudgetGuard? = nil) throws -> Trainer {
        let examples = try Batcher(manifest: m).padAll(tinyRows())
        let clock = TickClock()
        return try Trainer(manifest: m, programName: "tiny", runtime: runtime, examples: examples,
                           config: RunConfig(steps: steps, lr: 0.05, checkpointEvery: 2, shuffleSeed: 3), device: testDevice,
                           checkpoint: dir.map { CheckpointStore(url: $0.appendingPathComponent("checkpoint.safetensors")) },
                           telemetry: sinks, usedSeq: usedSeq, probes: probes, budget: budget, clock: clock.read, monotonic: clock.read)
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
        XCTAssertEqual(rt.loaded, m.methodNames, "every method is loaded before the first call")
        var losses: [Float] = []
        XCTAssertEqual(try t.run(onStep: { _, loss in losses.append(loss) }), .completed)
        XCTAssertEqual(losses.count, 6)
        XCTAssertLessThan(losses[5], losses[0], "the fake's quadratic loss must fall")
        XCTAssertEqual(Array(rt.calls.filter { $0.hasPrefix("train_step") }),
                       ["train_step_p0", "train_step_p1", "train_step_p0", "train_step_p1", "train_step_p0", "train_step_p1"])
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

    /// The exported tiny program's manifest (shared_schemas/examples/manifest_tiny.json), the example
    /// data row, the fake runtime: a whole session, then the adapter written the PEFT way.
    func testTrainsTheExampleProgramEndToEnd() throws {
        let m = try ProgramManifest.decode(try Repo.data(Repo.examples.appendingPathComponent("manifest_tiny.json")))
        let rows = try DataRow.parseJSONL(try Repo.data(Repo.examples.appendingPathComponent("data_row.json")))
        let rt = FakeRuntime(manifest: m)
        let sink = MemorySink()
        let dir = try tempDir()
        let t = try Trainer(manifest: m, programName: "tiny", runtime: rt, examples: try Batcher(manifest: m).padAll(rows),
                            config: RunConfig(steps: 4, lr: Float(m.optimizer.defaultLr ?? 1e-4)), device: testDevice,
                            checkpoint: CheckpointStore(url: dir.appendingPathComponent("c.safetensors")), telemetry: [sink])
        try t.start(runId: "ios-example")
        XCTAssertEqual(try t.run(), .completed)
        XCTAssertEqual(rt.calls.filter { $0.hasPrefix("train_step") }, ["train_step_p0", "train_step_p1", "train_step_p0", "train_step_p1"])
        for e in sink.events { XCTAssertEqual(TelemetrySchema.errors(in: e.fields), [], "\(e.fields)") }
        XCTAssertEqual(sink.events[0].fields["quant"], .string(m.quant.kind))
        try t.exportAdapter(to: dir.appendingPathComponent("adapter"))
        let st = try Safetensors.decode(try Data(contentsOf: dir.appendingPathComponent("adapter/adapter_model.safetensors")))
        XCTAssertEqual(Set(st.tensors.keys), Set(m.state.entries.filter { $0.role == "param" }.map(\.key)))
        XCTAssertEqual(try JSONValue.parse(try Data(contentsOf: dir.appendingPathComponent("adapter/adapter_config.json"))),
                       m.adapter.config)
    }

    /// A step through phase k only moves the LoRA parameters of phase k's layers.
    func testAStepMovesOnlyItsPhaseLayers() throws {
        let m = try TinyManifest.manifest(layers: 4, lcsb: true)
        let rt = FakeRuntime(manifest: m)
        let t = try makeTrainer(m, runtime: rt, dir: nil, steps: 1)
        try t.start(runId: "ios-phase")
        let before = try rt.getState()
        _ = try t.step()                                          // step 0: train_step_p0 = layers 0, 1
        let after = try rt.getState()
        for e in m.state.entries {
            let changed = before[e.offset..<(e.offset + e.count)] != after[e.offset..<(e.offset + e.count)]
            let layer = FakeRuntime.layer(ofKey: e.key)!
            XCTAssertEqual(changed, layer < 2, "\(e.name) changed=\(changed)")
        }
    }

    /// The ExecuTorch failure this guards against: methods with private copies of the state.
    func testRefusesARuntimeWhoseMethodsDoNotShareState() throws {
        let m = try TinyManifest.manifest()
        let t = try makeTrainer(m, runtime: FakeRuntime(manifest: m, sharedState: false), dir: nil)
        XCTAssertThrowsError(try t.start(runId: "ios-unshared")) { XCTAssertTrue("\($0)".contains("do not share"), "\($0)") }
    }

    /// Kill the app after step 3 (checkpoint at step 2, a half-written checkpoint left behind), relaunch
    /// with a fresh runtime: the run ends bit-identical to an uninterrupted one, and no seq is reused.
    func testKillAndResumeMatchesAnUninterruptedRun() throws {
        let m = try TinyManifest.manifest(layers: 4, lcsb: true, adamw: true)
        let reference = FakeRuntime(manifest: m)
        let r = try makeTrainer(m, runtime: reference, dir: try tempDir())
        try r.start(runId: "ios-ref")
        XCTAssertEqual(try r.run(), .completed)

        let dir = try tempDir()
        let queue = try TelemetryQueue(directory: dir.appendingPathComponent("telemetry"))
        let first = try makeTrainer(m, runtime: FakeRuntime(manifest: m), dir: dir, sinks: [queue], usedSeq: queue.nextSeq)
        try first.start(runId: "ios-killed")
        for _ in 0..<3 { _ = try first.step() }                 // checkpoint after step 2; step 3 is lost
        let seqBeforeKill = first.recorder!.nextSeq
        try Data("partial".utf8).write(to: dir.appendingPathComponent(".checkpoint.safetensors.tmp-dead"))

        let relaunched = try TelemetryQueue(directory: dir.appendingPathComponent("telemetry"))
        let second = FakeRuntime(manifest: m)
        let resumed = try makeTrainer(m, runtime: second, dir: dir, sinks: [relaunched], usedSeq: relaunched.nextSeq)
        XCTAssertTrue(try resumed.start())
        XCTAssertEqual(resumed.nextStep, 2)
        XCTAssertEqual(resumed.recorder?.runId, "ios-killed")
        XCTAssertEqual(resumed.recorder?.nextSeq, seqBeforeKill, "continue after the last queued seq, not the checkpoint's")
        XCTAssertEqual(second.loaded, m.methodNames, "load everything, then set_state")
        XCTAssertEqual(try resumed.run(), .completed)
        XCTAssertEqual(try second.getState(), try reference.getState(), "resumed state must equal the uninterrupted run's")
        XCTAssertEqual(resumed.losses, r.losses)
        let seqs = relaunched.pending.map(\.seq)
        XCTAssertEqual(seqs, Array(0..<seqs.count), "no seq reused or skipped across the kill")
        let leftovers = try FileManager.default.contentsOfDirectory(atPath: dir.path).filter { $0.contains(".tmp-") }
        XCTAssertEqual(leftovers, [], "temp files of a killed write are cleaned up")
    }

    func testCheckpointInteropAndRefusals() throws {
        // The host runner's checkpoint (toolchain/runtime/trainer.py) reads as ours.
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
        rt.failAtStep = 3
        let sink = MemorySink()
        let t = try makeTrainer(m, runtime: rt, dir: try tempDir(), sinks: [sink])
        try t.start(runId: "ios-fail")
        XCTAssertThrowsError(try t.run())
        let error = sink.events.first { $0.type == "error" }
        XCTAssertEqual(error?.fields["code"], .string("runtime_error"))
        XCTAssertEqual(error?.fields["fatal"], .bool(true))
        XCTAssertEqual(sink.events.last?.fields["status"], .string("failed"))
        XCTAssertEqual(sink.events.last?.fields["steps_completed"], .int(3))
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
