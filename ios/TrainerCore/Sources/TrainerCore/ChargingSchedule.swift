import Foundation

/// "Train while charging": what decides whether the app asks iOS for a background processing task,
/// what it asks for, and when a run inside one stops. The app's `BackgroundTraining` (BGTaskScheduler,
/// Darwin only) does what this says; the rules are here so they are tested on Linux.
public enum ChargingSchedule {
    /// What `BGProcessingTaskRequest` gets.
    public struct Request: Equatable {
        public var identifier: String
        public var requiresExternalPower: Bool
        public var requiresNetworkConnectivity: Bool
        /// Not before this (nil: as soon as iOS likes).
        public var earliestBeginDate: Date?
    }

    public static let identifier = "org.onphonellm.trainer.train"

    /// Ask for a task only when the switch is on and there is a run to continue: saved, unfinished and
    /// not stopped by the user (`SavedRun.resumable`: paused or killed), with its checkpoint on disk.
    public static func shouldSchedule(enabled: Bool, savedRun: SavedRun?, checkpointExists: Bool) -> Bool {
        guard enabled, let run = savedRun else { return false }
        return run.resumable && checkpointExists
    }

    /// On external power only (the point: overnight on the charger), no network (telemetry waits in
    /// its queue), not before `delay` seconds from `now` (0: no earliest date).
    public static func request(now: Date = Date(), delay: TimeInterval = 0) -> Request {
        Request(identifier: identifier, requiresExternalPower: true, requiresNetworkConnectivity: false,
                earliestBeginDate: delay > 0 ? now.addingTimeInterval(delay) : nil)
    }

    /// After a background session: schedule the next one unless the run completed, failed or was
    /// stopped by the user (same rule as `shouldSchedule`).
    public static func scheduleAgain(enabled: Bool, status: RunStatus, checkpointExists: Bool) -> Bool {
        enabled && status == .paused && checkpointExists
    }
}

/// The stop condition of a run inside a background task, checked by `TrainingSession.run(interrupt:)`
/// at step boundaries only (the step in progress finishes; the checkpoint and `run_end paused` follow):
/// iOS expired the task, the phone left the charger, or the switch was turned off. Thread-safe: the
/// expiration handler calls `expire()` on its own thread.
public final class BackgroundRunGate: @unchecked Sendable {
    private let lock = NSLock()
    private var expired = false
    private var reasonStorage: String?
    private let onPower: () -> Bool
    private let enabled: () -> Bool

    /// - onPower: whether the phone is on external power now (the app: `UIDevice.batteryState` is
    ///   `.charging` or `.full`).
    public init(onPower: @escaping () -> Bool, enabled: @escaping () -> Bool = { true }) {
        (self.onPower, self.enabled) = (onPower, enabled)
    }

    /// iOS ended the task's time (`BGTask.expirationHandler`).
    public func expire() { lock.lock(); expired = true; lock.unlock() }

    /// Why the run stopped (nil while it may go on).
    public var reason: String? { lock.lock(); defer { lock.unlock() }; return reasonStorage }

    /// `.paused` when the run must stop at this step boundary, else nil.
    public func interrupt() -> RunStatus? {
        lock.lock()
        defer { lock.unlock() }
        if expired { reasonStorage = "background time ended" }
        else if !onPower() { reasonStorage = "the phone left the charger" }
        else if !enabled() { reasonStorage = "train while charging was turned off" }
        else { return nil }
        return .paused
    }
}

/// When a run the background paused resumes: the app went to the background while the run was busy
/// (it asked it to pause), and now it is active again and the run is no longer busy (the pause has
/// finished: the last step, the checkpoint, `run_end paused`). Either can come first: a return during
/// the last step resumes as soon as that step's pause ends. Used on the main thread only.
public struct ResumeOnReturn: Equatable {
    public private(set) var pending = false
    public private(set) var active = true

    public init() {}

    /// The scene went to the background; `busy`: a run was going (it is asked to pause).
    public mutating func backgrounded(busy: Bool) {
        active = false
        if busy { pending = true }
    }

    /// The scene is active again.
    public mutating func activated() { active = true }

    /// Whether to resume now (then it is no longer pending): call on activation and when a run ends.
    /// `busy`: a run is still going; `canResume`: the saved run can be resumed.
    public mutating func shouldResume(busy: Bool, canResume: Bool) -> Bool {
        guard pending, active, !busy else { return false }
        pending = false
        return canResume
    }
}
