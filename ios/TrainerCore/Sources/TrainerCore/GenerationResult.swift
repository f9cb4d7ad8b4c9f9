import Foundation

/// Why a generation ended.
public enum GenerationStop: String, Equatable, Codable {
    /// A stop id came (EOS, `<|im_end|>`): the last id of the result.
    case eos
    /// `maxNewTokens` ids were generated.
    case maxNewTokens
    /// `GenerationCancel.cancel()` was called: the ids generated before it.
    case cancelled
}

/// The ids a generation produced (in the order `onToken` reported them) and how it stopped.
public struct GenerationResult: Equatable {
    public var ids: [Int64]
    public var stop: GenerationStop
    public init(ids: [Int64], stop: GenerationStop) { (self.ids, self.stop) = (ids, stop) }
}

/// Cancels a generation from any thread: `LayerLoop.generate` checks it before each decode step
/// (and before and during the prefill). Once cancelled it stays cancelled; one token per generation
/// request (the app makes a new one for each "Generate").
public final class GenerationCancel: @unchecked Sendable {
    private let lock = NSLock()
    private var flag = false
    public init() {}
    public func cancel() { lock.lock(); flag = true; lock.unlock() }
    public var isCancelled: Bool { lock.lock(); defer { lock.unlock() }; return flag }
}

/// A greedy continuation of a prompt with one adapter.
public struct Generation: Equatable {
    public var initial: Bool
    public var prompt: String
    /// The generated ids, a stop id last when `stop` is `.eos`.
    public var ids: [Int64]
    /// The decode of `ids` without the stop ids.
    public var text: String
    public var stop: GenerationStop = .maxNewTokens
    /// Steps in the live adapter the generation used (the state at that step boundary); nil: initial.
    public var adapterStep: Int?
}
