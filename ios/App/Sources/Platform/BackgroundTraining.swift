import BackgroundTasks
import Foundation
import TrainerCore

/// "Train while charging" with BGProcessingTask: iOS runs the task when the phone is idle and on
/// external power (`ChargingSchedule.request`: requiresExternalPower), and ends it whenever it likes.
/// The task resumes the saved run from its checkpoint; the run stops at the next step boundary
/// (checkpoint + run_end "paused") when iOS expires the task, the phone leaves the charger or the
/// switch is turned off (`BackgroundRunGate`), and the next task is asked for while there is still a
/// paused run (`ChargingSchedule.scheduleAgain`). Whether to ask at all: `ChargingSchedule.shouldSchedule`.
enum BackgroundTraining {
    static let identifier = ChargingSchedule.identifier
    static let enabledKey = "trainWhileCharging"

    /// The screen's switch (UserDefaults, `@AppStorage("trainWhileCharging")`).
    static var enabled: Bool { UserDefaults.standard.bool(forKey: enabledKey) }

    static func register(controller: TrainingController) {
        BGTaskScheduler.shared.register(forTaskWithIdentifier: identifier, using: nil) { task in
            guard let task = task as? BGProcessingTask else { return }
            handle(task, controller: controller)
        }
    }

    /// Ask iOS for a background session when the rules say so (a paused run, the switch on).
    static func schedule(savedRun: SavedRun?, checkpointExists: Bool) {
        guard ChargingSchedule.shouldSchedule(enabled: enabled, savedRun: savedRun, checkpointExists: checkpointExists) else { return }
        let r = ChargingSchedule.request()
        let request = BGProcessingTaskRequest(identifier: r.identifier)
        request.requiresExternalPower = r.requiresExternalPower
        request.requiresNetworkConnectivity = r.requiresNetworkConnectivity
        request.earliestBeginDate = r.earliestBeginDate
        do {
            try BGTaskScheduler.shared.submit(request)
        } catch {
            NSLog("BGProcessingTask not scheduled: \(error)")
        }
    }

    /// The switch was turned off: drop a pending request.
    static func cancel() {
        BGTaskScheduler.shared.cancel(taskRequestWithIdentifier: identifier)
    }

    private static func handle(_ task: BGProcessingTask, controller: TrainingController) {
        let gate = BackgroundRunGate(onPower: { DeviceFacts.onExternalPower }, enabled: { enabled })
        task.expirationHandler = { gate.expire() }
        guard enabled else { task.setTaskCompleted(success: true); return }
        controller.resumeInBackground(gate: gate) { status, checkpointExists in
            if ChargingSchedule.scheduleAgain(enabled: enabled, status: status, checkpointExists: checkpointExists) {
                schedule(savedRun: SavedRun.load(from: controller.paths.latestRun), checkpointExists: checkpointExists)
            }
            task.setTaskCompleted(success: status != .failed)
        }
    }
}
