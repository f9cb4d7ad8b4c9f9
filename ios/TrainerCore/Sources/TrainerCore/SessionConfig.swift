import Foundation

/// Which layers get `block_backward` at each step, chosen when the run starts (LCSB is a
/// run-time choice, not an export-time one).
public enum LayerSelection: Equatable, Codable {
    /// Every layer every step.
    case all
    /// An LCSB policy of `toolchain plan lcsb` (`StepPlan.make`: cyclic, strided, last, random, full)
    /// with at most `k` layers per step; k >= the model's layers means every layer.
    case lcsb(policy: String, k: Int, seed: Int64?)
    /// A plan from `toolchain plan lcsb` (or the manifest's `lcsb`).
    case plan(StepPlan)

    /// Contiguous groups of at most k layers, visited in ascending order (the host's `cyclic`).
    public static func cyclic(k: Int) -> LayerSelection { .lcsb(policy: "cyclic", k: k, seed: nil) }

    /// The plan of this selection for a model of `layers` layers (nil: all layers).
    public func plan(layers: Int) throws -> StepPlan? {
        switch self {
        case .all: return nil
        case .lcsb(let policy, let k, let seed):
            guard k >= 1 else { throw TrainerError.badInput("LCSB k must be at least 1") }
            if k >= layers && policy != "random" { return nil }
            return try StepPlan.make(layers: layers, k: min(k, layers), policy: policy, seed: policy == "random" ? (seed ?? 0) : nil)
        case .plan(let p):
            guard p.layers == layers else { throw TrainerError.badInput("the LCSB plan is for \(p.layers) layers, the program has \(layers)") }
            return p
        }
    }

    /// k of run_start (nil: all layers).
    public func k(layers: Int) -> Int? {
        switch self {
        case .all: return nil
        case .lcsb(_, let k, _): return k < layers ? k : nil
        case .plan(let p): return p.phases.map(\.count).max()
        }
    }
}

extension StepPlan: Codable {
    enum CodingKeys: String, CodingKey { case layers, policy, k, seed, phases, schedule, warmup }
    public init(from decoder: Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        try self.init(layers: try c.decode(Int.self, forKey: .layers), policy: try c.decode(String.self, forKey: .policy),
                      k: try c.decode(Int.self, forKey: .k), seed: try c.decodeIfPresent(Int64.self, forKey: .seed),
                      phases: try c.decode([[Int]].self, forKey: .phases), schedule: try c.decode([Int].self, forKey: .schedule),
                      warmup: try c.decodeIfPresent(Int.self, forKey: .warmup) ?? 0)
    }
    public func encode(to encoder: Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(layers, forKey: .layers); try c.encode(policy, forKey: .policy); try c.encode(k, forKey: .k)
        try c.encodeIfPresent(seed, forKey: .seed); try c.encode(phases, forKey: .phases); try c.encode(schedule, forKey: .schedule)
        if warmup > 0 { try c.encode(warmup, forKey: .warmup) }  // absent: 0 (saved runs stay the same)
    }
}

/// How long and how to train.
public struct SessionConfig: Equatable, Codable {
    public var steps: Int
    public var lr: Float
    /// Save a checkpoint every this many steps (and at the end of every session).
    public var checkpointEvery: Int
    /// nil: rows in file order; else `DataOrder`'s seeded permutation per epoch (the host's `--shuffle`).
    public var shuffleSeed: UInt64?
    public var selection: LayerSelection
    /// Checkpoint groups of the layer loop (`LayerLoop.trainStep(layersPerCheckpoint:)`): 1 keeps every
    /// selected layer's input; s > 1 keeps one per s selected layers and reruns the forward of each
    /// group in the backward ("use less memory, recompute more"). Same losses and state either way.
    public var layersPerCheckpoint: Int
    /// Full-backprop warm-up of the selection's plan (`StepPlan.warmup`): steps s < lcsbWarmup backpropagate
    /// every layer, later steps follow the plan. nil: the plan's own (a `.plan` may carry one; else 0).
    public var lcsbWarmup: Int?

    public init(steps: Int, lr: Float, checkpointEvery: Int = 10, shuffleSeed: UInt64? = nil, selection: LayerSelection = .all,
                layersPerCheckpoint: Int = 1, lcsbWarmup: Int? = nil) {
        (self.steps, self.lr, self.checkpointEvery) = (steps, lr, max(1, checkpointEvery))
        (self.shuffleSeed, self.selection, self.layersPerCheckpoint) = (shuffleSeed, selection, layersPerCheckpoint)
        self.lcsbWarmup = lcsbWarmup
    }

    enum CodingKeys: String, CodingKey { case steps, lr, checkpointEvery, shuffleSeed, selection, layersPerCheckpoint, lcsbWarmup }

    /// A saved run written before checkpoint groups has no `layersPerCheckpoint`: 1.
    public init(from decoder: Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        self.init(steps: try c.decode(Int.self, forKey: .steps), lr: try c.decode(Float.self, forKey: .lr),
                  checkpointEvery: try c.decode(Int.self, forKey: .checkpointEvery),
                  shuffleSeed: try c.decodeIfPresent(UInt64.self, forKey: .shuffleSeed),
                  selection: try c.decode(LayerSelection.self, forKey: .selection),
                  layersPerCheckpoint: try c.decodeIfPresent(Int.self, forKey: .layersPerCheckpoint) ?? 1,
                  lcsbWarmup: try c.decodeIfPresent(Int.self, forKey: .lcsbWarmup))
    }

    public func encode(to encoder: Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(steps, forKey: .steps); try c.encode(lr, forKey: .lr); try c.encode(checkpointEvery, forKey: .checkpointEvery)
        try c.encodeIfPresent(shuffleSeed, forKey: .shuffleSeed); try c.encode(selection, forKey: .selection)
        try c.encode(layersPerCheckpoint, forKey: .layersPerCheckpoint)
        try c.encodeIfPresent(lcsbWarmup, forKey: .lcsbWarmup)
    }

    /// The run's plan: the selection's, with `lcsbWarmup` when given (nil: every layer every step).
    public func plan(layers: Int) throws -> StepPlan? {
        if let w = lcsbWarmup, w < 0 { throw TrainerError.badInput("an LCSB warm-up must be >= 0 steps, got \(w)") }
        // No plan (every layer every step): a full-backprop warm-up changes nothing.
        guard var p = try selection.plan(layers: layers) else { return nil }
        if let w = lcsbWarmup { p.warmup = w }
        return p
    }

    /// The largest number of layers one step backpropagates (LCSB k; every layer without a plan or during a warm-up).
    public func selectedLayers(layers: Int) throws -> Int {
        try plan(layers: layers)?.maxLayers ?? layers
    }

    /// What the budget guard is planned with before a step was measured: the manifest's estimate with
    /// the checkpoints this run keeps at once (`Manifest.plannedPeakBytes(target:selectedLayers:
    /// layersPerCheckpoint:)`: min(k, ceil(k/s) + s - 1) of them).
    public func plannedPeakBytes(manifest: Manifest, target: String) throws -> UInt64 {
        manifest.plannedPeakBytes(target: target, selectedLayers: try selectedLayers(layers: manifest.loop.layers),
                                  layersPerCheckpoint: layersPerCheckpoint)
    }
}

public extension SessionConfig {
    /// The export's learning rate when none was asked (`lr` <= 0, the screen's default): the manifest's
    /// `defaults.lr`, else `optimizer.default_lr` (`toolchain export --lr`; the one source the apps and
    /// `toolchain train --program` share), else `Contract.fallbackLr` for a manifest without one.
    func resolvingLr(_ manifest: Manifest) -> SessionConfig {
        guard lr <= 0 else { return self }
        var c = self
        c.lr = Float(manifest.defaults?.lr ?? manifest.optimizer.defaultLr ?? Contract.fallbackLr)
        return c
    }

    /// The run defaults where none was asked (`lr` <= 0, `steps` <= 0: the screen's defaults): the manifest's
    /// `defaults` (what `toolchain export` measured and recorded, toolchain/export/app_defaults.py), else
    /// `optimizer.default_lr` and `Contract.fallbackSteps` for an older program (as Android's Manifest.runLr / runSteps).
    func resolvingDefaults(_ manifest: Manifest) -> SessionConfig {
        var c = resolvingLr(manifest)
        if c.steps <= 0 { c.steps = manifest.defaults?.steps ?? Contract.fallbackSteps }
        return c
    }
}
