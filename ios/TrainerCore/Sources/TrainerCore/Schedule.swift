import Foundation

/// An LCSB step plan (`shared_schemas/step_plan.schema.json`): step s backpropagates through
/// `phases[schedule[s % schedule.count]]`. Parsed strictly (unknown keys refused, like the schema's
/// `additionalProperties: false`), so a plan from a newer toolchain fails loudly instead of half-working.
public struct StepPlan: Equatable {
    public static let policies = ["cyclic", "strided", "last", "random", "full"]
    private static let keys: Set<String> = ["schema_version", "layers", "policy", "k", "seed", "phases", "schedule"]

    public var layers: Int
    public var policy: String
    public var k: Int
    public var seed: Int64?
    public var phases: [[Int]]
    public var schedule: [Int]

    public init(layers: Int, policy: String, k: Int, seed: Int64? = nil, phases: [[Int]], schedule: [Int]) throws {
        (self.layers, self.policy, self.k, self.seed, self.phases, self.schedule) = (layers, policy, k, seed, phases, schedule)
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
        do {
            return try StepPlan(layers: Int(layers), policy: policy, k: Int(k), seed: seed,
                                phases: phases.map { $0.map { $0! } }, schedule: schedule.map { $0! })
        } catch TrainerError.badInput(let why) {
            throw fail(why)
        }
    }

    func validate() throws {
        guard layers >= 1, k >= 1 else { throw TrainerError.badInput("layers and k must be at least 1") }
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

    /// Index of the phase that step `step` (0-based, counted over the whole run) uses.
    public func phase(forStep step: Int) -> Int { schedule[step % schedule.count] }

    /// Layers step `step` backpropagates through.
    public func layers(forStep step: Int) -> [Int] { phases[phase(forStep: step)] }
}

/// Which program method each step calls: `train_step` when the manifest has no LCSB, else
/// `train_step_p{phase}` with phase = `lcsb.schedule[step % len(schedule)]`.
public struct MethodSchedule: Equatable {
    public let phases: [[Int]]?
    public let schedule: [Int]?

    public init(manifest: ProgramManifest) {
        phases = manifest.lcsb?.phases
        schedule = manifest.lcsb?.schedule
    }

    /// The method and phase (nil without LCSB) of 0-based step `step`.
    public func method(forStep step: Int) -> (name: String, phase: Int?) {
        guard let schedule else { return ("train_step", nil) }
        let phase = schedule[step % schedule.count]
        return ("train_step_p\(phase)", phase)
    }

    /// Layers that step `step` backpropagates through (nil: all of them).
    public func backwardLayers(forStep step: Int) -> [Int]? {
        guard let phases, let phase = method(forStep: step).phase else { return nil }
        return phases[phase]
    }

    /// Check that a step plan (e.g. one the user picked) is the one the program was exported with.
    public func check(plan: StepPlan) throws {
        guard let phases, let schedule else {
            throw TrainerError.badInput("this program was exported without LCSB; the step plan cannot apply (re-export with --lcsb)")
        }
        guard plan.phases == phases, plan.schedule == schedule else {
            throw TrainerError.badInput("the step plan's phases/schedule differ from the program's; re-export the program with this plan")
        }
    }
}
