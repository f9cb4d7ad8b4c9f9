import Foundation
import XCTest
@testable import TrainerCore

final class FeedbackTests: XCTestCase {
    private func schema() throws -> [String: JSONValue] {
        try JSONValue.parse(Repo.data(Repo.root.appendingPathComponent("shared_schemas/feedback.schema.json"))).objectValue!
    }

    func testTablesMatchTheSchemaFile() throws {
        let s = try schema()
        XCTAssertEqual(s["required"]?.arrayValue?.compactMap(\.stringValue), FeedbackSchema.required)
        let props = s["properties"]!.objectValue!
        XCTAssertEqual(Set(props.keys), Set(FeedbackSchema.fields))
        XCTAssertEqual(props["action"]?.objectValue?["enum"]?.arrayValue?.compactMap(\.stringValue), FeedbackAction.allCases.map(\.rawValue))
        let role = props["messages"]?.objectValue?["items"]?.objectValue?["properties"]?.objectValue?["role"]?.objectValue
        XCTAssertEqual(role?["enum"]?.arrayValue?.compactMap(\.stringValue), FeedbackSchema.roles)
        XCTAssertEqual(props["schema_version"]?.objectValue?["const"]?.intValue, Int64(FeedbackSchema.version))
        XCTAssertEqual(props["time"]?.objectValue?["pattern"]?.stringValue, FeedbackSchema.rfc3339Pattern)
    }

    func testValidExamplesParseAndInvalidOnesAreRefused() throws {
        let text = try String(contentsOf: Repo.examples.appendingPathComponent("feedback.jsonl"), encoding: .utf8)
        let lines = text.split(separator: "\n").map(String.init)
        XCTAssertGreaterThanOrEqual(lines.count, 3)
        for (i, l) in lines.enumerated() { XCTAssertNoThrow(try FeedbackRecord.parse(l, location: "feedback.jsonl line \(i + 1)")) }
        let bad = Repo.files(Repo.invalid, prefix: "feedback_")
        XCTAssertGreaterThanOrEqual(bad.count, 8)
        for url in bad {
            let line = try String(contentsOf: url, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
            XCTAssertThrowsError(try FeedbackRecord.parse(line, location: url.lastPathComponent), "\(url.lastPathComponent) was accepted") {
                XCTAssertTrue("\($0)".hasPrefix(url.lastPathComponent), "\($0)")
            }
        }
        // The two rules the schema states in words.
        XCTAssertThrowsError(try FeedbackRecord.parse(#"{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}],"response":"c","action":"accept","time":"2026-12-07T09:30:00Z"}"#, location: "x"))
        XCTAssertThrowsError(try FeedbackRecord.parse(#"{"prompt":"a","response":"b","action":"edit","edited":"b","time":"2026-12-07T09:30:00Z"}"#, location: "x"))
    }

    /// Against Foundation's ISO 8601 formatter (UTC, whole seconds: exact in a Date), an independent calendar
    /// implementation; the milliseconds are the remainder.
    func testRFC3339UTCEqualsFoundationsISO8601() {
        let f = ISO8601DateFormatter()
        f.formatOptions = [.withInternetDateTime]
        f.timeZone = TimeZone(identifier: "UTC")
        var rng = SplitMix64(state: 43)
        let cases: [Int64] = [0, -1, 951_782_400_000, 4_107_542_399_999, -2_208_988_800_000] +
            (0..<2000).map { _ in Int64(rng.next() % 15_000_000_000_000) - 5_000_000_000_000 }
        for ms in cases {
            let seconds = ms >= 0 ? ms / 1000 : -((-ms + 999) / 1000)
            let frac = ms - seconds * 1000
            let want = String(f.string(from: Date(timeIntervalSince1970: Double(seconds))).dropLast()) + "." +
                String(String(frac + 1000).dropFirst()) + "Z"
            XCTAssertEqual(RFC3339.utc(epochMs: ms), want, "epoch ms \(ms)")
            XCTAssertTrue(FeedbackSchema.isRFC3339(RFC3339.utc(epochMs: ms)))
        }
    }

    /// Where the records are left for ios/test.sh's check with the schema itself (scripts/apps/check_feedback.py):
    /// /tmp/trainercore-feedback of the test chroot when ios/test.sh made it, else a temporary directory.
    private func interopFile() throws -> URL {
        let shared = URL(fileURLWithPath: ProcessInfo.processInfo.environment["FEEDBACK_OUT_DIR"] ?? "/tmp/trainercore-feedback")
        let dir = FileManager.default.fileExists(atPath: shared.path) ? shared : try tempDir()
        let url = dir.appendingPathComponent("feedback.jsonl")
        try? FileManager.default.removeItem(at: url)
        return url
    }

    func testKeepEditDiscardEachAppendOneValidRecordOncePerGeneration() throws {
        let url = try interopFile()
        var now = Date(timeIntervalSince1970: 1_796_636_400.25)  // 2026-12-07T09:40:00.250Z
        let fb = GenerationFeedback(log: try FeedbackLog(url: url), now: { now })
        XCTAssertNil(fb.pending)
        XCTAssertThrowsError(try fb.record(.accept), "no generation yet")

        fb.generated(prompt: "Dear Sam, thanks for", chat: false, response: " the quick reply.", complete: true)
        XCTAssertEqual(fb.pending?.response, " the quick reply.")
        let keep = try fb.record(.accept)
        XCTAssertNil(fb.pending, "answered: the buttons go away")
        XCTAssertThrowsError(try fb.record(.reject), "a second tap")

        now += 60
        fb.generated(prompt: "Can we meet on Friday?", chat: true, response: "Yes, Friday works for me.", complete: true)
        XCTAssertThrowsError(try fb.record(.edit, edited: ""), "an empty edit")
        XCTAssertEqual(try FeedbackLog(url: url).records().count, 1, "nothing written for a refused edit")
        let edit = try fb.record(.edit, edited: "Friday works, see you at ten.")

        now += 60
        fb.generated(prompt: "Notes for Monday:", chat: false, response: " buy milk", complete: true)
        let discard = try fb.record(.reject)

        now += 60
        fb.generated(prompt: "Notes for Monday:", chat: false, response: " call Ann", complete: true)
        let unchanged = try fb.record(.edit, edited: " call Ann")
        XCTAssertEqual(unchanged.action, .accept, "an edit saved unchanged is a keep")
        XCTAssertNil(unchanged.edited)

        fb.generated(prompt: "Hi", chat: false, response: " there", complete: false)
        XCTAssertNil(fb.pending, "cancelled")
        fb.generated(prompt: "Hi", chat: false, response: "", complete: true)
        XCTAssertNil(fb.pending, "empty response")
        fb.generated(prompt: "", chat: false, response: " there", complete: true)
        XCTAssertNil(fb.pending, "empty prompt")

        let lines = try String(contentsOf: url, encoding: .utf8).split(separator: "\n").map(String.init)
        XCTAssertEqual(lines.count, 4)
        XCTAssertEqual(lines[1], #"{"action":"edit","edited":"Friday works, see you at ten.","messages":[{"content":"Can we meet on Friday?","role":"user"}],"response":"Yes, Friday works for me.","schema_version":1,"time":"2026-12-07T09:41:00.250Z"}"#)
        XCTAssertEqual(try FeedbackLog(url: url).records(), [keep, edit, discard, unchanged])
        XCTAssertEqual(FeedbackLog.summary(try FeedbackLog(url: url).counts()), "2 kept, 1 edited, 1 discarded")
        for l in lines { XCTAssertEqual(FeedbackSchema.problems(try JSONValue.parse(Data(l.utf8))), [], l) }
    }

    func testATornLineIsCutOffOnOpen() throws {
        let url = try tempDir().appendingPathComponent("feedback.jsonl")
        let fb = GenerationFeedback(log: try FeedbackLog(url: url), now: { Date(timeIntervalSince1970: 0) })
        fb.generated(prompt: "a", chat: false, response: "b", complete: true)
        try fb.record(.accept)
        let h = try FileHandle(forWritingTo: url)
        try h.seekToEnd()
        try h.write(contentsOf: Data(#"{"schema_version":1,"prompt":"c","resp"#.utf8))
        try h.close()
        let log = try FeedbackLog(url: url)
        XCTAssertEqual(try log.records().count, 1)
        let fb2 = GenerationFeedback(log: log, now: { Date(timeIntervalSince1970: 1) })
        fb2.generated(prompt: "c", chat: false, response: "d", complete: true)
        try fb2.record(.reject)
        XCTAssertEqual(try FeedbackLog(url: url).records().map(\.action), [.accept, .reject])
    }
}
