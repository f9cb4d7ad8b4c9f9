import Foundation
import SwiftUI
import TrainerCore
import UIKit

/// Settings of the next run (kept in UserDefaults by the view).
struct RunSettings: Equatable {
    var program = ""
    var backend = "executorch"          // executorch | coreml
    var steps = 0                       // <= 0: the program's (manifest defaults.steps, SessionConfig.resolvingDefaults)
    var lr = 0.0                        // <= 0: the program's (manifest defaults.lr / optimizer.default_lr)
    var lcsbK = 0                       // 0: every layer every step; else at most k layers per step (LCSB)
    var lcsbPolicy = "cyclic"           // cyclic | strided | last | random (toolchain plan lcsb's policies)
    var lcsbWarmup = 0                  // LCSB only: the first N steps backpropagate every layer, then the plan
    var layersPerCheckpoint = 1         // 1: every selected layer's input kept; s > 1: "use less memory (recompute more)"
    var heldOutPercent = 10             // 0: no held-out loss
    var splitSeed = 0
    var shuffleSeed = -1                // < 0: file order; else the host's `--shuffle SEED`
    var budgetMB = 2048
    var checkpointEvery = 10
    var maxNewTokens = 32
    var telemetryURL = ""               // e.g. http://192.168.1.20:8765/v1/events ; empty: no upload
    var telemetryToken = ""
    var trainWhileCharging = false      // BGProcessingTask on external power continues a paused run

    var config: SessionConfig {
        SessionConfig(steps: steps, lr: Float(lr), checkpointEvery: checkpointEvery,
                      shuffleSeed: shuffleSeed >= 0 ? UInt64(shuffleSeed) : nil,
                      selection: lcsbK > 0 ? .lcsb(policy: lcsbPolicy, k: lcsbK, seed: lcsbPolicy == "random" ? 0 : nil) : .all,
                      layersPerCheckpoint: max(1, layersPerCheckpoint),
                      lcsbWarmup: lcsbK > 0 && lcsbWarmup > 0 ? lcsbWarmup : nil)
    }
}

/// The screen's controller: turns the user's text into rows (`TrainingData`), runs TrainerCore's
/// `TrainingSession` (the layer loop on `ExecuTorchRuntime` or `CoreMLRuntime`) on a
/// serial background queue, and republishes `TrainingViewModel`'s state on the main thread. Training,
/// data preparation and the telemetry queue are used on `work`, one at a time.
///
/// Generation runs on its own serial queue (`generation`), also while a run trains: it uses the
/// run's session (the loop serializes every runtime call, FIFO, so a step's calls and the
/// generation's alternate; the "after" side reads a copy of the live adapter taken between two
/// steps), so the run's step / loss / memory events keep coming while tokens stream. Each token is
/// appended on the main actor as it arrives (`SessionEvent.token`); Cancel stops it before its next
/// decode step. Outside a run it opens (or reuses) a session of the chosen program; Train waits
/// until that generation ends or is cancelled (one runtime at a time).
///
/// Lifecycle: while a run is busy the screen does not auto-lock (`isIdleTimerDisabled`). Going to the
/// background (or locking the screen by hand) asks the run to pause at the next step boundary inside a
/// `beginBackgroundTask`, so the step finishes and the checkpoint is written before iOS suspends the
/// app; coming back resumes it (also when the pause finished only after the return); with "train
/// while charging" on, a `BGProcessingTask` continues it on the charger. After a jetsam kill,
/// the saved run (`SavedRun` at `AppPaths.latestRun`: settings + rows) and the program's checkpoint
/// let "Resume" (or the background task) continue from the last checkpoint without asking for anything.
@MainActor
final class TrainingController: ObservableObject {
    @Published private(set) var view = TrainingViewState()
    @Published private(set) var programs: [String] = []
    @Published private(set) var savedRun: SavedRun?
    /// The program import in progress (nil: none) and the last import's outcome.
    @Published private(set) var importProgress: ProgramImport.Progress?
    @Published private(set) var importMessage = ""
    /// Why the exported adapter cannot be shared from the app (too large; nil: it can).
    @Published private(set) var adapterRefusal: String?
    /// Which kernel path the generation runs (ExecuTorchRuntime.kernelLine of the run's runtime; KernelPath).
    @Published private(set) var kernelLine = "native kernels: - (no program loaded)"

    nonisolated let paths: AppPaths
    /// Keep / edit / discard under the generation (FeedbackController.swift).
    let feedback: FeedbackController
    private let model = TrainingViewModel()
    private let work = DispatchQueue(label: "org.onphonellm.trainer.work", qos: .userInitiated)
    private let monitor = MemoryPressureMonitor()
    private let stopLock = NSLock()
    private nonisolated(unsafe) var stopRequest: RunStatus?
    /// The data the user prepared (nil until then, or restored from the saved run).
    private var data: TrainingData?
    private var dataSource = ""
    private var dataSettings: (fraction: Double, seed: UInt64) = (0, 0)
    /// The last session: the run's while it trains (set on `work`), read by generations on
    /// `generation`; eval, generation and export after a run use it. Behind `currentLock`.
    private let currentLock = NSLock()
    private nonisolated(unsafe) var currentSession: TrainingSession?
    private nonisolated var current: TrainingSession? {
        get { currentLock.lock(); defer { currentLock.unlock() }; return currentSession }
        set { currentLock.lock(); currentSession = newValue; currentLock.unlock() }
    }
    /// Generations (before/after), one at a time, beside `work`.
    private let generation = DispatchQueue(label: "org.onphonellm.trainer.generate", qos: .userInitiated)
    /// The last generation's cancel (cancelling one that ended does nothing).
    private var generationCancel: GenerationCancel?
    private var backgroundTask: UIBackgroundTaskIdentifier = .invalid
    /// The background paused the run: resume it once the app is active and the pause has finished.
    private var returning = ResumeOnReturn()
    /// File copies (program import), beside `work`.
    private let io = DispatchQueue(label: "org.onphonellm.trainer.io", qos: .userInitiated)
    private let importLock = NSLock()
    private nonisolated(unsafe) var importCancelled = false

    init() {
        let docs = FileManager.default.urls(for: .documentDirectory, in: .userDomainMask)[0]
        paths = AppPaths(documents: docs)
        feedback = FeedbackController(paths: paths)
        // programs, checkpoints and adapters out of iCloud / Finder backups (GBs), at every launch
        let notExcluded = paths.prepareDirectories(exclude: BackupExclusion.exclude)
        if !notExcluded.isEmpty { NSLog("not excluded from backup: \(notExcluded.map(\.lastPathComponent))") }
        ExecuTorchLog.shared.install()
        monitor.start()
        model.onChange = { [weak self] state in
            if Thread.isMainThread {
                MainActor.assumeIsolated { self?.show(state) }
            } else {
                DispatchQueue.main.async { self?.show(state) }
            }
        }
        refresh()
        restoreSavedRun()
    }

    func refresh() {
        programs = paths.programNames()
    }

    /// The screen's state; the screen stays awake while a run is busy (loading, training, pausing).
    private func show(_ state: TrainingViewState) {
        view = state
        let awake = state.phase.busy
        if UIApplication.shared.isIdleTimerDisabled != awake { UIApplication.shared.isIdleTimerDisabled = awake }
    }

    // MARK: programs

    /// Import a program folder picked with fileImporter (Files, iCloud Drive, a USB drive): checked,
    /// copied into Documents/Programs with progress, verified once (`ProgramImport`), on `io`; the
    /// list refreshes when it is in place. `replace`: an existing program of that name is replaced.
    func importProgram(from url: URL, replace: Bool = false) {
        guard importProgress == nil else { return }
        importLock.lock(); importCancelled = false; importLock.unlock()
        importProgress = ProgramImport.Progress(phase: .checking, bytesDone: 0, bytesTotal: 0, file: url.lastPathComponent)
        importMessage = "Importing \(url.lastPathComponent)…"
        let programs = paths.programs
        io.async { [weak self] in
            guard let controller = self else { return }
            let scoped = url.startAccessingSecurityScopedResource()
            defer { if scoped { url.stopAccessingSecurityScopedResource() } }
            var last = 0.0
            let result: Result<String, Error> = Result {
                try ProgramImport.run(source: url, into: programs, replace: replace, progress: { p in
                    // at most ~200 updates to the screen
                    guard p.phase != .copying && p.phase != .verifying || p.fraction - last >= 0.005 else { return }
                    last = p.fraction
                    DispatchQueue.main.async { controller.importProgress = p }
                }, cancel: { controller.isImportCancelled })
            }
            DispatchQueue.main.async {
                controller.importProgress = nil
                switch result {
                case .success(let name):
                    controller.importMessage = "Imported \(name) (verified)"
                    controller.refresh()
                case .failure(let error):
                    controller.importMessage = "Import failed: \(ErrorReport.parts(of: error).message)"
                }
            }
        }
    }

    func cancelImport() { importLock.lock(); importCancelled = true; importLock.unlock() }

    private nonisolated var isImportCancelled: Bool { importLock.lock(); defer { importLock.unlock() }; return importCancelled }

    /// The run the app was doing when it was killed, if unfinished: its rows come back and Resume is offered.
    /// The saved run's JSON is small (read here); its rows are read on `work`, then shown.
    private func restoreSavedRun() {
        guard let run = SavedRun.load(from: paths.latestRun), run.resumable,
              FileManager.default.fileExists(atPath: paths.checkpoint(program: run.program).path) else { return }
        savedRun = run
        dataSource = run.source
        dataSettings = (run.heldOutFraction, run.splitSeed)
        model.setPhase(.paused, "The last run (\(run.program), \(run.source)) stopped before it finished; Resume continues it")
        let paths = self.paths, model = self.model
        work.async { [weak self] in
            let rows = try? run.rows(besides: paths.latestRun)
            let layers = (try? Manifest.load(directory: paths.programs.appendingPathComponent(run.program)))?.loop.layers
            DispatchQueue.main.async {
                guard let self, let rows, self.data == nil else { return }
                self.data = rows
                model.prepared(rows, stepsPlanned: run.config.steps, budgetBytes: UInt64(run.budgetMB) << 20, layers: layers,
                               layersPerCheckpoint: run.config.layersPerCheckpoint)
            }
        }
    }

    // MARK: data

    /// Rows of pasted text for `program`, with the held-out split.
    func prepare(text: String, settings: RunSettings) {
        prepare(.text(text), name: "pasted text", settings: settings)
    }

    /// Rows of a file the user picked (fileImporter): `.jsonl` is a chat file (one `{"messages": [...]}`
    /// per line), anything else plain UTF-8 text.
    /// The file is read on `work` (a large or cloud-backed file never freezes the screen), with the
    /// size cap of `UserTextFile` (32 MB) and a message above it.
    func prepare(fileAt url: URL, settings: RunSettings) {
        model.setPhase(view.phase, "Reading \(url.lastPathComponent)…")
        work.async { [model] in
            let scoped = url.startAccessingSecurityScopedResource()
            defer { if scoped { url.stopAccessingSecurityScopedResource() } }
            do {
                let text = try UserTextFile.read(url)
                let source: TrainingData.Source = url.pathExtension.lowercased() == "jsonl" ? .chat(text, name: url.lastPathComponent) : .text(text)
                Task { @MainActor in self.prepare(source, name: url.lastPathComponent, settings: settings) }
            } catch {
                Task { @MainActor in model.preparationFailed(error) }
            }
        }
    }

    private func prepare(_ source: TrainingData.Source, name: String, settings: RunSettings) {
        guard !settings.program.isEmpty else { return model.preparationFailed(TrainerError.badInput("choose a program first")) }
        let dir = paths.programs.appendingPathComponent(settings.program)
        let fraction = Double(settings.heldOutPercent) / 100, seed = UInt64(max(settings.splitSeed, 0))
        work.async { [model] in
            do {
                let manifest = try Manifest.load(directory: dir)
                let tokenizer = try ProgramTokenizer.load(manifest: manifest, directory: dir)
                let data = try TrainingData.prepare(source, tokenizer: tokenizer, manifest: manifest, heldOutFraction: fraction, seed: seed)
                let layers = manifest.loop.layers
                Task { @MainActor in
                    self.data = data
                    self.dataSource = name
                    self.dataSettings = (fraction, seed)
                    self.current = nil
                    model.prepared(data, stepsPlanned: settings.steps, budgetBytes: UInt64(settings.budgetMB) << 20,
                                   layers: layers, layersPerCheckpoint: settings.config.layersPerCheckpoint)
                }
            } catch {
                Task { @MainActor in model.preparationFailed(error) }
            }
        }
    }

    // MARK: runs

    /// Stop at the next step boundary: `.cancelled` (user) or `.paused` (background, memory, time up).
    nonisolated func requestStop(_ status: RunStatus) {
        stopLock.lock()
        stopRequest = status
        stopLock.unlock()
    }

    nonisolated func requestPause(reason: String) { requestStop(.paused) }

    /// A stop is pending (not taken): what a held-out pass asks before each row.
    private nonisolated func stopPending() -> Bool {
        stopLock.lock()
        defer { stopLock.unlock() }
        return stopRequest != nil
    }

    private nonisolated func takeStopRequest() -> RunStatus? {
        stopLock.lock()
        defer { stopLock.unlock() }
        let s = stopRequest
        stopRequest = nil
        return s
    }

    /// A new run on the prepared rows (a checkpoint of the same program is resumed: "Start over" deletes it).
    func start(_ settings: RunSettings, background: Bool = false, completion: ((RunStatus) -> Void)? = nil) {
        guard view.canStartRun, let data else { completion?(.completed); return }
        let run = SavedRun(program: settings.program, backend: settings.backend, config: settings.config, budgetMB: settings.budgetMB,
                           source: dataSource, heldOutFraction: dataSettings.fraction, splitSeed: dataSettings.seed,
                           rowsFile: SavedRun.newRowsFile(), trainRows: data.train.count, heldOutRows: data.heldOut.count)
        launch(run, rows: data, settings: settings, background: background, gate: nil, completion: completion)
    }

    /// Continue the saved run from its checkpoint (after a kill, a pause or a stop).
    func resume(_ settings: RunSettings, background: Bool = false, gate: BackgroundRunGate? = nil,
                completion: ((RunStatus) -> Void)? = nil) {
        guard view.canStartRun, let run = savedRun ?? SavedRun.load(from: paths.latestRun) else { completion?(.completed); return }
        launch(run, rows: nil, settings: settings, background: background, gate: gate, completion: completion)
    }

    /// Resume inside a BGProcessingTask; the run stops at a step boundary when `gate` says so
    /// (expired, off the charger, switch off). `completion(status, checkpointExists)`.
    nonisolated func resumeInBackground(gate: BackgroundRunGate, completion: @escaping (RunStatus, Bool) -> Void) {
        Task { @MainActor in
            let paths = self.paths
            self.resume(Self.savedSettings(), background: true, gate: gate) { status in
                let program = SavedRun.load(from: paths.latestRun)?.program ?? ""
                completion(status, FileManager.default.fileExists(atPath: paths.checkpoint(program: program).path))
            }
        }
    }

    /// The "train while charging" switch changed: ask for (or drop) the background task now.
    func trainWhileChargingChanged(_ on: Bool) {
        if on {
            let run = savedRun ?? SavedRun.load(from: paths.latestRun)
            BackgroundTraining.schedule(savedRun: run, checkpointExists: run.map { FileManager.default.fileExists(atPath: paths.checkpoint(program: $0.program).path) } ?? false)
        } else {
            BackgroundTraining.cancel()
        }
    }

    /// `rows`: the run's rows when this screen has them (a new run: written to the rows file on `work`, before
    /// the session); nil: read from the saved run's rows file on `work`.
    private func launch(_ run: SavedRun, rows: TrainingData?, settings: RunSettings, background: Bool, gate: BackgroundRunGate?,
                        completion: ((RunStatus) -> Void)?) {
        _ = takeStopRequest()
        var record = run
        record.status = nil
        // The run id, chosen before anything can fail: a failure before the session starts is sent under it
        // (StartFailure), and the session started next uses it (a checkpoint's own id wins on a resume).
        record.runId = StartFailure.runId(saved: run.runId)
        savedRun = record
        // the saved run's settings (a resume keeps its layers per checkpoint, whatever the toggle says now)
        if let rows {
            model.prepared(rows, stepsPlanned: run.config.steps, budgetBytes: UInt64(run.budgetMB) << 20,
                           layersPerCheckpoint: run.config.layersPerCheckpoint)
        }
        model.setPhase(.loading, "Opening \(run.program)")
        let paths = self.paths, monitor = self.monitor, model = self.model
        let started = record
        let newRows = rows != nil && SavedRun.load(from: paths.latestRun)?.rowsFile != run.rowsFile
        work.async { [weak self] in
            var status = RunStatus.failed
            do {
                // off the main thread: the rows file of a new run first, then the JSON that points at it
                if newRows, let rows { try RowsFile.write(rows, to: started.rowsURL(besides: paths.latestRun)) }
                try started.save(to: paths.latestRun)
                let data = try rows ?? started.rows(besides: paths.latestRun)
                status = try Self.train(started, data: data, settings: settings, paths: paths, monitor: monitor, model: model,
                                        background: background, gate: gate, controller: self)
            } catch {
                // the message and ExecuTorch's own log lines (sent as an `error` event: by the session once it has
                // started, by StartFailure before)
                let text = ErrorReport.screenText(for: error, log: ExecuTorchLog.shared.ring.recent(8))
                DispatchQueue.main.async { model.setPhase(.failed, text) }
            }
            let final = status
            // DispatchQueue.main, FIFO behind the session's event hops: the view state has the run's end
            // (phase, canResume) before resumeIfReturned looks at it
            DispatchQueue.main.async {
                guard let self else { completion?(final); return }
                self.savedRun = SavedRun.load(from: paths.latestRun).flatMap { $0.resumable ? $0 : nil }
                self.endBackgroundTask()
                completion?(final)
                self.resumeIfReturned()
            }
        }
    }

    /// One session, on `work`, phase by phase on the screen (verifying the program once per import,
    /// opening the runtime, reading the checkpoint, loading the methods, the held-out loss before).
    /// Returns how the run ended.
    private nonisolated static func train(_ run: SavedRun, data: TrainingData, settings: RunSettings, paths: AppPaths, monitor: MemoryPressureMonitor,
                                          model: TrainingViewModel, background: Bool, gate: BackgroundRunGate?,
                                          controller: TrainingController?) throws -> RunStatus {
        let lastPhase = PhaseBox()
        func phase(_ text: String) { lastPhase.set(text); DispatchQueue.main.async { model.setPhase(.loading, text) } }
        let dir = paths.programs.appendingPathComponent(run.program)
        let runId = StartFailure.runId(saved: run.runId)
        // The sinks first: a failure from here to the session's start is sent as an `error` event of `runId`.
        let log = EventLog(url: paths.eventLog)
        let endpoint = settings.telemetryURL.isEmpty ? nil : URL(string: settings.telemetryURL)
        let queue = endpoint.flatMap { _ in try? TelemetryQueue(directory: paths.telemetryQueue) }
        var sinks: [TelemetrySink] = [log]
        if let queue { sinks.append(queue) }
        let usedSeq: (String) -> Int = { runId in max(log.nextSeq(runId: runId), queue?.nextSeq(runId: runId) ?? 0) }
        var opened: TrainingSession?
        let (session, resumed) = try StartFailure.reporting(
            runId: runId, phase: { lastPhase.get() }, sinks: { sinks }, usedSeq: usedSeq,
            log: { ExecuTorchLog.shared.ring.recent(ErrorReport.maxLogLines) }, started: { opened?.recorder != nil },
            sent: {
                // as at a session's end: retry with backoff before leaving the event for next time
                if let endpoint, let queue {
                    _ = try? TelemetryUploader(queue: queue, endpoint: endpoint, token: settings.telemetryToken,
                                               transport: URLSessionTransport(), maxAttempts: 5).flush()
                }
            }) { () throws -> (TrainingSession, Bool) in
            phase("Opening \(run.program)")
            if endpoint != nil && queue == nil { throw TrainerError.io("cannot open the telemetry queue in \(paths.telemetryQueue.path)") }
            let manifest = try Manifest.load(directory: dir)
            // once per import (keyed on the manifest's checksums): a program pushed with devicectl is hashed
            // on its first start, an imported one never again
            if !ProgramVerification.isVerified(directory: dir, manifest: manifest) {
                var shown = -1
                try ProgramVerification.verify(directory: dir, manifest: manifest) { done, total in
                    let pct = total > 0 ? done * 100 / total : 100
                    if pct != shown { shown = pct; phase("Verifying \(run.program) (once per import): \(pct)%") }
                }
            }
            phase("Opening the weights and the \(run.backend == "coreml" ? "Core ML" : "ExecuTorch") program")
            let runtime = try makeRuntime(backend: run.backend, directory: dir, manifest: manifest)
            let kernels = (runtime as? ExecuTorchRuntime)?.kernelLine ?? KernelPath.coreML
            DispatchQueue.main.async { controller?.kernelLine = kernels }
            let budget = UInt64(run.budgetMB) << 20
            let footprint = FootprintProbe()
            let session = try TrainingSession(
                programDirectory: dir, programName: run.program, runtime: runtime, data: data, config: run.config.resolvingDefaults(manifest),
                device: DeviceFacts.info(budgetBytes: budget, background: background),
                checkpoint: CheckpointStore(url: paths.checkpoint(program: run.program)), telemetry: sinks,
                usedSeq: usedSeq,
                probes: MemoryProbes(footprint: footprint, available: AvailableProbe(monitor: monitor), pressure: { monitor.level }),
                // the planned peak counts the checkpoints this run keeps at once (LCSB k, checkpoint groups)
                budget: MemoryGuard(budgetBytes: budget,
                                    plannedPeakBytes: (footprint.sample()?.anonBytes ?? 0) + run.config.plannedPeakBytes(manifest: manifest, target: run.backend)))
            opened = session
            // A background window (BGProcessingTask) may end at any time: a checkpoint after every step.
            session.checkpointEachStep = { background || gate != nil }
            // the gate's held-out loss at each checkpoint: skipped when a stop or the window's end comes during it
            session.evalCancelled = { controller?.stopPending() == true || gate?.interrupt() != nil }
            session.onEvent = { event in DispatchQueue.main.async { model.handle(event) } }
            session.onStartPhase = { phase($0) }
            session.runtimeLog = ExecuTorchLog.shared.ring
            controller?.current = session
            return (session, try session.start(runId: runId, sameRunOnly: true))
        }
        let uploader = queue.flatMap { q in
            endpoint.map { TelemetryUploader(queue: q, endpoint: $0, token: settings.telemetryToken, transport: URLSessionTransport(), maxAttempts: 1) }
        }
        if !resumed && !session.data.heldOut.isEmpty {
            DispatchQueue.main.async { model.setPhase(.evaluating, "Held-out loss before training") }
            do {
                try session.evaluate(initial: true, cancelled: { controller?.stopPending() == true || gate?.interrupt() != nil })
            } catch let e as EvalCancelled {
                let status = controller?.takeStopRequest() ?? .paused
                try? session.finish(status: status, message: "stopped during the held-out loss before training (\(e)); resume starts it again")
                return status
            } catch { session.reportError(error, fatal: true); try? session.finish(status: .failed, message: "\(error)"); throw error }
        }
        var thermal = ""
        let status = try session.run(interrupt: {
            if DeviceFacts.thermalState != thermal {
                thermal = DeviceFacts.thermalState
                _ = try? session.recorder?.emit("thermal", ["state": .string(thermal)])
            }
            if session.step % 10 == 0, let battery = DeviceFacts.batteryFields() { _ = try? session.recorder?.emit("battery", battery) }
            if session.step % 10 == 9 { _ = try? uploader?.flush() }
            return controller?.takeStopRequest() ?? gate?.interrupt()
        }).status
        var record = run
        record.status = status
        record.runId = session.recorder?.runId
        if status == .completed {
            do {
                if !session.data.heldOut.isEmpty {
                    DispatchQueue.main.async { model.setPhase(.evaluating, "Held-out loss after training") }
                    // capped (32 rows); a stop during it skips the loss after (the run is complete, its adapter is exported)
                    try session.evaluate(initial: false, cancelled: { controller?.stopPending() == true })
                }
            } catch is EvalCancelled {
                _ = controller?.takeStopRequest()
            } catch { session.reportError(error, fatal: false); throw error }
            if let runId = session.recorder?.runId {
                let adapter = paths.adapter(runId: runId)
                do { try session.exportAdapter(to: adapter) } catch { session.reportError(error, fatal: false); throw error }
                // measured here, off the main thread; above the cap the screen offers no share
                let refusal = (try? AdapterExport.size(of: adapter)).flatMap { AdapterExport.refusal(bytes: $0) }
                DispatchQueue.main.async { controller?.adapterRefusal = refusal }
                DispatchQueue.main.async { model.exported(adapter); model.setPhase(.completed, "Completed; adapter \(runId)") }
            }
        }
        try? record.save(to: paths.latestRun)
        if let endpoint, let queue {
            // End of session: retry with backoff (1, 2, 4, 8 s) before leaving events for next time.
            _ = try? TelemetryUploader(queue: queue, endpoint: endpoint, token: settings.telemetryToken,
                                       transport: URLSessionTransport(), maxAttempts: 5).flush()
        }
        if status == .paused {
            BackgroundTraining.schedule(savedRun: record, checkpointExists: FileManager.default.fileExists(atPath: paths.checkpoint(program: run.program).path))
        }
        return status
    }

    private nonisolated static func makeRuntime(backend: String, directory: URL, manifest: Manifest) throws -> ProgramRuntime {
        // An fp16 program (manifest compute): never on Core ML, and not on a CPU without float16 arithmetic; refused
        // before anything loads (where the CPU cannot tell, ExecuTorchRuntime maps the method's load error).
        if let refused = Compute.refusal(manifest, program: directory.lastPathComponent, runtime: backend == "coreml" ? "coreml" : "executorch",
                                         support: DeviceFacts.fp16Support) {
            throw refused
        }
        // An int8 program (its training methods call the toolchain's native kernels): refused before anything loads where
        // the kernel registry lacks them (an app built without TOOLCHAIN_NATIVE_KERNELS) and on Core ML.
        let needed = Compute.requiredKernels(manifest)
        if let refused = Compute.kernelRefusal(manifest, program: directory.lastPathComponent, runtime: backend == "coreml" ? "coreml" : "executorch",
                                               registered: needed.isEmpty ? nil : ExecuTorchRuntime.kernelsRegistered(needed),
                                               advice: ExecuTorchRuntime.kernelsAdvice) {
            throw refused
        }
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
            return try box.result.get()
        default:
            guard let program = manifest.program(target: "executorch") else {
                throw TrainerError.badInput("this program has no ExecuTorch export; export it with --target executorch")
            }
            return try ExecuTorchRuntime(programFile: directory.appendingPathComponent(program.file), manifest: manifest)
        }
    }

    /// Forget the program's checkpoint and the saved run (the next run starts over).
    func resetRun(program: String) {
        try? FileManager.default.removeItem(at: paths.checkpoint(program: program))
        try? FileManager.default.removeItem(at: paths.latestRun)
        savedRun = nil
        current = nil
        model.setCanResume(false)
        model.setPhase(data == nil ? .idle : .ready, "Checkpoint of \(program) deleted")
    }

    // MARK: before / after

    /// Greedy continuations of `prompt` with the initial adapter (state_init.bin) and the trained one,
    /// side by side (the trained one once a checkpoint exists, or the live adapter while a run trains),
    /// streamed token by token into the view. Runs on `generation`, beside a run if one is going (its
    /// progress keeps coming); `cancelGeneration()` stops it before its next decode step.
    func generate(prompt: String, settings: RunSettings, chat: Bool) {
        guard view.canGenerate, !prompt.isEmpty else { return }
        let paths = self.paths, model = self.model, feedback = self.feedback
        let run = savedRun ?? SavedRun.load(from: paths.latestRun)
        let program = run?.program ?? settings.program
        let shown = self.data
        let duringRun = view.phase.busy
        let cancel = GenerationCancel()
        generationCancel = cancel
        model.generationRequested()
        feedback.cleared()
        generation.async { [weak self] in
            var message: String
            do {
                var session = self?.current
                if session == nil || session?.programName != program {
                    // a run's session is set before it loads; without it there is no run to share
                    guard !duringRun else { throw TrainerError.badInput("the run is still loading; try again in a moment") }
                    // the rows on this thread: the screen's, else the saved run's file
                    let loaded = try shown ?? run.map { try $0.rows(besides: paths.latestRun) }
                    guard let data = loaded, !data.train.isEmpty else { throw TrainerError.badInput("prepare some text first") }
                    let dir = paths.programs.appendingPathComponent(program)
                    let manifest = try Manifest.load(directory: dir)
                    let s = try TrainingSession(programDirectory: dir, programName: program,
                                                runtime: try Self.makeRuntime(backend: run?.backend ?? settings.backend, directory: dir, manifest: manifest),
                                                data: data, config: (run?.config ?? settings.config).resolvingDefaults(manifest),
                                                device: DeviceFacts.info(budgetBytes: UInt64(settings.budgetMB) << 20, background: false),
                                                checkpoint: CheckpointStore(url: paths.checkpoint(program: program)))
                    s.onEvent = { event in DispatchQueue.main.async { model.handle(event) } }
                    // with a checkpoint the live adapter is the trained one (resuming loads it; no event is sent)
                    if FileManager.default.fileExists(atPath: paths.checkpoint(program: program).path) { try s.start() }
                    session = s
                    self?.current = s
                }
                guard let session else { return }
                // tokens reach the view through session.onEvent (.token), hopped to the main actor
                let before = try session.generate(prompt: prompt, maxNewTokens: settings.maxNewTokens, initial: true, chat: chat, cancel: cancel)
                message = Self.describe(before, side: "before")
                var answered = before  // the feedback buttons answer the trained adapter's response, else the initial one's
                if before.stop != .cancelled, session.state != nil {
                    let after = try session.generate(prompt: prompt, maxNewTokens: settings.maxNewTokens, initial: false, chat: chat, cancel: cancel)
                    message = Self.describe(after, side: "after")
                    if after.stop != .cancelled { message = "Generated" + (after.adapterStep.map { " (trained adapter at step \($0))" } ?? "") }
                    answered = after
                }
                feedback.generated(prompt: prompt, chat: chat, answered)
                // int4 programs: the fused methods ran on the app's native kernel (ExecuTorchRuntime.registeredKernels)
                if session.loop.generationIsFused, before.stop != .cancelled { message += "; native int4 kernel" }
            } catch {
                message = "Generation failed: " + ErrorReport.screenText(for: error, log: ExecuTorchLog.shared.ring.recent(8)).dropFirst("Error: ".count)
                self?.current?.reportError(error, fatal: false)
            }
            let text = message
            // after the tokens (each hopped with DispatchQueue.main.async before this one)
            DispatchQueue.main.async { model.generationFinished(text) }
        }
    }

    /// Stop the running generation before its next decode step (the tokens so far stay on screen).
    func cancelGeneration() {
        generationCancel?.cancel()
    }

    private nonisolated static func describe(_ g: Generation, side: String) -> String {
        switch g.stop {
        case .cancelled: return "Cancelled (\(side): \(g.ids.count) token\(g.ids.count == 1 ? "" : "s"))"
        case .eos: return "Generated (\(side) ended at its end-of-text token)"
        case .maxNewTokens: return "Generated"
        }
    }

    // MARK: lifecycle

    /// Background / screen lock: pause at the next step boundary with a background task, so the step
    /// finishes and the checkpoint is written before suspension (iOS gives ~30 s; a step of the 0.5B
    /// program at T=256 takes a few seconds). Back in the foreground: resume what the background
    /// paused, at once if the pause has finished, else as soon as it does (`resumeIfReturned`). While
    /// a run is busy the screen does not auto-lock (`show`), so this is a lock by hand or another app.
    func scenePhaseChanged(to phase: ScenePhase, settings: RunSettings) {
        switch phase {
        case .background:
            returning.backgrounded(busy: view.phase.busy)
            // a generation is for the screen: stop it, so a run's last step before suspension has the runtime to itself
            cancelGeneration()
            guard view.phase.busy else { return }
            backgroundTask = UIApplication.shared.beginBackgroundTask(withName: "finish the training step") { [weak self] in
                Task { @MainActor in self?.endBackgroundTask() }
            }
            model.setPhase(.pausing, "Pausing: the app went to the background")
            requestStop(.paused)
        case .active:
            returning.activated()
            resumeIfReturned(settings)
        default:
            break
        }
    }

    /// Resume the run the background paused, once the app is active again and the pause has ended.
    private func resumeIfReturned(_ settings: RunSettings? = nil) {
        guard returning.shouldResume(busy: view.phase.busy, canResume: view.canResume) else { return }
        resume(settings ?? Self.savedSettings())
    }

    private func endBackgroundTask() {
        guard backgroundTask != .invalid else { return }
        UIApplication.shared.endBackgroundTask(backgroundTask)
        backgroundTask = .invalid
    }

    func stop() {
        model.setPhase(.pausing, "Stopping after this step")
        requestStop(.cancelled)
    }

    static func savedSettings() -> RunSettings {
        let d = UserDefaults.standard
        var s = RunSettings()
        s.program = d.string(forKey: "program") ?? s.program
        s.backend = d.string(forKey: "backend") ?? s.backend
        s.steps = d.object(forKey: "steps") as? Int ?? s.steps
        s.lr = d.object(forKey: "lr") as? Double ?? s.lr
        s.lcsbK = d.object(forKey: "lcsbK") as? Int ?? s.lcsbK
        s.lcsbPolicy = d.string(forKey: "lcsbPolicy") ?? s.lcsbPolicy
        s.lcsbWarmup = d.object(forKey: "lcsbWarmup") as? Int ?? s.lcsbWarmup
        s.layersPerCheckpoint = d.object(forKey: "layersPerCheckpoint") as? Int ?? s.layersPerCheckpoint
        s.heldOutPercent = d.object(forKey: "heldOutPercent") as? Int ?? s.heldOutPercent
        s.budgetMB = d.object(forKey: "budgetMB") as? Int ?? s.budgetMB
        s.telemetryURL = d.string(forKey: "telemetryURL") ?? ""
        s.telemetryToken = d.string(forKey: "telemetryToken") ?? ""
        s.trainWhileCharging = d.bool(forKey: BackgroundTraining.enabledKey)
        return s
    }
}

/// Hands a value from an async task to the thread waiting for it (guarded by the semaphore).
private final class ResultBox: @unchecked Sendable {
    var result: Result<ProgramRuntime, Error> = .failure(TrainerError.runtime("Core ML did not load"))
}

/// The last start phase shown (set on the work queue, read there when a start fails).
private final class PhaseBox: @unchecked Sendable {
    private let lock = NSLock()
    private var text: String?
    func set(_ t: String) { lock.lock(); text = t; lock.unlock() }
    func get() -> String? { lock.lock(); defer { lock.unlock() }; return text }
}
