import Foundation

/// What the person did with a generation (`shared_schemas/feedback.schema.json`, `action`).
public enum FeedbackAction: String, CaseIterable, Equatable, Sendable {
    /// Keep: the response as it is is a training example.
    case accept
    /// Edit: the edited text is a training example, and preferred over the response.
    case edit
    /// Discard: a rejected response (a pair when the same prompt has a kept or edited response).
    case reject
}

/// One record of the app's feedback file (`shared_schemas/feedback.schema.json`, one JSON object a line): the
/// context (`prompt` for a plain generation, else the chat `messages` before the response), the `response` the
/// program generated, the `action`, the `edited` text (iff `.edit`: non-empty, not the response) and the RFC 3339
/// `time`. The host reads the file with `toolchain data --program P --feedback F.jsonl`.
public struct FeedbackRecord: Equatable {
    public let prompt: String?
    public let messages: [(role: String, content: String)]?
    public let response: String
    public let action: FeedbackAction
    public let edited: String?
    public let time: String

    /// Throws `TrainerError.badInput` naming every rule the record breaks.
    public init(prompt: String?, messages: [(role: String, content: String)]?, response: String, action: FeedbackAction,
                edited: String?, time: String) throws {
        (self.prompt, self.messages, self.response, self.action, self.edited, self.time) = (prompt, messages, response, action, edited, time)
        let p = FeedbackSchema.problems(json)
        if !p.isEmpty { throw TrainerError.badInput("feedback record: \(p.joined(separator: "; "))") }
    }

    public static func == (a: FeedbackRecord, b: FeedbackRecord) -> Bool { a.json == b.json }

    public var json: JSONValue {
        var o: [String: JSONValue] = ["schema_version": .int(Int64(FeedbackSchema.version)), "response": .string(response),
                                      "action": .string(action.rawValue), "time": .string(time)]
        if let prompt { o["prompt"] = .string(prompt) }
        if let messages { o["messages"] = .array(messages.map { .object(["role": .string($0.role), "content": .string($0.content)]) }) }
        if let edited { o["edited"] = .string(edited) }
        return .object(o)
    }

    /// One line of a feedback file; `location` names it in the error (file and line).
    public static func parse(_ line: String, location: String) throws -> FeedbackRecord {
        let doc: JSONValue
        do { doc = try JSONValue.parse(Data(line.utf8)) } catch { throw TrainerError.badInput("\(location): not JSON") }
        let p = FeedbackSchema.problems(doc)
        if !p.isEmpty { throw TrainerError.badInput("\(location): \(p.joined(separator: "; "))") }
        let o = doc.objectValue!
        let messages = o["messages"]?.arrayValue?.map { m -> (role: String, content: String) in
            (m.objectValue!["role"]!.stringValue!, m.objectValue!["content"]!.stringValue!)
        }
        return try FeedbackRecord(prompt: o["prompt"]?.stringValue, messages: messages, response: o["response"]!.stringValue!,
                                  action: FeedbackAction(rawValue: o["action"]!.stringValue!)!, edited: o["edited"]?.stringValue,
                                  time: o["time"]!.stringValue!)
    }
}

/// `shared_schemas/feedback.schema.json` as code, so the app never writes a record the host refuses (FeedbackTests
/// compares these tables with the schema file and runs its valid and invalid examples through `problems`; ios/test.sh
/// validates the records the tests wrote with the schema itself, scripts/apps/check_feedback.py).
public enum FeedbackSchema {
    public static let version = 1
    public static let required = ["response", "action", "time"]
    public static let fields = ["schema_version", "prompt", "messages", "response", "action", "edited", "time"]
    public static let roles = ["system", "user", "assistant"]
    /// RFC 3339 date-time (section 5.6): full-date "T" full-time, seconds fraction optional, "Z" or a numeric offset.
    public static let rfc3339Pattern =
        "^[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt]([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"
    private static let rfc3339 = try! NSRegularExpression(pattern: rfc3339Pattern)

    public static func isRFC3339(_ s: String) -> Bool {
        rfc3339.firstMatch(in: s, range: NSRange(s.startIndex..., in: s)) != nil
    }

    /// Violations of the schema, and of its two rules in words (messages end with a user turn, edited differs
    /// from the response); empty: valid.
    public static func problems(_ doc: JSONValue) -> [String] {
        guard let o = doc.objectValue else { return ["a feedback record must be a JSON object"] }
        var out: [String] = []
        for k in required where o[k] == nil { out.append("missing '\(k)'") }
        for k in o.keys.sorted() where !fields.contains(k) { out.append("unknown field '\(k)'") }
        if let v = o["schema_version"], v.intValue != Int64(version) || v.boolValue != nil { out.append("'schema_version' must be \(version)") }
        let hasPrompt = o["prompt"] != nil, hasMessages = o["messages"] != nil
        if hasPrompt == hasMessages { out.append("exactly one of 'prompt' and 'messages' is needed") }
        if hasPrompt, (o["prompt"]?.stringValue ?? "").isEmpty { out.append("'prompt' must be a non-empty string") }
        if hasMessages {
            let items = o["messages"]?.arrayValue ?? []
            if items.isEmpty { out.append("'messages' must be a non-empty array") }
            for (i, m) in items.enumerated() {
                guard let mo = m.objectValue, Set(mo.keys) == ["role", "content"] else { out.append("messages[\(i)]: needs exactly 'role' and 'content'"); continue }
                if !roles.contains(mo["role"]?.stringValue ?? "") { out.append("messages[\(i)]: 'role' must be one of \(roles)") }
                if mo["content"]?.stringValue == nil { out.append("messages[\(i)]: 'content' must be a string") }
            }
            if let last = items.last?.objectValue?["role"]?.stringValue, last != "user" { out.append("'messages' must end with a user turn") }
        }
        let response = o["response"]?.stringValue
        if o["response"] != nil, (response ?? "").isEmpty { out.append("'response' must be a non-empty string") }
        let action = o["action"]?.stringValue
        if o["action"] != nil, FeedbackAction(rawValue: action ?? "") == nil {
            out.append("'action' must be one of \(FeedbackAction.allCases.map(\.rawValue)), got \(action ?? "a non-string")")
        }
        if action == "edit" {
            switch o["edited"] {
            case nil: out.append("an edit needs 'edited'")
            case .some(let e) where (e.stringValue ?? "").isEmpty: out.append("'edited' must be a non-empty string")
            case .some(let e) where e.stringValue == response: out.append("'edited' must differ from 'response'")
            default: break
            }
        } else if o["edited"] != nil {
            out.append("'edited' is only for action 'edit'")
        }
        if let t = o["time"], !isRFC3339(t.stringValue ?? "") { out.append("'time' must be an RFC 3339 date-time") }
        return out
    }
}

/// RFC 3339 UTC times from epoch milliseconds, the same digits as trainer-core's `Rfc3339.utc` (no locale, no calendar).
public enum RFC3339 {
    /// "2026-12-07T09:30:00.250Z" for `epochMs`.
    public static func utc(epochMs: Int64) -> String {
        func floorDiv(_ a: Int64, _ b: Int64) -> Int64 { a >= 0 ? a / b : -((-a + b - 1) / b) }
        let days = floorDiv(epochMs, 86_400_000)
        let msOfDay = epochMs - days * 86_400_000
        // Days since 1970-01-01 to a proleptic Gregorian date (H. Hinnant's civil_from_days).
        let z = days + 719_468
        let era = floorDiv(z, 146_097)
        let doe = z - era * 146_097
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let d = doy - (153 * mp + 2) / 5 + 1
        let m = mp < 10 ? mp + 3 : mp - 9
        let y = yoe + era * 400 + (m <= 2 ? 1 : 0)
        func pad(_ v: Int64, _ n: Int) -> String { let s = String(v); return String(repeating: "0", count: max(0, n - s.count)) + s }
        return "\(pad(y, 4))-\(pad(m, 2))-\(pad(d, 2))T\(pad(msOfDay / 3_600_000, 2)):\(pad(msOfDay / 60_000 % 60, 2)):" +
            "\(pad(msOfDay / 1000 % 60, 2)).\(pad(msOfDay % 1000, 3))Z"
    }
}

/// The app's feedback file (`Documents/Feedback/feedback.jsonl`), one `FeedbackRecord` a line, appended to by the
/// keep / edit / discard buttons and shared as it is. Each append is one write of a whole line, synchronized to
/// disk; a line torn by a kill is cut off when the log is opened.
public final class FeedbackLog {
    public static let fileName = "feedback.jsonl"
    public let url: URL
    private let lock = NSLock()

    public init(url: URL) throws {
        self.url = url
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        guard let h = try? FileHandle(forUpdating: url) else { return }
        defer { try? h.close() }
        let data = try h.readToEnd() ?? Data()
        if let lastNewline = data.lastIndex(of: UInt8(ascii: "\n")) {
            if lastNewline + 1 != data.count { try h.truncate(atOffset: UInt64(lastNewline + 1)) }
        } else if !data.isEmpty {
            try h.truncate(atOffset: 0)
        }
    }

    public func append(_ r: FeedbackRecord) throws {
        lock.lock()
        defer { lock.unlock() }
        var line = try r.json.jsonData()
        line.append(UInt8(ascii: "\n"))
        if !FileManager.default.fileExists(atPath: url.path) {
            guard FileManager.default.createFile(atPath: url.path, contents: nil) else { throw TrainerError.io("cannot create \(url.path)") }
        }
        let h = try FileHandle(forWritingTo: url)
        defer { try? h.close() }
        try h.seekToEnd()
        try h.write(contentsOf: line)
        try h.synchronize()
    }

    /// Every record (an invalid line: `badInput` naming the line).
    public func records() throws -> [FeedbackRecord] {
        guard FileManager.default.fileExists(atPath: url.path) else { return [] }
        let text = try String(contentsOf: url, encoding: .utf8)
        return try text.split(separator: "\n", omittingEmptySubsequences: false).enumerated().compactMap { i, line in
            line.trimmingCharacters(in: .whitespaces).isEmpty ? nil
                : try FeedbackRecord.parse(String(line), location: "\(url.lastPathComponent) line \(i + 1)")
        }
    }

    /// Records per action, for the screen.
    public func counts() throws -> [FeedbackAction: Int] {
        try records().reduce(into: [:]) { $0[$1.action, default: 0] += 1 }
    }

    /// "3 kept, 1 edited, 2 discarded".
    public static func summary(_ c: [FeedbackAction: Int]) -> String {
        "\(c[.accept] ?? 0) kept, \(c[.edit] ?? 0) edited, \(c[.reject] ?? 0) discarded"
    }
}

/// The feedback buttons' state for the generation on screen: `generated` offers a finished generation (its prompt
/// as typed, whether it was a chat turn, the response text); the first tap (`record`) writes its one record and
/// answers it, later taps are refused until the next generation. A cancelled or empty generation, or one from an
/// empty prompt, offers nothing (the schema wants both non-empty). An edit saved unchanged is a keep (the schema's
/// `edited` differs from the response). Thread-safe.
public final class GenerationFeedback: @unchecked Sendable {  // lock-protected: offered on the generation queue, answered on another
    public struct Offer: Equatable {
        public let prompt: String
        public let chat: Bool
        public let response: String
    }

    public let log: FeedbackLog
    private let now: () -> Date
    private let lock = NSLock()
    private var offer: Offer?
    private var answered: FeedbackAction?

    public init(log: FeedbackLog, now: @escaping () -> Date = Date.init) { (self.log, self.now) = (log, now) }

    /// A generation finished (`complete` false for a cancelled one); `response` without its stop token.
    public func generated(prompt: String, chat: Bool, response: String, complete: Bool) {
        lock.lock(); defer { lock.unlock() }
        offer = complete && !prompt.isEmpty && !response.isEmpty ? Offer(prompt: prompt, chat: chat, response: response) : nil
        answered = nil
    }

    /// A new generation started: no buttons until it finishes.
    public func cleared() {
        lock.lock(); defer { lock.unlock() }
        (offer, answered) = (nil, nil)
    }

    /// The response the buttons are for (nil: none, or answered already); the editor starts from it.
    public var pending: Offer? { lock.lock(); defer { lock.unlock() }; return answered == nil ? offer : nil }
    public var lastAnswer: FeedbackAction? { lock.lock(); defer { lock.unlock() }; return answered }

    /// The person tapped `action` (`edited`: the editor's text, for `.edit`): one record appended and returned.
    /// Refused (`badInput`, nothing written) when there is no generation to answer, it was answered already, or the
    /// edited text is empty.
    @discardableResult
    public func record(_ action: FeedbackAction, edited: String? = nil) throws -> FeedbackRecord {
        lock.lock(); defer { lock.unlock() }
        guard let o = offer else { throw TrainerError.badInput("no finished generation to give feedback on") }
        if let a = answered { throw TrainerError.badInput("this generation has its feedback already (\(a.rawValue))") }
        if action == .edit, (edited ?? "").isEmpty { throw TrainerError.badInput("the edited text is empty; discard the response instead") }
        let a: FeedbackAction = action == .edit && edited == o.response ? .accept : action
        let ms = Int64((now().timeIntervalSince1970 * 1000).rounded())
        let r = try FeedbackRecord(prompt: o.chat ? nil : o.prompt, messages: o.chat ? [(role: "user", content: o.prompt)] : nil,
                                   response: o.response, action: a, edited: a == .edit ? edited : nil, time: RFC3339.utc(epochMs: ms))
        try log.append(r)
        answered = a
        return r
    }
}

extension AppPaths {
    public static let feedbackFile = "Feedback/feedback.jsonl"
    /// Documents/Feedback/feedback.jsonl: every keep / edit / discard, append-only (in the backup: the user's own).
    public var feedbackLog: URL { documents.appendingPathComponent(Self.feedbackFile) }
}
