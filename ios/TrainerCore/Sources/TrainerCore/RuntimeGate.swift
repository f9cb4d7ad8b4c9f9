import Foundation

/// Who gets the runtime next when a generation runs beside training: the generation. A training call
/// takes ~0.3 s on a phone, a decode call ~1 ms and a token is L + 2 calls; alternating call by call,
/// each token would wait L + 2 training calls (~8 s). While a generation is in progress
/// (`beginGeneration` ... `endGeneration`) a training-side call waits (`awaitTrainingTurn`) before it
/// queues for the runtime, so the generation waits at most for the training call already running.
/// A generation whose consumer (its token callback) holds it for `grace` seconds or more lets training
/// go on meanwhile (re-checked call by call).
///
/// The grace is measured on `now` (seconds; the uptime clock unless given: tests pass a clock they move
/// by hand, so the property holds whatever the machine's load). A training call waiting inside a consumer's
/// grace re-reads `now` at least every `grace` seconds of real time.
public final class RuntimeGate: @unchecked Sendable {
    private let condition = NSCondition()
    private var generating = 0
    private var inConsumer = false
    private var consumerSince = 0.0
    private var waiting = 0
    private let now: () -> Double
    public let grace: Double
    /// Training-side calls that waited for a generation.
    public private(set) var trainingWaits = 0

    public init(grace: Double = 0.05, now: @escaping () -> Double = RuntimeGate.uptime) { (self.grace, self.now) = (grace, now) }

    /// Seconds since boot (`DispatchTime`): the default clock of the grace.
    public static func uptime() -> Double { Double(DispatchTime.now().uptimeNanoseconds) / 1e9 }

    /// Training-side calls waiting in `awaitTrainingTurn` now.
    public var trainingCallsWaiting: Int { condition.lock(); defer { condition.unlock() }; return waiting }

    public func beginGeneration() {
        condition.lock(); generating += 1; condition.unlock()
    }

    public func endGeneration() {
        condition.lock(); generating -= 1; inConsumer = false; condition.broadcast(); condition.unlock()
    }

    /// The generation's consumer (its token callback) runs `body`: after `grace` of it, training may go on.
    public func consumer<T>(_ body: () throws -> T) rethrows -> T {
        condition.lock(); inConsumer = true; consumerSince = now(); condition.broadcast(); condition.unlock()
        defer { condition.lock(); inConsumer = false; condition.unlock() }
        return try body()
    }

    /// Before a training-side call queues for the runtime: wait while a generation is in progress (outside
    /// its consumer, however long its thread is not scheduled; inside it, for at most `grace`).
    public func awaitTrainingTurn() {
        condition.lock()
        defer { condition.unlock() }
        var waited = false
        while generating > 0 {
            if !waited { (waited, waiting) = (true, waiting + 1) }
            if inConsumer {
                let held = now() - consumerSince
                if held >= grace { break }
                _ = condition.wait(until: Date().addingTimeInterval(grace - held))
            } else {
                condition.wait()  // broadcast when a consumer starts and when the generation ends
            }
        }
        if waited { (trainingWaits, waiting) = (trainingWaits + 1, waiting - 1) }
    }
}

/// A FIFO lock (a ticket lock over `NSCondition`): threads get it in the order they asked for it, so
/// two threads that each take it for one short call after another (the training step's method calls
/// and a generation's) alternate instead of one starving the other, as an unfair lock allows.
/// Not reentrant.
public final class FairLock: @unchecked Sendable {
    private let condition = NSCondition()
    private var nextTicket: UInt64 = 0
    private var serving: UInt64 = 0

    public init() {}

    public func lock() {
        condition.lock()
        let ticket = nextTicket
        nextTicket &+= 1
        while serving != ticket { condition.wait() }
        condition.unlock()
    }

    public func unlock() {
        condition.lock()
        serving &+= 1
        condition.broadcast()
        condition.unlock()
    }

    public func withLock<T>(_ body: () throws -> T) rethrows -> T {
        lock()
        defer { unlock() }
        return try body()
    }

    /// Take it if no thread holds it or waits for it; false (not taken) otherwise.
    public func tryLock() -> Bool {
        condition.lock()
        defer { condition.unlock() }
        guard serving == nextTicket else { return false }
        nextTicket &+= 1
        return true
    }
}
