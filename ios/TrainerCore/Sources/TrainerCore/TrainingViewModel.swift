import Foundation

/// Where the screen's run stands.
public enum TrainingPhase: String, Equatable {
    case idle            // no data yet
    case ready           // rows prepared, not started
    case loading         // opening the program, loading methods
    case evaluating      // held-out loss / generation before or after
    case training
    case pausing         // stop requested; finishing the current step
    case paused          // checkpointed; resumable
    case completed
    case cancelled
    case failed

    /// A session is running (start / stop buttons).
    public var busy: Bool { [.loading, .evaluating, .training, .pausing].contains(self) }
}

/// Everything the screen shows, as plain values (SwiftUI only draws it): the rows, the phase, the
/// losses for the chart, memory against the budget, held-out loss and generations before and after.
public struct TrainingViewState: Equatable {
    public var phase: TrainingPhase = .idle
    public var message: String = ""
    public var trainRows = 0
    public var heldOutRows = 0
    public var trainTokens = 0
    public var stepsPlanned = 0
    public var stepsDone = 0
    /// (step, loss) of every finished step with a finite loss, resumed runs included.
    public var losses: [LossPoint] = []
    public var footprintBytes: UInt64?
    public var peakBytes: UInt64?
    public var availableBytes: UInt64?
    public var budgetBytes: UInt64 = 0
    public var pressure: MemoryPressure = .normal
    public var evalBefore: EvalResult?
    public var evalAfter: EvalResult?
    /// The evaluation gate's line ("rolled back: held-out 2.3100 -> 2.4000"; nil until the run decides).
    public var gateReason: String?
    /// The finished generations (nil while one streams or after a new prompt).
    public var generationBefore: Generation?
    public var generationAfter: Generation?
    /// The generations as they stream (text so far; then the final text and how it stopped).
    public var streamBefore: GenerationStream?
    public var streamAfter: GenerationStream?
    /// A generation request is running (the screen shows Cancel); independent of `phase`: it may run
    /// while the training runs, and never changes the run's phase or message.
    public var generating = false
    public var generationMessage = ""
    public var adapterDirectory: URL?
    public var canResume = false
    /// Layers of the program the rows were prepared for (nil: not known yet).
    public var programLayers: Int?
    /// The checkpoint groups of the prepared / running / saved run (`SessionConfig.layersPerCheckpoint`;
    /// a resume keeps the saved run's).
    public var layersPerCheckpoint = 1

    public init() {}

    /// Layers one step backpropagates with `lcsbK` (0: every layer), and how many of their inputs a
    /// step keeps at once with `layersPerCheckpoint` (`CheckpointGroups.maxAlive`); nil until the
    /// program's layer count is known.
    public func checkpointPlan(lcsbK: Int, layersPerCheckpoint: Int) -> (kept: Int, selected: Int)? {
        guard let layers = programLayers, layers > 0 else { return nil }
        let k = lcsbK > 0 ? min(lcsbK, layers) : layers
        return (CheckpointGroups.maxAlive(selected: k, layersPerCheckpoint: layersPerCheckpoint), k)
    }

    /// What "use less memory" turns on: round(sqrt(k)) layers per checkpoint, at least 2 (2 while
    /// the program's layer count is not known).
    public func suggestedLayersPerCheckpoint(lcsbK: Int) -> Int {
        guard let plan = checkpointPlan(lcsbK: lcsbK, layersPerCheckpoint: 1) else { return 2 }
        return max(2, CheckpointGroups.suggested(selected: plan.selected))
    }

    /// "Generate" is possible: none is running, and the run (if any) is not still loading its session.
    public var canGenerate: Bool { !generating && phase != .loading }

    /// Train / Resume are possible: no run and no generation is going (a generation outside a run
    /// opens its own session; a new run waits for it, or for its Cancel).
    public var canStartRun: Bool { !phase.busy && !generating }

    /// One side of the before/after comparison as it streams.
    public struct GenerationStream: Equatable {
        public var prompt: String
        public var text: String = ""
        public var tokens = 0
        /// nil while streaming.
        public var stop: GenerationStop?
        /// Steps in the adapter it uses (nil: the initial adapter).
        public var adapterStep: Int?
        public var finished: Bool { stop != nil }
    }

    public struct LossPoint: Equatable {
        public var step: Int
        public var loss: Double
    }

    /// Footprint / budget (nil: no reading yet).
    public var memoryFraction: Double? {
        guard let f = footprintBytes, budgetBytes > 0 else { return nil }
        return Double(f) / Double(budgetBytes)
    }

    public var progress: Double { stepsPlanned > 0 ? Double(stepsDone) / Double(stepsPlanned) : 0 }

    /// The loss curve in the unit square (x: step over the planned steps, y: 0 at the lowest loss, 1 at
    /// the highest), at most `maxPoints` points (means of equal runs of steps), for a `Path`.
    public func lossCurve(maxPoints: Int = 200) -> [(x: Double, y: Double)] {
        guard !losses.isEmpty else { return [] }
        let bucket = max(1, (losses.count + maxPoints - 1) / maxPoints)
        var pts: [(Double, Double)] = []
        var i = 0
        while i < losses.count {
            let chunk = losses[i..<min(i + bucket, losses.count)]
            pts.append((Double(chunk.map(\.step).reduce(0, +)) / Double(chunk.count), chunk.map(\.loss).reduce(0, +) / Double(chunk.count)))
            i += bucket
        }
        let lo = pts.map(\.1).min()!, hi = pts.map(\.1).max()!
        let span = hi > lo ? hi - lo : 1
        let xs = Double(max(stepsPlanned - 1, losses.last!.step, 1))
        return pts.map { (x: $0.0 / xs, y: ($0.1 - lo) / span) }
    }

    /// Held-out loss change, after minus before (nil until both exist).
    public var evalDelta: Double? {
        guard let b = evalBefore, let a = evalAfter else { return nil }
        return a.loss - b.loss
    }
}

/// Folds a session's events and the controller's actions into `TrainingViewState`. Platform
/// independent: the app's ObservableObject republishes `state` on the main thread (`onChange`).
public final class TrainingViewModel {
    public private(set) var state = TrainingViewState() {
        didSet { if state != oldValue { onChange?(state) } }
    }
    public var onChange: ((TrainingViewState) -> Void)?

    public init() {}

    /// Rows were prepared from the user's text (or restored from a saved run). `layers`: the program's
    /// (nil: unchanged); `layersPerCheckpoint`: the run's checkpoint groups.
    public func prepared(_ data: TrainingData, stepsPlanned: Int, budgetBytes: UInt64, layers: Int? = nil, layersPerCheckpoint: Int = 1) {
        var s = state
        if let layers { s.programLayers = layers }
        s.layersPerCheckpoint = layersPerCheckpoint
        s.trainRows = data.train.count
        s.heldOutRows = data.heldOut.count
        s.trainTokens = data.trainTokens
        s.stepsPlanned = stepsPlanned
        s.budgetBytes = budgetBytes
        if !s.phase.busy { s.phase = .ready }
        s.message = "\(data.train.count) training rows, \(data.heldOut.count) held out (\(data.trainTokens) target tokens)"
        state = s
    }

    /// Preparing the rows failed (the message says why: too short, a bad chat line, ...).
    public func preparationFailed(_ error: Error) {
        state.phase = .idle
        state.message = "\(error)"
    }

    public func setPhase(_ phase: TrainingPhase, _ message: String? = nil) {
        var s = state
        s.phase = phase
        if let message { s.message = message }
        s.canResume = phase == .paused || phase == .cancelled ? true : (phase == .completed ? false : s.canResume)
        state = s
    }

    public func setCanResume(_ on: Bool) { state.canResume = on }

    public func exported(_ dir: URL) { state.adapterDirectory = dir }

    /// "Generate" was tapped: the previous comparison is cleared; the phase and message of the run stay.
    public func generationRequested() {
        var s = state
        s.generating = true
        (s.generationBefore, s.generationAfter, s.streamBefore, s.streamAfter) = (nil, nil, nil, nil)
        s.generationMessage = "Generating…"
        state = s
    }

    /// The generation request ended (done, cancelled or failed: `message` says which).
    public func generationFinished(_ message: String) {
        var s = state
        s.generating = false
        s.generationMessage = message
        state = s
    }

    /// A session event (from the session's threads; the app hops to the main thread first: the view
    /// model is used from one thread at a time). Generation events touch only the generation fields.
    public func handle(_ event: SessionEvent) {
        var s = state
        switch event {
        case .started(let resumed, let step, let losses):
            s.stepsDone = step
            s.losses = losses.enumerated().compactMap { i, l in l.map { TrainingViewState.LossPoint(step: i, loss: Double($0)) } }
            s.phase = .training
            s.message = resumed ? "Resumed at step \(step)" : "Training"
        case .step(let step, let loss, let seconds):
            s.stepsDone = step + 1
            if loss.isFinite { s.losses.append(.init(step: step, loss: Double(loss))) }
            if s.phase != .pausing { s.phase = .training }
            s.message = String(format: "Step %d/%d, loss %.4f (%.1f s)", step + 1, s.stepsPlanned, Double(loss), seconds)
        case .memory(let footprint, let peak, let available, let pressure):
            if let footprint { s.footprintBytes = footprint }
            if let peak { s.peakBytes = max(peak, s.peakBytes ?? 0) }
            s.availableBytes = available
            s.pressure = pressure
        case .eval(let r):
            if r.initial { s.evalBefore = r } else { s.evalAfter = r }
        case .evalRow(let initial, let row, let rows):
            s.message = "Held-out loss \(initial ? "before" : "after") training: row \(row + 1) of \(rows)"
        case .generationStarted(let initial, let prompt, let step):
            let stream = TrainingViewState.GenerationStream(prompt: prompt, adapterStep: step)
            if initial { s.streamBefore = stream } else { s.streamAfter = stream }
            s.generationMessage = initial ? "Generating with the initial adapter…" : "Generating with the trained adapter…"
        case .token(let t):
            var stream = (t.initial ? s.streamBefore : s.streamAfter) ?? TrainingViewState.GenerationStream(prompt: "")
            stream.text += t.text
            stream.tokens = t.index + 1
            if t.initial { s.streamBefore = stream } else { s.streamAfter = stream }
        case .generated(let g):
            if g.initial { s.generationBefore = g } else { s.generationAfter = g }
            var stream = (g.initial ? s.streamBefore : s.streamAfter) ?? TrainingViewState.GenerationStream(prompt: g.prompt)
            (stream.text, stream.tokens, stream.stop, stream.adapterStep) = (g.text, g.ids.count, g.stop, g.adapterStep)
            if g.initial { s.streamBefore = stream } else { s.streamAfter = stream }
        case .checkpointed:
            break
        case .gate(let d):
            s.gateReason = d.reason
        case .memoryAdapted(let step, let knob, let from, let to, let trigger):
            s.message = "Memory (\(trigger)): \(knob) lowered from step \(step + 1): \(from.description) -> \(to.description)"
        case .ended(let status, let message):
            switch status {
            case .completed: s.phase = .completed; s.canResume = false
            case .paused: s.phase = .paused; s.canResume = true
            case .cancelled: s.phase = .cancelled; s.canResume = true
            case .failed: s.phase = .failed
            }
            s.message = status.rawValue.prefix(1).uppercased() + status.rawValue.dropFirst() + (message.map { ": \($0)" } ?? "")
        }
        state = s
    }
}
