import Foundation

/// The evaluation gate (docs/training.md "The evaluation gate", the host's toolchain/training/gate.py; trainer-core's
/// `GateDecision`): the held-out loss of the starting adapter, of the live state at the run's evaluations (each
/// checkpoint) and after the last step; at the end the last adapter is kept only when its loss is finite and below the
/// start's and no earlier evaluation was lower (`kept`), else the lowest finite one below the start's (`keptBest`),
/// else the starting adapter is restored (`rolledBack`). "Below" is strictly lower; a non-finite start counts as +inf.
public struct GateDecision: Equatable {
    public enum Kind: String, Equatable { case kept, keptBest = "kept_best", rolledBack = "rolled_back" }

    public var decision: Kind
    public var startLoss: Double
    public var endLoss: Double
    /// Lowest finite loss after the start (nil: none finite).
    public var bestLoss: Double?
    public var bestStep: Int?
    /// Steps in the adapter that is kept: the last step, `bestStep`, or the start's.
    public var keptStep: Int
    /// One line for people: "rolled back: held-out 2.3100 -> 2.4000".
    public var reason: String

    public static func == (a: GateDecision, b: GateDecision) -> Bool {
        a.decision == b.decision && a.reason == b.reason && a.keptStep == b.keptStep && a.bestStep == b.bestStep
    }

    /// As Python formats it: 4 decimals, or nan / inf / -inf.
    public static func fmt(_ x: Double) -> String {
        if x.isNaN { return "nan" }
        if x.isInfinite { return x > 0 ? "inf" : "-inf" }
        return String(format: "%.4f", x)
    }

    /// The decision from the start's held-out loss and the later evaluations (step, loss), the last of them after the
    /// last step (gate.py's `decide`; ties go to the later step).
    public static func decide(startStep: Int, startLoss: Double, later: [(step: Int, loss: Double)]) -> GateDecision {
        precondition(!later.isEmpty, "the gate needs the evaluation after the last step")
        let end = later[later.count - 1]
        let best = later.filter { $0.loss.isFinite }.min { a, b in a.loss != b.loss ? a.loss < b.loss : a.step > b.step }
        let start = startLoss.isFinite ? startLoss : .infinity
        if end.loss.isFinite, end.loss < start, let best, end.loss <= best.loss {
            return GateDecision(decision: .kept, startLoss: startLoss, endLoss: end.loss, bestLoss: best.loss, bestStep: best.step,
                                keptStep: end.step, reason: "kept: held-out \(fmt(startLoss)) -> \(fmt(end.loss))")
        }
        if let best, best.loss < start {
            return GateDecision(decision: .keptBest, startLoss: startLoss, endLoss: end.loss, bestLoss: best.loss, bestStep: best.step,
                                keptStep: best.step,
                                reason: "kept best: held-out \(fmt(startLoss)) -> \(fmt(best.loss)) at step \(best.step) (last \(fmt(end.loss)))")
        }
        return GateDecision(decision: .rolledBack, startLoss: startLoss, endLoss: end.loss, bestLoss: best?.loss, bestStep: best?.step,
                            keptStep: startStep, reason: "rolled back: held-out \(fmt(startLoss)) -> \(fmt(end.loss))")
    }

    /// The `gate` telemetry event's fields (non-finite losses as null; the apps ship no forgetting probe yet).
    public var eventFields: [String: JSONValue] {
        ["decision": .string(decision.rawValue), "start_loss": .number(startLoss), "end_loss": .number(endLoss),
         "best_loss": bestLoss.map { .double($0) } ?? .null, "best_step": bestStep.map { .int(Int64($0)) } ?? .null,
         "kept_step": .int(Int64(keptStep)), "reason": .string(reason), "probe": .string("no_probe")]
    }
}

/// One run's gate as the session keeps it across sessions (an iPhone run is paused and resumed often): a JSON file
/// beside the checkpoint (`<program>.gate.json`: the run id, the start loss, the evaluations so far) and the state of
/// the lowest finite one so far (`<program>.gate-best.safetensors`, on disk: the state with its optimizer moments is
/// tens of MB at 0.5B). The start is the run's: state_init.bin (a run of the app starts from it), its held-out loss
/// before the first step, so a resumed run is gated against where it began (the host: where it resumed).
public final class GateRecord {
    public let url: URL
    public let best: CheckpointStore
    public private(set) var runId: String?
    public private(set) var startLoss: Double?
    public private(set) var points: [(step: Int, loss: Double)] = []

    /// `checkpoint`: the run's checkpoint file; nil (no checkpoint store): a temporary directory.
    public init(checkpoint: URL?) {
        let base = checkpoint?.deletingPathExtension()
            ?? FileManager.default.temporaryDirectory.appendingPathComponent("gate-\(UUID().uuidString)")
        url = base.appendingPathExtension("gate.json")
        best = CheckpointStore(url: URL(fileURLWithPath: base.path + ".gate-best.safetensors"))
        if let data = try? Data(contentsOf: url), let o = (try? JSONValue.parse(data))?.objectValue {
            runId = o["run_id"]?.stringValue
            startLoss = o["start_loss"].flatMap { $0 == .null ? Double.nan : $0.doubleValue }
            points = (o["points"]?.arrayValue ?? []).compactMap { p in
                guard let a = p.arrayValue, a.count == 2, let s = a[0].intValue else { return nil }
                return (Int(s), a[1].doubleValue ?? .nan)
            }
        }
    }

    /// The record of `run` (another run's is dropped: a new run starts a new gate).
    public func begin(runId run: String) {
        guard runId != run else { return }
        (runId, startLoss, points) = (run, nil, [])
        try? FileManager.default.removeItem(at: best.url)
        save()
    }

    public func started(loss: Double) { startLoss = loss; save() }

    /// Lowest finite loss so far (+inf: none).
    public var bestLoss: Double { points.map(\.loss).filter(\.isFinite).min() ?? .infinity }

    /// Record the evaluation after `step` steps (one repeated after a resume replaces the earlier one).
    public func add(step: Int, loss: Double) {
        points.removeAll { $0.step == step }
        points.append((step, loss))
        save()
    }

    /// Decided: the kept state is in the checkpoint and the adapter now; the record is cleared.
    public func finished() {
        points = []
        startLoss = nil
        save()
        try? FileManager.default.removeItem(at: best.url)
    }

    private func save() {
        let o: JSONValue = .object([
            "run_id": runId.map { .string($0) } ?? .null, "start_loss": startLoss.map { .number($0) } ?? .null,
            "points": .array(points.map { .array([.int(Int64($0.step)), .number($0.loss)]) }),
        ])
        if let data = try? o.jsonData() { try? AtomicFiles.write(data, to: url) }
    }
}

/// The run-time knobs of a step's working set (telemetry `working_set`): checkpoint groups and LCSB's layers per step
/// (`lcsbK` nil: every layer). A program's rows are padded to its export seq_len: the host's third knob (the next rows'
/// length) is not one the app has.
public struct WorkingSet: Equatable {
    public var layersPerCheckpoint: Int
    public var lcsbK: Int?

    public init(layersPerCheckpoint: Int, lcsbK: Int?) { (self.layersPerCheckpoint, self.lcsbK) = (layersPerCheckpoint, lcsbK) }

    public func selected(layers: Int) -> Int { lcsbK ?? layers }

    public var json: JSONValue {
        .object(["layers_per_checkpoint": .int(Int64(layersPerCheckpoint)), "lcsb_k": lcsbK.map { .int(Int64($0)) } ?? .null])
    }

    public var description: String { "layers_per_checkpoint \(layersPerCheckpoint), lcsb_k \(lcsbK.map(String.init) ?? "all")" }
}

/// One notch down the ladder.
public struct Notch: Equatable {
    public var knob: String
    public var before: WorkingSet
    public var after: WorkingSet
    /// The planner's peak for `after` (bytes; nil: no figure).
    public var predictedBytes: UInt64?
}

/// The memory-pressure ladder of a phone run, pure (trainer-core's `PressurePolicy`, the host's
/// toolchain/memory/fallback.py): checkpoint groups doubled up to the layers per step, then LCSB k halved down to 1
/// (cyclic plan), a notch taken only where the planner's figure (`predict`) is lower. An OS signal adapts at most once
/// per `osCooldownSteps` steps (one notch per event, then the next step is measured).
public final class PressurePolicy {
    public static let knobs = ["layers_per_checkpoint", "lcsb_k"]
    public let layers: Int
    public let osCooldownSteps: Int
    private let predict: (WorkingSet) -> UInt64?
    private var lastOsAdaptStep = Int.min / 2

    public init(layers: Int, osCooldownSteps: Int = 3, predict: @escaping (WorkingSet) -> UInt64?) {
        (self.layers, self.osCooldownSteps, self.predict) = (layers, osCooldownSteps, predict)
    }

    /// At most this many layer inputs alive at once (`CheckpointGroups.maxAlive`).
    public static func plannerPeak(_ ws: WorkingSet, manifest: Manifest, target: String) -> UInt64 {
        manifest.plannedPeakBytes(target: target, selectedLayers: ws.lcsbK, layersPerCheckpoint: ws.layersPerCheckpoint)
    }

    /// `ws` with `knob` one notch lower, or nil at its lowest.
    public func notch(_ ws: WorkingSet, knob: String) -> WorkingSet? {
        let k = ws.selected(layers: layers)
        switch knob {
        case "layers_per_checkpoint":
            return ws.layersPerCheckpoint >= k ? nil : WorkingSet(layersPerCheckpoint: min(2 * ws.layersPerCheckpoint, k), lcsbK: ws.lcsbK)
        default:
            guard k > 1 else { return nil }
            let nk = max(1, k / 2)
            return WorkingSet(layersPerCheckpoint: min(ws.layersPerCheckpoint, nk), lcsbK: nk)
        }
    }

    /// The first notch in `knobs` order the planner says lowers the peak; nil: none.
    public func next(_ ws: WorkingSet) -> Notch? {
        let base = predict(ws)
        for knob in Self.knobs {
            var n = notch(ws, knob: knob)
            while let cand = n {
                let p = predict(cand)
                if base == nil || p == nil || p! < base! { return Notch(knob: knob, before: ws, after: cand, predictedBytes: p) }
                n = notch(cand, knob: knob)
            }
        }
        return nil
    }

    /// An OS signal adapted within the last `osCooldownSteps` steps: the next steps are measured before another.
    public func inCooldown(atStep step: Int) -> Bool { step - lastOsAdaptStep < osCooldownSteps }

    public func osAdapted(atStep step: Int) { lastOsAdaptStep = step }
}

extension StateBuffer {
    /// Overwrite the whole state with `values` (a restore: the gate's kept state).
    public func overwrite(with values: [Float]) throws {
        guard values.count == buffer.floats.count else {
            throw TrainerError.badInput("the state holds \(buffer.floats.count) values, not \(values.count)")
        }
        _ = buffer.floats.update(fromContentsOf: values)
    }
}
