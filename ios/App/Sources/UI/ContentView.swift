import SwiftUI
import TrainerCore
import UniformTypeIdentifiers

/// The one screen: choose a program, paste text or pick a file (text, or a .jsonl chat file), see it
/// as rows with a held-out split, start / stop / resume, watch the loss and the memory against the
/// budget, compare held-out loss and generations before and after, export the adapter. Everything it
/// shows is `TrainingViewState` (TrainerCore): this view only draws it.
struct ContentView: View {
    @EnvironmentObject private var controller: TrainingController
    @Environment(\.scenePhase) private var scenePhase
    @AppStorage("program") private var program = ""
    @AppStorage("backend") private var backend = "executorch"
    @AppStorage("steps") private var steps = 0   // 0: the program's (manifest defaults.steps)
    @AppStorage("lrAsked") private var lr = 0.0  // 0: the program's own (its manifest's default_lr)
    @AppStorage("lcsbK") private var lcsbK = 0
    @AppStorage("lcsbPolicy") private var lcsbPolicy = "cyclic"
    @AppStorage("layersPerCheckpoint") private var layersPerCheckpoint = 1
    @AppStorage("heldOutPercent") private var heldOutPercent = 10
    @AppStorage("budgetMB") private var budgetMB = 2048
    @AppStorage("telemetryURL") private var telemetryURL = ""
    @AppStorage("telemetryToken") private var telemetryToken = ""
    @AppStorage("trainWhileCharging") private var trainWhileCharging = false
    /// What the one file importer of this screen is open for (SwiftUI presents one `.fileImporter` per view
    /// hierarchy: a second one, on a section, may never show).
    enum Picking { case text, program }
    @State private var picking: Picking?
    @State private var text = ""
    @State private var exporting = false
    @State private var prompt = ""
    @State private var chatPrompt = false
    @State private var exportMessage = ""

    private var state: TrainingViewState { controller.view }

    var body: some View {
        NavigationStack {
            Form {
                programSection
                dataSection
                runSection
                progressSection
                evalSection
                generateSection
                adapterSection
                telemetrySection
            }
            .navigationTitle("LoRA Trainer")
            .refreshable { controller.refresh() }
            .onAppear { controller.refresh() }
            .onChange(of: scenePhase) { _, phase in
                // the list refreshes on every return (a program pushed with devicectl while the app was open)
                if phase == .active { controller.refresh() }
                controller.scenePhaseChanged(to: phase, settings: settings)
            }
            .onChange(of: trainWhileCharging) { _, on in controller.trainWhileChargingChanged(on) }
            .fileImporter(isPresented: Binding(get: { picking != nil }, set: { if !$0 { picking = nil } }),
                          allowedContentTypes: picking == .program ? [.folder] : Self.importTypes) { result in
                let kind = picking
                picking = nil
                guard case .success(let url) = result else { return }
                if kind == .program { controller.importProgram(from: url) } else { controller.prepare(fileAt: url, settings: settings) }
            }
            .fileExporter(isPresented: $exporting, document: state.adapterDirectory.map { AdapterFolder(url: $0) },
                          contentType: .folder, defaultFilename: state.adapterDirectory?.lastPathComponent) { result in
                if case .failure(let error) = result { exportMessage = "Saving failed: \(error.localizedDescription)" }
            }
        }
    }

    static let importTypes: [UTType] = [.plainText, .utf8PlainText, .text, .json, UTType(filenameExtension: "jsonl") ?? .data]

    private var programSection: some View {
        Section("Program") {
            Picker("Program", selection: $program) {
                Text("Choose…").tag("")
                ForEach(controller.programs, id: \.self) { Text($0).tag($0) }
            }
            Picker("Runtime", selection: $backend) {
                Text("ExecuTorch").tag("executorch")
                Text("Core ML").tag("coreml")
            }
            .pickerStyle(.segmented)
            // a program folder from Files / iCloud Drive / a USB drive: copied in, checked, verified once
            if let p = controller.importProgress {
                ProgressView(value: p.fraction) {
                    Text(Self.describe(p)).font(.caption)
                }
                Button("Cancel import", role: .cancel) { controller.cancelImport() }
            } else {
                Button("Import a program folder…") { picking = .program }
                    .disabled(state.phase.busy)
            }
            if !controller.importMessage.isEmpty {
                Text(controller.importMessage).font(.caption).foregroundStyle(.secondary)
            }
        }
    }

    static func describe(_ p: ProgramImport.Progress) -> String {
        let mb = { (n: Int) in String(format: "%.0f", Double(n) / 1_048_576) }
        switch p.phase {
        case .checking: return "Checking \(p.file)…"
        case .copying: return "Copying \(p.file): \(mb(p.bytesDone)) of \(mb(p.bytesTotal)) MB"
        case .verifying: return "Verifying checksums: \(Int(p.fraction * 100))%"
        case .done: return "Done"
        }
    }

    private var dataSection: some View {
        Section {
            TextEditor(text: $text)
                .frame(minHeight: 120)
                .font(.callout)
                .overlay(alignment: .topLeading) {
                    if text.isEmpty { Text("Paste your text here").foregroundStyle(.tertiary).padding(8).allowsHitTesting(false) }
                }
            Stepper("Held out: \(heldOutPercent)%", value: $heldOutPercent, in: 0...50, step: 5)
            HStack {
                Button("Use this text") { controller.prepare(text: text, settings: settings) }
                    .disabled(text.isEmpty || program.isEmpty || state.phase.busy)
                Spacer()
                Button("Pick a file…") { picking = .text }
                    .disabled(program.isEmpty || state.phase.busy)
            }
            if state.trainRows > 0 {
                LabeledContent("Rows", value: "\(state.trainRows) train, \(state.heldOutRows) held out")
                LabeledContent("Target tokens", value: "\(state.trainTokens)")
            }
        } header: {
            Text("Your text")
        } footer: {
            Text("Plain text is cut into windows of the program's sequence length; a .jsonl file is a chat, one {\"messages\": [...]} per line.")
        }
    }

    private var runSection: some View {
        Section("Run") {
            Stepper(steps > 0 ? "Steps: \(steps)" : "Steps: the program's default", value: $steps, in: 0...100_000, step: 10)
            LabeledContent(lr > 0 ? "Learning rate" : "Learning rate (0: the program's)") {
                TextField("lr", value: $lr, format: .number).keyboardType(.decimalPad).multilineTextAlignment(.trailing)
            }
            Stepper(lcsbK == 0 ? "Layers per step: all" : "Layers per step: \(lcsbK) (LCSB)", value: $lcsbK, in: 0...64)
            if lcsbK > 0 {
                Picker("LCSB policy", selection: $lcsbPolicy) {
                    ForEach(["cyclic", "strided", "last", "anchored", "random"], id: \.self) { Text($0).tag($0) }
                }
            }
            checkpointRows
            Stepper("Budget: \(budgetMB) MB", value: $budgetMB, in: 128...16_384, step: 128)
            // BGProcessingTask with requiresExternalPower: a paused run continues on the charger, stopping at
            // a step boundary when iOS ends the task or the phone is unplugged
            Toggle("Train while charging", isOn: $trainWhileCharging)
            if state.phase.busy {
                Button(state.phase == .pausing ? "Stopping…" : "Stop", role: .destructive) { controller.stop() }
                    .disabled(state.phase == .pausing)
            } else {
                Button("Train") { controller.start(settings) }
                    .disabled(program.isEmpty || state.trainRows == 0 || !state.canStartRun)
                if state.canResume {
                    Button("Resume") { controller.resume(settings) }
                        .disabled(!state.canStartRun)
                }
                Button("Start over (delete checkpoint)", role: .destructive) { controller.resetRun(program: program) }
                    .disabled(program.isEmpty)
            }
        }
    }

    /// Checkpoint groups: off keeps every selected layer's input ([T, d] each) through the backward;
    /// on keeps one per `layersPerCheckpoint` selected layers and reruns the forward of each group
    /// (same results, less memory, a bit more compute). Saved with the run: Resume uses the run's.
    @ViewBuilder private var checkpointRows: some View {
        Toggle("Use less memory (recompute more)", isOn: Binding(
            get: { layersPerCheckpoint > 1 },
            set: { layersPerCheckpoint = $0 ? state.suggestedLayersPerCheckpoint(lcsbK: lcsbK) : 1 }))
        if layersPerCheckpoint > 1 {
            Stepper("Layers per checkpoint: \(layersPerCheckpoint)", value: $layersPerCheckpoint, in: 2...64)
        }
        if let plan = state.checkpointPlan(lcsbK: lcsbK, layersPerCheckpoint: layersPerCheckpoint) {
            Text("Keeps \(plan.kept) of \(plan.selected) layer inputs at once" +
                 (plan.kept < plan.selected ? "; reruns the forward of each group in the backward" : ""))
                .font(.caption).foregroundStyle(.secondary)
        }
        if state.canResume && state.layersPerCheckpoint != max(1, layersPerCheckpoint) {
            Text("Resume continues the saved run with \(state.layersPerCheckpoint) layer(s) per checkpoint")
                .font(.caption).foregroundStyle(.secondary)
        }
    }

    private var progressSection: some View {
        Section("Progress") {
            Text(state.message).font(.callout)
            Text(controller.kernelLine).font(.caption).foregroundStyle(.secondary)
            if state.stepsPlanned > 0 {
                ProgressView(value: state.progress) { Text("Step \(state.stepsDone) of \(state.stepsPlanned)") }
            }
            if !state.losses.isEmpty {
                LossChart(points: state.lossCurve(), last: state.losses.last!.loss,
                          range: (state.losses.map(\.loss).min()!, state.losses.map(\.loss).max()!))
                    .frame(height: 140)
            }
            MemoryRow(footprint: state.footprintBytes, available: state.availableBytes, budget: state.budgetBytes, pressure: state.pressure)
        }
    }

    private var evalSection: some View {
        Section("Held-out loss") {
            LabeledContent("Before", value: state.evalBefore.map { String(format: "%.4f", $0.loss) } ?? "–")
            LabeledContent("After", value: state.evalAfter.map { String(format: "%.4f", $0.loss) } ?? "–")
            if let d = state.evalDelta {
                LabeledContent("Change", value: String(format: "%+.4f", d)).foregroundStyle(d < 0 ? Color.green : Color.red)
            }
            if let gate = state.gateReason { Text(gate).font(.caption) }  // the evaluation gate's decision
        }
    }

    private var generateSection: some View {
        Section("Try it") {
            TextField("Prompt", text: $prompt, axis: .vertical)
            Toggle("As a chat turn", isOn: $chatPrompt)
            if state.generating {
                // stops before the next decode step; the tokens so far stay
                Button("Cancel generation", role: .cancel) { controller.cancelGeneration() }
            } else {
                // also while a run trains: the run's progress keeps coming while tokens stream
                Button("Generate before / after") { controller.generate(prompt: prompt, settings: settings, chat: chatPrompt) }
                    .disabled(prompt.isEmpty || program.isEmpty || !state.canGenerate)
            }
            if !state.generationMessage.isEmpty {
                Text(state.generationMessage).font(.caption).foregroundStyle(.secondary)
            }
            HStack(alignment: .top, spacing: 12) {
                GenerationColumn(title: "Before", stream: state.streamBefore)
                Divider()
                GenerationColumn(title: state.streamAfter?.adapterStep.map { "After (step \($0))" } ?? "After", stream: state.streamAfter)
            }
            FeedbackSection(feedback: controller.feedback)
        }
    }

    @ViewBuilder private var adapterSection: some View {
        if let dir = state.adapterDirectory {
            Section("Adapter (PEFT)") {
                LabeledContent("Run", value: dir.lastPathComponent)
                if let refusal = controller.adapterRefusal {
                    Text(refusal).font(.caption).foregroundStyle(.secondary)
                } else {
                    ShareLink("Share adapter files", items: [dir.appendingPathComponent("adapter_config.json"),
                                                             dir.appendingPathComponent("adapter_model.safetensors")])
                    Button("Save folder to Files…") { exporting = true }
                }
                if !exportMessage.isEmpty { Text(exportMessage).font(.caption).foregroundStyle(.red) }
            }
        }
    }

    private var telemetrySection: some View {
        Section("Telemetry") {
            TextField("http://laptop:8765/v1/events", text: $telemetryURL)
                .textInputAutocapitalization(.never).autocorrectionDisabled().keyboardType(.URL)
            SecureField("Token", text: $telemetryToken)
        }
    }

    private var settings: RunSettings {
        var s = RunSettings()
        s.program = program
        s.backend = backend
        s.steps = steps
        s.lr = lr
        s.lcsbK = lcsbK
        s.lcsbPolicy = lcsbPolicy
        s.layersPerCheckpoint = layersPerCheckpoint
        s.heldOutPercent = heldOutPercent
        s.budgetMB = budgetMB
        s.telemetryURL = telemetryURL
        s.telemetryToken = telemetryToken
        s.trainWhileCharging = trainWhileCharging
        return s
    }
}

/// The loss curve (points in the unit square from `TrainingViewState.lossCurve`) as a Path.
struct LossChart: View {
    let points: [(x: Double, y: Double)]
    let last: Double
    let range: (Double, Double)

    var body: some View {
        VStack(alignment: .leading, spacing: 4) {
            GeometryReader { geo in
                Path { path in
                    for (i, p) in points.enumerated() {
                        let pt = CGPoint(x: p.x * geo.size.width, y: (1 - p.y) * geo.size.height)
                        if i == 0 { path.move(to: pt) } else { path.addLine(to: pt) }
                    }
                }
                .stroke(Color.accentColor, lineWidth: 2)
            }
            HStack {
                Text(String(format: "min %.3f  max %.3f", range.0, range.1))
                Spacer()
                Text(String(format: "last %.4f", last))
            }
            .font(.caption).foregroundStyle(.secondary)
        }
    }
}

/// Footprint against the budget, what iOS still allows, and the pressure level.
struct MemoryRow: View {
    let footprint: UInt64?
    let available: UInt64?
    let budget: UInt64
    let pressure: MemoryPressure

    var body: some View {
        VStack(alignment: .leading, spacing: 4) {
            if let footprint, budget > 0 {
                let used = Double(footprint) / 1_048_576, total = Double(budget) / 1_048_576
                ProgressView(value: min(used, total), total: total) {
                    Text(String(format: "Memory %.0f / %.0f MB", used, total))
                }
                .tint(used > 0.9 * total ? .red : .accentColor)
            }
            HStack {
                if let available { Text(String(format: "Available %.0f MB", Double(available) / 1_048_576)) }
                Spacer()
                Text("Pressure: \(pressure.rawValue)").foregroundStyle(pressure == .normal ? Color.secondary : Color.red)
            }
            .font(.caption)
        }
    }
}

/// One side of the comparison: the text as it streams (a cursor while tokens come), then how it stopped.
struct GenerationColumn: View {
    let title: String
    let stream: TrainingViewState.GenerationStream?

    var body: some View {
        VStack(alignment: .leading, spacing: 4) {
            Text(title).font(.caption).foregroundStyle(.secondary)
            if let stream {
                Text(stream.finished ? stream.text : stream.text + "▍").font(.callout).textSelection(.enabled)
                if let stop = stream.stop {
                    Text(Self.describe(stop, tokens: stream.tokens)).font(.caption2).foregroundStyle(.secondary)
                }
            } else {
                Text("–").font(.callout)
            }
        }
        .frame(maxWidth: .infinity, alignment: .leading)
    }

    static func describe(_ stop: GenerationStop, tokens: Int) -> String {
        switch stop {
        case .eos: return "\(tokens) tokens, ended by the model"
        case .maxNewTokens: return "\(tokens) tokens (the maximum)"
        case .cancelled: return "cancelled after \(tokens) tokens"
        }
    }
}

/// The exported adapter directory as a document for `fileExporter` (a folder with the two PEFT files).
struct AdapterFolder: FileDocument {
    static var readableContentTypes: [UTType] { [.folder] }
    let url: URL

    init(url: URL) { self.url = url }

    init(configuration: ReadConfiguration) throws {
        throw CocoaError(.fileReadUnsupportedScheme)
    }

    func fileWrapper(configuration: WriteConfiguration) throws -> FileWrapper {
        // read when the exporter writes (not up front on the main thread); the controller measured the
        // folder off the main thread and hides this above AdapterExport's cap
        try FileWrapper(url: url, options: [])
    }
}
