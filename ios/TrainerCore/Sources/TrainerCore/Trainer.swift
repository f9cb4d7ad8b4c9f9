import Foundation

/// How long and how to train.
public struct RunConfig: Equatable {
    public var steps: Int
    public var lr: Float
    /// Save a checkpoint every this many steps (and at the end of every session).
    public var checkpointEvery: Int
    /// nil: rows in file order; else a seeded permutation per epoch (`DataOrder`).
    public var shuffleSeed: UInt64?

    public init(steps: Int, lr: Float, checkpointEvery: Int = 10, shuffleSeed: UInt64? = nil) {
        (self.steps, self.lr, self.checkpointEvery, self.shuffleSeed) = (steps, lr, max(1, checkpointEvery), shuffleSeed)
    }
}

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
public enum RunStatus: String, Equatable {
    case completed, failed, cancelled, paused
}

/// Memory readings the trainer takes around each step (any may be nil: probe not available).
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

/// Drives an exported training program the way the manifest (schema_version 2) says, one step at a
/// time. The trainer owns the flat float32 state: from the checkpoint when there is one, else from
/// `state.init_file`. Per step: pick the LCSB method, pad the row, call it with (ids, labels, lr,
/// every state entry's slice), copy each returned entry into its slice, record the loss;
/// checkpoints (the state array, atomically), budget guard, telemetry. Mirrors the host runner
/// (`toolchain/training/program.py`, contract v2 era), which plays the phone on Linux.
public final class Trainer {
    public let manifest: ProgramManifest
    public let programName: String
    public let config: RunConfig
    public private(set) var nextStep = 0
    public private(set) var losses: [Float?] = []
    public private(set) var recorder: TelemetryRecorder?
    public private(set) var started = false
    /// The LoRA parameters and optimizer state (`manifest.state`), empty until `start()`.
    public private(set) var state: [Float] = []

    private let runtime: TrainingRuntime
    private let programDirectory: URL
    private let entryIndex: [String: Int]
    private let examples: [PaddedExample]
    private let order: DataOrder
    private let schedule: MethodSchedule
    private let device: DeviceInfo
    private let checkpoint: CheckpointStore?
    private let sinks: [TelemetrySink]
    private let usedSeq: ((String) -> Int)?
    private let probes: MemoryProbes
    private let budget: BudgetGuard?
    private let monotonic: () -> Double
    private let clock: () -> Double
    private var sessionStart = 0.0

    /// - Parameters:
    ///   - programDirectory: the exported program directory (holds `state.init_file`).
    ///   - usedSeq: the first seq of a run id not yet used by any queued or sent event (the
    ///     telemetry queue's `nextSeq(runId:)`), so a resumed run never reuses a seq.
    public init(manifest: ProgramManifest, programName: String, programDirectory: URL, runtime: TrainingRuntime,
                examples: [PaddedExample], config: RunConfig, device: DeviceInfo, checkpoint: CheckpointStore? = nil,
                telemetry sinks: [TelemetrySink] = [], usedSeq: ((String) -> Int)? = nil,
                probes: MemoryProbes = MemoryProbes(), budget: BudgetGuard? = nil,
                clock: @escaping () -> Double = { Date().timeIntervalSince1970 },
                monotonic: @escaping () -> Double = { ProcessInfo.processInfo.systemUptime }) throws {
        guard !examples.isEmpty else { throw TrainerError.badInput("no training rows; give a JSONL file with at least one row") }
        guard config.steps >= 1, config.lr >= 0, config.lr.isFinite else {
            throw TrainerError.badInput("steps must be >= 1 and lr a finite number >= 0")
        }
        (self.manifest, self.programName, self.runtime, self.examples, self.config) = (manifest, programName, runtime, examples, config)
        self.programDirectory = programDirectory
        entryIndex = Dictionary(uniqueKeysWithValues: manifest.state.entries.enumerated().map { ($1.name, $0) })
        (self.device, self.checkpoint, self.sinks, self.usedSeq) = (device, checkpoint, sinks, usedSeq)
        (self.probes, self.budget, self.clock, self.monotonic) = (probes, budget, clock, monotonic)
        order = DataOrder(rowCount: examples.count, seed: config.shuffleSeed)
        schedule = MethodSchedule(manifest: manifest)
    }

    /// Take the state from the checkpoint if there is one (resuming its run: step, run id, seq,
    /// losses), else from `state.init_file` (a new run: `run_start`); then load every train method.
    /// Returns true when it resumed.
    @discardableResult
    public func start(runId newRunId: String? = nil) throws -> Bool {
        precondition(!started, "start() runs once per Trainer")
        sessionStart = monotonic()
        var runId = newRunId ?? TelemetryRecorder.newRunId(platform: device.platform)
        var seq = 0
        var resumed = false
        if let checkpoint, checkpoint.exists {
            let (saved, meta) = try checkpoint.load(expectedNumel: manifest.state.numel, programSha256: programSha256)
            state = saved
            (nextStep, runId, seq, losses) = (meta.step, meta.runId, meta.seq, meta.losses)
            resumed = true
        } else {
            state = try StateFile.loadInitial(manifest: manifest, programDirectory: programDirectory)
        }
        try runtime.load(methods: manifest.trainMethodNames)
        seq = max(seq, usedSeq?(runId) ?? 0)
        recorder = try TelemetryRecorder(runId: runId, startSeq: seq, sinks: sinks, clock: clock, monotonic: monotonic)
        started = true
        if !resumed { try emit("run_start", runStartFields()) }
        return resumed
    }

    /// Identifies the export in checkpoints (`ProgramManifest.exportSha256`).
    private var programSha256: String? { manifest.exportSha256 }

    private func runStartFields() -> [String: JSONValue] {
        let m = manifest
        var f: [String: JSONValue] = [
            "model": .string(m.model.source), "method": .string("mesp"), "backend": .string(runtime.backendName),
            "seq_len": .int(Int64(m.seqLen)), "rank": .int(Int64(m.lora.rank)),
            "targets": .array(m.lora.targets.map { .string($0) }), "optimizer": .string(m.optimizer.kind),
            "lr": .double(Double(config.lr)), "quant": .string(m.quant.kind), "steps_planned": .int(Int64(config.steps)),
            "platform": .string(device.platform), "device_model": .string(device.deviceModel), "os": .string(device.os),
            "total_ram_bytes": .int(Int64(device.totalRamBytes)), "budget_bytes": .int(Int64(device.budgetBytes)),
            "program": .string(programName),
        ]
        if let k = m.lcsb?.k ?? m.lcsb?.phases.map(\.count).max() { f["lcsb_k"] = .int(Int64(k)) }
        if let p = device.deviceProfile { f["device_profile"] = .string(p) }
        if let v = device.appVersion { f["app_version"] = .string(v) }
        if !device.config.isEmpty { f["config"] = .object(device.config) }
        return f
    }

    private func emit(_ type: String, _ fields: [String: JSONValue]) throws {
        guard let recorder else { return }
        try recorder.emit(type, fields)
    }

    /// Run the next step, unless the run is done or the budget guard says pause or stop.
    public func step() throws -> StepOutcome {
        precondition(started, "call start() first")
        guard nextStep < config.steps else { return .finished }
        let before = [probes.footprint?.sample(), probes.available?.sample()].compactMap { $0 }
        if let budget {
            let decision = budget.decide(footprint: before.first { $0.probe == "ios_phys_footprint" }?.anonBytes,
                                         available: before.first { $0.probe == "ios_os_proc_available" }?.availableBytes,
                                         pressure: probes.pressure())
            switch decision {
            case .proceed: break
            case .pause(let reason):
                try emitMemory(before, step: nil)
                try saveCheckpoint()
                return .paused(reason: reason)
            case .stop(let reason):
                try emit("error", ["message": .string(reason), "fatal": .bool(true), "code": .string("budget_exceeded"),
                                   "step": .int(Int64(nextStep))])
                try saveCheckpoint()
                return .stopped(reason: reason)
            }
        }
        let step = nextStep
        let (method, phase) = schedule.method(forStep: step)
        let example = examples[order.row(forStep: step)]
        let t0 = monotonic()
        let loss: Float
        do {
            let outputs = try call(method, example)
            loss = try apply(outputs, of: method)
        } catch {
            try? emit("error", ["message": .string("\(method) failed at step \(step): \(error)"), "fatal": .bool(true),
                                "code": .string("runtime_error"), "step": .int(Int64(step))])
            throw error
        }
        let dt = max(0, monotonic() - t0)
        losses.append(loss.isFinite ? loss : nil)
        var fields: [String: JSONValue] = [
            "step": .int(Int64(step)), "loss": .number(Double(loss)), "step_time_s": .double(dt),
            "tokens": .int(Int64(example.tokens)), "tokens_per_s": .double(dt > 0 ? Double(example.tokens) / dt : 0),
            "lr": .double(Double(config.lr)),
        ]
        if let phase { fields["lcsb_phase"] = .int(Int64(phase)) }
        try emit("step", fields)
        let after = [probes.footprint?.sample(), probes.available?.sample()].compactMap { $0 }
        try emitMemory(after, step: step)
        let fp = after.first { $0.probe == "ios_phys_footprint" }
        budget?.observeStep(footprintAfter: fp?.anonBytes, peakAfter: fp?.peakBytes)
        nextStep += 1
        if nextStep % config.checkpointEvery == 0 || nextStep == config.steps { try saveCheckpoint() }
        return .trained(step: step, loss: loss)
    }

    /// One call of `method`: inputs in the manifest's order (ids, labels, lr, every state entry as a
    /// slice of the state array, not copied). The inputs go out of scope on return, so the state is
    /// not shared (copied on write) when `apply` writes into it.
    private func call(_ method: String, _ example: PaddedExample) throws -> [TensorValue] {
        var inputs: [TensorValue] = [.int64("input_ids", example.inputIds), .int64("labels", example.labels),
                                     .float32("lr", [config.lr], shape: [1])]
        inputs.reserveCapacity(3 + manifest.state.entries.count)
        for e in manifest.state.entries {
            inputs.append(.float32(e.name, state[e.offset..<(e.offset + e.count)], shape: e.shape))
        }
        return try runtime.execute(method: method, inputs: inputs)
    }

    /// Check every output first (loss float32[1] first, then known entries of the right size, each
    /// once), then copy each entry into its slice: a bad output leaves the state untouched.
    /// Returns the loss.
    private func apply(_ outputs: [TensorValue], of method: String) throws -> Float {
        func fail(_ why: String) -> TrainerError { .runtime("\(method) \(why); re-export the program or update the app") }
        guard let first = outputs.first, first.name == "loss", let lossValues = first.floats, lossValues.count == 1 else {
            throw fail("did not return the loss (float32[1]) as its first output")
        }
        var seen = Set<String>()
        var updates: [(ProgramManifest.StateEntry, ArraySlice<Float>)] = []
        for out in outputs.dropFirst() {
            guard let i = entryIndex[out.name] else { throw fail("returned '\(out.name)', which is not a state entry") }
            let e = manifest.state.entries[i]
            guard let values = out.floats else { throw fail("returned \(out.name) as \(out.dtype), not float32") }
            guard values.count == e.count else {
                throw fail("returned \(values.count) values for \(out.name), the entry holds \(e.count)")
            }
            guard seen.insert(out.name).inserted else { throw fail("returned \(out.name) twice") }
            updates.append((e, values))
        }
        for (e, values) in updates { state.replaceSubrange(e.offset..<(e.offset + e.count), with: values) }
        return lossValues.first!
    }

    private func emitMemory(_ samples: [MemorySample], step: Int?) throws {
        for s in samples { try emit("memory", s.eventFields(step: step)) }
    }

    /// Write the state and the run's position (atomically; a kill leaves the previous checkpoint).
    public func saveCheckpoint() throws {
        guard let checkpoint, let recorder else { return }
        let meta = CheckpointMeta(step: nextStep, runId: recorder.runId, seq: recorder.nextSeq, losses: losses,
                                  stateNumel: manifest.state.numel, program: programName, programSha256: programSha256)
        try checkpoint.save(state: state, meta: meta)
    }

    /// End this session: checkpoint (unless failed before any state exists) and `run_end`.
    public func finish(status: RunStatus, message: String? = nil) throws {
        guard started else { return }
        if status != .failed || nextStep > 0 { try saveCheckpoint() }
        var f: [String: JSONValue] = [
            "status": .string(status.rawValue), "steps_completed": .int(Int64(nextStep)),
            "duration_s": .double(max(0, monotonic() - sessionStart)),
            "final_loss": losses.last.flatMap { $0 }.map { .double(Double($0)) } ?? .null,
        ]
        if let peak = budget?.peakFootprintBytes, peak > 0 { f["peak_bytes"] = .int(Int64(peak)) }
        if let message { f["message"] = .string(String(message.prefix(4096))) }
        try emit("run_end", f)
    }

    /// Step until done, paused, stopped, or `interrupt` returns a status (`.paused` when iOS ends a
    /// background task, `.cancelled` when the user stops). Ends the session with `run_end`.
    public func run(interrupt: () -> RunStatus? = { nil }, onStep: (Int, Float) -> Void = { _, _ in }) throws -> RunStatus {
        while true {
            if let status = interrupt() {
                try finish(status: status)
                return status
            }
            let outcome: StepOutcome
            do {
                outcome = try step()
            } catch {
                try? finish(status: .failed, message: "\(error)")
                throw error
            }
            switch outcome {
            case .trained(let s, let loss): onStep(s, loss)
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

    /// Write the trained adapter (PEFT layout) from the current state.
    public func exportAdapter(to directory: URL) throws {
        precondition(started, "call start() first")
        try AdapterExporter.write(state: state, manifest: manifest, to: directory)
    }
}
