import Foundation
import TrainerCore

/// TelemetryTransport over URLSession: one synchronous POST (called from the trainer's queue).
final class URLSessionTransport: TelemetryTransport {
    /// The answer, written by the completion handler before the semaphore lets the caller read it.
    private final class Box: @unchecked Sendable {
        var result = TransportResult.failure("no answer")
    }

    private let session: URLSession

    init(timeout: TimeInterval = 10) {
        let config = URLSessionConfiguration.ephemeral
        config.timeoutIntervalForRequest = timeout
        config.waitsForConnectivity = false
        session = URLSession(configuration: config)
    }

    func post(_ request: TelemetryRequest) -> TransportResult {
        var r = URLRequest(url: request.url)
        r.httpMethod = "POST"
        r.httpBody = request.body
        for (k, v) in request.headers { r.setValue(v, forHTTPHeaderField: k) }
        let done = DispatchSemaphore(value: 0)
        let box = Box()
        session.dataTask(with: r) { _, response, error in
            if let http = response as? HTTPURLResponse {
                box.result = .status(http.statusCode)
            } else {
                box.result = .failure(error?.localizedDescription ?? "no HTTP response")
            }
            done.signal()
        }.resume()
        done.wait()
        return box.result
    }
}
