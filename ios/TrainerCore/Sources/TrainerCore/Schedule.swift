import Foundation

/// An LCSB step plan (`shared_schemas/step_plan.schema.json`): step s backpropagates through
/// `phases[schedule[s % schedule.count]]`, except that a step s < `warmup` (a full-backprop warm-up)
/// backpropagates through every layer (global step index: the schedule does not restart). Parsed strictly (unknown keys refused, like the schema's
/// `additionalProperties: false`), so a plan from a newer toolchain fails loudly instead of half-working.
public struct StepPlan: Equatable {
    public static let policies = ["cyclic", "strided", "last", "anchored", "random", "full"]
    private static let keys: Set<String> = ["schema_version", "layers", "policy", "k", "seed", "phases", "schedule", "warmup"]

    public var layers: Int
    public var policy: String
    public var k: Int
    public var seed: Int64?
    public var phases: [[Int]]
    public var schedule: [Int]
    /// Steps s < warmup backpropagate through every layer (0: no warm-up; absent in JSON).
    public var warmup: Int

    public init(layers: Int, policy: String, k: Int, seed: Int64? = nil, phases: [[Int]], schedule: [Int], warmup: Int = 0) throws {
        (self.layers, self.policy, self.k, self.seed, self.phases, self.schedule) = (layers, policy, k, seed, phases, schedule)
        self.warmup = warmup
        try validate()
    }

    public static func decode(_ data: Data, source: String = "step plan") throws -> StepPlan {
        func fail(_ why: String) -> TrainerError { .badInput("\(source): \(why); rebuild it with `toolchain plan lcsb`") }
        guard let obj = (try? JSONValue.parse(data))?.objectValue else { throw fail("not a JSON object") }
        if let extra = Set(obj.keys).subtracting(keys).sorted().first { throw fail("unknown key '\(extra)'") }
        guard obj["schema_version"]?.intValue == 1 else { throw fail("schema_version must be 1") }
        guard let layers = obj["layers"]?.intValue, let k = obj["k"]?.intValue,
              let policy = obj["policy"]?.stringValue else { throw fail("layers, k and policy are required") }
        guard let rawPhases = obj["phases"]?.arrayValue, let rawSchedule = obj["schedule"]?.arrayValue else {
            throw fail("phases and schedule are required")
        }
        let phases = rawPhases.map { $0.arrayValue?.map { $0.intValue.map(Int.init) } ?? [nil] }
        let schedule = rawSchedule.map { $0.intValue.map(Int.init) }
        guard phases.allSatisfy({ $0.allSatisfy { $0 != nil } }), schedule.allSatisfy({ $0 != nil }) else {
            throw fail("phases and schedule must hold integers only")
        }
        let seed: Int64?
        switch obj["seed"] {
        case nil, .some(.null): seed = nil
        case .some(let v):
            guard let s = v.intValue else { throw fail("seed must be an integer or null") }
            seed = s
        }
        var warmup: Int64 = 0
        if let w = obj["warmup"] {
            guard let v = w.intValue else { throw fail("warmup must be an integer") }
            warmup = v
        }
        do {
            return try StepPlan(layers: Int(layers), policy: policy, k: Int(k), seed: seed,
                                phases: phases.map { $0.map { $0! } }, schedule: schedule.map { $0! }, warmup: Int(warmup))
        } catch TrainerError.badInput(let why) {
            throw fail(why)
        }
    }

    func validate() throws {
        guard layers >= 1, k >= 1 else { throw TrainerError.badInput("layers and k must be at least 1") }
        guard warmup >= 0 else { throw TrainerError.badInput("warmup must be >= 0 steps, got \(warmup)") }
        guard Self.policies.contains(policy) else {
            throw TrainerError.badInput("unknown policy '\(policy)' (choose \(Self.policies.joined(separator: ", ")))")
        }
        guard !phases.isEmpty, !schedule.isEmpty else { throw TrainerError.badInput("phases and schedule must not be empty") }
        for (i, phase) in phases.enumerated() {
            guard !phase.isEmpty else { throw TrainerError.badInput("phase \(i) is empty") }
            guard Set(phase).count == phase.count else { throw TrainerError.badInput("phase \(i) repeats a layer") }
            if let bad = phase.first(where: { $0 < 0 || $0 >= layers }) {
                throw TrainerError.badInput("phase \(i) names layer \(bad); the model has \(layers)")
            }
        }
        if let bad = schedule.first(where: { $0 < 0 || $0 >= phases.count }) {
            throw TrainerError.badInput("schedule names phase \(bad); there are \(phases.count)")
        }
    }

    /// Index of the phase that step `step` (0-based, counted over the whole run) uses; nil during the
    /// warm-up (every layer, no phase: telemetry then has no `lcsb_phase`).
    public func phase(forStep step: Int) -> Int? { step < warmup ? nil : schedule[step % schedule.count] }

    /// Layers step `step` backpropagates through: every layer during the warm-up, else its phase's.
    public func layers(forStep step: Int) -> [Int] {
        guard let p = phase(forStep: step) else { return Array(0..<layers) }
        return phases[p]
    }

    /// Most layers one step backpropagates: every layer with a warm-up, else the largest phase (memory planning).
    public var maxLayers: Int { warmup > 0 ? layers : (phases.map(\.count).max() ?? layers) }
}

extension StepPlan {
    /// The plan of an LCSB policy, exactly `toolchain/lcsb/plan.py:make_plan` (tested against the
    /// `lcsb_plan` cases of shared_schemas/data_corpus), so the phone chooses layers at run time as
    /// the host does. g = ceil(L / k) groups:
    /// cyclic: contiguous groups `[L*i/g, L*(i+1)/g)`; strided: `{i, i+g, ...}`; last: the last k;
    /// anchored: the last k - 1 plus one of layers 0...L-k, ascending (period L - k + 1);
    /// full: every layer (k = L); random: step t selects the first k of
    /// `Shuffle.permutation(L, seed + t)`, sorted, for `period` steps (default 4g), equal draws sharing
    /// a phase. seed / period only for random (seed default 0). `warmup`: full-backprop steps first (default 0).
    public static func make(layers: Int, k: Int?, policy: String, seed: Int64? = nil, period: Int? = nil, warmup: Int = 0) throws -> StepPlan {
        guard warmup >= 0 else { throw TrainerError.badInput("an LCSB warm-up must be >= 0 steps, got \(warmup)") }
        guard policies.contains(policy) else {
            throw TrainerError.badInput("unknown LCSB policy \(policy); choose \(policies.joined(separator: ", "))")
        }
        guard layers >= 1 else { throw TrainerError.badInput("`layers` must be >= 1, got \(layers)") }
        let kk: Int
        if policy == "full" { kk = layers } else {
            guard let k else { throw TrainerError.badInput("the \(policy) policy needs k (layers per step)") }
            kk = k
        }
        guard (1...layers).contains(kk) else { throw TrainerError.badInput("k = \(kk) is outside 1..\(layers) (the model's layers)") }
        if policy != "random" && (seed != nil || period != nil) {
            throw TrainerError.badInput("seed and period only apply to the random policy, not \(policy)")
        }
        let groups = (layers + kk - 1) / kk
        var phases: [[Int]]
        switch policy {
        case "cyclic":
            let bounds = (0...groups).map { layers * $0 / groups }
            phases = (0..<groups).map { Array(bounds[$0]..<bounds[$0 + 1]) }
        case "strided":
            phases = (0..<groups).map { Array(stride(from: $0, to: layers, by: groups)) }
        case "last":
            phases = [Array((layers - kk)..<layers)]
        case "anchored":
            phases = (0...(layers - kk)).map { [$0] + Array((layers - kk + 1)..<layers) }
        case "full":
            phases = [Array(0..<layers)]
        default:
            let s = seed ?? 0, n = period ?? 4 * groups
            guard n >= 1 else { throw TrainerError.badInput("`period` must be >= 1, got \(n)") }
            phases = []
            var schedule: [Int] = []
            for step in 0..<n {
                let draw = Shuffle.permutation(layers, seed: UInt64(bitPattern: s) &+ UInt64(step)).prefix(kk).sorted()
                if let i = phases.firstIndex(of: draw) { schedule.append(i) } else { phases.append(draw); schedule.append(phases.count - 1) }
            }
            return try StepPlan(layers: layers, policy: policy, k: kk, seed: s, phases: phases, schedule: schedule, warmup: warmup)
        }
        return try StepPlan(layers: layers, policy: policy, k: kk, phases: phases, schedule: Array(0..<phases.count), warmup: warmup)
    }
}

extension StepPlan {
    /// The layers to backpropagate at `step` as a set (LCSB chosen at run time).
    public func selected(forStep step: Int) -> Set<Int> { Set(layers(forStep: step)) }
}
