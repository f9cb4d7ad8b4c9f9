import Foundation

/// A runtime call that failed, with what the runtime itself logged around it (ExecuTorch's `Log`
/// sink lines, `LogRing`): the screen shows the lines under the message, and the `error` event
/// carries them (`log`).
public struct RuntimeFailure: Error, Equatable, CustomStringConvertible {
    public var message: String
    /// The event's `code` (snake_case): runtime_error, load_failed, ...
    public var code: String
    public var log: [String]

    public init(message: String, code: String = "runtime_error", log: [String] = []) {
        (self.message, self.code, self.log) = (message, code, log)
    }

    public var description: String { message }
}

/// The last `capacity` log lines of a runtime, from any thread (ExecuTorch calls its sinks on its own
/// queue). `mark()` before a call and `lines(since:)` after it: the lines the call logged (those
/// still held).
public final class LogRing: @unchecked Sendable {
    private let lock = NSLock()
    private var lines: [String] = []
    private var first: UInt64 = 0          // number of the oldest line held
    public let capacity: Int

    public init(capacity: Int = 256) { self.capacity = max(1, capacity) }

    public func append(_ line: String) {
        lock.lock()
        lines.append(line)
        if lines.count > capacity {
            let dropped = lines.count - capacity
            lines.removeFirst(dropped)
            first += UInt64(dropped)
        }
        lock.unlock()
    }

    /// The number the next line will get.
    public func mark() -> UInt64 {
        lock.lock()
        defer { lock.unlock() }
        return first + UInt64(lines.count)
    }

    /// Lines numbered `mark` and later that are still held, oldest first.
    public func lines(since mark: UInt64) -> [String] {
        lock.lock()
        defer { lock.unlock() }
        let start = Int(max(mark, first) - first)
        return start < lines.count ? Array(lines[start...]) : []
    }

    /// The newest `n` lines, oldest first.
    public func recent(_ n: Int) -> [String] {
        lock.lock()
        defer { lock.unlock() }
        return Array(lines.suffix(max(0, n)))
    }
}

/// What the app reports when something fails: the `error` telemetry event's fields and the text the
/// screen shows (the message, then the runtime's log lines).
public enum ErrorReport {
    /// The schema's limits on `log` (shared_schemas/telemetry_event.schema.json).
    public static let maxLogLines = 64
    public static let maxLogLineLength = 1024

    /// The message, code and log lines of any error: a `RuntimeFailure` keeps its own; a
    /// `TrainerError` maps to bad_input / runtime_error / io_error; `log` (e.g. the ring's recent
    /// lines) is used when the error carries none.
    public static func parts(of error: Error, log: [String] = []) -> (message: String, code: String, log: [String]) {
        switch error {
        case let f as RuntimeFailure:
            return (f.message, f.code, f.log.isEmpty ? log : f.log)
        case let e as TrainerError:
            switch e {
            case .badInput(let m): return (m, "bad_input", log)
            case .runtime(let m): return (m, "runtime_error", log)
            case .io(let m): return (m, "io_error", log)
            }
        default:
            return ("\(error)", "error", log)
        }
    }

    /// The `error` event's fields: message (cut to 4096), fatal, code, step, and the newest
    /// `maxLogLines` log lines each cut to `maxLogLineLength` (no `log` key without lines).
    public static func fields(for error: Error, fatal: Bool, step: Int?, log: [String] = []) -> [String: JSONValue] {
        let (message, code, lines) = parts(of: error, log: log)
        var f: [String: JSONValue] = [
            "message": .string(String((message.isEmpty ? "unknown error" : message).prefix(4096))),
            "fatal": .bool(fatal), "code": .string(code),
        ]
        if let step { f["step"] = .int(Int64(max(0, step))) }
        let kept = lines.suffix(maxLogLines).map { String($0.prefix(maxLogLineLength)) }
        if !kept.isEmpty { f["log"] = .array(kept.map { .string($0) }) }
        return f
    }

    /// What the screen shows: the message, then up to `lines` log lines.
    public static func screenText(for error: Error, log: [String] = [], lines: Int = 8) -> String {
        let (message, _, l) = parts(of: error, log: log)
        let shown = l.suffix(lines)
        return shown.isEmpty ? "Error: \(message)" : "Error: \(message)\nExecuTorch log:\n" + shown.joined(separator: "\n")
    }
}

/// A failure before the session has its recorder: opening or verifying the program, loading the
/// runtime, building the session, reading the checkpoint, loading the methods. Such a run has sent no
/// event yet, so the `error` event (fatal; code, message and ExecuTorch's log lines as `ErrorReport`
/// makes them; the message prefixed with the phase it failed in) goes out under the run id the launch
/// chose before anything could fail (`runId(saved:)`: the saved run's, else a new one the run then
/// keeps), numbered after whatever the log and the queue already hold for that id. Sent as every event
/// is: into the sinks (the telemetry log, and the upload queue when there is an endpoint).
public enum StartFailure {
    /// The run id of a launch: the saved run's (a resume), else a new one.
    public static func runId(saved: String?, platform: String = "ios", now: Date = Date()) -> String {
        if let saved, TelemetrySchema.matches(saved, pattern: "run_id") { return saved }
        return TelemetryRecorder.newRunId(platform: platform, now: now)
    }

    /// The `error` event's fields for `error` raised while `phase` (nil: none known).
    public static func fields(for error: Error, phase: String?, log: [String]) -> [String: JSONValue] {
        var f = ErrorReport.fields(for: error, fatal: true, step: nil, log: log)
        if let phase, !phase.isEmpty, let m = f["message"]?.stringValue {
            f["message"] = .string(String("\(phase): \(m)".prefix(4096)))
        }
        return f
    }

    /// Record the event for `error` under `runId` into `sinks`, seq = `usedSeq(runId)` (0 without).
    @discardableResult
    public static func report(_ error: Error, phase: String?, runId: String, sinks: [TelemetrySink], usedSeq: ((String) -> Int)?,
                              log: [String], clock: @escaping () -> Double = { Date().timeIntervalSince1970 },
                              monotonic: @escaping () -> Double = { ProcessInfo.processInfo.systemUptime }) throws -> TelemetryEvent {
        let recorder = try TelemetryRecorder(runId: runId, startSeq: usedSeq?(runId) ?? 0, sinks: sinks, clock: clock, monotonic: monotonic)
        return try recorder.emit("error", fields(for: error, phase: phase, log: log))
    }

    /// Runs `body` (the start of a session); if it throws and `started()` says the session has no
    /// recorder yet, the failure is reported (a failing sink is ignored: the error thrown is the
    /// start's), `sent()` is called (the app's upload attempt), and the error is rethrown.
    public static func reporting<T>(runId: String, phase: () -> String?, sinks: () -> [TelemetrySink], usedSeq: ((String) -> Int)?,
                                    log: () -> [String], started: () -> Bool = { false }, sent: () -> Void = {},
                                    clock: @escaping () -> Double = { Date().timeIntervalSince1970 },
                                    _ body: () throws -> T) throws -> T {
        do {
            return try body()
        } catch {
            if !started() {
                _ = try? report(error, phase: phase(), runId: runId, sinks: sinks(), usedSeq: usedSeq, log: log(), clock: clock)
                sent()
            }
            throw error
        }
    }
}
