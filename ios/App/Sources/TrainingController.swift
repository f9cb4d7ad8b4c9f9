import Foundation
import SwiftUI
import TrainerCore

/// Settings of the next run (kept in UserDefaults by the view).
struct RunSettings: Equatable {
    var program = ""
    var dataFile = ""
    var backend = "executorch"          // executorch | coreml
    var steps = 100
    var lr = 1e-4
    var budgetMB = 2048
    var checkpointEvery = 10
    var telemetryURL = ""               // e.g. http://192.168.1.20:8765/v1/events ; empty: no upload
    var telemetryToken = ""
}

/// Runs TrainerCore's `Trainer` on a serial background queue and publishes progress to the UI.
/// Everything that touches the trainer, the runtime or the telemetry queue happens on `work`.
@MainActor
final class TrainingController: ObservableObject {
    @Published private(set) var programs: [String] = []
    @Published private(set) var dataFiles: [String] = []
    @Published private(set) var running = false
    @Published private(set) var status = "Idle"
    @Published private(set) var step = 0
    @Published private(set) var losses: [Float] = []
    @Published private(set) var footprintMB: Double?
    @Published private(set) var availableMB: Double?
    @Published private(set) var pressure = MemoryPressure.normal
    @Published private(set) var lastAdapter: URL?

    nonisolated let paths: AppPaths
    private let work = DispatchQueue(label: "org.onphonellm.trainer.work", qos: .userInitiated)
    private let monitor = MemoryPressureMonitor()
    private let stopLock = NSLock()
    private nonisolated(unsafe) var stopRequest: RunStatus?
    private var lastSettings: RunSettings?

    init() {
        let docs = FileManager.default.urls(for: .documentDirectory, in: .userDomainMask)[0]
        paths = AppPaths(documents: docs)
        for dir in [paths.programs, paths.data] {
            try? FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        }
        monitor.start()
        refresh()
    }

    func refresh() {
        programs = paths.programNames()
        dataFiles = paths.dataFiles()
    }

    /// Stop at the next step boundary: `.cancelled` (user) or `.paused` (background time is up).
    nonisolated func requestStop(_ status: RunStatus) {
        stopLock.lock()
        stopRequest = status
        stopLock.unlock()
    }

    nonisolated func requestPause(reason: String) { requestStop(.paused) }

    private nonisolated func takeStopRequest() -> RunStatus? {
        stopLock.lock()
        defer { stopLock.unlock() }
        let s = stopRequest
        stopRequest = nil
        return s
    }

    func start(_ settings: RunSettings, background: Bool = false, completion: ((Bool) -> Void)? = nil) {
        guard !running else { return }
        running = true
        lastSettings = settings
        status = "Loading \(settings.program)"
        losses = []
        let monitor = self.monitor
        let paths = self.paths
        work.async { [weak self] in
            let finished: Bool
            do {
                finished = try Self.train(settings, paths: paths, monitor: monitor, background: background, controller: self)
            } catch {
                finished = false
                Task { @MainActor in self?.status = "Error: \(error)" }
            }
            Task { @MainActor in
                self?.running = false
                completion?(finished)
            }
        }
    }

    /// Continue the last (or the saved) run from its checkpoint inside a BGProcessingTask.
    nonisolated func resumeInBackground(completion: @escaping (Bool) -> Void) {
        Task { @MainActor in
            guard let settings = self.lastSettings ?? Self.savedSettings() else { return completion(true) }
            self.start(settings, background: true, completion: completion)
        }
    }

    static func savedSettings() -> RunSettings? {
        let d = UserDefaults.standard
        guard let program = d.string(forKey: "program"), !program.isEmpty,
              let data = d.string(forKey: "dataFile"), !data.isEmpty else { return nil }
        var s = RunSettings()
        s.program = program
        s.dataFile = data
        s.backend = d.string(forKey: "backend") ?? s.backend
        s.steps = d.object(forKey: "steps") as? Int ?? s.steps
        s.lr = d.object(forKey: "lr") as? Double ?? s.lr
        s.budgetMB = d.object(forKey: "budgetMB") as? Int ?? s.budgetMB
        s.telemetryURL = d.string(forKey: "telemetryURL") ?? ""
        s.telemetryToken = d.string(forKey: "telemetryToken") ?? ""
        return s
    }

    /// What one session needs: the trainer and where its telemetry goes.
    private struct Session {
        let trainer: Trainer
        let footprint: FootprintProbe
        let queue: TelemetryQueue?
        let endpoint: URL?
    }

    private nonisolated static func makeSession(_ s: RunSettings, paths: AppPaths, monitor: MemoryPressureMonitor,
                                                background: Bool) throws -> Session {
        let dir = paths.programs.appendingPathComponent(s.program)
        let manifest = try ProgramManifest.load(directory: dir)
        let rows = try DataRow.parseJSONL(try Data(contentsOf: paths.data.appendingPathComponent(s.dataFile)), source: s.dataFile)
        let examples = try Batcher(manifest: manifest).padAll(rows, source: s.dataFile)
        let runtime = try makeRuntime(backend: s.backend, directory: dir, manifest: manifest)
        // Every event goes to the log; the upload queue only exists with a server to drain it.
        let log = TelemetryLog(url: paths.telemetryLog)
        let endpoint = s.telemetryURL.isEmpty ? nil : URL(string: s.telemetryURL)
        let queue = try endpoint.map { _ in try TelemetryQueue(directory: paths.telemetryQueue) }
        var sinks: [TelemetrySink] = [log]
        if let queue { sinks.append(queue) }
        let budget = UInt64(s.budgetMB) << 20
        let footprint = FootprintProbe()
        let trainer = try Trainer(
            manifest: manifest, programName: s.program, programDirectory: dir, runtime: runtime, examples: examples,
            config: RunConfig(steps: s.steps, lr: Float(s.lr), checkpointEvery: s.checkpointEvery),
            device: DeviceFacts.info(budgetBytes: budget, background: background),
            checkpoint: CheckpointStore(url: paths.checkpoint(program: s.program)),
            telemetry: sinks,
            usedSeq: { runId in max(log.nextSeq(runId: runId), queue?.nextSeq(runId: runId) ?? 0) },
            probes: MemoryProbes(footprint: footprint, available: AvailableProbe(monitor: monitor), pressure: { monitor.level }),
            budget: BudgetGuard(budgetBytes: budget, plannedPeakBytes: (footprint.sample()?.anonBytes ?? 0) + manifest.plannedPeakBytes))
        return Session(trainer: trainer, footprint: footprint, queue: queue, endpoint: endpoint)
    }

    /// The whole session, on `work`. Returns true when the run completed.
    private nonisolated static func train(_ s: RunSettings, paths: AppPaths, monitor: MemoryPressureMonitor,
                                          background: Bool, controller: TrainingController?) throws -> Bool {
        let session = try makeSession(s, paths: paths, monitor: monitor, background: background)
        let trainer = session.trainer
        // During the run: one try per flush, so a missing server never stalls training.
        let uploader = session.queue.flatMap { queue in
            session.endpoint.map { TelemetryUploader(queue: queue, endpoint: $0, token: s.telemetryToken,
                                                     transport: URLSessionTransport(), maxAttempts: 1) }
        }
        try trainer.start()
        var thermal = ""
        var status: RunStatus = .completed
        var message: String?
        loop: while true {
            if let stop = controller?.takeStopRequest() { status = stop; break }
            if DeviceFacts.thermalState != thermal {
                thermal = DeviceFacts.thermalState
                try trainer.recorder?.emit("thermal", ["state": .string(thermal)])
            }
            let outcome: StepOutcome
            do {
                outcome = try trainer.step()
            } catch {
                try? trainer.finish(status: .failed, message: "\(error)")
                throw error
            }
            switch outcome {
            case .trained(let step, let loss):
                if step % 10 == 0, let battery = DeviceFacts.batteryFields() { try trainer.recorder?.emit("battery", battery) }
                if step % 10 == 9 { _ = try? uploader?.flush() }
                publish(step: step, loss: loss, of: s.steps, footprint: session.footprint, monitor: monitor, to: controller)
            case .finished: break loop
            case .paused(let why): status = .paused; message = why; break loop
            case .stopped(let why): status = .failed; message = why; break loop
            }
        }
        try trainer.finish(status: status, message: message)
        var adapter: URL?
        if status == .completed, let runId = trainer.recorder?.runId {
            adapter = paths.adapter(runId: runId)
            try trainer.exportAdapter(to: adapter!)
        }
        if let endpoint = session.endpoint, let queue = session.queue {
            // End of session: retry with backoff (1, 2, 4, 8 s) before leaving events for next time.
            let flush = TelemetryUploader(queue: queue, endpoint: endpoint, token: s.telemetryToken,
                                          transport: URLSessionTransport(), maxAttempts: 5)
            _ = try? flush.flush()
        }
        if status == .paused { BackgroundTraining.schedule() }
        let final = "\(status.rawValue)" + (message.map { ": \($0)" } ?? "")
        Task { @MainActor in
            controller?.status = final.prefix(1).uppercased() + final.dropFirst()
            controller?.lastAdapter = adapter
        }
        return status == .completed
    }

    private nonisolated static func publish(step: Int, loss: Float, of steps: Int, footprint: FootprintProbe,
                                            monitor: MemoryPressureMonitor, to controller: TrainingController?) {
        let sample = footprint.sample()
        let available = os_proc_available_memory_mb()
        let pressure = monitor.level
        Task { @MainActor in
            controller?.step = step + 1
            controller?.losses.append(loss)
            controller?.footprintMB = sample.map { Double($0.anonBytes ?? 0) / 1_048_576 }
            controller?.availableMB = available
            controller?.pressure = pressure
            controller?.status = "Step \(step + 1)/\(steps), loss \(String(format: "%.4f", loss))"
        }
    }

    private nonisolated static func makeRuntime(backend: String, directory: URL, manifest: ProgramManifest) throws -> TrainingRuntime {
        switch backend {
        case "coreml":
            let done = DispatchSemaphore(value: 0)
            let box = ResultBox()
            Task.detached {
                do { box.result = .success(try await CoreMLRuntime.make(programDirectory: directory, manifest: manifest)) }
                catch { box.result = .failure(error) }
                done.signal()
            }
            done.wait()
            let result = box.result
            return try result.get()
        default:
            guard let program = manifest.program(target: "executorch") else {
                throw TrainerError.badInput("this program has no ExecuTorch export; export it with --target executorch")
            }
            return try ExecuTorchRuntime(programFile: directory.appendingPathComponent(program.file), manifest: manifest)
        }
    }

    /// Forget the saved checkpoint of a program (the next run starts over).
    func resetRun(program: String) {
        try? FileManager.default.removeItem(at: paths.checkpoint(program: program))
        status = "Checkpoint of \(program) deleted"
    }
}

/// Hands a value from an async task to the thread waiting for it (guarded by the semaphore).
private final class ResultBox: @unchecked Sendable {
    var result: Result<TrainingRuntime, Error> = .failure(TrainerError.runtime("Core ML did not load"))
}

private func os_proc_available_memory_mb() -> Double? {
    let bytes = AvailableProbe.availableBytes()
    return bytes > 0 ? Double(bytes) / 1_048_576 : nil
}
