import SwiftUI
import TrainerCore

/// The one screen: choose program, data and backend, set steps, lr and the memory budget, start or
/// stop, and watch loss and memory.
struct ContentView: View {
    @EnvironmentObject private var controller: TrainingController
    @AppStorage("program") private var program = ""
    @AppStorage("dataFile") private var dataFile = ""
    @AppStorage("backend") private var backend = "executorch"
    @AppStorage("steps") private var steps = 100
    @AppStorage("lr") private var lr = 1e-4
    @AppStorage("budgetMB") private var budgetMB = 2048
    @AppStorage("telemetryURL") private var telemetryURL = ""
    @AppStorage("telemetryToken") private var telemetryToken = ""

    var body: some View {
        NavigationStack {
            Form {
                Section("Program") {
                    Picker("Program", selection: $program) {
                        Text("Choose…").tag("")
                        ForEach(controller.programs, id: \.self) { Text($0).tag($0) }
                    }
                    Picker("Data", selection: $dataFile) {
                        Text("Choose…").tag("")
                        ForEach(controller.dataFiles, id: \.self) { Text($0).tag($0) }
                    }
                    Picker("Runtime", selection: $backend) {
                        Text("ExecuTorch").tag("executorch")
                        Text("Core ML").tag("coreml")
                    }
                    .pickerStyle(.segmented)
                }
                Section("Run") {
                    Stepper("Steps: \(steps)", value: $steps, in: 1...100_000, step: 10)
                    LabeledContent("Learning rate") {
                        TextField("lr", value: $lr, format: .number).keyboardType(.decimalPad).multilineTextAlignment(.trailing)
                    }
                    Stepper("Budget: \(budgetMB) MB", value: $budgetMB, in: 128...16_384, step: 128)
                }
                Section("Telemetry") {
                    TextField("http://laptop:8765/v1/events", text: $telemetryURL)
                        .textInputAutocapitalization(.never).autocorrectionDisabled().keyboardType(.URL)
                    SecureField("Token", text: $telemetryToken)
                }
                Section("Status") {
                    Text(controller.status).font(.callout)
                    MemoryRow(footprintMB: controller.footprintMB, availableMB: controller.availableMB,
                              budgetMB: Double(budgetMB), pressure: controller.pressure)
                    if let last = controller.losses.last {
                        LabeledContent("Loss", value: String(format: "%.4f (step %d)", last, controller.step))
                    }
                    if let adapter = controller.lastAdapter {
                        LabeledContent("Adapter", value: adapter.lastPathComponent)
                    }
                }
                Section {
                    if controller.running {
                        Button("Stop", role: .destructive) { controller.requestStop(.cancelled) }
                    } else {
                        Button("Train") { controller.start(settings) }
                            .disabled(program.isEmpty || dataFile.isEmpty)
                        Button("Start over (delete checkpoint)", role: .destructive) { controller.resetRun(program: program) }
                            .disabled(program.isEmpty)
                    }
                }
            }
            .navigationTitle("LoRA Trainer")
            .refreshable { controller.refresh() }
            .onAppear { controller.refresh() }
        }
    }

    private var settings: RunSettings {
        var s = RunSettings()
        s.program = program
        s.dataFile = dataFile
        s.backend = backend
        s.steps = steps
        s.lr = lr
        s.budgetMB = budgetMB
        s.telemetryURL = telemetryURL
        s.telemetryToken = telemetryToken
        return s
    }
}

/// Footprint against the budget, what iOS still allows, and the pressure level.
struct MemoryRow: View {
    let footprintMB: Double?
    let availableMB: Double?
    let budgetMB: Double
    let pressure: MemoryPressure

    var body: some View {
        VStack(alignment: .leading, spacing: 4) {
            if let footprintMB {
                ProgressView(value: min(footprintMB, budgetMB), total: budgetMB) {
                    Text(String(format: "Footprint %.0f / %.0f MB", footprintMB, budgetMB))
                }
                .tint(footprintMB > 0.9 * budgetMB ? .red : .accentColor)
            }
            HStack {
                if let availableMB { Text(String(format: "Available %.0f MB", availableMB)) }
                Spacer()
                Text("Pressure: \(pressure.rawValue)").foregroundStyle(pressure == .normal ? Color.secondary : Color.red)
            }
            .font(.caption)
        }
    }
}
