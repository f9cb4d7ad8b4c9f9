import Foundation

/// One POST the uploader wants sent.
public struct TelemetryRequest: Equatable {
    public var url: URL
    public var body: Data
    public var headers: [String: String]
}

/// What came back: an HTTP status, or no answer at all (timeout, no route, TLS...).
public enum TransportResult: Equatable {
    case status(Int)
    case failure(String)
}

/// Sends one request and waits for the answer. The app wraps URLSession; tests script the answers.
public protocol TelemetryTransport {
    func post(_ request: TelemetryRequest) -> TransportResult
}

/// Exponential backoff: base * factor^attempt seconds, capped; `jitter` maps each delay (the app
/// randomizes it so phones do not retry in lock-step; tests keep it exact).
public struct Backoff {
    public var base: Double
    public var factor: Double
    public var cap: Double
    public var jitter: (Double) -> Double

    public init(base: Double = 1, factor: Double = 2, cap: Double = 60, jitter: @escaping (Double) -> Double = { $0 }) {
        (self.base, self.factor, self.cap, self.jitter) = (base, factor, cap, jitter)
    }

    public func delay(attempt: Int) -> Double { jitter(min(cap, base * pow(factor, Double(attempt)))) }
}

public struct FlushReport: Equatable {
    public var sentEvents = 0
    public var rejectedEvents = 0
    public var retries = 0
    /// true when the last batch still failed after `maxAttempts` tries (events stay queued).
    public var gaveUp = false
    public var lastError: String?
}

/// Uploads the queue to `POST /v1/events` (docs/telemetry.md) in batches, oldest first.
/// Idempotent by (run_id, seq): a batch is retried with the same bytes and the server stores each
/// event once. 2xx: sent. 401, 408, 429, 5xx and no answer: retried with backoff. 413: the batch is
/// halved. Other 4xx: refused for good, moved to rejected.jsonl so later events still go out.
public final class TelemetryUploader {
    public let queue: TelemetryQueue
    public let endpoint: URL
    public let token: String
    public private(set) var batchSize: Int
    public let maxAttempts: Int
    private let transport: TelemetryTransport
    private let backoff: Backoff
    private let sleep: (Double) -> Void

    public init(queue: TelemetryQueue, endpoint: URL, token: String, transport: TelemetryTransport,
                batchSize: Int = 64, maxAttempts: Int = 5, backoff: Backoff = Backoff(),
                sleep: @escaping (Double) -> Void = { Thread.sleep(forTimeInterval: $0) }) {
        precondition(batchSize >= 1 && maxAttempts >= 1)
        (self.queue, self.endpoint, self.token, self.transport) = (queue, endpoint, token, transport)
        (self.batchSize, self.maxAttempts, self.backoff, self.sleep) = (batchSize, maxAttempts, backoff, sleep)
    }

    static func isRetryable(_ status: Int) -> Bool { status == 401 || status == 408 || status == 429 || status >= 500 }

    /// Send everything pending (or stop after `maxAttempts` failed tries of one batch).
    public func flush() throws -> FlushReport {
        var report = FlushReport()
        var attempt = 0
        while !queue.pending.isEmpty {
            let batch = Array(queue.pending.prefix(batchSize))
            var body = Data("[".utf8)
            for (i, e) in batch.enumerated() {
                if i > 0 { body += Data(",".utf8) }
                body += e.line
            }
            body += Data("]".utf8)
            let request = TelemetryRequest(url: endpoint, body: body, headers: [
                "Authorization": "Bearer \(token)", "Content-Type": "application/json",
            ])
            let result = transport.post(request)
            switch result {
            case .status(let s) where (200..<300).contains(s):
                try queue.markSent(batch.count)
                report.sentEvents += batch.count
                attempt = 0
                continue
            case .status(413) where batch.count > 1:
                batchSize = max(1, batch.count / 2)
                continue
            case .status(let s) where !TelemetryUploader.isRetryable(s):
                try queue.markRejected(batch.count)
                report.rejectedEvents += batch.count
                report.lastError = "HTTP \(s)"
                attempt = 0
                continue
            case .status(let s):
                report.lastError = "HTTP \(s)"
            case .failure(let why):
                report.lastError = why
            }
            attempt += 1
            if attempt >= maxAttempts {
                report.gaveUp = true
                return report
            }
            report.retries += 1
            sleep(backoff.delay(attempt: attempt - 1))
        }
        return report
    }
}
