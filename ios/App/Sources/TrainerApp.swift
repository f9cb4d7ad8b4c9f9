import SwiftUI

/// The app: one screen to pick a program and data, train within a memory budget, and watch
/// loss and memory; the training itself is TrainerCore's `TrainingSession`.
@main
struct TrainerApp: App {
    @StateObject private var controller: TrainingController

    init() {
        let controller = TrainingController()
        _controller = StateObject(wrappedValue: controller)
        // BGTaskScheduler wants its handlers registered before launch finishes.
        BackgroundTraining.register(controller: controller)
    }

    var body: some Scene {
        WindowGroup {
            ContentView()
                .environmentObject(controller)
        }
    }
}
