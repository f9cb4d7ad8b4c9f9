import Foundation

/// What the UI hears from a session, on the thread of the call that caused it: the training thread
/// (start, steps, memory, eval, checkpoints, end) or the thread a generation runs on (generation
/// started, tokens, generated). Both may run at once: the handler must be thread-safe (the app hops
/// to the main thread before it touches `TrainingViewModel`).
public enum SessionEvent: Equatable {
    case started(resumed: Bool, step: Int, losses: [Float?])
    case step(step: Int, loss: Float, seconds: Double)
    case memory(footprintBytes: UInt64?, peakBytes: UInt64?, availableBytes: UInt64?, pressure: MemoryPressure)
    case eval(EvalResult)
    /// Before held-out row `row` (0-based) of `rows` of the pass with the initial (`initial`) or the live adapter.
    case evalRow(initial: Bool, row: Int, rows: Int)
    /// A generation with the initial (`initial`) or the live adapter starts (`adapterStep`: the steps
    /// in the live adapter it uses, nil for the initial one).
    case generationStarted(initial: Bool, prompt: String, adapterStep: Int?)
    /// One generated token and the text it completed.
    case token(GeneratedToken)
    case generated(Generation)
    case checkpointed(step: Int)
    case ended(status: RunStatus, message: String?)
    /// The evaluation gate decided after the held-out loss after the last step (`GateDecision.reason`: the screen's line).
    case gate(GateDecision)
    /// The working set was lowered under memory pressure (a `memory_adapted` event; its first step `step`).
    case memoryAdapted(step: Int, knob: String, from: WorkingSet, to: WorkingSet, trigger: String)
}

/// Held-out loss of one adapter: `initial` is state_init.bin's (before training), else the live state's.
public struct EvalResult: Equatable {
    public var initial: Bool
    public var step: Int
    public var loss: Double
    public var rows: Int
    public var tokens: Int
    public var seconds: Double
}
