import Foundation

/// A training run as the app runs it: the layer loop (`LayerLoop`) over the program's
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

    let programDirectory: URL
    private let order: DataOrder
    private let device: DeviceInfo
    private let checkpoint: CheckpointStore?
    private let sinks: [TelemetrySink]
    private let usedSeq: ((String) -> Int)?
    private let probes: MemoryProbes
    private let budget: MemoryGuard?
    let monotonic: () -> Double
    private let clock: () -> Double
    private var sessionStart = 0.0
    var initialState: StateBuffer?
    let initialLock = NSLock()
    /// Held while a step updates the state (and while `start()` sets it); a generation takes its
    /// snapshot of the live state under it, so it sees the state between two steps, never inside one.
    /// FIFO: a snapshot waits for at most the step in progress.
    let stateLock = FairLock()
    var liveStateStorage: StateBuffer?
    /// Steps whose updates are in the live state (under `stateLock`).
    var stepsInState = 0
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
    ///   - priority: the loop's `RuntimeGate` (a generation beside training goes first); tests pass one with their own clock.
    public init(programDirectory: URL, programName: String, runtime: ProgramRuntime, data: TrainingData, config: SessionConfig,
                device: DeviceInfo, checkpoint: CheckpointStore? = nil, telemetry sinks: [TelemetrySink] = [],
                usedSeq: ((String) -> Int)? = nil, probes: MemoryProbes = MemoryProbes(), budget: MemoryGuard? = nil,
                clock: @escaping () -> Double = { Date().timeIntervalSince1970 },
                monotonic: @escaping () -> Double = { ProcessInfo.processInfo.systemUptime },
                weightsIdentity: FileIdentitySource? = nil, priority: RuntimeGate = RuntimeGate()) throws {
        guard !data.train.isEmpty else { throw TrainerError.badInput("no training rows; give a longer text or more conversations") }
        guard config.steps >= 1, config.lr >= 0, config.lr.isFinite else { throw TrainerError.badInput("steps must be >= 1 and lr a finite number >= 0") }
        guard config.layersPerCheckpoint >= 1 else {
            throw TrainerError.badInput("layers per checkpoint must be >= 1 (1 keeps every selected layer's input), got \(config.layersPerCheckpoint)")
        }
        let loop = try LayerLoop(programDirectory: programDirectory, runtime: runtime, identitySource: weightsIdentity, priority: priority)
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

    func emit(_ type: String, _ fields: [String: JSONValue]) throws {
        guard let recorder else { return }
        try recorder.emit(type, fields)
    }

    func liveState() throws -> StateBuffer {
        guard let state else { throw TrainerError.badInput("call start() first") }
        return state
    }

    /// The message of the stop for a weights file changed under its mapping (nil: no change seen).
    public var weightsChangedMessage: String? { weightsLock.lock(); defer { weightsLock.unlock() }; return weightsStop }

    /// The step boundary's check of the memory-mapped weights file (`MappedWeights.checkChanged`: size,
    /// time, device and inode against those when it was mapped). Unchanged: nil. Changed: the message,
    /// and the first time the one `error` event (code weights_changed, fatal, the step); the mapping is
    /// stale from then on, so no loop call of this session reads it again (step, eval, generation).
    func weightsCheck() throws -> String? {
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
    func decideGate(endLoss: Double) throws {
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
    /// step boundaries only. Ends the session with `run_end`; returns what that event says (`RunOutcome`).
    public func run(interrupt: () -> RunStatus? = { nil }) throws -> RunOutcome {
        while true {
            if let status = interrupt() {
                try finish(status: status)
                return outcome(status)
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
                return self.outcome(.completed)
            case .paused(let reason):
                try finish(status: .paused, message: reason)
                return self.outcome(.paused, message: reason)
            case .stopped(let reason):
                try finish(status: .failed, message: reason)
                return self.outcome(.failed, message: reason)
            }
        }
    }

    /// The run's outcome as `finish` reported it in `run_end`: the status, the steps done, the last step's loss.
    private func outcome(_ status: RunStatus, message: String? = nil) -> RunOutcome {
        RunOutcome(status: status, stepsCompleted: step, finalLoss: losses.last.flatMap { $0 }, message: message)
    }

    /// Checkpoint after every step, not only every `checkpointEvery`: the app says yes while it runs in a
    /// background window iOS may end at any time (a background task, a BGProcessingTask), so an expiry loses
    /// at most the step in flight. Asked after each step, on the training thread.
    public var checkpointEachStep: () -> Bool = { false }

    /// The live adapter (the state's param entries under their PEFT keys) as `adapter_config.json` +
    /// `adapter_model.safetensors` in `directory` (replaced as a whole).
    public func exportAdapter(to directory: URL) throws {
        try AdapterExporter.write(state: try liveState().values, manifest: manifest, to: directory)
    }
}
