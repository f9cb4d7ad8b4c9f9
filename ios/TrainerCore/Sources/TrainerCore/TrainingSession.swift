import Foundation

/// Facts about the phone for the `run_start` event (the app fills them in).
public struct DeviceInfo: Equatable {
    public var platform: String
    public var deviceModel: String
    public var os: String
    public var totalRamBytes: UInt64
    public var budgetBytes: UInt64
    public var deviceProfile: String?
    public var appVersion: String?
    /// Free-form `config` of run_start (e.g. background task, power requirement).
    public var config: [String: JSONValue]

    public init(platform: String = "ios", deviceModel: String, os: String, totalRamBytes: UInt64, budgetBytes: UInt64,
                deviceProfile: String? = nil, appVersion: String? = nil, config: [String: JSONValue] = [:]) {
        (self.platform, self.deviceModel, self.os, self.totalRamBytes) = (platform, deviceModel, os, totalRamBytes)
        (self.budgetBytes, self.deviceProfile, self.appVersion, self.config) = (budgetBytes, deviceProfile, appVersion, config)
    }
}

public enum StepOutcome: Equatable {
    case trained(step: Int, loss: Float)
    case paused(reason: String)
    case stopped(reason: String)
    case finished
}

/// How a session ended (the telemetry `run_end` status).
public enum RunStatus: String, Equatable, Codable {
    case completed, failed, cancelled, paused
}

/// Memory readings the session takes around each step (any may be nil: probe not available).
public struct MemoryProbes {
    public var footprint: MemoryProbe?
    public var available: MemoryProbe?
    /// The latest memory-pressure level (the app's dispatch source updates it).
    public var pressure: () -> MemoryPressure

    public init(footprint: MemoryProbe? = nil, available: MemoryProbe? = nil,
                pressure: @escaping () -> MemoryPressure = { .normal }) {
        (self.footprint, self.available, self.pressure) = (footprint, available, pressure)
    }
}

/// Which layers get `block_backward` at each step, chosen when the run starts (contract v3: LCSB is a
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

/// The user's data as rows for a program: text or chat JSONL -> rows (`TextRows`), checked against
/// the program (`Batcher`), and the seeded held-out split (`TextRows.splitHeldOut`).
public struct TrainingData: Equatable {
    public var train: [DataRow]
    public var heldOut: [DataRow]
    /// Target tokens (labels after the shift that are not -100) of the training rows.
    public var trainTokens: Int { train.reduce(0) { $0 + TrainingData.targets($1) } }

    public init(train: [DataRow], heldOut: [DataRow]) { (self.train, self.heldOut) = (train, heldOut) }

    public enum Source: Equatable {
        case text(String)
        /// JSONL, one `{"messages": [...]}` per line; `name` is used in error messages.
        case chat(String, name: String)
    }

    /// Rows of `source` for the program, `heldOutFraction` of them held out (0: none) with `seed`.
    public static func prepare(_ source: Source, tokenizer: ProgramTokenizer, manifest: Manifest,
                               heldOutFraction: Double, seed: UInt64) throws -> TrainingData {
        let rows: [DataRow]
        switch source {
        case .text(let t): rows = try TextRows.dataRows(text: t, tokenizer: tokenizer, seqLen: manifest.seqLen)
        case .chat(let t, let name): rows = try TextRows.chatRows(t, tokenizer: tokenizer.base, seqLen: manifest.seqLen, source: name)
        }
        let batcher = Batcher(seqLen: manifest.seqLen, padTokenId: Int64(tokenizer.padId), vocab: Int64(manifest.model.arch.vocab))
        for (i, r) in rows.enumerated() { _ = try batcher.pad(r, where: "row \(i + 1)") }
        guard heldOutFraction > 0 else { return TrainingData(train: rows, heldOut: []) }
        let (train, held) = try TextRows.splitHeldOut(rows, fraction: heldOutFraction, seed: seed)
        return TrainingData(train: train, heldOut: held)
    }

    static func targets(_ r: DataRow) -> Int { (r.labels ?? r.inputIds).dropFirst().filter { $0 != DataRow.ignoreIndex }.count }
}

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

/// One token of a streaming generation: its index in the generation, its id and the text it
/// completed (`IncrementalTextDecoder`: "" while a character is still incomplete, never a broken
/// one; the texts of a generation's tokens concatenate to its `Generation.text`, but for an
/// incomplete character at the very end, which only the final text shows, as U+FFFD).
public struct GeneratedToken: Equatable {
    public var initial: Bool
    public var index: Int
    public var id: Int64
    public var text: String
}

/// A contract-v3 training run as the app runs it: the layer loop (`LayerLoop`) over the program's
/// memory-mapped weights and the app-owned state, rows in `DataOrder`, LCSB chosen at run time,
/// the memory budget guard before each step, telemetry (run_start, step, memory, eval, error,
/// run_end; every event checked against the schema), checkpoints in the host's layout and resume
/// from them after a kill, held-out loss and greedy generation with the initial adapter
/// (state_init.bin) or the live one, and the adapter exported as PEFT files.
public final class TrainingSession {
    public let manifest: Manifest
    public let loop: LayerLoop
    public let tokenizer: ProgramTokenizer?
    public let programName: String
    public let data: TrainingData
    public let config: SessionConfig
    public let plan: StepPlan?
    /// The live state (nil before `start()`). The training thread updates it in place during a step;
    /// another thread reads it through `generate`, which copies what it needs at a step boundary.
    public var state: StateBuffer? { stateLock.withLock { liveStateStorage } }
    public private(set) var step = 0
    public private(set) var losses: [Float?] = []
    public private(set) var recorder: TelemetryRecorder?
    public var onEvent: ((SessionEvent) -> Void)?
    /// The runtime's recent log lines (the app's ExecuTorch log sink): a failing step's `error` event
    /// carries them when the error itself has none (`ErrorReport`).
    public var runtimeLog: LogRing?
    /// Where `start()` is (verifying, loading methods, preparing the state), for the screen.
    public var onStartPhase: ((String) -> Void)?
    /// The step's run-time knobs, lowered under memory pressure (`PressurePolicy`); the run's own at each session start.
    public private(set) var working: WorkingSet
    /// The layers of each step: the run's plan, a cyclic one of the lowered k after a memory_adapted on lcsb_k.
    private var livePlan: StepPlan?
    private let pressure: PressurePolicy
    /// The evaluation gate's record of this run (beside the checkpoint; `GateRecord`) and its decision once made.
    public let gateRecord: GateRecord
    public private(set) var gateDecision: GateDecision?
    /// Asked before each row of the gate's evaluations at the checkpoints (true: that evaluation is skipped).
    public var evalCancelled: () -> Bool = { false }

    private let programDirectory: URL
    private let order: DataOrder
    private let device: DeviceInfo
    private let checkpoint: CheckpointStore?
    private let sinks: [TelemetrySink]
    private let usedSeq: ((String) -> Int)?
    private let probes: MemoryProbes
    private let budget: MemoryGuard?
    private let monotonic: () -> Double
    private let clock: () -> Double
    private var sessionStart = 0.0
    private var initialState: StateBuffer?
    private let initialLock = NSLock()
    /// Held while a step updates the state (and while `start()` sets it); a generation takes its
    /// snapshot of the live state under it, so it sees the state between two steps, never inside one.
    /// FIFO: a snapshot waits for at most the step in progress.
    private let stateLock = FairLock()
    private var liveStateStorage: StateBuffer?
    /// Steps whose updates are in the live state (under `stateLock`).
    private var stepsInState = 0
    /// Set once the weights file was seen changed under its mapping (`weightsCheck`), with the message sent.
    private var weightsStop: String?
    private let weightsLock = NSLock()

    /// - Parameters:
    ///   - runtime: the program's runtime (ExecuTorch or Core ML; a fake in tests).
    ///   - usedSeq: the first seq of a run id not yet used by any queued or sent event (the telemetry
    ///     queue's `nextSeq(runId:)`), so a resumed run never reuses a seq.
    ///   - budget: nil: no guard. The app builds it with `config.plannedPeakBytes(manifest:target:)`.
    ///   - weightsIdentity: how the weights file's identity is read at each step boundary (nil: `stat`, the
    ///     app's; see `MappedWeights`); tests pass a fake.
    public init(programDirectory: URL, programName: String, runtime: ProgramRuntime, data: TrainingData, config: SessionConfig,
                device: DeviceInfo, checkpoint: CheckpointStore? = nil, telemetry sinks: [TelemetrySink] = [],
                usedSeq: ((String) -> Int)? = nil, probes: MemoryProbes = MemoryProbes(), budget: MemoryGuard? = nil,
                clock: @escaping () -> Double = { Date().timeIntervalSince1970 },
                monotonic: @escaping () -> Double = { ProcessInfo.processInfo.systemUptime },
                weightsIdentity: FileIdentitySource? = nil) throws {
        guard !data.train.isEmpty else { throw TrainerError.badInput("no training rows; give a longer text or more conversations") }
        guard config.steps >= 1, config.lr >= 0, config.lr.isFinite else { throw TrainerError.badInput("steps must be >= 1 and lr a finite number >= 0") }
        guard config.layersPerCheckpoint >= 1 else {
            throw TrainerError.badInput("layers per checkpoint must be >= 1 (1 keeps every selected layer's input), got \(config.layersPerCheckpoint)")
        }
        let loop = try LayerLoop(programDirectory: programDirectory, runtime: runtime, identitySource: weightsIdentity)
        let m = loop.manifest
        (self.loop, manifest) = (loop, m)
        if let t = m.tokenizer, t.kind != "none" {
            tokenizer = try ProgramTokenizer.load(manifest: m, directory: programDirectory)
        } else {
            tokenizer = nil
        }
        plan = try config.plan(layers: m.loop.layers)
        (self.programDirectory, self.programName, self.data, self.config) = (programDirectory, programName, data, config)
        (self.device, self.checkpoint, self.sinks, self.usedSeq) = (device, checkpoint, sinks, usedSeq)
        (self.probes, self.budget, self.clock, self.monotonic) = (probes, budget, clock, monotonic)
        order = DataOrder(rowCount: data.train.count, seed: config.shuffleSeed)
        working = WorkingSet(layersPerCheckpoint: config.layersPerCheckpoint, lcsbK: plan.flatMap { $0.policy == "full" ? nil : $0.k })
        livePlan = plan
        let target = loop.runtime.backendName
        pressure = PressurePolicy(layers: m.loop.layers) { ws in PressurePolicy.plannerPeak(ws, manifest: m, target: target) }
        gateRecord = GateRecord(checkpoint: checkpoint?.url)
    }

    public var padTokenId: Int64 { Int64(manifest.tokenizer?.padTokenId ?? 0) }
    public var programSha256: String? { manifest.exportSha256 }
    public var isDone: Bool { step >= config.steps }

    /// Take the state from the checkpoint if there is one (resuming its run: step, run id, seq,
    /// losses), else from `state.init_file` (a new run: `run_start`); load the training methods.
    /// Returns true when it resumed.
    @discardableResult
    ///
    /// `sameRunOnly`: resume the checkpoint only when it is `newRunId`'s (the app's new run on new text starts
    /// from state_init.bin, its first checkpoint replacing the other run's, instead of continuing, or
    /// "completing" at once, a run on other rows).
    public func start(runId newRunId: String? = nil, sameRunOnly: Bool = false) throws -> Bool {
        precondition(state == nil, "start() runs once per session")
        sessionStart = monotonic()
        var runId = newRunId ?? TelemetryRecorder.newRunId(platform: device.platform)
        var seq = 0
        var resumed = false
        var live: StateBuffer?
        if let checkpoint, checkpoint.exists {
            onStartPhase?("Reading the checkpoint")
            let (values, meta) = try checkpoint.load(expectedNumel: manifest.state.numel, programSha256: programSha256)
            if !sameRunOnly || meta.runId == newRunId {
                live = try StateBuffer(manifest: manifest, values: values)
                (step, runId, seq, losses) = (meta.step, meta.runId, meta.seq, meta.losses)
                resumed = true
            }
        }
        let started = try live ?? StateBuffer.initial(manifest: manifest, programDirectory: programDirectory)
        stateLock.withLock { (liveStateStorage, stepsInState) = (started, step) }
        onStartPhase?("Loading the training methods")
        try loop.loadTraining()
        seq = max(seq, usedSeq?(runId) ?? 0)
        recorder = try TelemetryRecorder(runId: runId, startSeq: seq, sinks: sinks, clock: clock, monotonic: monotonic)
        gateRecord.begin(runId: runId)
        if !resumed { try emit("run_start", runStartFields()) }
        onEvent?(.started(resumed: resumed, step: step, losses: losses))
        return resumed
    }

    private func runStartFields() -> [String: JSONValue] {
        let m = manifest
        var f: [String: JSONValue] = [
            "model": .string(m.model.source.flatMap { $0.isEmpty ? nil : $0 } ?? programName), "method": .string("mesp"),
            "backend": .string(loop.runtime.backendName), "seq_len": .int(Int64(m.seqLen)), "rank": .int(Int64(m.lora?.rank ?? 1)),
            "optimizer": .string(m.optimizer.kind), "lr": .double(Double(config.lr)), "steps_planned": .int(Int64(config.steps)),
            "platform": .string(device.platform), "device_model": .string(device.deviceModel), "os": .string(device.os),
            "total_ram_bytes": .int(Int64(device.totalRamBytes)), "budget_bytes": .int(Int64(device.budgetBytes)),
            "program": .string(programName),
        ]
        if let t = m.lora?.targets { f["targets"] = .array(t.map { .string($0) }) }
        if let q = m.quant?.kind { f["quant"] = .string(q) }
        f["compute"] = .string(m.computePrecision)
        if let k = config.selection.k(layers: m.loop.layers) { f["lcsb_k"] = .int(Int64(k)) }
        if let p = device.deviceProfile { f["device_profile"] = .string(p) }
        if let v = device.appVersion { f["app_version"] = .string(v) }
        var cfg = device.config
        cfg["contract"] = .int(3)
        cfg["train_rows"] = .int(Int64(data.train.count))
        cfg["held_out_rows"] = .int(Int64(data.heldOut.count))
        if let s = config.shuffleSeed { cfg["shuffle_seed"] = .string(String(s)) }
        cfg["layers_per_checkpoint"] = .int(Int64(config.layersPerCheckpoint))
        if let plan { cfg["lcsb_phases"] = .array(plan.phases.map { .array($0.map { .int(Int64($0)) }) }) }
        if let plan, plan.warmup > 0 { cfg["lcsb_warmup"] = .int(Int64(plan.warmup)) }
        f["config"] = .object(cfg)
        return f
    }

    private func emit(_ type: String, _ fields: [String: JSONValue]) throws {
        guard let recorder else { return }
        try recorder.emit(type, fields)
    }

    private func liveState() throws -> StateBuffer {
        guard let state else { throw TrainerError.badInput("call start() first") }
        return state
    }

    /// The message of the stop for a weights file changed under its mapping (nil: no change seen).
    public var weightsChangedMessage: String? { weightsLock.lock(); defer { weightsLock.unlock() }; return weightsStop }

    /// The step boundary's check of the memory-mapped weights file (`MappedWeights.checkChanged`: size,
    /// time, device and inode against those when it was mapped). Unchanged: nil. Changed: the message,
    /// and the first time the one `error` event (code weights_changed, fatal, the step); the mapping is
    /// stale from then on, so no loop call of this session reads it again (step, eval, generation).
    private func weightsCheck() throws -> String? {
        weightsLock.lock()
        defer { weightsLock.unlock() }
        if let m = weightsStop { return m }
        guard let why = loop.weights.checkChanged() else { return nil }
        let at = step < config.steps ? "before step \(step + 1)" : "after the last step"
        let m = "the weights file changed under the run (\(why)); stopped \(at), the checkpoint of step \(step) is kept: \(MappedWeights.changedAdvice)"
        weightsStop = m
        try emit("error", ["message": .string(String(m.prefix(4096))), "fatal": .bool(true), "code": .string("weights_changed"),
                           "step": .int(Int64(step))])
        return m
    }

    /// Run the next step, unless the run is done or the budget guard says pause or stop. Each call is a
    /// step boundary: the weights file changed since it was mapped stops the run (`.stopped`), the
    /// checkpoint of the steps done saved, before any program call.
    public func trainStep() throws -> StepOutcome {
        let state = try liveState()
        if let m = try weightsCheck() {
            try saveCheckpoint()
            return .stopped(reason: m)
        }
        guard step < config.steps else { return .finished }
        let before = [probes.footprint?.sample(), probes.available?.sample()].compactMap { $0 }
        if let budget {
            let decision = budget.decide(footprint: before.first { $0.probe == "ios_phys_footprint" }?.anonBytes,
                                         available: before.first { $0.probe == "ios_os_proc_available" }?.availableBytes,
                                         pressure: probes.pressure())
            var current = decision
            // Memory pressure lowers the working set (PressurePolicy: checkpoint groups, then LCSB k) before it pauses
            // or stops: a budget the plan is over walks the ladder now; an OS signal takes one notch, then the next
            // steps are measured (within the policy's cooldown a signal does not pause the run).
            let fp = before.first { $0.probe == "ios_phys_footprint" }?.anonBytes
            while case .stop = current, let n = pressure.next(working) {
                let predicted = budget.predictedPeak(footprint: fp ?? 0)
                try adapt(n, trigger: (fp ?? 0) > budget.budgetBytes ? "measured" : "predicted", measured: predicted)
                current = budget.decide(footprint: fp, available: before.first { $0.probe == "ios_os_proc_available" }?.availableBytes,
                                        pressure: probes.pressure())
            }
            if case .pause = current {
                if pressure.inCooldown(atStep: step) {
                    current = .proceed
                } else if let n = pressure.next(working) {
                    pressure.osAdapted(atStep: step)
                    try adapt(n, trigger: "os_signal", measured: fp ?? 0)
                    current = .proceed
                }
            }
            switch current {
            case .proceed: break
            case .pause(let reason):
                try emitMemory(before, step: nil)
                try saveCheckpoint()
                return .paused(reason: reason)
            case .stop(let reason):
                let why = "\(reason) with the smallest settings (\(working.description))"
                try emit("error", ["message": .string(why), "fatal": .bool(true), "code": .string("budget_exceeded"),
                                   "step": .int(Int64(step))])
                try saveCheckpoint()
                return .stopped(reason: why)
            }
        }
        let s = step
        let row = data.train[order.row(forStep: s)]
        let labels = row.labels ?? row.inputIds
        let t0 = monotonic()
        let loss: Float
        do {
            stateLock.lock()
            defer { stateLock.unlock() }
            loss = try loop.trainStep(inputIds: row.inputIds, labels: labels, lr: config.lr, state: state,
                                      selected: livePlan?.selected(forStep: s), padTokenId: padTokenId,
                                      layersPerCheckpoint: working.layersPerCheckpoint)
            stepsInState = s + 1
        } catch {
            // The step's first call refused: a generation beside training saw the weights file change between
            // two steps (its check holds `stateLock`), so the state holds the `s` steps done: the same clean stop.
            if loop.weights.stale != nil, let m = try weightsCheck() {
                try saveCheckpoint()
                return .stopped(reason: m)
            }
            var f = ErrorReport.fields(for: error, fatal: true, step: s, log: runtimeLog?.recent(ErrorReport.maxLogLines) ?? [])
            f["message"] = .string(String("step \(s) failed: \(ErrorReport.parts(of: error).message)".prefix(4096)))
            try? emit("error", f)
            throw error
        }
        let dt = max(0, monotonic() - t0)
        losses.append(loss.isFinite ? loss : nil)
        let tokens = TrainingData.targets(row)
        var fields: [String: JSONValue] = [
            "step": .int(Int64(s)), "loss": .number(Double(loss)), "step_time_s": .double(dt), "tokens": .int(Int64(tokens)),
            "tokens_per_s": .double(dt > 0 ? Double(tokens) / dt : 0), "lr": .double(Double(config.lr)),
        ]
        if let phase = livePlan?.phase(forStep: s) { fields["lcsb_phase"] = .int(Int64(phase)) }  // none on warm-up steps
        try emit("step", fields)
        let after = [probes.footprint?.sample(), probes.available?.sample()].compactMap { $0 }
        try emitMemory(after, step: s)
        let fp = after.first { $0.probe == "ios_phys_footprint" }
        budget?.observeStep(footprintAfter: fp?.anonBytes, peakAfter: fp?.peakBytes)
        step += 1
        onEvent?(.step(step: s, loss: loss, seconds: dt))
        onEvent?(.memory(footprintBytes: fp?.anonBytes, peakBytes: fp?.peakBytes,
                         availableBytes: after.first { $0.probe == "ios_os_proc_available" }?.availableBytes, pressure: probes.pressure()))
        if step % config.checkpointEvery == 0 || step == config.steps || checkpointEachStep() { try saveCheckpoint() }
        if step % config.checkpointEvery == 0, step < config.steps { try gateEvaluate() }
        return .trained(step: s, loss: loss)
    }

    /// Run the next steps with `n`'s working set: a `memory_adapted` event (its first step: the next one).
    private func adapt(_ n: Notch, trigger: String, measured: UInt64) throws {
        working = n.after
        if n.knob == "lcsb_k" { livePlan = try StepPlan.make(layers: manifest.loop.layers, k: n.after.lcsbK, policy: "cyclic") }
        let target = loop.runtime.backendName
        budget?.replan(plannedPeakBytes: (budget?.plannedPeakBytes ?? 0) - min(budget?.plannedPeakBytes ?? 0, PressurePolicy.plannerPeak(n.before, manifest: manifest, target: target))
                       + PressurePolicy.plannerPeak(n.after, manifest: manifest, target: target))
        var f: [String: JSONValue] = ["step": .int(Int64(step)), "knob": .string(n.knob), "from": n.before.json, "to": n.after.json,
                                      "measured_bytes": .int(Int64(measured)), "budget_bytes": .int(Int64(device.budgetBytes)),
                                      "trigger": .string(trigger)]
        if let p = n.predictedBytes { f["predicted_bytes"] = .int(Int64(p)) }
        try emit("memory_adapted", f)
        onEvent?(.memoryAdapted(step: step, knob: n.knob, from: n.before, to: n.after, trigger: trigger))
    }

    /// The gate's evaluation at a checkpoint during the run: an `eval` event; the state saved as the best so far
    /// (beside the checkpoint) before the point is recorded, when it is. A cancelled one is left out.
    private func gateEvaluate() throws {
        guard !data.heldOut.isEmpty, gateRecord.startLoss != nil, let state else { return }
        let r: EvalResult
        do {
            guard let e = try evaluate(initial: false, cancelled: evalCancelled) else { return }
            r = e
        } catch is EvalCancelled { return }
        if r.loss.isFinite, r.loss <= gateRecord.bestLoss, let recorder {
            try gateRecord.best.save(state: state.values, meta: CheckpointMeta(step: step, runId: recorder.runId, seq: recorder.nextSeq, losses: losses,
                                                                             stateNumel: manifest.state.numel, program: programName, programSha256: programSha256))
        }
        gateRecord.add(step: step, loss: r.loss)
    }

    /// After the held-out loss after the last step: the decision, the kept state made live (rolled back:
    /// state_init.bin's; kept best: the saved best) and checkpointed, a `gate` event, `.gate` to the screen.
    private func decideGate(endLoss: Double) throws {
        guard let start = gateRecord.startLoss, let state else { return }
        gateRecord.add(step: step, loss: endLoss)
        let d = GateDecision.decide(startStep: 0, startLoss: start, later: gateRecord.points)
        switch d.decision {
        case .kept: break
        case .rolledBack:
            let initial = try initialAdapterState().values
            try stateLock.withLock { try state.overwrite(with: initial) }
            try saveCheckpoint()
        case .keptBest:
            let (values, _) = try gateRecord.best.load(expectedNumel: manifest.state.numel, programSha256: programSha256)
            try stateLock.withLock { try state.overwrite(with: values) }
            try saveCheckpoint()
        }
        try emit("gate", d.eventFields)
        gateRecord.finished()
        gateDecision = d
        onEvent?(.gate(d))
    }

    private func emitMemory(_ samples: [MemorySample], step: Int?) throws {
        for s in samples { try emit("memory", s.eventFields(step: step)) }
    }

    /// Write the state and the run's position (atomically; a kill leaves the previous checkpoint).
    public func saveCheckpoint() throws {
        guard let checkpoint, let recorder, let state else { return }
        let meta = CheckpointMeta(step: step, runId: recorder.runId, seq: recorder.nextSeq, losses: losses,
                                  stateNumel: manifest.state.numel, program: programName, programSha256: programSha256)
        try checkpoint.save(state: state.values, meta: meta)
        onEvent?(.checkpointed(step: step))
    }

    /// End this session: checkpoint (unless it failed before any step) and `run_end`.
    public func finish(status: RunStatus, message: String? = nil) throws {
        guard state != nil else { return }
        if status != .failed || step > 0 { try saveCheckpoint() }
        var f: [String: JSONValue] = [
            "status": .string(status.rawValue), "steps_completed": .int(Int64(step)),
            "duration_s": .double(max(0, monotonic() - sessionStart)),
            "final_loss": losses.last.flatMap { $0 }.map { .double(Double($0)) } ?? .null,
        ]
        if let peak = budget?.peakFootprintBytes, peak > 0 { f["peak_bytes"] = .int(Int64(peak)) }
        if let message { f["message"] = .string(String(message.prefix(4096))) }
        try emit("run_end", f)
        onEvent?(.ended(status: status, message: message))
    }

    /// Send an `error` event for a failure outside a step (eval, generation, export, upload): the
    /// message, its code and the runtime's log lines (`ErrorReport`); nothing before `start()`.
    public func reportError(_ error: Error, fatal: Bool) {
        // A weights file changed under the run: its one event is the check's (sent now if not yet).
        if let f = error as? RuntimeFailure, f.code == "weights_changed" { _ = try? weightsCheck(); return }
        try? emit("error", ErrorReport.fields(for: error, fatal: fatal, step: step, log: runtimeLog?.recent(ErrorReport.maxLogLines) ?? []))
    }

    /// Step until done, paused, stopped, or `interrupt` returns a status (`.paused` when the app goes
    /// to the background or iOS ends a background task, `.cancelled` when the user stops); checked at
    /// step boundaries only. Ends the session with `run_end`.
    public func run(interrupt: () -> RunStatus? = { nil }) throws -> RunStatus {
        while true {
            if let status = interrupt() {
                try finish(status: status)
                return status
            }
            let outcome: StepOutcome
            do {
                outcome = try trainStep()
            } catch {
                try? finish(status: .failed, message: "\(error)")
                throw error
            }
            switch outcome {
            case .trained: continue
            case .finished:
                try finish(status: .completed)
                return .completed
            case .paused(let reason):
                try finish(status: .paused, message: reason)
                return .paused
            case .stopped(let reason):
                try finish(status: .failed, message: reason)
                return .failed
            }
        }
    }

    // MARK: before / after

    /// The rows a held-out loss reads: the first `Contract.heldOutEvalRows` of the held-out rows.
    public var evalRows: ArraySlice<DataRow> { data.heldOut.prefix(Contract.heldOutEvalRows) }

    /// Checkpoint after every step, not only every `checkpointEvery`: the app says yes while it runs in a
    /// background window iOS may end at any time (a background task, a BGProcessingTask), so an expiry loses
    /// at most the step in flight. Asked after each step, on the training thread.
    public var checkpointEachStep: () -> Bool = { false }

    /// state_init.bin's adapter (what the program starts from), loaded once.
    public func initialAdapterState() throws -> StateBuffer {
        initialLock.lock()
        defer { initialLock.unlock() }
        if let initialState { return initialState }
        let s = try StateBuffer.initial(manifest: manifest, programDirectory: programDirectory)
        initialState = s
        return s
    }

    /// Held-out loss with the initial adapter (`initial`, telemetry step 0) or the live one (step =
    /// steps done); nil without held-out rows. Emits an `eval` event.
    ///
    /// Reads the first `Contract.heldOutEvalRows` held-out rows (`evalRows`); `cancelled` is asked before
    /// each row (true: `EvalCancelled` is thrown, no event), `.evalRow` reports "row i of N".
    @discardableResult
    public func evaluate(initial: Bool, cancelled: () -> Bool = { false }) throws -> EvalResult? {
        guard !data.heldOut.isEmpty else { return nil }
        if let m = try weightsCheck() { throw RuntimeFailure(message: m, code: "weights_changed") }
        let s = initial ? try initialAdapterState() : try liveState()
        let t0 = monotonic()
        let rows = evalRows.map { (inputIds: $0.inputIds, labels: $0.labels ?? $0.inputIds) }
        let (loss, tokens) = try loop.evaluate(rows: rows, state: s, padTokenId: padTokenId, cancelled: cancelled,
                                               onRow: { [onEvent] i, n in onEvent?(.evalRow(initial: initial, row: i, rows: n)) })
        guard tokens > 0 else { return nil }
        let r = EvalResult(initial: initial, step: initial ? 0 : step, loss: loss, rows: rows.count, tokens: tokens,
                           seconds: max(0, monotonic() - t0))
        try emit("eval", ["step": .int(Int64(r.step)), "loss": .number(loss), "rows": .int(Int64(r.rows)),
                          "tokens": .int(Int64(tokens)), "eval_time_s": .double(r.seconds)])
        onEvent?(.eval(r))
        // The gate: the start's loss is the initial adapter's before the first step; after the last step it decides.
        if initial, step == 0 { gateRecord.started(loss: loss) }
        if !initial, step >= config.steps { try decideGate(endLoss: loss) }
        return r
    }

    /// The state a generation reads: state_init.bin's (never written), or a copy of the live state's
    /// generation entries taken between two steps (`LayerLoop.generationSnapshot`), with the steps it holds.
    private func generationState(initial: Bool) throws -> (StateBuffer, Int?) {
        if initial { return (try initialAdapterState(), nil) }
        return try stateLock.withLock {
            guard let live = liveStateStorage else { throw TrainerError.badInput("call start() first") }
            return (try loop.generationSnapshot(of: live), stepsInState)
        }
    }

    /// The ids that end a generation: EOS and `<|im_end|>` (none without a tokenizer).
    public var stopIds: Set<Int64> {
        guard let t = tokenizer else { return [] }
        var stop: Set<Int64> = [Int64(t.eosId)]
        if let e = t.base.tokenId(Contract.imEnd) { stop.insert(Int64(e)) }
        return stop
    }

    /// Greedy generation of up to `maxNewTokens` ids after `promptIds` with the initial or the live
    /// adapter; stops at EOS (and `<|im_end|>`), or when `cancel` is set (checked before each decode
    /// step); `onToken` gets each id as it is decoded. Loads the generation methods the first time.
    ///
    /// May run on its own thread while another thread trains this session (`run`/`trainStep`): it
    /// reads state_init.bin's state or a snapshot of the live one taken at a step boundary (the
    /// entries the generation methods bind), and its method calls interleave with the step's one by
    /// one (the loop serializes every runtime call, FIFO), so neither waits for the other to finish.
    public func generate(promptIds: [Int64], maxNewTokens: Int, initial: Bool, cancel: GenerationCancel? = nil,
                         onToken: ((Int64) -> Void)? = nil) throws -> GenerationResult {
        try runGeneration(promptIds: promptIds, maxNewTokens: maxNewTokens, initial: initial, cancel: cancel, onToken: onToken).result
    }

    private func runGeneration(promptIds: [Int64], maxNewTokens: Int, initial: Bool, cancel: GenerationCancel?,
                          onToken: ((Int64) -> Void)?, started: ((Int?) -> Void)? = nil) throws -> (result: GenerationResult, adapterStep: Int?) {
        guard manifest.canGenerate else { throw TrainerError.badInput("this program was exported without the generation methods; re-export it") }
        if cancel?.isCancelled == true {
            started?(nil)
            return (GenerationResult(ids: [], stop: .cancelled), nil)
        }
        // The weights file checked as at a step boundary: now if no step is in progress (idle, or between two
        // steps); else the training thread checks it after its step, and every program call after a change refuses.
        if stateLock.tryLock() {
            defer { stateLock.unlock() }
            if let m = try weightsCheck() { throw RuntimeFailure(message: m, code: "weights_changed") }
        } else if let why = loop.weights.stale {
            throw RuntimeFailure(message: "\(why) while it was memory-mapped: \(MappedWeights.changedAdvice)", code: "weights_changed")
        }
        try loop.loadGeneration()
        let (s, adapterStep) = try generationState(initial: initial)
        started?(adapterStep)
        let r = try loop.generate(prompt: promptIds, maxNewTokens: maxNewTokens, state: s, padTokenId: padTokenId, stopIds: stopIds,
                                  cancel: cancel, onToken: onToken)
        return (r, adapterStep)
    }

    /// The prompt as the program's tokenizer encodes it (BOS first for the byte tokenizer; `chat`: as
    /// a user turn of Qwen's ChatML followed by the assistant header), cut from the front so that
    /// `maxNewTokens` fit in seq_len; generated and decoded with the initial or the live adapter.
    ///
    /// Streams: `.generationStarted`, then per token `.token` (the id and the text it completed, decoded
    /// incrementally: never a broken UTF-8 character) to `onEvent` and `onToken`, then `.generated`
    /// with the whole text and how it stopped (`cancel`: `.cancelled` with the tokens so far). Safe
    /// beside a training run of this session on another thread (see `generate(promptIds:...)`).
    public func generate(prompt: String, maxNewTokens: Int = 32, initial: Bool, chat: Bool = false,
                         cancel: GenerationCancel? = nil, onToken: ((GeneratedToken) -> Void)? = nil) throws -> Generation {
        guard let t = tokenizer else { throw TrainerError.badInput("this program was exported without a tokenizer; re-export it with one") }
        let ids = try promptIds(prompt, maxNewTokens: maxNewTokens, chat: chat)
        let n = newTokens(maxNewTokens)
        let stop = stopIds
        let decoder = IncrementalTextDecoder(tokenizer: t.base, hidden: Set(stop.map { Int($0) }))
        var index = 0
        let (r, adapterStep) = try runGeneration(
            promptIds: ids.map(Int64.init), maxNewTokens: n, initial: initial, cancel: cancel,
            onToken: { [onEvent] id in
                let piece = GeneratedToken(initial: initial, index: index, id: id, text: (try? decoder.append(Int(id))) ?? "")
                index += 1
                onToken?(piece)
                onEvent?(.token(piece))
            },
            started: { [onEvent] step in onEvent?(.generationStarted(initial: initial, prompt: prompt, adapterStep: step)) })
        let visible = r.ids.map(Int.init).filter { !stop.contains(Int64($0)) }
        let g = Generation(initial: initial, prompt: prompt, ids: r.ids, text: (try? t.decode(visible)) ?? "", stop: r.stop,
                           adapterStep: adapterStep)
        onEvent?(.generated(g))
        return g
    }

    private func newTokens(_ maxNewTokens: Int) -> Int {
        let cap = manifest.generate?.maxTokens ?? manifest.seqLen
        return max(1, min(maxNewTokens, cap, manifest.seqLen - 1))
    }

    /// The prompt's ids (see `generate(prompt:...)`), cut from the front to leave room for the new tokens.
    public func promptIds(_ prompt: String, maxNewTokens: Int, chat: Bool = false) throws -> [Int] {
        guard let t = tokenizer else { throw TrainerError.badInput("this program was exported without a tokenizer; re-export it with one") }
        var ids: [Int] = t.bosId.map { [$0] } ?? []
        if chat, let start = t.base.tokenId(Contract.imStart), let end = t.base.tokenId(Contract.imEnd) {
            let nl: [Int] = t.encode("\n")
            ids.append(start)
            ids += t.encode("user\n")
            ids += t.encode(prompt)
            ids.append(end)
            ids += nl
            ids.append(start)
            ids += t.encode("assistant\n")
        } else {
            ids += t.encode(prompt)
        }
        let n = newTokens(maxNewTokens)
        if ids.count + n > manifest.seqLen { ids = Array(ids.suffix(manifest.seqLen - n)) }
        guard !ids.isEmpty else { throw TrainerError.badInput("the prompt is empty") }
        return ids
    }

    /// The live adapter (the state's param entries under their PEFT keys) as `adapter_config.json` +
    /// `adapter_model.safetensors` in `directory` (replaced as a whole).
    public func exportAdapter(to directory: URL) throws {
        try AdapterExporter.write(state: try liveState().values, manifest: manifest, to: directory)
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

/// The run the app resumes after it was killed (jetsam, reboot, swipe): settings and the name of its
/// rows file (the prepared rows, beside it: the user's text may be gone), in `AppPaths.latestRun`,
/// written atomically when a run starts and marked finished when it completes; with the program's
/// checkpoint it is all a resume needs.
public struct SavedRun: Codable, Equatable {
    public var program: String
    public var backend: String
    public var config: SessionConfig
    public var budgetMB: Int
    public var source: String
    public var heldOutFraction: Double
    public var splitSeed: UInt64
    /// The run's rows: a binary file (`RowsFile`) beside the saved run's JSON, by name. The JSON stays a few
    /// hundred bytes whatever the text (a 32 MB text is ~100 MB of rows as JSON: seconds of coding, a
    /// watchdog kill at launch when done on the main thread); the rows are written and read off the main
    /// thread only (`RowsFile.write`, `rows(besides:)`).
    public var rowsFile: String
    public var trainRows: Int
    public var heldOutRows: Int
    public var status: RunStatus?
    public var runId: String?

    public init(program: String, backend: String, config: SessionConfig, budgetMB: Int, source: String,
                heldOutFraction: Double, splitSeed: UInt64, rowsFile: String, trainRows: Int, heldOutRows: Int) {
        (self.program, self.backend, self.config, self.budgetMB, self.source) = (program, backend, config, budgetMB, source)
        (self.heldOutFraction, self.splitSeed) = (heldOutFraction, splitSeed)
        (self.rowsFile, self.trainRows, self.heldOutRows) = (rowsFile, trainRows, heldOutRows)
    }

    /// A new rows file name (one per run: a new run never overwrites the rows a saved run points at).
    public static func newRowsFile() -> String { "rows-\(UUID().uuidString.lowercased()).bin" }

    /// The rows file's location when the saved run's JSON is at `json`.
    public func rowsURL(besides json: URL) -> URL { json.deletingLastPathComponent().appendingPathComponent(rowsFile) }

    /// The run's rows, read from its rows file (off the main thread), checked against the counts saved.
    public func rows(besides json: URL) throws -> TrainingData {
        let d = try RowsFile.read(rowsURL(besides: json))
        guard d.train.count == trainRows, d.heldOut.count == heldOutRows else {
            throw TrainerError.badInput("\(rowsFile) has \(d.train.count) + \(d.heldOut.count) rows, the saved run \(trainRows) + \(heldOutRows); prepare the text again")
        }
        return d
    }

    /// Unfinished: a resume continues it.
    public var resumable: Bool { status == nil || status == .paused }

    /// The JSON only (no rows: see `rowsFile`).
    public func save(to url: URL) throws {
        let e = JSONEncoder()
        e.outputFormatting = [.sortedKeys]
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        try AtomicFiles.write(try e.encode(self), to: url)
    }

    public static func load(from url: URL) -> SavedRun? {
        guard let d = try? Data(contentsOf: url) else { return nil }
        return try? JSONDecoder().decode(SavedRun.self, from: d)
    }
}

/// A run's rows as a binary file: "TRROWS01", u32 train count, u32 held-out count, then per row (train
/// rows first) u32 n, u8 has-labels, n int32 input ids, and n int32 labels when it has them; little-endian.
/// Written atomically. Coding it is a copy of the ids (no text parsing), done off the main thread.
public enum RowsFile {
    static let magic = Array("TRROWS01".utf8)

    public static func encode(_ data: TrainingData) throws -> Data {
        var out = Data()
        out.reserveCapacity(16 + (data.train + data.heldOut).reduce(0) { $0 + 5 + 4 * $1.inputIds.count * ($1.labels == nil ? 1 : 2) })
        out.append(contentsOf: magic)
        func u32(_ v: Int) { var x = UInt32(v).littleEndian; withUnsafeBytes(of: &x) { out.append(contentsOf: $0) } }
        func ids(_ a: [Int64]) throws {
            var v = try a.map { (x: Int64) -> Int32 in
                guard let y = Int32(exactly: x) else { throw TrainerError.badInput("token id \(x) does not fit a rows file") }
                return y.littleEndian
            }
            v.withUnsafeMutableBytes { out.append(contentsOf: $0) }
        }
        u32(data.train.count)
        u32(data.heldOut.count)
        for r in data.train + data.heldOut {
            u32(r.inputIds.count)
            out.append(r.labels == nil ? 0 : 1)
            try ids(r.inputIds)
            if let l = r.labels {
                guard l.count == r.inputIds.count else { throw TrainerError.badInput("a row's labels (\(l.count)) and ids (\(r.inputIds.count)) differ in length") }
                try ids(l)
            }
        }
        return out
    }

    public static func decode(_ d: Data, name: String = "rows file") throws -> TrainingData {
        try d.withUnsafeBytes { (raw: UnsafeRawBufferPointer) -> TrainingData in
            var at = 0
            func bad(_ why: String) -> Error { TrainerError.badInput("\(name) is damaged (\(why)); prepare the text again") }
            func need(_ n: Int) throws { if n < 0 || at + n > raw.count { throw bad("truncated at byte \(at)") } }
            func u32() throws -> Int { try need(4); defer { at += 4 }; return Int(UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: at, as: UInt32.self))) }
            func ids(_ n: Int) throws -> [Int64] {
                try need(4 * n)
                var out = [Int64](repeating: 0, count: n)
                for i in 0..<n { out[i] = Int64(Int32(littleEndian: raw.loadUnaligned(fromByteOffset: at + 4 * i, as: Int32.self))) }
                at += 4 * n
                return out
            }
            try need(8)
            guard Array(raw[0..<8]) == magic else { throw bad("not a rows file") }
            at = 8
            let (nTrain, nHeld) = (try u32(), try u32())
            var rows: [DataRow] = []
            rows.reserveCapacity(min(nTrain + nHeld, raw.count / 5))
            for _ in 0..<(nTrain + nHeld) {
                let n = try u32()
                try need(1)
                let flag = raw[at]
                at += 1
                guard flag <= 1 else { throw bad("bad row flag \(flag)") }
                let input = try ids(n)
                var labels: [Int64]?
                if flag == 1 { labels = try ids(n) }
                rows.append(DataRow(inputIds: input, labels: labels))
            }
            guard at == raw.count else { throw bad("\(raw.count - at) bytes after the last row") }
            return TrainingData(train: Array(rows[0..<nTrain]), heldOut: Array(rows[nTrain...]))
        }
    }

    public static func write(_ data: TrainingData, to url: URL) throws {
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        try AtomicFiles.write(try encode(data), to: url)
    }

    public static func read(_ url: URL) throws -> TrainingData {
        try decode(try Data(contentsOf: url, options: .mappedIfSafe), name: url.lastPathComponent)
    }
}
