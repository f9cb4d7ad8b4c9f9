import Foundation
#if canImport(Glibc)
import Glibc
#endif
import XCTest
@testable import TrainerCore

/// What a first run on a phone would meet (issue 42): the held-out pass capped at
/// `Contract.heldOutEvalRows` rows, cancellable between rows with "row i of N" progress; a checkpoint
/// after every step in background windows; generation beside training at the idle decode speed
/// (`RuntimeGate`: training waits while a generation is in progress), checked on the gate's own clock.
final class FirstRunTests: XCTestCase {
    var dir: URL!

    override func setUpWithError() throws { dir = try tempDir("first-run") }
    override func tearDownWithError() throws { try? FileManager.default.removeItem(at: dir) }

    /// 40 rows of 8 byte tokens (distinct), all with targets.
    func rows(_ n: Int, seed: Int64) -> [DataRow] {
        var out: [DataRow] = []
        for i in 0..<Int64(n) {
            var ids: [Int64] = []
            for j in 0..<Int64(8) {
                let v: Int64 = seed * 31 + i * 7 + j * 3
                ids.append(v % 200 + 1)
            }
            out.append(DataRow(inputIds: ids, labels: ids))
        }
        return out
    }

    func session(_ p: URL, _ m: Manifest, data: TrainingData, runtime: ProgramRuntime, steps: Int = 6,
                 checkpoint: CheckpointStore? = nil) throws -> TrainingSession {
        let clock = TickClock()
        return try TrainingSession(programDirectory: p, programName: "tiny", runtime: runtime, data: data,
                                   config: SessionConfig(steps: steps, lr: 0.01, checkpointEvery: 2, shuffleSeed: 7, selection: .cyclic(k: 3)),
                                   device: testDevice, checkpoint: checkpoint, telemetry: [MemorySink()], clock: clock.read, monotonic: clock.read)
    }

    func testHeldOutPassIsCappedReportsRowsAndIsTheLossOfThoseRows() throws {
        let (p, m) = try syntheticProgram(in: dir)
        let held = rows(40, seed: 2)
        let cap = Contract.heldOutEvalRows
        XCTAssertLessThan(cap, held.count)
        let s = try session(p, m, data: TrainingData(train: rows(6, seed: 1), heldOut: held), runtime: HashRuntime(manifest: m))
        var reported: [String] = []
        s.onEvent = { if case .evalRow(let initial, let row, let n) = $0 { reported.append("\(initial) \(row)/\(n)") } }
        _ = try s.start(runId: "ios-capped")
        let r = try XCTUnwrap(try s.evaluate(initial: true))
        XCTAssertEqual(r.rows, cap)
        XCTAssertEqual(reported, (0..<cap).map { "true \($0)/\(cap)" })
        // The loss of the first `cap` rows, by an independent loop; all 40 give another.
        let ref = try LayerLoop(programDirectory: p, runtime: HashRuntime(manifest: m))
        let initial = try StateBuffer.initial(manifest: m, programDirectory: p)
        func pairs(_ r: ArraySlice<DataRow>) -> [(inputIds: [Int64], labels: [Int64])] { r.map { ($0.inputIds, $0.labels ?? $0.inputIds) } }
        XCTAssertEqual(r.loss, try ref.evaluate(rows: pairs(held.prefix(cap)), state: initial, padTokenId: s.padTokenId).loss)
        XCTAssertNotEqual(r.loss, try ref.evaluate(rows: pairs(held[...]), state: initial, padTokenId: s.padTokenId).loss)
    }

    func testHeldOutPassStopsBetweenRows() throws {
        let (p, m) = try syntheticProgram(in: dir)
        let rt = HashRuntime(manifest: m)
        let sink = MemorySink()
        let clock = TickClock()
        let s = try TrainingSession(programDirectory: p, programName: "tiny", runtime: rt,
                                    data: TrainingData(train: rows(6, seed: 1), heldOut: rows(40, seed: 2)),
                                    config: SessionConfig(steps: 6, lr: 0.01), device: testDevice, telemetry: [sink],
                                    clock: clock.read, monotonic: clock.read)
        var reported = 0
        s.onEvent = { if case .evalRow = $0 { reported += 1 } }
        _ = try s.start(runId: "ios-cancel-eval")
        let callsBefore = rt.calls.count
        XCTAssertThrowsError(try s.evaluate(initial: true, cancelled: { reported >= 5 })) { e in
            XCTAssertTrue(e is EvalCancelled, "\(e)")
            XCTAssertEqual((e as? EvalCancelled)?.row, 5)
        }
        XCTAssertEqual(reported, 5)
        // 5 rows: embed, each layer's block_forward, head_loss; no call after the stop, no eval event.
        XCTAssertEqual(rt.calls.count - callsBefore, 5 * (m.loop.layers + 2))
        XCTAssertFalse(sink.events.contains { $0.fields["type"] == .string("eval") })
    }

    func testBackgroundWindowCheckpointsEveryStep() throws {
        let (p, m) = try syntheticProgram(in: dir)
        for each in [false, true] {
            let store = CheckpointStore(url: dir.appendingPathComponent("ckpt-\(each).safetensors"))
            let s = try session(p, m, data: TrainingData(train: rows(6, seed: 1), heldOut: []), runtime: HashRuntime(manifest: m), checkpoint: store)
            s.checkpointEachStep = { each }
            _ = try s.start(runId: "ios-bg-\(each)")
            for _ in 0..<3 { _ = try s.trainStep() }
            // Killed now (mid the 4th step): what the store holds is what a relaunch resumes from.
            let meta = try store.load(expectedNumel: m.state.numel).meta
            XCTAssertEqual(meta.step, each ? 3 : 2, "checkpoint each step: \(each)")
        }
    }

    /// `inner` with each call taking `trainMs` (training and held-out methods) or `genMs` (generation methods) more.
    final class TimedRuntime: ProgramRuntime {
        let inner: ProgramRuntime, trainMs: UInt32, genMs: UInt32
        var backendName: String { inner.backendName }
        var registeredKernels: Set<String> { inner.registeredKernels }
        init(_ inner: ProgramRuntime, trainMs: UInt32, genMs: UInt32) { (self.inner, self.trainMs, self.genMs) = (inner, trainMs, genMs) }
        func load(methods: [String]) throws { try inner.load(methods: methods) }
        func execute(method: String, layer: Int?, inputs: [LoopInput]) throws -> [Data] {
            let out = try inner.execute(method: method, layer: layer, inputs: inputs)
            usleep(1000 * (Contract.generationRoles.contains(method) ? genMs : trainMs))
            return out
        }
    }

    /// Outputs of the manifest's sizes with a fixed pattern, at no cost of its own (HashRuntime hashes every input,
    /// which in a Debug build takes longer than the call times this test replays).
    final class ConstRuntime: ProgramRuntime {
        let backendName = "executorch"
        let registeredKernels: Set<String> = []
        let outputs: [String: [Data]]
        init(manifest: Manifest) {
            var o: [String: [Data]] = [:]
            for m in manifest.methods {
                o[m.name] = m.outputs.map { io in
                    (0..<io.count).map { Float($0 % 5) / 1000 }.withUnsafeBytes { Data($0) }
                }
            }
            outputs = o
        }
        func load(methods: [String]) throws {}
        func execute(method: String, layer: Int?, inputs: [LoopInput]) throws -> [Data] {
            guard let o = outputs[method] else { throw TrainerError.runtime("no \(method)") }
            return o
        }
    }

    final class Counter: @unchecked Sendable {
        private let lock = NSLock()
        private var n = 0
        func add() { lock.lock(); n += 1; lock.unlock() }
        var count: Int { lock.lock(); defer { lock.unlock() }; return n }
    }

    /// A clock the test moves by hand (seconds), read from any thread: the `RuntimeGate`'s `now`.
    final class ManualClock: @unchecked Sendable {
        private let lock = NSLock()
        private var t = 100.0
        func read() -> Double { lock.lock(); defer { lock.unlock() }; return t }
        func advance(by dt: Double) { lock.lock(); t += dt; lock.unlock() }
    }

    /// `inner`, recording the order in which methods start (the loop calls its runtime one call at a time).
    final class CallOrder: ProgramRuntime {
        let inner: ProgramRuntime
        private let lock = NSLock()
        private var log: [String] = []
        var backendName: String { inner.backendName }
        var registeredKernels: Set<String> { inner.registeredKernels }
        init(_ inner: ProgramRuntime) { self.inner = inner }
        func load(methods: [String]) throws { try inner.load(methods: methods) }
        func execute(method: String, layer: Int?, inputs: [LoopInput]) throws -> [Data] {
            lock.lock(); log.append(method); lock.unlock()
            return try inner.execute(method: method, layer: layer, inputs: inputs)
        }
        var methods: [String] { lock.lock(); defer { lock.unlock() }; return log }
        /// Training-side calls (not generation methods) that started at or after index `from`, before `to`.
        func trainingCalls(from: Int, to: Int? = nil) -> Int {
            let m = methods
            return m[min(from, m.count)..<min(to ?? m.count, m.count)].filter { !Contract.generationRoles.contains($0) }.count
        }
    }

    /// Polls `condition` every millisecond for up to `timeout` seconds: whether it came true.
    func waitUntil(_ timeout: Double = 60, _ condition: () -> Bool) -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        while !condition() {
            if Date() > deadline { return false }
            usleep(1000)
        }
        return true
    }

    /// Generation beside training (issue 42), as a scheduling property on the gate's own clock (a clock the test
    /// moves by hand, so no figure depends on the machine's load): once a generation is in progress, at most the
    /// training call already in flight starts before its first token; while its consumer (the token callback) is
    /// within `RuntimeGate.grace` on that clock no training call starts, however long that lasts in real time;
    /// once the grace has passed training goes on; after the consumer, at most the training call in flight runs
    /// among the decode's calls (so tokens come at the idle speed whatever a training call costs); training goes
    /// on after the generation, and the runtime is never called from two threads at once.
    func testTrainingWaitsForAGenerationAndItsConsumerWithinTheGrace() throws {
        let (p, m) = try syntheticProgram(in: dir)
        let order = CallOrder(TimedRuntime(ConstRuntime(manifest: m), trainMs: 2, genMs: 0))
        let rt = CheckedRuntime(order)
        let data = try TrainingData.prepare(.text(SessionTests.text), tokenizer: .byte(), manifest: m, heldOutFraction: 0, seed: 0)
        let gateClock = ManualClock()
        let gate = RuntimeGate(grace: 0.05, now: gateClock.read)
        let clock = TickClock()
        let s = try TrainingSession(programDirectory: p, programName: "tiny", runtime: rt, data: data,
                                    config: SessionConfig(steps: 100_000, lr: 0.01, checkpointEvery: 1_000_000, selection: .cyclic(k: 3)),
                                    device: testDevice, clock: clock.read, monotonic: clock.read, priority: gate)
        XCTAssertTrue(s.loop.priority === gate)
        let progress = Counter()
        s.onEvent = { e in if case .step = e { progress.add() } }
        _ = try s.start(runId: "ios-gate")
        let stop = GenerationCancel()
        let trained = DispatchSemaphore(value: 0)
        DispatchQueue(label: "test.train").async {
            _ = try? s.run(interrupt: { stop.isCancelled ? .cancelled : nil })
            trained.signal()
        }
        XCTAssertTrue(waitUntil { progress.count >= 1 }, "training runs")
        var consumerStart = -1
        var waitingAtGate = false
        var trainingWithinGrace = -1
        var resumedAfterGrace = false
        let g = try s.generate(prompt: "The lamp", maxNewTokens: 8, initial: false, onToken: { t in
            guard t.index == 0 else { return }
            consumerStart = order.methods.count
            // The training thread comes to the gate and waits there: the consumer has held it 0 s on the gate's clock.
            waitingAtGate = self.waitUntil { gate.trainingCallsWaiting >= 1 }
            usleep(300_000)  // six graces of real time: the gate's clock decides, not the wall clock
            trainingWithinGrace = order.trainingCalls(from: consumerStart)
            gateClock.advance(by: 2 * gate.grace)  // past the grace (not to its edge: 100.05 - 100 < 0.05 in binary)
            resumedAfterGrace = self.waitUntil { order.trainingCalls(from: consumerStart) >= 1 }
        })
        let atEnd = progress.count
        XCTAssertTrue(waitUntil { progress.count >= atEnd + 2 }, "training goes on after the generation")
        stop.cancel()
        XCTAssertEqual(trained.wait(timeout: .now() + 60), .success)
        XCTAssertEqual(g.ids.count, 8)
        XCTAssertTrue(waitingAtGate, "a training call waits at the gate while the consumer is within the grace")
        XCTAssertEqual(trainingWithinGrace, 0, "no training call starts while the consumer is within the grace")
        XCTAssertTrue(resumedAfterGrace, "training goes on once the consumer has held the generation for the grace")
        let methods = order.methods
        let prefill = try XCTUnwrap(methods.firstIndex(of: "embed_prefill"))
        XCTAssertLessThanOrEqual(order.trainingCalls(from: prefill, to: consumerStart), 1, "before the first token: at most the call in flight")
        let decode = try XCTUnwrap(methods.firstIndex(of: "embed_token"))
        let last = try XCTUnwrap(methods.lastIndex { Contract.generationRoles.contains($0) })
        XCTAssertLessThanOrEqual(order.trainingCalls(from: decode, to: last), 1, "the decode: at most the training call in flight among its calls")
        XCTAssertGreaterThanOrEqual(gate.trainingWaits, 1, "training gave way to the generation")
        XCTAssertEqual(rt.maxInFlight, 1, "the runtime is never called from two threads at once")
    }

    /// The saved run is small JSON holding a path; its rows are a binary file that round-trips exactly
    /// (labels or none, -100 labels), is checked against the saved counts, and a damaged one is an error.
    func testSavedRunHoldsAPathRowsAreABinaryFile() throws {
        var train = rows(30, seed: 3)
        train[1] = DataRow(inputIds: [5, 6, 7], labels: [-100, 6, 7])
        train[2] = DataRow(inputIds: [151_643, 9], labels: nil)
        let data = TrainingData(train: train, heldOut: rows(4, seed: 9))
        let json = dir.appendingPathComponent("runs/latest-run.json")
        let run = SavedRun(program: "tiny", backend: "executorch", config: SessionConfig(steps: 5, lr: 0.01), budgetMB: 512,
                           source: "pasted text", heldOutFraction: 0.1, splitSeed: 0, rowsFile: SavedRun.newRowsFile(),
                           trainRows: data.train.count, heldOutRows: data.heldOut.count)
        try RowsFile.write(data, to: run.rowsURL(besides: json))
        try run.save(to: json)
        let text = try String(contentsOf: json, encoding: .utf8)
        XCTAssertFalse(text.contains("input_ids"), text)
        XCTAssertLessThan(text.utf8.count, 2048)
        let back = try XCTUnwrap(SavedRun.load(from: json))
        XCTAssertEqual(back, run)
        XCTAssertEqual(try back.rows(besides: json), data)
        // Counts that do not match, a damaged file, a missing file: errors, not other rows.
        var wrong = back
        wrong.trainRows += 1
        XCTAssertThrowsError(try wrong.rows(besides: json))
        var bytes = try Data(contentsOf: run.rowsURL(besides: json))
        bytes.removeLast(3)
        XCTAssertThrowsError(try RowsFile.decode(bytes))
        XCTAssertThrowsError(try RowsFile.decode(Data("not rows at all".utf8)))
        try FileManager.default.removeItem(at: run.rowsURL(besides: json))
        XCTAssertNotNil(SavedRun.load(from: json), "the JSON alone loads (the rows are read later, off the main thread)")
        XCTAssertThrowsError(try back.rows(besides: json))
        XCTAssertThrowsError(try RowsFile.encode(TrainingData(train: [DataRow(inputIds: [1 << 40])], heldOut: [])))
    }

    /// A new run on other text does not resume (or "complete" at once from) the program's checkpoint of
    /// another run; the same run resumes it.
    func testANewRunDoesNotResumeAnotherRunsCheckpoint() throws {
        let (p, m) = try syntheticProgram(in: dir)
        let store = CheckpointStore(url: dir.appendingPathComponent("program.safetensors"))
        let a = try session(p, m, data: TrainingData(train: rows(6, seed: 1), heldOut: []), runtime: HashRuntime(manifest: m), steps: 4, checkpoint: store)
        XCTAssertFalse(try a.start(runId: "ios-first", sameRunOnly: true))
        XCTAssertEqual(try a.run().status, .completed)
        let other = try session(p, m, data: TrainingData(train: rows(6, seed: 5), heldOut: []), runtime: HashRuntime(manifest: m), steps: 4, checkpoint: store)
        XCTAssertFalse(try other.start(runId: "ios-second", sameRunOnly: true), "another run's checkpoint is not resumed")
        XCTAssertEqual(other.step, 0)
        let same = try session(p, m, data: TrainingData(train: rows(6, seed: 1), heldOut: []), runtime: HashRuntime(manifest: m), steps: 4, checkpoint: store)
        XCTAssertTrue(try same.start(runId: "ios-first", sameRunOnly: true), "the same run resumes")
        XCTAssertEqual(same.step, 4)
    }

    /// The screen's default lr (0) is the program's: the manifest's optimizer.default_lr (the export's --lr);
    /// an lr asked for is kept.
    func testDefaultLearningRateIsTheManifests() throws {
        let (_, m) = try syntheticProgram(in: dir)
        let lr = try XCTUnwrap(m.optimizer.defaultLr)
        XCTAssertEqual(SessionConfig(steps: 10, lr: 0).resolvingLr(m).lr, Float(lr))
        XCTAssertEqual(SessionConfig(steps: 10, lr: 0.02).resolvingLr(m).lr, 0.02)
        var none = m
        none.optimizer.defaultLr = nil
        XCTAssertEqual(SessionConfig(steps: 10, lr: 0).resolvingLr(none).lr, Float(Contract.fallbackLr))
    }
}
