import Foundation

public enum StepOutcome: Equatable {
    case trained(step: Int, loss: Float)
    case paused(reason: String)
    case stopped(reason: String)
    case finished
}

/// How a session ended (the telemetry `run_end` status).
public enum RunStatus: String, Equatable, Codable {
    case completed, failed, cancelled, paused
}
