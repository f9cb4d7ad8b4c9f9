import BackgroundTasks
import Foundation

/// Training in the background with BGProcessingTask: iOS runs it when the phone is idle and (as
/// requested here) on external power, and ends it whenever it likes; the expiration handler pauses
/// the run at the next step boundary (checkpoint + run_end "paused"), and the next task resumes it.
enum BackgroundTraining {
    static let identifier = "org.onphonellm.trainer.train"

    static func register(controller: TrainingController) {
        BGTaskScheduler.shared.register(forTaskWithIdentifier: identifier, using: nil) { task in
            guard let task = task as? BGProcessingTask else { return }
            handle(task, controller: controller)
        }
    }

    /// Ask iOS for a background session (call when a run is paused or the app goes to the background).
    static func schedule() {
        let request = BGProcessingTaskRequest(identifier: identifier)
        request.requiresExternalPower = true
        request.requiresNetworkConnectivity = false
        do {
            try BGTaskScheduler.shared.submit(request)
        } catch {
            NSLog("BGProcessingTask not scheduled: \(error)")
        }
    }

    private static func handle(_ task: BGProcessingTask, controller: TrainingController) {
        task.expirationHandler = {
            controller.requestPause(reason: "background time expired")
        }
        controller.resumeInBackground { finished in
            if !finished { schedule() }
            task.setTaskCompleted(success: true)
        }
    }
}
