import Foundation
import XCTest
@testable import TrainerCore

/// What a person meets on the phone (issue 25): program import (copy + validation + progress),
/// verification once per import, the text file cap, backup exclusion, errors with the runtime's log
/// lines as `error` events, and the "train while charging" rules.
final class PhoneTests: XCTestCase {
    var dir: URL!
    override func setUpWithError() throws { dir = try tempDir("phone") }
    override func tearDownWithError() throws { try? FileManager.default.removeItem(at: dir) }

    /// The recorded trace's program (a real export: every file's sha256 in its manifest).
    var traceProgram: URL { Repo.root.appendingPathComponent("shared_schemas/traces/tiny/program") }

    func copyOfTraceProgram(_ name: String = "source") throws -> URL {
        let to = dir.appendingPathComponent(name)
        try FileManager.default.copyItem(at: traceProgram, to: to)
        return to
    }

    // MARK: import

    /// The folder is checked, copied file by file with progress (monotone, ending at the total),
    /// verified, and appears in the program list only once complete; the copy is the source byte for
    /// byte, with the verification stamp, and the staging directory is gone.
    func testImportCopiesChecksAndReportsProgress() throws {
        let source = try copyOfTraceProgram("tiny (copy)")
        let paths = AppPaths(documents: dir.appendingPathComponent("Documents"))
        var seen: [ProgramImport.Progress] = []
        let name = try ProgramImport.run(source: source, into: paths.programs, chunkBytes: 64 << 10) { seen.append($0) }
        XCTAssertEqual(name, "tiny__copy_")
        XCTAssertEqual(paths.programNames(), [name])
        let m = try Manifest.load(directory: source)
        let total = try ([Contract.manifestName] + m.files.keys).map { try XCTUnwrap(ProgramVerification.facts(source.appendingPathComponent($0))).size }.reduce(0, +)
        XCTAssertEqual(seen.first?.phase, .checking)
        XCTAssertEqual(seen.last, ProgramImport.Progress(phase: .done, bytesDone: total, bytesTotal: total, file: ""))
        let copying = seen.filter { $0.phase == .copying }
        XCTAssertGreaterThan(copying.count, m.files.count, "progress within the larger files (64 KiB chunks)")
        XCTAssertEqual(copying.map(\.bytesDone), copying.map(\.bytesDone).sorted(), "monotone")
        XCTAssertTrue(seen.contains { $0.phase == .verifying })
        let dest = paths.programs.appendingPathComponent(name)
        for f in [Contract.manifestName] + m.files.keys {
            XCTAssertEqual(try Data(contentsOf: dest.appendingPathComponent(f)), try Data(contentsOf: source.appendingPathComponent(f)), f)
        }
        XCTAssertTrue(ProgramVerification.isVerified(directory: dest, manifest: m))
        let left = try FileManager.default.contentsOfDirectory(atPath: paths.programs.path)
        XCTAssertEqual(left, [name], "no staging directory left")
        // the same name again: refused unless replace
        XCTAssertThrowsError(try ProgramImport.run(source: source, into: paths.programs)) { XCTAssertTrue("\($0)".contains("already there")) }
        XCTAssertNoThrow(try ProgramImport.run(source: source, into: paths.programs, replace: true))
    }

    /// A file that does not match its checksum, a missing file, a folder without a manifest, and a
    /// cancel are refused with a message that says what to do, and leave nothing behind.
    func testImportRefusalsLeaveNothing() throws {
        let programs = dir.appendingPathComponent("Programs")
        let bad = try copyOfTraceProgram("bad")
        let state = bad.appendingPathComponent("state_init.bin")
        var bytes = try Data(contentsOf: state)
        bytes[100] ^= 0xff
        try bytes.write(to: state)
        XCTAssertThrowsError(try ProgramImport.run(source: bad, into: programs)) { XCTAssertTrue("\($0)".contains("does not match its checksum"), "\($0)") }
        let missing = try copyOfTraceProgram("missing")
        try FileManager.default.removeItem(at: missing.appendingPathComponent("weights.safetensors"))
        XCTAssertThrowsError(try ProgramImport.run(source: missing, into: programs)) { XCTAssertTrue("\($0)".contains("weights.safetensors is missing"), "\($0)") }
        let empty = dir.appendingPathComponent("not-a-program")
        try FileManager.default.createDirectory(at: empty, withIntermediateDirectories: true)
        XCTAssertThrowsError(try ProgramImport.run(source: empty, into: programs)) { XCTAssertTrue("\($0)".contains("no manifest.json"), "\($0)") }
        let good = try copyOfTraceProgram("good")
        var chunks = 0
        XCTAssertThrowsError(try ProgramImport.run(source: good, into: programs, chunkBytes: 4096, cancel: { chunks += 1; return chunks > 3 })) {
            XCTAssertTrue("\($0)".contains("cancelled"))
        }
        let left = (try? FileManager.default.contentsOfDirectory(atPath: programs.path)) ?? []
        XCTAssertEqual(left, [], "nothing left behind")
        XCTAssertEqual(ProgramImport.programName("../..//x y"), "_..__x_y")
    }

    /// Verification once per import: the first `ensureVerified` hashes (progress up to the total),
    /// the next ones do not; a file replaced (another size / time) or a manifest with other checksums
    /// is hashed again.
    func testVerifyOncePerImport() throws {
        let p = try copyOfTraceProgram()
        let m = try Manifest.load(directory: p)
        var last = (0, 0)
        XCTAssertTrue(try ProgramVerification.ensureVerified(directory: p, manifest: m) { last = ($0, $1) })
        XCTAssertEqual(last.0, last.1)
        XCTAssertGreaterThan(last.1, 0)
        XCTAssertFalse(try ProgramVerification.ensureVerified(directory: p, manifest: m), "verified once, not once per start")
        XCTAssertFalse(try ProgramVerification.ensureVerified(directory: p, manifest: m))
        // a file replaced by hand (e.g. a devicectl push of another export's weights): hashed again, refused
        let w = p.appendingPathComponent("weights.safetensors")
        var data = try Data(contentsOf: w)
        data.append(0)
        try data.write(to: w)
        XCTAssertFalse(ProgramVerification.isVerified(directory: p, manifest: m))
        XCTAssertThrowsError(try ProgramVerification.ensureVerified(directory: p, manifest: m))
        data.removeLast()
        try data.write(to: w)
        XCTAssertTrue(try ProgramVerification.ensureVerified(directory: p, manifest: m))
        // another export's manifest (other checksums): another key
        var other = m
        other.files["state_init.bin"] = String(repeating: "0", count: 64)
        XCTAssertNotEqual(ProgramVerification.key(other), ProgramVerification.key(m))
        XCTAssertFalse(ProgramVerification.isVerified(directory: p, manifest: other))
        // the streamed hash of a file = the one-shot hash
        XCTAssertEqual(try ProgramVerification.hashFile(w), SHA256.hex(try Data(contentsOf: w)))
    }

    // MARK: files, backup

    func testTextFileCapAndBackupExclusion() throws {
        let f = dir.appendingPathComponent("notes.txt")
        try Data(repeating: 0x61, count: 5000).write(to: f)
        XCTAssertEqual(try UserTextFile.read(f).count, 5000)
        XCTAssertThrowsError(try UserTextFile.read(f, maxBytes: 4096)) { XCTAssertTrue("\($0)".contains("notes.txt is 0.0 MB; the app takes text files up to 0.0 MB"), "\($0)") }
        try Data([0xff, 0xfe, 0x00, 0xd8]).write(to: f)
        XCTAssertThrowsError(try UserTextFile.read(f)) { XCTAssertTrue("\($0)".contains("not UTF-8")) }
        let paths = AppPaths(documents: dir.appendingPathComponent("Documents"))
        var excluded: [URL] = []
        let failed = paths.prepareDirectories { excluded.append($0) }
        XCTAssertEqual(failed, [])
        XCTAssertEqual(Set(excluded.map(\.lastPathComponent)), ["Programs", "Checkpoints", "Adapters"])
        for u in excluded + [paths.data, paths.telemetryQueue] { XCTAssertTrue(FileManager.default.fileExists(atPath: u.path), u.path) }
        XCTAssertTrue(paths.checkpoint(program: "p").path.hasPrefix(excluded[1].path))
        XCTAssertTrue(paths.adapter(runId: "r").path.hasPrefix(excluded[2].path))
        XCTAssertEqual(paths.prepareDirectories { if $0.lastPathComponent == "Adapters" { throw TrainerError.io("no") } }.map(\.lastPathComponent), ["Adapters"])
    }

    func testAdapterExportCap() throws {
        let a = dir.appendingPathComponent("Adapters/run-1")
        try FileManager.default.createDirectory(at: a, withIntermediateDirectories: true)
        try Data(count: 3000).write(to: a.appendingPathComponent("adapter_model.safetensors"))
        try Data(count: 100).write(to: a.appendingPathComponent("adapter_config.json"))
        XCTAssertEqual(try AdapterExport.size(of: a), 3100)
        XCTAssertNil(AdapterExport.refusal(bytes: 3100))
        let why = try XCTUnwrap(AdapterExport.refusal(bytes: 3100, maxBytes: 2048))
        XCTAssertTrue(why.contains("pull_telemetry.sh --adapters"), why)
        XCTAssertThrowsError(try AdapterExport.size(of: dir.appendingPathComponent("none")))
    }

    // MARK: errors

    func testLogRingAndErrorEvents() throws {
        let ring = LogRing(capacity: 4)
        ring.append("a")
        let mark = ring.mark()
        for l in ["b", "c", "d", "e"] { ring.append(l) }
        XCTAssertEqual(ring.lines(since: mark), ["b", "c", "d", "e"])
        ring.append("f")
        XCTAssertEqual(ring.lines(since: mark), ["c", "d", "e", "f"], "the lines still held")
        XCTAssertEqual(ring.recent(2), ["e", "f"])
        XCTAssertEqual(ring.lines(since: ring.mark()), [])
        let recorder = try TelemetryRecorder(runId: "ios-err-1", startSeq: 0, sinks: [], clock: { 1_767_225_600 }, monotonic: { 0 })
        let failure = RuntimeFailure(message: "ExecuTorch failed in block_backward: Error 18", log: (0..<100).map { "E line \($0) " + String(repeating: "x", count: 2000) })
        let e = try recorder.emit("error", ErrorReport.fields(for: failure, fatal: true, step: 3))
        XCTAssertEqual(e.fields["code"], .string("runtime_error"))
        let log = try XCTUnwrap(e.fields["log"]?.arrayValue)
        XCTAssertEqual(log.count, 64, "the newest 64 lines")
        XCTAssertTrue(log[0].stringValue!.hasPrefix("E line 36 "))
        XCTAssertEqual(log[0].stringValue!.count, 1024)
        let plain = try recorder.emit("error", ErrorReport.fields(for: TrainerError.io("disk full"), fatal: false, step: nil, log: ["I ok"]))
        XCTAssertEqual(plain.fields["code"], .string("io_error"))
        XCTAssertEqual(plain.fields["log"], .array([.string("I ok")]))
        XCTAssertNil(try recorder.emit("error", ErrorReport.fields(for: TrainerError.badInput("x"), fatal: false, step: 0)).fields["log"])
        XCTAssertTrue(ErrorReport.screenText(for: failure, lines: 2).hasPrefix("Error: ExecuTorch failed in block_backward: Error 18\nExecuTorch log:\nE line 98"))
        // the schema refuses a log of non-strings or too many lines
        var bad = e.fields
        bad["log"] = .array([.string("a"), .int(1)])
        XCTAssertFalse(TelemetrySchema.errors(in: bad).isEmpty)
        bad["log"] = .array((0..<65).map { _ in .string("a") })
        XCTAssertFalse(TelemetrySchema.errors(in: bad).isEmpty)
    }

    /// A step that fails in the runtime: the session sends an `error` event (schema-valid) with the
    /// runtime's log lines (the failure's own, else the session's ring), then `run_end failed`.
    func testFailingStepSendsItsLogLines() throws {
        let (p, m) = try syntheticProgram(in: dir)
        let data = try TrainingData.prepare(.text(SessionTests.text), tokenizer: .byte(), manifest: m, heldOutFraction: 0, seed: 0)
        for withOwnLog in [true, false] {
            let rt = FailingRuntime(manifest: m, failAtCall: 20, ownLog: withOwnLog)
            let sink = MemorySink()
            let clock = TickClock()
            let s = try TrainingSession(programDirectory: p, programName: "tiny", runtime: rt, data: data,
                                        config: SessionConfig(steps: 4, lr: 0.01, checkpointEvery: 2), device: testDevice,
                                        telemetry: [sink], clock: clock.read, monotonic: clock.read)
            let ring = LogRing()
            ring.append("I ring line")
            s.runtimeLog = ring
            try s.start(runId: "ios-fail-\(withOwnLog)")
            XCTAssertThrowsError(try s.run())
            let err = try XCTUnwrap(sink.events.first { $0.type == "error" })
            XCTAssertEqual(err.fields["code"], .string("runtime_error"))
            XCTAssertTrue(err.fields["message"]!.stringValue!.hasPrefix("step "))
            XCTAssertEqual(err.fields["log"], .array((withOwnLog ? ["E method.cpp] input 3 has the wrong size"] : ["I ring line"]).map { .string($0) }))
            XCTAssertEqual(sink.events.last?.type, "run_end")
            XCTAssertEqual(sink.events.last?.fields["status"], .string("failed"))
        }
    }

    /// A start that fails before the session has its recorder (here: the program's manifest is broken,
    /// and a runtime that fails to load with its own ExecuTorch log) is sent as a fatal `error` event of the
    /// run id the launch chose: schema-valid, the phase in its message, the log lines kept, numbered after the
    /// id's earlier events, into the telemetry log and the upload queue, which then posts it; a start that
    /// succeeds, or fails once the session sends its own events, adds nothing.
    func testFailureBeforeTheRunHasAnIdIsSentAsAnErrorEvent() throws {
        let dir = try tempDir()
        let runId = StartFailure.runId(saved: nil, now: Date(timeIntervalSince1970: 1_767_225_600))
        XCTAssertTrue(runId.hasPrefix("ios-20260101T000000Z-"), runId)
        XCTAssertEqual(StartFailure.runId(saved: "ios-kept-1"), "ios-kept-1", "a resume keeps its id")
        XCTAssertNotEqual(StartFailure.runId(saved: "not/an id"), "not/an id")
        let logURL = dir.appendingPathComponent("Telemetry/events.jsonl")
        let log = EventLog(url: logURL)
        let q = try TelemetryQueue(directory: dir.appendingPathComponent("queue"))
        let usedSeq: (String) -> Int = { max(log.nextSeq(runId: $0), q.nextSeq(runId: $0)) }
        let prog = dir.appendingPathComponent("prog")
        try FileManager.default.createDirectory(at: prog, withIntermediateDirectories: true)
        try Data("{\"schema_version\": 3,".utf8).write(to: prog.appendingPathComponent("manifest.json"))
        var sent = 0
        func start<T>(_ phase: String, started: Bool = false, _ body: () throws -> T) throws -> T {
            try StartFailure.reporting(runId: runId, phase: { phase }, sinks: { [log, q] }, usedSeq: usedSeq,
                                       log: { ["I ring: loading", "E ring: the last line"] }, started: { started },
                                       sent: { sent += 1 }, clock: { 1_767_225_600 }) { try body() }
        }
        XCTAssertThrowsError(try start("Opening prog") { try Manifest.load(directory: prog) })
        // a second start of the same run, failing in the runtime with ExecuTorch's own lines
        let loadFailure = RuntimeFailure(message: "ExecuTorch could not load model.pte: Error 0x14 (OperatorMissing)", code: "load_failed",
                                         log: ["E operator_registry.cpp:1] toolchain::int4_linear_a8.out missing"])
        XCTAssertThrowsError(try start("Loading the training methods") { () throws -> Int in throw loadFailure })
        XCTAssertEqual(sent, 2)
        let lines = try String(contentsOf: logURL, encoding: .utf8).split(separator: "\n")
        let events = try lines.map { try TelemetryEvent.parse(line: Data($0.utf8)) }
        XCTAssertEqual(events.map(\.type), ["error", "error"])
        XCTAssertEqual(events.map(\.runId), [runId, runId])
        XCTAssertEqual(events.map(\.seq), [0, 1], "numbered after the id's earlier events")
        for e in events {
            XCTAssertEqual(TelemetrySchema.errors(in: e.fields), [])
            XCTAssertEqual(e.fields["fatal"], .bool(true))
            XCTAssertNil(e.fields["step"])
        }
        XCTAssertTrue(events[0].fields["message"]!.stringValue!.hasPrefix("Opening prog: "), events[0].fields["message"]!.stringValue!)
        XCTAssertEqual(events[0].fields["log"], .array([.string("I ring: loading"), .string("E ring: the last line")]), "the ring's lines")
        XCTAssertEqual(events[1].fields["message"], .string("Loading the training methods: ExecuTorch could not load model.pte: Error 0x14 (OperatorMissing)"))
        XCTAssertEqual(events[1].fields["code"], .string("load_failed"))
        XCTAssertEqual(events[1].fields["log"], .array([.string("E operator_registry.cpp:1] toolchain::int4_linear_a8.out missing")]), "the failure's own lines")
        // the queue holds the same two events and the uploader posts them
        XCTAssertEqual(q.pending.count, 2)
        let t = ScriptedTransport([.status(200)])
        let report = try TelemetryUploader(queue: q, endpoint: URL(string: "http://127.0.0.1:8765/v1/events")!, token: "T", transport: t).flush()
        XCTAssertEqual(report.sentEvents, 2)
        let posted = try XCTUnwrap(try JSONValue.parse(t.requests[0].body).arrayValue)
        XCTAssertEqual(posted.compactMap { $0.objectValue?["run_id"]?.stringValue }, [runId, runId])
        XCTAssertEqual(posted.compactMap { $0.objectValue?["type"]?.stringValue }, ["error", "error"])
        // a start that succeeds, or fails after the session has its recorder (it reports itself): nothing more
        XCTAssertEqual(try start("Opening prog") { 7 }, 7)
        XCTAssertThrowsError(try start("Training", started: true) { () throws -> Int in throw TrainerError.runtime("step 3 failed") })
        XCTAssertEqual(try String(contentsOf: logURL, encoding: .utf8).split(separator: "\n").count, 2)
        XCTAssertEqual(sent, 2)
        // a message near the schema's limit stays within it with the phase in front
        let long = StartFailure.fields(for: TrainerError.io(String(repeating: "m", count: 5000)), phase: "Verifying prog", log: [])
        XCTAssertEqual(long["message"]?.stringValue?.count, 4096)
        XCTAssertTrue(long["message"]!.stringValue!.hasPrefix("Verifying prog: mmm"))
    }

    // MARK: train while charging

    func testChargingScheduleRules() throws {
        let run = SavedRun(program: "tiny", backend: "executorch", config: SessionConfig(steps: 10, lr: 0.01), budgetMB: 1024,
                           source: "pasted text", heldOutFraction: 0, splitSeed: 0, rowsFile: "rows.bin", trainRows: tinyRows().count, heldOutRows: 0)
        XCTAssertTrue(ChargingSchedule.shouldSchedule(enabled: true, savedRun: run, checkpointExists: true))
        XCTAssertFalse(ChargingSchedule.shouldSchedule(enabled: false, savedRun: run, checkpointExists: true), "the switch is off")
        XCTAssertFalse(ChargingSchedule.shouldSchedule(enabled: true, savedRun: run, checkpointExists: false), "nothing to resume")
        XCTAssertFalse(ChargingSchedule.shouldSchedule(enabled: true, savedRun: nil, checkpointExists: true))
        for (status, want) in [(RunStatus.paused, true), (.completed, false), (.cancelled, false), (.failed, false)] {
            var r = run
            r.status = status
            XCTAssertEqual(ChargingSchedule.shouldSchedule(enabled: true, savedRun: r, checkpointExists: true), want, "\(status)")
            XCTAssertEqual(ChargingSchedule.scheduleAgain(enabled: true, status: status, checkpointExists: true), want, "\(status)")
        }
        let now = Date(timeIntervalSince1970: 1_767_225_600)
        let req = ChargingSchedule.request(now: now, delay: 60)
        XCTAssertTrue(req.requiresExternalPower)
        XCTAssertFalse(req.requiresNetworkConnectivity)
        XCTAssertEqual(req.identifier, "org.onphonellm.trainer.train")
        XCTAssertEqual(req.earliestBeginDate, now.addingTimeInterval(60))
        XCTAssertNil(ChargingSchedule.request(now: now).earliestBeginDate)
    }

    /// Resume after a lock: only a run the background paused, only once the app is active and the
    /// pause has ended, whichever comes first; once.
    func testResumeOnReturn() {
        var r = ResumeOnReturn()
        r.backgrounded(busy: true)
        XCTAssertFalse(r.shouldResume(busy: false, canResume: true), "still in the background (the pause ended there)")
        r.activated()
        XCTAssertFalse(r.shouldResume(busy: true, canResume: true), "back during the last step: not yet")
        XCTAssertTrue(r.shouldResume(busy: false, canResume: true), "the pause ended: resume")
        XCTAssertFalse(r.shouldResume(busy: false, canResume: true), "once")
        var idle = ResumeOnReturn()
        idle.backgrounded(busy: false)
        idle.activated()
        XCTAssertFalse(idle.shouldResume(busy: false, canResume: true), "nothing was running")
        var failed = ResumeOnReturn()
        failed.backgrounded(busy: true)
        failed.activated()
        XCTAssertFalse(failed.shouldResume(busy: false, canResume: false), "the run failed or completed meanwhile")
        XCTAssertFalse(failed.pending)
    }

    /// Inside a background task the run stops at a step boundary when the task expires or the phone
    /// leaves the charger: the step in progress finishes, the checkpoint is of that step, run_end
    /// paused; resuming from it continues the same run to the end.
    func testBackgroundGateStopsAtAStepBoundary() throws {
        let (p, m) = try syntheticProgram(in: dir)
        let data = try TrainingData.prepare(.text(SessionTests.text), tokenizer: .byte(), manifest: m, heldOutFraction: 0, seed: 0)
        var power = true
        let store = CheckpointStore(url: dir.appendingPathComponent("ckpt.safetensors"))
        func session(_ sink: MemorySink) throws -> TrainingSession {
            let clock = TickClock()
            return try TrainingSession(programDirectory: p, programName: "tiny", runtime: HashRuntime(manifest: m), data: data,
                                       config: SessionConfig(steps: 6, lr: 0.01, checkpointEvery: 100), device: testDevice,
                                       checkpoint: store, telemetry: [sink], clock: clock.read, monotonic: clock.read)
        }
        let sink = MemorySink()
        let s = try session(sink)
        try s.start(runId: "ios-bg-1")
        let gate = BackgroundRunGate(onPower: { power })
        var steps = 0
        s.onEvent = { if case .step = $0 { steps += 1; if steps == 2 { power = false } } }
        XCTAssertEqual(try s.run(interrupt: gate.interrupt).status, .paused)
        XCTAssertEqual(s.step, 2, "stopped at the boundary after the step that saw the charger go")
        XCTAssertEqual(gate.reason, "the phone left the charger")
        XCTAssertEqual(sink.events.last?.fields["status"], .string("paused"))
        XCTAssertEqual(try store.load(expectedNumel: m.state.numel, programSha256: s.programSha256).meta.step, 2)
        // the next task: on power; iOS expires it after one more step
        power = true
        let sink2 = MemorySink()
        let s2 = try session(sink2)
        XCTAssertTrue(try s2.start())
        let gate2 = BackgroundRunGate(onPower: { power })
        s2.onEvent = { if case .step = $0 { gate2.expire() } }
        XCTAssertEqual(try s2.run(interrupt: gate2.interrupt).status, .paused)
        XCTAssertEqual(s2.step, 3)
        XCTAssertEqual(gate2.reason, "background time ended")
        // and the last one runs to the end, same run id
        let s3 = try session(MemorySink())
        XCTAssertTrue(try s3.start())
        XCTAssertEqual(try s3.run(interrupt: BackgroundRunGate(onPower: { true }).interrupt).status, .completed)
        XCTAssertEqual(s3.recorder?.runId, "ios-bg-1")
        XCTAssertEqual(BackgroundRunGate(onPower: { true }, enabled: { false }).interrupt(), .paused, "the switch turned off")
    }
}

/// HashRuntime that throws a `RuntimeFailure` at its `failAtCall`-th call (with a log line of its
/// own when `ownLog`).
final class FailingRuntime: ProgramRuntime {
    let backendName = "executorch"
    let inner: HashRuntime
    let failAtCall: Int
    let ownLog: Bool
    var calls = 0
    init(manifest: Manifest, failAtCall: Int, ownLog: Bool) { (inner, self.failAtCall, self.ownLog) = (HashRuntime(manifest: manifest), failAtCall, ownLog) }
    func load(methods: [String]) throws { try inner.load(methods: methods) }
    func execute(method: String, layer: Int?, inputs: [LoopInput]) throws -> [Data] {
        calls += 1
        if calls == failAtCall {
            throw RuntimeFailure(message: "ExecuTorch failed in \(method): Error 18", log: ownLog ? ["E method.cpp] input 3 has the wrong size"] : [])
        }
        return try inner.execute(method: method, layer: layer, inputs: inputs)
    }
}
