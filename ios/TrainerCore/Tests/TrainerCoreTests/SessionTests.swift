import Foundation
#if canImport(Glibc)
import Glibc
#endif
import XCTest
@testable import TrainerCore

/// The app's session (`TrainingSession`) and the screen's state (`TrainingViewModel`).
final class SessionTests: XCTestCase {
    var dir: URL!

    override func setUpWithError() throws { dir = try tempDir("session") }
    override func tearDownWithError() throws { try? FileManager.default.removeItem(at: dir) }

    /// A program directory for the manifest `example` (`Repo.manifest`): its manifest, a synthetic weights
    /// file, a state_init.bin (the tiny examples' tokenizer is the byte one: no file needed).
    func program(_ example: String = "manifest_tiny_generate.json") throws -> (URL, Manifest) {
        try syntheticProgram(in: dir, example: example)
    }

    static let text = String(repeating: "The lamp was lit at dusk and the fog came in from the sea. ", count: 12)

    func session(_ p: URL, _ m: Manifest, data: TrainingData, steps: Int = 6, selection: LayerSelection = .cyclic(k: 3),
                 checkpoint: CheckpointStore? = nil, sink: MemorySink = MemorySink(), budget: MemoryGuard? = nil,
                 probes: MemoryProbes = MemoryProbes(), usedSeq: ((String) -> Int)? = nil,
                 identity: FileIdentitySource? = nil) throws -> (TrainingSession, HashRuntime) {
        let rt = HashRuntime(manifest: m)
        let clock = TickClock()
        let s = try TrainingSession(programDirectory: p, programName: "tiny", runtime: rt, data: data,
                                    config: SessionConfig(steps: steps, lr: 0.01, checkpointEvery: 2, shuffleSeed: 7, selection: selection),
                                    device: testDevice, checkpoint: checkpoint, telemetry: [sink], usedSeq: usedSeq, probes: probes, budget: budget,
                                    clock: clock.read, monotonic: clock.read, weightsIdentity: identity)
        return (s, rt)
    }

    /// Text -> rows with the held-out split, eval before (state_init.bin) and after, LCSB chosen at run
    /// time, seeded row order, generation before and after, PEFT export, a valid telemetry stream, and the
    /// view model folding it all.
    func testTextToAdapterWithEvalGenerationAndTelemetry() throws {
        let (p, m) = try program()
        let tok = try ProgramTokenizer.load(manifest: m, directory: p)
        XCTAssertEqual(tok.kind, "byte")
        let data = try TrainingData.prepare(.text(Self.text), tokenizer: tok, manifest: m, heldOutFraction: 0.2, seed: 5)
        let all = try TextRows.dataRows(text: Self.text, tokenizer: tok, seqLen: m.seqLen)
        let split = try TextRows.splitHeldOut(count: all.count, fraction: 0.2, seed: 5)
        XCTAssertEqual(data.heldOut, split.held.map { all[$0] })
        XCTAssertEqual(data.train, split.train.map { all[$0] })
        let sink = MemorySink()
        let (s, rt) = try session(p, m, data: data, sink: sink)
        let vm = TrainingViewModel()
        var changes = 0
        vm.onChange = { _ in changes += 1 }
        vm.prepared(data, stepsPlanned: 6, budgetBytes: 1 << 30)
        s.onEvent = vm.handle
        XCTAssertFalse(try s.start(runId: "ios-session-1"))
        let before = try XCTUnwrap(try s.evaluate(initial: true))
        let genBefore = try s.generate(prompt: "The lamp", maxNewTokens: 5, initial: true)
        XCTAssertEqual(try s.run().status, .completed)
        let after = try XCTUnwrap(try s.evaluate(initial: false))
        let genAfter = try s.generate(prompt: "The lamp", maxNewTokens: 5, initial: false)
        XCTAssertEqual(before.step, 0)
        XCTAssertEqual(after.step, 6)
        XCTAssertEqual(before.rows, data.heldOut.count)
        XCTAssertEqual(before.tokens, after.tokens)
        XCTAssertNotEqual(before.loss, after.loss, "the live state is not the initial one")
        XCTAssertEqual(genBefore.ids.count, 5)
        XCTAssertNotEqual(genBefore.ids, genAfter.ids)
        // LCSB cyclic k=3 of 8 layers chosen at run time (the host's make_plan): [0,1], [2,3,4], [5,6,7], in turn.
        let bb = rt.calls.filter { $0.method == "block_backward" }.map(\.layer!)
        XCTAssertEqual(Array(bb.prefix(8)), [1, 0, 4, 3, 2, 7, 6, 5])
        // Rows in the host's seeded order (permutation(rows, 7 + epoch)).
        let order = DataOrder(rowCount: data.train.count, seed: 7)
        // (the embeds of the eval before come first, those of the gate's evals after steps 2 and 4 between the steps'
        // pairs; generation embeds with embed_prefill / embed_token)
        let embeds = rt.calls.filter { $0.method == "embed" }.map { $0.inputs[0].sha }
        let h = data.heldOut.count
        let trainEmbeds = [h, h + 1, 2 * h + 2, 2 * h + 3, 3 * h + 4, 3 * h + 5].map { embeds[$0] }
        XCTAssertEqual(rt.calls.filter { $0.method == "embed_prefill" }.count, 2, "one chunk per generation (a short prompt, C = 16)")
        let want = (0..<6).map { step -> String in
            let ids = data.train[order.row(forStep: step)].inputIds
            let padded: [Int64] = ids + Array(repeating: 258, count: m.seqLen - ids.count)
            return padded.map { $0.littleEndian }.withUnsafeBytes { SHA256.hex($0) }
        }
        XCTAssertEqual(Array(trainEmbeds), want, "rows in DataOrder's seeded order")
        XCTAssertNotEqual((0..<6).map(order.row(forStep:)), Array(0..<6), "seed 7 shuffles")
        // Telemetry: run_start, eval (before), 6 x step with the gate's eval at the checkpoints of steps 2 and 4,
        // run_end, eval (after), gate; all schema-valid.
        let types = sink.events.map { $0.fields["type"]!.stringValue! }
        XCTAssertEqual(types.filter { $0 == "step" }.count, 6)
        XCTAssertEqual(types.first, "run_start")
        XCTAssertEqual(types.filter { $0 == "eval" }.count, 4)
        XCTAssertEqual(Array(types.suffix(3)), ["run_end", "eval", "gate"])
        for e in sink.events { XCTAssertEqual(TelemetrySchema.errors(in: e.fields), [], "\(e.fields)") }
        XCTAssertEqual(sink.events.map { $0.fields["seq"]!.intValue! }, (0..<Int64(sink.events.count)).map { $0 })
        let start = sink.events[0].fields
        XCTAssertEqual(start["lcsb_k"], .int(3))
        XCTAssertEqual(start["backend"], .string("executorch"))
        XCTAssertEqual(start["compute"], .string("fp32"), "the manifest has no compute: the exact float32 program")
        XCTAssertEqual(start["config"]?.objectValue?["held_out_rows"], .int(Int64(data.heldOut.count)))
        // The view model.
        let v = vm.state
        XCTAssertEqual(v.phase, .completed)
        XCTAssertEqual(v.stepsDone, 6)
        XCTAssertEqual(v.losses.map(\.step), Array(0..<6))
        XCTAssertEqual(v.evalBefore, before)
        XCTAssertEqual(v.evalAfter, after)
        XCTAssertEqual(v.generationBefore, genBefore)
        XCTAssertEqual(v.generationAfter, genAfter)
        XCTAssertEqual(v.trainRows, data.train.count)
        XCTAssertEqual(v.heldOutRows, data.heldOut.count)
        XCTAssertNotNil(v.evalDelta)
        XCTAssertEqual(v.lossCurve().count, 6)
        XCTAssertTrue(v.lossCurve().allSatisfy { (0...1).contains($0.x) && (0...1).contains($0.y) })
        XCTAssertGreaterThan(changes, 8)
        // The adapter: param entries of the live state under PEFT keys.
        let out = dir.appendingPathComponent("adapter")
        try s.exportAdapter(to: out)
        let st = try Safetensors.decode(try Data(contentsOf: out.appendingPathComponent("adapter_model.safetensors")))
        let state = s.state!.values
        for e in m.state.entries where e.role == "param" {
            XCTAssertEqual(st.tensors[e.key]?.values, Array(state[e.offset..<e.offset + e.count]), e.key)
        }
        XCTAssertEqual(st.tensors.count, m.state.entries.filter { $0.role == "param" }.count)
    }

    /// Killed after 3 of 6 steps (the checkpoint of step 2 on disk, plus the saved run): a new session
    /// from the saved run alone continues and ends bit-identical to an uninterrupted run, no seq reused.
    func testKillAndResumeFromTheSavedRunIsBitIdentical() throws {
        let (p, m) = try program("manifest_tiny.json")
        let data = try TrainingData.prepare(.text(Self.text), tokenizer: .byte(), manifest: m, heldOutFraction: 0.25, seed: 1)
        let full = CheckpointStore(url: dir.appendingPathComponent("full.safetensors"))
        let (a, _) = try session(p, m, data: data, checkpoint: full)
        try a.start(runId: "ios-full")
        XCTAssertEqual(try a.run().status, .completed)

        let saved = SavedRun(program: "tiny", backend: "executorch", config: a.config, budgetMB: 1024, source: "pasted text",
                             heldOutFraction: 0.25, splitSeed: 1, rowsFile: SavedRun.newRowsFile(), trainRows: data.train.count,
                             heldOutRows: data.heldOut.count)
        let runFile = dir.appendingPathComponent("latest-run.json")
        try RowsFile.write(data, to: saved.rowsURL(besides: runFile))
        try saved.save(to: runFile)
        XCTAssertLessThan(try Data(contentsOf: runFile).count, 2048, "the saved run's JSON holds no rows")
        let cut = CheckpointStore(url: dir.appendingPathComponent("cut.safetensors"))
        let sinkB = MemorySink()
        let (b, _) = try session(p, m, data: data, checkpoint: cut, sink: sinkB)
        try b.start(runId: "ios-cut")
        for _ in 0..<3 { _ = try b.trainStep() }     // then the app is killed: no run_end, checkpoint of step 2
        XCTAssertEqual(b.step, 3)

        let restored = try XCTUnwrap(SavedRun.load(from: runFile))
        XCTAssertEqual(restored, saved)
        XCTAssertTrue(restored.resumable)
        let sinkC = MemorySink()
        // the app's telemetry log knows the seqs B used after its last checkpoint
        let usedByB = Int(sinkB.events.map { $0.fields["seq"]!.intValue! }.max()!) + 1
        let (c, _) = try session(p, m, data: try restored.rows(besides: runFile), checkpoint: cut, sink: sinkC, usedSeq: { $0 == "ios-cut" ? usedByB : 0 })
        XCTAssertTrue(try c.start())
        XCTAssertEqual(c.step, 2)
        XCTAssertEqual(c.recorder?.runId, "ios-cut")
        XCTAssertEqual(try c.run().status, .completed)
        XCTAssertEqual(c.state!.sha256, a.state!.sha256)
        XCTAssertEqual(c.losses, a.losses)
        let seqB = sinkB.events.map { $0.fields["seq"]!.intValue! }, seqC = sinkC.events.map { $0.fields["seq"]!.intValue! }
        XCTAssertEqual(seqC.first!, seqB.last! + 1, "no seq reused")
        XCTAssertFalse(sinkC.events.contains { $0.fields["type"] == .string("run_start") }, "a resumed run has no second run_start")
        // Another export's checkpoint is refused.
        var other = try JSONSerialization.jsonObject(with: try Data(contentsOf: p.appendingPathComponent("manifest.json"))) as! [String: Any]
        var files = other["files"] as! [String: String]
        files["model.pte"] = String(repeating: "e", count: 64)
        other["files"] = files
        try JSONSerialization.data(withJSONObject: other).write(to: p.appendingPathComponent("manifest.json"))
        let (d, _) = try session(p, try Manifest.load(directory: p), data: data, checkpoint: cut)
        XCTAssertThrowsError(try d.start()) { XCTAssertTrue("\($0)".contains("another export"), "\($0)") }
    }

    /// A pause (stop request at a step boundary) checkpoints and ends with run_end paused; the budget
    /// guard stops a run that cannot fit with budget_exceeded.
    func testPauseAndBudgetStop() throws {
        let (p, m) = try program("manifest_tiny.json")
        let data = try TrainingData.prepare(.text(Self.text), tokenizer: .byte(), manifest: m, heldOutFraction: 0, seed: 0)
        XCTAssertTrue(data.heldOut.isEmpty)
        let ck = CheckpointStore(url: dir.appendingPathComponent("p.safetensors"))
        let sink = MemorySink()
        let (s, _) = try session(p, m, data: data, checkpoint: ck, sink: sink)
        try s.start(runId: "ios-pause")
        XCTAssertNil(try s.evaluate(initial: true), "no held-out rows: no eval")
        var n = 0
        let paused = try s.run(interrupt: { n += 1; return n > 2 ? .paused : nil })
        XCTAssertEqual(paused.status, .paused)
        XCTAssertEqual(try ck.load(expectedNumel: m.state.numel).meta.step, 2)
        XCTAssertEqual(sink.events.last?.fields["status"], .string("paused"))
        // The outcome is what run_end says: the steps done, the last step's loss.
        XCTAssertEqual(sink.events.last?.fields["steps_completed"], .int(Int64(paused.stepsCompleted)))
        XCTAssertEqual(paused.stepsCompleted, 2)
        XCTAssertEqual(sink.events.last?.fields["final_loss"], .double(Double(try XCTUnwrap(paused.finalLoss))))
        XCTAssertEqual(paused.finalLoss, s.losses.last!)
        XCTAssertNil(paused.message)

        let fp = ScriptedProbe([MemorySample(probe: "ios_phys_footprint", anonBytes: 900 << 20, peakBytes: 900 << 20)])
        let sink2 = MemorySink()
        let (t, _) = try session(p, m, data: data, checkpoint: CheckpointStore(url: dir.appendingPathComponent("b.safetensors")), sink: sink2,
                                 budget: MemoryGuard(budgetBytes: 512 << 20, plannedPeakBytes: m.plannedPeakBytes()),
                                 probes: MemoryProbes(footprint: fp))
        try t.start(runId: "ios-budget")
        let stopped = try t.run()
        XCTAssertEqual(stopped.status, .failed)
        XCTAssertTrue(sink2.events.contains { $0.fields["code"] == .string("budget_exceeded") })
        XCTAssertEqual(sink2.events.last?.fields["message"], .string(try XCTUnwrap(stopped.message)), "the stop's reason, as run_end says it")
        XCTAssertEqual(sink2.events.last?.fields["steps_completed"], .int(Int64(stopped.stepsCompleted)))
        XCTAssertEqual(stopped.finalLoss, t.losses.last ?? nil)
        XCTAssertGreaterThan(m.plannedPeakBytes(), 0)
    }

    // MARK: the weights file changed under the run (issue 27)

    /// A weights file identity the test changes between steps (the mapped file is left alone).
    final class ScriptedIdentity: FileIdentitySource {
        var current: FileIdentity?
        init(_ current: FileIdentity?) { self.current = current }
        func identity(of url: URL) -> FileIdentity? { current }
    }

    /// A memory probe that runs a hook at each reading (the session reads it before and after each step).
    final class HookProbe: MemoryProbe {
        var hook: (Int) -> Void = { _ in }
        private var n = 0
        func sample() -> MemorySample? { hook(n); n += 1; return nil }
    }

    static let mapped = FileIdentity(size: 4096, mtimeNanos: 1_767_225_600_123_456_789, device: 64769, inode: 1042)

    func errors(_ sink: MemorySink) -> [[String: JSONValue]] { sink.events.map(\.fields).filter { $0["type"] == .string("error") } }
    func types(_ sink: MemorySink) -> [String] { sink.events.map { $0.fields["type"]!.stringValue! } }

    /// Changed after 3 of 6 steps: the 4th never runs (no program call after the change), the checkpoint
    /// is of the 3 steps done (checkpoint_every 2 had saved step 2) and equals a pause's after 3, one
    /// `error` weights_changed, run_end failed; the stale mapping refuses eval and generation; a new
    /// mapping of the unchanged file resumes and ends bit-identical to an uninterrupted run.
    func testWeightsFileChangedBetweenStepsStopsCleanly() throws {
        let (p, m) = try program()
        let tok = try ProgramTokenizer.load(manifest: m, directory: p)
        let data = try TrainingData.prepare(.text(Self.text), tokenizer: tok, manifest: m, heldOutFraction: 0.25, seed: 1)
        let (a, _) = try session(p, m, data: data, checkpoint: CheckpointStore(url: dir.appendingPathComponent("one-go.safetensors")))
        try a.start(runId: "ios-one-go")
        XCTAssertEqual(try a.run().status, .completed)
        let refStore = CheckpointStore(url: dir.appendingPathComponent("ref.safetensors"))
        let (ref, _) = try session(p, m, data: data, checkpoint: refStore)
        try ref.start(runId: "ios-ref")
        var r = 0
        XCTAssertEqual(try ref.run(interrupt: { r += 1; return r > 3 ? .paused : nil }).status, .paused)

        let ids = ScriptedIdentity(Self.mapped)
        let sink = MemorySink()
        let store = CheckpointStore(url: dir.appendingPathComponent("changed.safetensors"))
        let (s, rt) = try session(p, m, data: data, checkpoint: store, sink: sink, identity: ids)
        XCTAssertEqual(s.loop.weights.identity, Self.mapped)
        try s.start(runId: "ios-changed")
        XCTAssertNotNil(try s.evaluate(initial: true))
        var n = 0
        var callsAtChange = -1
        let status = try s.run(interrupt: {
            n += 1
            if n == 4 { ids.current = FileIdentity(size: 2048, mtimeNanos: Self.mapped.mtimeNanos, device: 64769, inode: 1042); callsAtChange = rt.calls.count }
            return nil
        }).status
        XCTAssertEqual(status, .failed)
        XCTAssertEqual(s.step, 3)
        XCTAssertEqual(rt.calls.count, callsAtChange, "no program call after the change: the 4th step never ran")
        let (values, meta) = try store.load(expectedNumel: m.state.numel)
        XCTAssertEqual(meta.step, 3)
        XCTAssertEqual(values, try refStore.load(expectedNumel: m.state.numel).state, "the state of a pause after 3 steps")
        for e in sink.events { XCTAssertEqual(TelemetrySchema.errors(in: e.fields), [], "\(e.fields)") }
        XCTAssertEqual(types(sink).filter { $0 == "step" }.count, 3)
        let errs = errors(sink)
        XCTAssertEqual(errs.count, 1)
        XCTAssertEqual(errs.first?["code"], .string("weights_changed"))
        XCTAssertEqual(errs.first?["fatal"], .bool(true))
        XCTAssertEqual(errs.first?["step"], .int(3))
        let message = errs.first?["message"]?.stringValue ?? ""
        XCTAssertTrue(message.contains("changed under the run") && message.contains("changed size from 4096 to 2048")
                      && message.contains("re-import the program"), message)
        let end = sink.events.last!.fields
        XCTAssertEqual(end["type"], .string("run_end"))
        XCTAssertEqual(end["status"], .string("failed"))
        XCTAssertEqual(end["steps_completed"], .int(3))
        XCTAssertEqual(s.weightsChangedMessage, message)
        // Stale for good (even if the file looked as it did): eval, generation and further steps make no program
        // call and send no second error.
        ids.current = Self.mapped
        XCTAssertNotNil(s.loop.weights.checkChanged())
        XCTAssertThrowsError(try s.evaluate(initial: false)) { XCTAssertEqual(ErrorReport.parts(of: $0).code, "weights_changed") }
        XCTAssertThrowsError(try s.generate(prompt: "The lamp", maxNewTokens: 3, initial: true)) {
            XCTAssertTrue("\($0)".contains("re-import the program"), "\($0)")
        }
        XCTAssertEqual(try s.trainStep(), .stopped(reason: message))
        s.reportError(RuntimeFailure(message: message, code: "weights_changed"), fatal: false)
        XCTAssertEqual(rt.calls.count, callsAtChange)
        XCTAssertEqual(errors(sink).count, 1, "the error event is sent once")
        // Re-imported (a new mapping of the unchanged file, real stat): resumes at step 3, ends as one uninterrupted run.
        let (c, _) = try session(p, m, data: data, checkpoint: store)
        XCTAssertTrue(try c.start())
        XCTAssertEqual(c.step, 3)
        XCTAssertEqual(try c.run().status, .completed)
        XCTAssertEqual(c.state!.sha256, a.state!.sha256)
        XCTAssertEqual(c.losses, a.losses)
    }

    /// Every kind of change (another inode, a newer time, gone); a change before the first step (not even
    /// the held-out loss before reads the mapping); one first seen by a generation between two steps, and
    /// one seen by a generation after the session's own check (the step's first call refused): the same stop.
    func testWeightsFileChangesOfEveryKindAndWhoSeesThemFirst() throws {
        let (p, m) = try program()
        let tok = try ProgramTokenizer.load(manifest: m, directory: p)
        let data = try TrainingData.prepare(.text(Self.text), tokenizer: tok, manifest: m, heldOutFraction: 0.25, seed: 1)
        let mp = Self.mapped
        let kinds: [(String, FileIdentity?)] = [
            ("replaced", FileIdentity(size: mp.size, mtimeNanos: mp.mtimeNanos, device: mp.device, inode: 2001)),
            ("modified", FileIdentity(size: mp.size, mtimeNanos: mp.mtimeNanos + 1, device: mp.device, inode: mp.inode)),
            ("gone", nil),
        ]
        for (label, change) in kinds {
            let ids = ScriptedIdentity(mp)
            let sink = MemorySink()
            let store = CheckpointStore(url: dir.appendingPathComponent("\(label).safetensors"))
            let (s, rt) = try session(p, m, data: data, checkpoint: store, sink: sink, identity: ids)
            try s.start(runId: "ios-\(label)")
            var n = 0, calls = -1
            XCTAssertEqual(try s.run(interrupt: { n += 1; if n == 2 { ids.current = change; calls = rt.calls.count }; return nil }).status, .failed, label)
            XCTAssertEqual(s.step, 1, label)
            XCTAssertEqual(rt.calls.count, calls, label)
            XCTAssertEqual(try store.load(expectedNumel: m.state.numel).meta.step, 1, label)
            XCTAssertEqual(errors(sink).map { $0["code"] }, [.string("weights_changed")], label)
            XCTAssertTrue(s.weightsChangedMessage?.contains(label) == true, "\(label): \(s.weightsChangedMessage ?? "")")
        }
        // No inode on either side: size and time only.
        XCTAssertNil(FileIdentity(size: 1, mtimeNanos: 2).change(to: FileIdentity(size: 1, mtimeNanos: 2, device: 3, inode: 4), path: "w"))
        XCTAssertNotNil(mp.change(to: FileIdentity(size: 1, mtimeNanos: mp.mtimeNanos, device: mp.device, inode: mp.inode), path: "w"))

        // Before the first step: the held-out loss before is refused (the app reports it: no second event), nothing runs.
        do {
            let ids = ScriptedIdentity(mp)
            let sink = MemorySink()
            let (s, rt) = try session(p, m, data: data, sink: sink, identity: ids)
            try s.start(runId: "ios-early")
            ids.current = FileIdentity(size: 0, mtimeNanos: mp.mtimeNanos, device: mp.device, inode: mp.inode)
            XCTAssertThrowsError(try s.evaluate(initial: true)) { error in
                XCTAssertEqual(ErrorReport.parts(of: error).code, "weights_changed")
                s.reportError(error, fatal: true)
            }
            XCTAssertEqual(try s.run().status, .failed)
            XCTAssertEqual(rt.calls.count, 0)
            XCTAssertEqual(s.step, 0)
            XCTAssertEqual(errors(sink).map { $0["step"] }, [.int(0)])
            XCTAssertFalse(types(sink).contains("step") || types(sink).contains("eval"))
        }
        // First seen by a generation between two steps: it is refused before any call; the session stops at the boundary.
        do {
            let ids = ScriptedIdentity(mp)
            let sink = MemorySink()
            let store = CheckpointStore(url: dir.appendingPathComponent("gen.safetensors"))
            let (s, rt) = try session(p, m, data: data, checkpoint: store, sink: sink, identity: ids)
            try s.start(runId: "ios-gen-first")
            var n = 0, calls = -1
            var generationError: Error?
            let status = try s.run(interrupt: {
                n += 1
                if n == 3 {
                    ids.current = FileIdentity(size: 1, mtimeNanos: mp.mtimeNanos, device: mp.device, inode: mp.inode)
                    calls = rt.calls.count
                    do { _ = try s.generate(prompt: "The lamp", maxNewTokens: 3, initial: false) } catch { generationError = error }
                }
                return nil
            }).status
            XCTAssertEqual(generationError.map { ErrorReport.parts(of: $0).code }, "weights_changed")
            XCTAssertEqual(status, .failed)
            XCTAssertEqual(s.step, 2)
            XCTAssertEqual(rt.calls.count, calls)
            XCTAssertEqual(try store.load(expectedNumel: m.state.numel).meta.step, 2)
            XCTAssertEqual(errors(sink).map { $0["code"] }, [.string("weights_changed")])
        }
        // Seen by another thread's check after the session's own (here from the memory probe the step reads before it
        // runs): the step's first program call is refused, the state holds the 2 steps done, the same clean stop.
        do {
            let ids = ScriptedIdentity(mp)
            let sink = MemorySink()
            let store = CheckpointStore(url: dir.appendingPathComponent("late.safetensors"))
            let probe = HookProbe()
            let (s, rt) = try session(p, m, data: data, checkpoint: store, sink: sink, probes: MemoryProbes(footprint: probe), identity: ids)
            var calls = -1
            probe.hook = { i in   // readings: before step 0, after it, before step 1, after it, before step 2 (4)
                guard i == 4 else { return }
                ids.current = FileIdentity(size: 1, mtimeNanos: mp.mtimeNanos, device: mp.device, inode: mp.inode)
                XCTAssertNotNil(s.loop.weights.checkChanged())
                calls = rt.calls.count
            }
            try s.start(runId: "ios-refused")
            XCTAssertEqual(try s.run().status, .failed)
            XCTAssertEqual(s.step, 2)
            XCTAssertEqual(rt.calls.count, calls, "the refused call never reached the runtime")
            XCTAssertEqual(try store.load(expectedNumel: m.state.numel).meta.step, 2)
            XCTAssertEqual(errors(sink).map { $0["code"] }, [.string("weights_changed")])
        }
    }

    /// The real thing: the mapped file truncated under the run (a SIGBUS on any read past the new end), seen by
    /// `stat` at the next boundary and never read again; and `StatFileIdentity` on a file appended to, touched,
    /// replaced by a rename, removed.
    func testWeightsFileTruncatedUnderTheRunAndStatIdentity() throws {
        let (p, m) = try program()
        let data = try TrainingData.prepare(.text(Self.text), tokenizer: try ProgramTokenizer.load(manifest: m, directory: p), manifest: m,
                                            heldOutFraction: 0, seed: 0)
        let sink = MemorySink()
        let (s, rt) = try session(p, m, data: data, sink: sink)
        let file = p.appendingPathComponent(m.weights.file)
        let st = StatFileIdentity()
        XCTAssertEqual(s.loop.weights.identity, st.identity(of: file), "fstat of the mapped descriptor = stat of the path")
        XCTAssertNotNil(s.loop.weights.identity.inode)
        try s.start(runId: "ios-truncated")
        var n = 0, calls = -1
        let status = try s.run(interrupt: {
            n += 1
            if n == 3 {
                let h = try! FileHandle(forWritingTo: file)
                try! h.truncate(atOffset: UInt64(s.loop.weights.fileSize / 3))
                try! h.close()
                calls = rt.calls.count
            }
            return nil
        }).status
        XCTAssertEqual(status, .failed)
        XCTAssertEqual(s.step, 2)
        XCTAssertEqual(rt.calls.count, calls)
        XCTAssertTrue(s.weightsChangedMessage?.contains("changed size from") == true, s.weightsChangedMessage ?? "")
        XCTAssertThrowsError(try s.generate(prompt: "The lamp", maxNewTokens: 3, initial: true))
        XCTAssertEqual(rt.calls.count, calls)

        let f = dir.appendingPathComponent("f")
        try Data("abc".utf8).write(to: f)
        let id = try XCTUnwrap(st.identity(of: f))
        XCTAssertEqual(id.size, 3)
        let h = try FileHandle(forWritingTo: f)
        try h.seekToEnd()
        try h.write(contentsOf: Data("d".utf8))
        try h.close()
        XCTAssertTrue(id.change(to: st.identity(of: f), path: f.path)?.contains("from 3 to 4 bytes") == true)
        let grown = try XCTUnwrap(st.identity(of: f))
        try FileManager.default.setAttributes([.modificationDate: Date(timeIntervalSince1970: 1_000_000)], ofItemAtPath: f.path)
        XCTAssertTrue(grown.change(to: st.identity(of: f), path: f.path)?.contains("was modified") == true)
        let touched = try XCTUnwrap(st.identity(of: f))
        let other = dir.appendingPathComponent("g")
        try Data("abcd".utf8).write(to: other)
        try FileManager.default.setAttributes([.modificationDate: Date(timeIntervalSince1970: 1_000_000)], ofItemAtPath: other.path)
        XCTAssertEqual(rename(other.path, f.path), 0)
        let replaced = try XCTUnwrap(st.identity(of: f))
        XCTAssertEqual(replaced.size, touched.size)
        XCTAssertTrue(touched.change(to: replaced, path: f.path)?.contains("replaced by another file") == true, "\(touched) \(replaced)")
        try FileManager.default.removeItem(at: f)
        XCTAssertNil(st.identity(of: f))
        XCTAssertTrue(touched.change(to: nil, path: f.path)?.contains("is gone") == true)
    }

    /// A warm-up of 2 steps: block_backward on every layer at steps 0-1, then cyclic k=3 on the global step
    /// index (step 2 -> phase 2); warm-up steps have no lcsb_phase.
    func testSessionWithWarmup() throws {
        let (p, m) = try program()
        let tok = try ProgramTokenizer.load(manifest: m, directory: p)
        let data = try TrainingData.prepare(.text(Self.text), tokenizer: tok, manifest: m, heldOutFraction: 0.2, seed: 5)
        let sink = MemorySink()
        let plan = try StepPlan.make(layers: m.loop.layers, k: 3, policy: "cyclic", warmup: 2)
        let (s, rt) = try session(p, m, data: data, steps: 4, selection: .plan(plan), sink: sink)
        XCTAssertFalse(try s.start(runId: "ios-warmup-1"))
        XCTAssertEqual(try s.run().status, .completed)
        let bb = rt.calls.filter { $0.method == "block_backward" }.map(\.layer!)
        let all = Array((0..<m.loop.layers).reversed())
        XCTAssertEqual(bb, all + all + [7, 6, 5] + [1, 0])
        let steps = sink.events.map(\.fields).filter { $0["type"] == .string("step") }
        XCTAssertEqual(steps.map { $0["lcsb_phase"] }, [nil, nil, .int(2), .int(0)])
        for e in sink.events { XCTAssertEqual(TelemetrySchema.errors(in: e.fields), [], "\(e.fields)") }
        XCTAssertEqual(sink.events[0].fields["config"]?.objectValue?["lcsb_warmup"], .int(2))
    }

    func testWarmupPlans() throws {
        let p = try StepPlan.make(layers: 10, k: 4, policy: "anchored", warmup: 30)
        XCTAssertEqual(p.warmup, 30)
        XCTAssertEqual(p.layers(forStep: 0), Array(0..<10))
        XCTAssertEqual(p.layers(forStep: 29), Array(0..<10))
        XCTAssertEqual(p.layers(forStep: 30), [2, 7, 8, 9])   // 30 % 7 = 2: the schedule does not restart
        XCTAssertNil(p.phase(forStep: 29)); XCTAssertEqual(p.phase(forStep: 30), 2)
        XCTAssertEqual(p.maxLayers, 10)
        XCTAssertEqual(try StepPlan.make(layers: 10, k: 4, policy: "anchored").maxLayers, 4)
        XCTAssertEqual(try StepPlan.make(layers: 10, k: 4, policy: "anchored").warmup, 0)
        XCTAssertThrowsError(try StepPlan.make(layers: 10, k: 4, policy: "anchored", warmup: -1))
        XCTAssertThrowsError(try StepPlan(layers: 3, policy: "cyclic", k: 1, phases: [[0], [1], [2]], schedule: [0, 1, 2], warmup: -1))
        // decode: absent = 0, a value kept, a negative one refused
        let text = #"{"schema_version": 1, "layers": 3, "policy": "cyclic", "k": 1, "seed": null, "phases": [[0], [1], [2]], "schedule": [0, 1, 2]"#
        XCTAssertEqual(try StepPlan.decode(Data((text + "}").utf8)).warmup, 0)
        let warm = try StepPlan.decode(Data((text + #", "warmup": 2}"#).utf8))
        XCTAssertEqual((0..<4).map { warm.layers(forStep: $0) }, [[0, 1, 2], [0, 1, 2], [2], [0]])
        XCTAssertThrowsError(try StepPlan.decode(Data((text + #", "warmup": -1}"#).utf8)))
        // the session config passes a warm-up to the selection's plan; it round trips, absent = the plan's own
        let cfg = SessionConfig(steps: 3, lr: 0.1, selection: .cyclic(k: 3), lcsbWarmup: 4)
        let plan = try XCTUnwrap(try cfg.plan(layers: 8))
        XCTAssertEqual(plan.warmup, 4)
        XCTAssertEqual(try cfg.selectedLayers(layers: 8), 8)   // a warm-up step backpropagates every layer
        XCTAssertEqual(try SessionConfig(steps: 3, lr: 0.1, selection: .cyclic(k: 3)).selectedLayers(layers: 8), 3)
        XCTAssertEqual(try JSONDecoder().decode(SessionConfig.self, from: try JSONEncoder().encode(cfg)), cfg)
        XCTAssertEqual(try JSONDecoder().decode(StepPlan.self, from: try JSONEncoder().encode(plan)), plan)
        XCTAssertThrowsError(try SessionConfig(steps: 3, lr: 0.1, selection: .cyclic(k: 3), lcsbWarmup: -1).plan(layers: 8))
        XCTAssertNil(try SessionConfig(steps: 3, lr: 0.1, selection: .all, lcsbWarmup: 2).plan(layers: 8))
    }

    func testLayerSelectionPlans() throws {
        XCTAssertNil(try LayerSelection.all.plan(layers: 4))
        XCTAssertNil(try LayerSelection.cyclic(k: 4).plan(layers: 4))
        let p = try XCTUnwrap(try LayerSelection.cyclic(k: 3).plan(layers: 8))
        XCTAssertEqual(p.phases, [[0, 1], [2, 3, 4], [5, 6, 7]])
        XCTAssertEqual((0..<4).map { p.layers(forStep: $0) }, [[0, 1], [2, 3, 4], [5, 6, 7], [0, 1]])
        let r = try XCTUnwrap(try LayerSelection.lcsb(policy: "random", k: 2, seed: 7).plan(layers: 8))
        XCTAssertEqual(r, try StepPlan.make(layers: 8, k: 2, policy: "random", seed: 7))
        XCTAssertThrowsError(try LayerSelection.lcsb(policy: "sideways", k: 2, seed: nil).plan(layers: 8))
        XCTAssertThrowsError(try LayerSelection.plan(p).plan(layers: 6))
        let json = try JSONEncoder().encode(SessionConfig(steps: 3, lr: 0.1, selection: .plan(p)))
        XCTAssertEqual(try JSONDecoder().decode(SessionConfig.self, from: json).selection, .plan(p))
        // layers per checkpoint round trips; a config saved before checkpoint groups reads as 1
        let grouped = SessionConfig(steps: 3, lr: 0.1, shuffleSeed: 4, selection: .cyclic(k: 3), layersPerCheckpoint: 3)
        XCTAssertEqual(try JSONDecoder().decode(SessionConfig.self, from: try JSONEncoder().encode(grouped)), grouped)
        var old = try JSONSerialization.jsonObject(with: try JSONEncoder().encode(grouped)) as! [String: Any]
        old.removeValue(forKey: "layersPerCheckpoint")
        let decoded = try JSONDecoder().decode(SessionConfig.self, from: try JSONSerialization.data(withJSONObject: old))
        XCTAssertEqual(decoded.layersPerCheckpoint, 1)
        XCTAssertEqual(decoded.selection, grouped.selection)
        let (prog, m) = try program("manifest_tiny.json")
        let data = TrainingData(train: tinyRows(), heldOut: [])
        XCTAssertThrowsError(try TrainingSession(programDirectory: prog, programName: "tiny", runtime: HashRuntime(manifest: m), data: data,
                                                 config: SessionConfig(steps: 1, lr: 0.1, layersPerCheckpoint: 0), device: testDevice))
    }

    /// The screen's "use less memory (recompute more)": the suggestion (round(sqrt(k)), at least 2) and
    /// the inputs a step keeps, from the program's layer count; the run's setting as prepared.
    func testViewModelCheckpointGroups() throws {
        let vm = TrainingViewModel()
        XCTAssertNil(vm.state.checkpointPlan(lcsbK: 0, layersPerCheckpoint: 2))
        XCTAssertEqual(vm.state.suggestedLayersPerCheckpoint(lcsbK: 0), 2)
        vm.prepared(TrainingData(train: tinyRows(), heldOut: []), stepsPlanned: 4, budgetBytes: 1 << 30, layers: 24, layersPerCheckpoint: 5)
        XCTAssertEqual(vm.state.programLayers, 24)
        XCTAssertEqual(vm.state.layersPerCheckpoint, 5)
        XCTAssertEqual(vm.state.suggestedLayersPerCheckpoint(lcsbK: 0), 5)
        XCTAssertEqual(vm.state.suggestedLayersPerCheckpoint(lcsbK: 3), 2)
        XCTAssertEqual(vm.state.checkpointPlan(lcsbK: 0, layersPerCheckpoint: 5)?.kept, 9)
        XCTAssertEqual(vm.state.checkpointPlan(lcsbK: 0, layersPerCheckpoint: 1)?.kept, 24)
        XCTAssertEqual(vm.state.checkpointPlan(lcsbK: 8, layersPerCheckpoint: 3)?.kept, 5)
        XCTAssertEqual(vm.state.checkpointPlan(lcsbK: 99, layersPerCheckpoint: 1)?.selected, 24)
        vm.prepared(TrainingData(train: tinyRows(), heldOut: []), stepsPlanned: 4, budgetBytes: 1 << 30)
        XCTAssertEqual(vm.state.programLayers, 24, "kept when not given")
        XCTAssertEqual(vm.state.layersPerCheckpoint, 1)
    }

    /// The session replays the host's tiny trace: its 5 train steps (LCSB chosen per step through a
    /// plan), the eval pass and the generation are exactly the recorded calls, bit for bit.
    func testSessionReplaysTheTrace() throws { try sessionReplay(ReplayTests.traceDir) }

    /// ... and tiny_groups (checkpoint groups, layers per checkpoint 2) with the setting taken from
    /// the saved run (`SavedRun` written and read back, as a resume does) and sent in run_start.
    func testSessionReplaysTheGroupsTrace() throws { try sessionReplay(ReplayTests.groupsTraceDir) }

    /// ... and tiny_qwen3 (the same recording on a Qwen3-shaped program: q/k norms, head_dim != hidden / heads).
    func testSessionReplaysTheQwen3Trace() throws { try sessionReplay(ReplayTests.qwen3TraceDir) }

    func sessionReplay(_ traceDir: URL) throws {
        let trace = try JSONSerialization.jsonObject(with: try Data(contentsOf: traceDir.appendingPathComponent("trace.json"))) as! [String: Any]
        XCTAssertEqual(trace["format"] as? String, "toolchain-trace")
        let outputs = try Data(contentsOf: traceDir.appendingPathComponent(trace["outputs_file"] as! String), options: .alwaysMapped)
        let program = traceDir.appendingPathComponent(trace["program"] as! String)
        func rows(_ key: String) -> [DataRow] {
            (trace[key] as! [[String: Any]]).map { DataRow(inputIds: ($0["input_ids"] as! [Int]).map(Int64.init), labels: ($0["labels"] as! [Int]).map(Int64.init)) }
        }
        let steps = trace["steps"] as! [[String: Any]]
        let train = steps.filter { $0["kind"] as? String == "train" }
        let eval = steps.first { $0["kind"] as? String == "eval" }!
        let gen = steps.first { $0["kind"] as? String == "generate" }!
        let trainRows = rows("rows")
        XCTAssertEqual(train.map { $0["row"] as! Int }, (0..<train.count).map { $0 % trainRows.count }, "the trace's rows are in file order")
        let selected = train.map { $0["selected"] as! [Int] }
        let plan = try StepPlan(layers: 3, policy: "random", k: 3, phases: selected, schedule: Array(0..<selected.count))
        let held = rows("eval_rows")
        let data = TrainingData(train: trainRows, heldOut: (eval["rows"] as! [Int]).map { held[$0] })
        let rt = ReplayRuntime(trace: trace, outputs: outputs)
        let sink = MemorySink()
        let groups = trace["layers_per_checkpoint"] as? Int ?? 1
        let saved = SavedRun(program: "tiny", backend: "executorch",
                             config: SessionConfig(steps: train.count, lr: Float(trace["lr"] as! Double), checkpointEvery: 2, selection: .plan(plan),
                                                   layersPerCheckpoint: groups),
                             budgetMB: 64, source: "trace", heldOutFraction: 0, splitSeed: 0, rowsFile: "rows.bin",
                             trainRows: data.train.count, heldOutRows: data.heldOut.count)
        let runFile = dir.appendingPathComponent("latest-run.json")
        try saved.save(to: runFile)
        let config = try XCTUnwrap(SavedRun.load(from: runFile)).config
        XCTAssertEqual(config.layersPerCheckpoint, groups)
        let s = try TrainingSession(programDirectory: program, programName: "tiny", runtime: rt, data: data, config: config,
                                    device: testDevice, checkpoint: CheckpointStore(url: dir.appendingPathComponent("t.safetensors")), telemetry: [sink])
        XCTAssertNil(s.tokenizer, "tiny has no tokenizer")
        try s.start(runId: "ios-replay")
        XCTAssertEqual(try s.run().status, .completed)
        XCTAssertEqual(s.losses.map { $0! }, (trace["losses"] as! [Double]).map(Float.init))
        XCTAssertEqual(s.state!.sha256, trace["final_state_sha256"] as? String)
        let r = try XCTUnwrap(try s.evaluate(initial: false))
        XCTAssertEqual(r.tokens, eval["tokens"] as? Int)
        XCTAssertEqual(r.loss, eval["loss"] as! Double, accuracy: 1e-9 * abs(r.loss))
        let ids = try s.generate(promptIds: (gen["prompt_ids"] as! [Int]).map(Int64.init), maxNewTokens: gen["max_new_tokens"] as! Int, initial: false).ids
        XCTAssertEqual(ids, (gen["output_ids"] as! [Int]).map(Int64.init))
        XCTAssertNil(rt.mismatch)
        XCTAssertEqual(rt.next, rt.calls.count, "every recorded call, nothing else")
        for e in sink.events { XCTAssertEqual(TelemetrySchema.errors(in: e.fields), [], "\(e.fields)") }
        XCTAssertEqual(sink.events.first?.fields["config"]?.objectValue?["layers_per_checkpoint"], .int(Int64(groups)))
    }
}
