import Foundation

/// One telemetry event: a flat JSON object (`shared_schemas/telemetry_event.schema.json`).
public struct TelemetryEvent: Equatable {
    public let fields: [String: JSONValue]

    public init(fields: [String: JSONValue]) throws {
        let errs = TelemetrySchema.errors(in: fields)
        guard errs.isEmpty else { throw TrainerError.badInput("telemetry event breaks the schema: \(errs.joined(separator: "; "))") }
        self.fields = fields
    }

    public var type: String { fields["type"]?.stringValue ?? "" }
    public var runId: String { fields["run_id"]?.stringValue ?? "" }
    public var seq: Int { Int(fields["seq"]?.intValue ?? -1) }

    /// Compact JSON, sorted keys: the same bytes every time, so a retried batch is unchanged.
    public func jsonLine() throws -> Data { try JSONValue.object(fields).jsonData() }

    public static func parse(line: Data) throws -> TelemetryEvent {
        guard let obj = (try? JSONValue.parse(line))?.objectValue else {
            throw TrainerError.badInput("telemetry line is not a JSON object")
        }
        return try TelemetryEvent(fields: obj)
    }
}

/// Where recorded events go (a JSONL log, the upload queue).
public protocol TelemetrySink: AnyObject {
    func append(_ event: TelemetryEvent) throws
}

/// Numbers and stamps a run's events: `seq` 0, 1, 2, ... per run (continued after a resume),
/// wall-clock `timestamp`, and `elapsed_s` since this session started. Every event is checked
/// against the schema before any sink sees it.
public final class TelemetryRecorder {
    public let runId: String
    public private(set) var nextSeq: Int
    private let sinks: [TelemetrySink]
    private let clock: () -> Double
    private let monotonic: () -> Double
    private let started: Double

    public init(runId: String, startSeq: Int = 0, sinks: [TelemetrySink],
                clock: @escaping () -> Double = { Date().timeIntervalSince1970 },
                monotonic: @escaping () -> Double = { ProcessInfo.processInfo.systemUptime }) throws {
        guard TelemetrySchema.matches(runId, pattern: "run_id") else {
            throw TrainerError.badInput("run id '\(runId)' must be letters, digits, '.', '_' or '-' (at most 128)")
        }
        (self.runId, self.nextSeq, self.sinks, self.clock, self.monotonic) = (runId, startSeq, sinks, clock, monotonic)
        started = monotonic()
    }

    /// A run id for a new run: platform, UTC time and a random suffix (e.g. `ios-20260101T000000Z-7c1e`).
    public static func newRunId(platform: String = "ios", now: Date = Date()) -> String {
        let f = DateFormatter()
        f.locale = Locale(identifier: "en_US_POSIX")
        f.timeZone = TimeZone(identifier: "UTC")
        f.dateFormat = "yyyyMMdd'T'HHmmss'Z'"
        return "\(platform)-\(f.string(from: now))-\(UUID().uuidString.prefix(8).lowercased())"
    }

    @discardableResult
    public func emit(_ type: String, _ fields: [String: JSONValue]) throws -> TelemetryEvent {
        var all = fields
        all["schema_version"] = .int(1)
        all["type"] = .string(type)
        all["run_id"] = .string(runId)
        all["seq"] = .int(Int64(nextSeq))
        all["timestamp"] = .double(clock())
        all["elapsed_s"] = .double(max(0, monotonic() - started))
        let event = try TelemetryEvent(fields: all)
        nextSeq += 1
        for sink in sinks { try sink.append(event) }
        return event
    }
}

/// Append-only JSONL file of every event (pulled with `scripts/ios/pull_telemetry.sh`, read by
/// `toolchain telemetry import`).
public final class EventLog: TelemetrySink {
    public let url: URL
    public init(url: URL) { self.url = url }

    public func append(_ event: TelemetryEvent) throws {
        try appendLine(try event.jsonLine(), to: url)
    }

    /// The first seq of `runId` not used in the log: resuming after a kill continues after the
    /// last event written, even when the checkpoint is older. Streams the file line by line.
    public func nextSeq(runId: String) -> Int {
        guard let data = try? Data(contentsOf: url, options: .alwaysMapped) else { return 0 }
        // Lines are compact JSON with sorted keys, so a run's lines contain `"run_id":"<id>",`.
        let quoted = (try? JSONValue.string(runId).jsonData()).map { String(decoding: $0, as: UTF8.self) } ?? "\"\(runId)\""
        let needle = Data("\"run_id\":\(quoted),".utf8)
        var next = 0
        for line in data.split(separator: UInt8(ascii: "\n")) where line.range(of: needle) != nil {
            if let seq = (try? TelemetryEvent.parse(line: Data(line)))?.seq { next = max(next, seq + 1) }
        }
        return next
    }
}

func appendLine(_ line: Data, to url: URL) throws {
    let fm = FileManager.default
    if !fm.fileExists(atPath: url.path) {
        try fm.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        guard fm.createFile(atPath: url.path, contents: nil) else { throw TrainerError.io("cannot create \(url.path)") }
    }
    do {
        let h = try FileHandle(forWritingTo: url)
        defer { try? h.close() }
        try h.seekToEnd()
        try h.write(contentsOf: line + Data([UInt8(ascii: "\n")]))
    } catch {
        throw TrainerError.io("cannot append to \(url.path): \(error.localizedDescription)")
    }
}

/// An event waiting for upload: its identity and its exact JSON line (what is sent, byte for byte).
public struct QueuedEvent: Equatable {
    public let runId: String
    public let seq: Int
    public let line: Data
}

/// Events waiting for upload, kept on disk (`pending.jsonl`) so they survive a kill; events the
/// server refused for good go to `rejected.jsonl`. `sent.json` remembers the next seq per run after
/// what was uploaded, so a resumed run never reuses a seq the server already holds. Holds the JSON
/// lines, not parsed events, to stay small in a memory-budgeted app.
public final class TelemetryQueue: TelemetrySink {
    public let directory: URL
    private var queued: [QueuedEvent] = []
    private var sentNextSeq: [String: Int] = [:]
    /// Lines of pending.jsonl that could not be read back (a write cut by a crash).
    public private(set) var unreadableLines = 0

    var pendingURL: URL { directory.appendingPathComponent("pending.jsonl") }
    var rejectedURL: URL { directory.appendingPathComponent("rejected.jsonl") }
    var sentURL: URL { directory.appendingPathComponent("sent.json") }

    public init(directory: URL) throws {
        self.directory = directory
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        if let data = try? Data(contentsOf: pendingURL) {
            for line in data.split(separator: UInt8(ascii: "\n")) where !line.isEmpty {
                if let e = try? TelemetryEvent.parse(line: Data(line)) {
                    queued.append(QueuedEvent(runId: e.runId, seq: e.seq, line: try e.jsonLine()))
                } else {
                    unreadableLines += 1
                }
            }
        }
        if let data = try? Data(contentsOf: sentURL), let map = try? JSONDecoder().decode([String: Int].self, from: data) {
            sentNextSeq = map
        }
    }

    public var pending: [QueuedEvent] { queued }

    public func append(_ event: TelemetryEvent) throws {
        let line = try event.jsonLine()
        try appendLine(line, to: pendingURL)
        queued.append(QueuedEvent(runId: event.runId, seq: event.seq, line: line))
    }

    /// The first seq of `runId` not yet used by any event this queue has seen.
    public func nextSeq(runId: String) -> Int {
        let pendingMax = queued.filter { $0.runId == runId }.map(\.seq).max().map { $0 + 1 } ?? 0
        return max(pendingMax, sentNextSeq[runId] ?? 0)
    }

    /// Drop the first `count` pending events after the server stored them.
    public func markSent(_ count: Int) throws {
        try drop(count, rejected: false)
    }

    /// Move the first `count` pending events to rejected.jsonl (refused for good, e.g. 422).
    public func markRejected(_ count: Int) throws {
        try drop(count, rejected: true)
    }

    private func drop(_ count: Int, rejected: Bool) throws {
        let batch = Array(queued.prefix(count))
        for e in batch { sentNextSeq[e.runId] = max(sentNextSeq[e.runId] ?? 0, e.seq + 1) }
        if rejected { for e in batch { try appendLine(e.line, to: rejectedURL) } }
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        try AtomicFiles.write(try encoder.encode(sentNextSeq), to: sentURL)
        queued.removeFirst(batch.count)
        var rest = Data()
        for e in queued { rest += e.line + Data([UInt8(ascii: "\n")]) }
        try AtomicFiles.write(rest, to: pendingURL)
    }
}
