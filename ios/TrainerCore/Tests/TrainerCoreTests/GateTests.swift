import Foundation
import XCTest
@testable import TrainerCore

/// The evaluation gate and the memory-pressure ladder: the pure decisions against the host's definitions
/// (docs/training.md, toolchain/training/gate.py, toolchain/memory/fallback.py), then sessions on the tiny program
/// made to diverge (losses that grow, NaN), to improve, and to meet memory pressure.
final class GateTests: XCTestCase {
    var dir: URL!

    override func setUpWithError() throws { dir = try tempDir("gate") }
    override func tearDownWithError() throws { try? FileManager.default.removeItem(at: dir) }

    func testTheDecisionTableOfDocsTraining() throws {
        let rolled = GateDecision.decide(startStep: 0, startLoss: 2.31, later: [(10, 2.35), (20, 2.40)])
        XCTAssertEqual(rolled.decision, .rolledBack)
        XCTAssertEqual(rolled.reason, "rolled back: held-out 2.3100 -> 2.4000")
        XCTAssertEqual(rolled.keptStep, 0)
        XCTAssertEqual(GateDecision.decide(startStep: 0, startLoss: 2.31, later: [(10, .nan)]).reason, "rolled back: held-out 2.3100 -> nan")
        let kept = GateDecision.decide(startStep: 0, startLoss: 2.31, later: [(20, 2.10), (40, 2.05)])
        XCTAssertEqual(kept.decision, .kept)
        XCTAssertEqual(kept.reason, "kept: held-out 2.3100 -> 2.0500")
        let best = GateDecision.decide(startStep: 0, startLoss: 2.31, later: [(20, 2.02), (40, 2.10)])
        XCTAssertEqual(best.decision, .keptBest)
        XCTAssertEqual(best.reason, "kept best: held-out 2.3100 -> 2.0200 at step 20 (last 2.1000)")
        XCTAssertEqual(GateDecision.decide(startStep: 0, startLoss: 2.31, later: [(20, 2.02), (40, .infinity)]).reason,
                       "kept best: held-out 2.3100 -> 2.0200 at step 20 (last inf)")
        XCTAssertEqual(GateDecision.decide(startStep: 0, startLoss: 2.31, later: [(10, 2.31)]).decision, .rolledBack, "strictly lower")
        XCTAssertEqual(GateDecision.decide(startStep: 0, startLoss: 2.31, later: [(10, 2.0), (20, 2.0)]).decision, .kept, "ties: the later")
        XCTAssertEqual(GateDecision.decide(startStep: 0, startLoss: .nan, later: [(10, 5.0)]).decision, .kept, "a non-finite start is +inf")
        let sink = MemorySink()
        let r = try TelemetryRecorder(runId: "ios-gate-1", sinks: [sink])
        for d in [rolled, kept, best] { try r.emit("gate", d.eventFields) }
        XCTAssertTrue(sink.events.allSatisfy { TelemetrySchema.errors(in: $0.fields).isEmpty })
        for name in ["telemetry_gate_rolled_back.json", "telemetry_gate_kept_no_probe.json", "telemetry_memory_adapted_host.json"] {
            XCTAssertEqual(TelemetrySchema.errors(inDocument: try Repo.data(Repo.examples.appendingPathComponent(name))), [], name)
        }
    }

    func testTheLadderIsTheHosts() {
        // Expected: toolchain/memory/fallback.py fallback_ladder(WorkingSet(1, None, None), 24, 1000 + 10 per input alive,
        // budget 0), run with the repository's .venv: knob, layers_per_checkpoint, lcsb_k, predicted.
        let p = PressurePolicy(layers: 24) { ws in UInt64(1000 + 10 * CheckpointGroups.maxAlive(selected: ws.selected(layers: 24), layersPerCheckpoint: ws.layersPerCheckpoint)) }
        var ws = WorkingSet(layersPerCheckpoint: 1, lcsbK: nil)
        var walked: [Notch] = []
        while let n = p.next(ws) { walked.append(n); ws = n.after }
        XCTAssertEqual(walked.map { "\($0.knob) \($0.after.layersPerCheckpoint) \($0.after.lcsbK.map(String.init) ?? "nil") \($0.predictedBytes!)" }, [
            "layers_per_checkpoint 2 nil 1130", "layers_per_checkpoint 4 nil 1090", "lcsb_k 4 12 1060", "lcsb_k 4 6 1050",
            "lcsb_k 3 3 1030", "lcsb_k 1 1 1010",
        ])
        XCTAssertFalse(p.inCooldown(atStep: 5))
        p.osAdapted(atStep: 5)
        XCTAssertTrue(p.inCooldown(atStep: 7))
        XCTAssertFalse(p.inCooldown(atStep: 8))
    }

    /// HashRuntime's outputs with head_loss's loss scripted by the steps trained so far (block_backward calls: one per
    /// step with cyclic k = 1): a training step's loss and the held-out loss alike.
    final class ScriptedLoss: ProgramRuntime {
        let backendName = "executorch"
        let inner: HashRuntime
        let lossIndex: Int
        let loss: (Int) -> Float
        var backward = 0
        init(manifest: Manifest, loss: @escaping (Int) -> Float) {
            inner = HashRuntime(manifest: manifest)
            lossIndex = manifest.methods.first { $0.name == "head_loss" }!.outputs.firstIndex { $0.name == "loss" }!
            self.loss = loss
        }
        func load(methods: [String]) throws { try inner.load(methods: methods) }
        func execute(method: String, layer: Int?, inputs: [LoopInput]) throws -> [Data] {
            var out = try inner.execute(method: method, layer: layer, inputs: inputs)
            if method == "block_backward" { backward += 1 }
            if method == "head_loss" { var v = loss(backward); out[lossIndex] = Data(bytes: &v, count: 4) }
            return out
        }
    }

    private func data(_ m: Manifest, _ p: URL) throws -> TrainingData {
        let tok = try ProgramTokenizer.load(manifest: m, directory: p)
        return try TrainingData.prepare(.text(SessionTests.text), tokenizer: tok, manifest: m, heldOutFraction: 0.2, seed: 5)
    }

    private func run(_ p: URL, _ m: Manifest, steps: Int, name: String, selection: LayerSelection = .cyclic(k: 1),
                     loss: @escaping (Int) -> Float, sink: MemorySink = MemorySink(), budget: MemoryGuard? = nil,
                     probes: MemoryProbes = MemoryProbes()) throws -> (TrainingSession, CheckpointStore) {
        let store = CheckpointStore(url: dir.appendingPathComponent("\(name).safetensors"))
        let clock = TickClock()
        let s = try TrainingSession(programDirectory: p, programName: "tiny", runtime: ScriptedLoss(manifest: m, loss: loss), data: try data(m, p),
                                    config: SessionConfig(steps: steps, lr: 0.01, checkpointEvery: 2, shuffleSeed: 7, selection: selection),
                                    device: testDevice, checkpoint: store, telemetry: [sink], probes: probes, budget: budget,
                                    clock: clock.read, monotonic: clock.read)
        try s.start(runId: "ios-\(name)")
        try s.evaluate(initial: true)
        _ = try s.run()
        try s.evaluate(initial: false)
        return (s, store)
    }

    private func events(_ sink: MemorySink, _ type: String) -> [[String: JSONValue]] { sink.events.filter { $0.type == type }.map(\.fields) }

    func testAGrowingLossIsRolledBackAndAnImprovingOneKept() throws {
        let (p, m) = try syntheticProgram(in: dir)
        let initial = try StateBuffer.initial(manifest: m, programDirectory: p).values
        let sink = MemorySink()
        let vm = TrainingViewModel()
        let (s, store) = try run(p, m, steps: 6, name: "diverge", loss: { 2.0 + 0.5 * Float($0) }, sink: sink)
        XCTAssertEqual(s.gateDecision?.reason, "rolled back: held-out 2.0000 -> 5.0000")
        XCTAssertEqual(events(sink, "eval").map { $0["step"]?.intValue }, [0, 2, 4, 6], "the start, each checkpoint, the end")
        XCTAssertEqual(events(sink, "gate").first?["decision"], .string("rolled_back"))
        XCTAssertEqual(s.state?.values, initial, "the live state is the starting adapter again")
        XCTAssertEqual(try store.load(expectedNumel: m.state.numel).state, initial, "and so is the checkpoint")
        XCTAssertTrue(sink.events.allSatisfy { TelemetrySchema.errors(in: $0.fields).isEmpty })
        vm.handle(.gate(s.gateDecision!))
        XCTAssertEqual(vm.state.gateReason, "rolled back: held-out 2.0000 -> 5.0000")

        let good = MemorySink()
        let (g, _) = try run(p, m, steps: 6, name: "good", loss: { 2.0 - 0.1 * Float($0) }, sink: good)
        XCTAssertEqual(g.gateDecision?.reason, "kept: held-out 2.0000 -> 1.4000")
        XCTAssertNotEqual(g.state?.values, initial)
        XCTAssertTrue(good.events.allSatisfy { TelemetrySchema.errors(in: $0.fields).isEmpty })
    }

    func testANaNRunKeepsTheBestEvaluatedAdapter() throws {
        let (p, m) = try syntheticProgram(in: dir)
        let (s, store) = try run(p, m, steps: 6, name: "nan", loss: { $0 >= 3 ? .nan : 2.0 - 0.1 * Float($0) })
        XCTAssertEqual(s.gateDecision?.reason, "kept best: held-out 2.0000 -> 1.8000 at step 2 (last nan)")
        let (two, _) = try run(p, m, steps: 2, name: "two", loss: { 2.0 - 0.1 * Float($0) })
        XCTAssertEqual(two.gateDecision?.decision, .kept)
        XCTAssertEqual(s.state?.values, two.state?.values, "the state of step 2")
        XCTAssertEqual(try store.load(expectedNumel: m.state.numel).state, two.state?.values)
        XCTAssertFalse(FileManager.default.fileExists(atPath: s.gateRecord.best.url.path), "the best copy is gone once decided")
    }

    final class ScriptedFootprint: MemoryProbe {
        var values: [UInt64]
        var calls = 0
        init(_ values: [UInt64]) { self.values = values }
        func sample() -> MemorySample? {
            defer { calls += 1 }
            return MemorySample(probe: "ios_phys_footprint", anonBytes: values[min(calls, values.count - 1)])
        }
    }

    func testMemoryPressureLowersTheWorkingSetAndTheRunCompletes() throws {
        let (p, m) = try syntheticProgram(in: dir)
        // Sampled before and after each step: step 1 grows by 70 MB, so step 2 is predicted over the 100 MB budget.
        let mb: UInt64 = 1 << 20
        let probe = ScriptedFootprint([50 * mb, 50 * mb, 50 * mb, 120 * mb, 60 * mb])
        let budget = MemoryGuard(budgetBytes: 100 * mb, plannedPeakBytes: 50 * mb)
        let sink = MemorySink()
        let (s, _) = try run(p, m, steps: 6, name: "press", selection: .all, loss: { _ in 2.0 }, sink: sink, budget: budget,
                             probes: MemoryProbes(footprint: probe))
        let a = events(sink, "memory_adapted")
        XCTAssertEqual(a.count, 1)
        XCTAssertEqual(a.first?["step"], .int(2))
        XCTAssertEqual(a.first?["knob"], .string("layers_per_checkpoint"))
        XCTAssertEqual(a.first?["trigger"], .string("predicted"))
        XCTAssertEqual(a.first?["measured_bytes"], .int(Int64(130 * mb)))
        XCTAssertEqual(s.working, WorkingSet(layersPerCheckpoint: 2, lcsbK: nil))
        XCTAssertEqual(events(sink, "step").count, 6, "the run completes")
        XCTAssertTrue(sink.events.allSatisfy { TelemetrySchema.errors(in: $0.fields).isEmpty })

    }

    final class Level { var value: MemoryPressure = .normal }

    /// Critical pressure from step 1 on: one notch (os_signal) at step 1, none within the cooldown, the next at step 4.
    func testCriticalPressureTakesOneNotchPerCooldown() throws {
        let (p, m) = try syntheticProgram(in: dir)
        let mb: UInt64 = 1 << 20
        let sink = MemorySink()
        let clock = TickClock()
        let level = Level()
        let s = try TrainingSession(programDirectory: p, programName: "tiny", runtime: HashRuntime(manifest: m), data: try data(m, p),
                                    config: SessionConfig(steps: 6, lr: 0.01, checkpointEvery: 2, shuffleSeed: 7, selection: .all),
                                    device: testDevice, checkpoint: CheckpointStore(url: dir.appendingPathComponent("os.safetensors")),
                                    telemetry: [sink], probes: MemoryProbes(footprint: ScriptedFootprint([50 * mb]), pressure: { level.value }),
                                    budget: MemoryGuard(budgetBytes: 1 << 30, plannedPeakBytes: 10 * mb), clock: clock.read, monotonic: clock.read)
        try s.start(runId: "ios-os")
        for i in 0..<6 {
            if i == 1 { level.value = .critical }
            guard case .trained(let step, _) = try s.trainStep() else { return XCTFail("step \(i) did not train") }
            XCTAssertEqual(step, i)
        }
        let a = events(sink, "memory_adapted")
        XCTAssertEqual(a.map { $0["step"] }, [.int(1), .int(4)])
        XCTAssertEqual(a.map { $0["trigger"] }, [.string("os_signal"), .string("os_signal")])
        XCTAssertEqual(s.working, WorkingSet(layersPerCheckpoint: 2, lcsbK: 4))
        XCTAssertTrue(sink.events.allSatisfy { TelemetrySchema.errors(in: $0.fields).isEmpty })
        // Smallest settings and still critical: the run pauses (checkpointed).
        let tight = try TrainingSession(programDirectory: p, programName: "tiny", runtime: HashRuntime(manifest: m), data: try data(m, p),
                                        config: SessionConfig(steps: 6, lr: 0.01, checkpointEvery: 2, shuffleSeed: 7, selection: .cyclic(k: 1)),
                                        device: testDevice, telemetry: [MemorySink()],
                                        probes: MemoryProbes(footprint: ScriptedFootprint([50 * mb]), pressure: { .critical }),
                                        budget: MemoryGuard(budgetBytes: 1 << 30, plannedPeakBytes: 10 * mb), clock: clock.read, monotonic: clock.read)
        try tight.start(runId: "ios-tight")
        guard case .paused = try tight.trainStep() else { return XCTFail("expected a pause") }
    }
}
