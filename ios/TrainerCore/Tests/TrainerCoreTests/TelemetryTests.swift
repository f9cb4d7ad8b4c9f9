import Foundation
import XCTest
@testable import TrainerCore

final class TelemetrySchemaTests: XCTestCase {
    func testEveryValidTelemetryExampleIsAccepted() throws {
        let files = Repo.files(Repo.examples, prefix: "telemetry_")
        XCTAssertGreaterThanOrEqual(files.count, 4)
        for url in files {
            XCTAssertEqual(TelemetrySchema.errors(inDocument: try Repo.data(url)), [], url.lastPathComponent)
        }
    }

    func testEveryInvalidTelemetryExampleIsRefused() throws {
        let files = Repo.files(Repo.invalid, prefix: "telemetry_")
        XCTAssertGreaterThanOrEqual(files.count, 16)
        for url in files {
            XCTAssertNotEqual(TelemetrySchema.errors(inDocument: try Repo.data(url)), [], "\(url.lastPathComponent) was accepted")
        }
    }

    func testRecorderNumbersStampsAndRefusesBadEvents() throws {
        let sink = MemorySink()
        let clock = TickClock()
        let r = try TelemetryRecorder(runId: "ios-test-1", startSeq: 5, sinks: [sink], clock: clock.read, monotonic: clock.read)
        try r.emit("thermal", ["state": .string("fair")])
        XCTAssertThrowsError(try r.emit("thermal", ["state": .string("toasty")]))
        XCTAssertThrowsError(try r.emit("step", ["step": .int(0), "loss": .double(1), "step_time_s": .double(0.1),
                                                 "tokens_per_s": .double(1), "probe": .string("ios_phys_footprint")]))
        try r.emit("step", ["step": .int(0), "loss": .number(.nan), "step_time_s": .double(0.1), "tokens_per_s": .double(10)])
        XCTAssertEqual(sink.events.map(\.seq), [5, 6], "a refused event must not use up a seq")
        XCTAssertEqual(sink.events[1].fields["loss"], .null, "a NaN loss is written as null")
        XCTAssertTrue(sink.events.allSatisfy { TelemetrySchema.errors(in: $0.fields).isEmpty })
        XCTAssertGreaterThan(sink.events[1].fields["elapsed_s"]?.doubleValue ?? 0, 0)
        XCTAssertThrowsError(try TelemetryRecorder(runId: "../etc/passwd", sinks: []))
        XCTAssertTrue(TelemetrySchema.matches(TelemetryRecorder.newRunId(), pattern: "run_id"))
    }
}

final class EventLogTests: XCTestCase {
    /// Without an upload queue, the JSONL log is what tells a resumed run its next seq.
    func testLogRemembersTheNextSeqPerRun() throws {
        let dir = try tempDir()
        let log = EventLog(url: dir.appendingPathComponent("Telemetry/events.jsonl"))
        XCTAssertEqual(log.nextSeq(runId: "ios-a"), 0)
        let a = try TelemetryRecorder(runId: "ios-a", sinks: [log])
        let b = try TelemetryRecorder(runId: "ios-a-2", startSeq: 40, sinks: [log])
        for _ in 0..<3 { try a.emit("thermal", ["state": .string("nominal")]) }
        try b.emit("thermal", ["state": .string("fair")])
        XCTAssertEqual(log.nextSeq(runId: "ios-a"), 3, "ios-a-2 must not count for ios-a")
        XCTAssertEqual(log.nextSeq(runId: "ios-a-2"), 41)
        let lines = try String(contentsOf: log.url, encoding: .utf8).split(separator: "\n")
        XCTAssertEqual(lines.count, 4)
        XCTAssertTrue(lines.allSatisfy { TelemetrySchema.errors(inDocument: Data($0.utf8)).isEmpty })
    }
}

final class UploaderTests: XCTestCase {
    private func queue(_ dir: URL, events n: Int, runId: String = "ios-up-1") throws -> TelemetryQueue {
        let q = try TelemetryQueue(directory: dir)
        let r = try TelemetryRecorder(runId: runId, sinks: [q], clock: { 1_767_225_600 }, monotonic: { 0 })
        for i in 0..<n { try r.emit("battery", ["level_pct": .double(Double(50 + i)), "charging": .bool(true)]) }
        return q
    }

    func testRetriesWithBackoffResendingTheSameBytes() throws {
        let dir = try tempDir()
        let q = try queue(dir, events: 3)
        let t = ScriptedTransport([.status(503), .failure("timed out"), .status(401), .status(200)])
        var slept: [Double] = []
        let up = TelemetryUploader(queue: q, endpoint: URL(string: "http://127.0.0.1:8765/v1/events")!, token: "T",
                                   transport: t, backoff: Backoff(base: 1, factor: 2, cap: 3), sleep: { slept.append($0) })
        let report = try up.flush()
        XCTAssertEqual(report.sentEvents, 3)
        XCTAssertEqual(report.retries, 3)
        XCTAssertEqual(slept, [1, 2, 3], "exponential, capped")
        XCTAssertEqual(Set(t.requests.map(\.body)).count, 1, "a retried batch must be byte-identical (idempotent by run_id+seq)")
        XCTAssertEqual(t.requests[0].headers["Authorization"], "Bearer T")
        XCTAssertEqual(try JSONValue.parse(t.requests[0].body).arrayValue?.compactMap { $0.objectValue?["seq"]?.intValue }, [0, 1, 2])
        XCTAssertTrue(q.pending.isEmpty)
        XCTAssertEqual(try TelemetryQueue(directory: dir).pending.count, 0, "sent events must not come back after a restart")
    }

    func testPermanentRefusalMovesTheBatchAsideAndLaterEventsStillGo() throws {
        let dir = try tempDir()
        let q = try queue(dir, events: 4)
        let t = ScriptedTransport([.status(422), .status(200)])
        let up = TelemetryUploader(queue: q, endpoint: URL(string: "http://h/v1/events")!, token: "T", transport: t,
                                   batchSize: 2, sleep: { _ in XCTFail("no backoff for a permanent error") })
        let report = try up.flush()
        XCTAssertEqual(report.rejectedEvents, 2)
        XCTAssertEqual(report.sentEvents, 2)
        let rejected = try String(contentsOf: dir.appendingPathComponent("rejected.jsonl"), encoding: .utf8)
        XCTAssertEqual(rejected.split(separator: "\n").count, 2)
    }

    func testGivesUpAfterMaxAttemptsAndKeepsEventsAcrossRestart() throws {
        let dir = try tempDir()
        let q = try queue(dir, events: 2)
        let t = ScriptedTransport(Array(repeating: .status(500), count: 10))
        let up = TelemetryUploader(queue: q, endpoint: URL(string: "http://h/v1/events")!, token: "T", transport: t,
                                   maxAttempts: 3, sleep: { _ in })
        let report = try up.flush()
        XCTAssertTrue(report.gaveUp)
        XCTAssertEqual(t.requests.count, 3)
        XCTAssertEqual(report.lastError, "HTTP 500")
        // A new app session (new queue object) still has them, and the next run seq is past them.
        let reopened = try TelemetryQueue(directory: dir)
        XCTAssertEqual(reopened.pending.map(\.seq), [0, 1])
        XCTAssertEqual(reopened.nextSeq(runId: "ios-up-1"), 2)
        XCTAssertEqual(reopened.nextSeq(runId: "another"), 0)
    }

    func testOversizedBatchIsHalvedAndAllEventsArrive() throws {
        let dir = try tempDir()
        let q = try queue(dir, events: 5)
        let t = ScriptedTransport([.status(413)])
        let up = TelemetryUploader(queue: q, endpoint: URL(string: "http://h/v1/events")!, token: "T", transport: t,
                                   batchSize: 8, sleep: { _ in })
        let report = try up.flush()
        XCTAssertEqual(report.sentEvents, 5)
        XCTAssertEqual(up.batchSize, 2)
        let sizes = t.requests.map { (try? JSONValue.parse($0.body).arrayValue?.count) ?? 0 }
        XCTAssertEqual(sizes, [5, 2, 2, 1])
        XCTAssertEqual(try TelemetryQueue(directory: dir).nextSeq(runId: "ios-up-1"), 5, "sent.json remembers what went out")
    }

    func testAPartlyWrittenLastLineIsSkippedNotFatal() throws {
        let dir = try tempDir()
        _ = try queue(dir, events: 2)
        let h = try FileHandle(forWritingTo: dir.appendingPathComponent("pending.jsonl"))
        try h.seekToEnd()
        try h.write(contentsOf: Data("{\"schema_version\": 1, \"type\": \"bat".utf8))   // killed mid-write
        try h.close()
        let q = try TelemetryQueue(directory: dir)
        XCTAssertEqual(q.pending.count, 2)
        XCTAssertEqual(q.unreadableLines, 1)
    }
}
