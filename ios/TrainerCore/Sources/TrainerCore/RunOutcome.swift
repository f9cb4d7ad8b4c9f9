import Foundation

/// How a training run ended, as its `run_end` event says: the status, the steps in the state, the
/// last step's loss (nil: no step, or a non-finite loss) and the reason of a pause or a stop.
public struct RunOutcome: Equatable {
    public var status: RunStatus
    public var stepsCompleted: Int
    public var finalLoss: Float?
    public var message: String?

    public init(status: RunStatus, stepsCompleted: Int, finalLoss: Float? = nil, message: String? = nil) {
        (self.status, self.stepsCompleted, self.finalLoss, self.message) = (status, stepsCompleted, finalLoss, message)
    }
}

/// The status of a run's end (the telemetry `run_end` status).
public enum RunStatus: String, Equatable, Codable {
    case completed, failed, cancelled, paused
}

/// What one `TrainingSession.trainStep()` call did: trained step `step`, paused or stopped by the
/// budget guard (or a changed weights file) before it, or nothing because the run is done.
public enum StepOutcome: Equatable {
    case trained(step: Int, loss: Float)
    case paused(reason: String)
    case stopped(reason: String)
    case finished
}
