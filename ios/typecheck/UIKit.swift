// Stand-in for the part of UIKit that ios/App/Sources/TrainingController.swift uses: `isIdleTimerDisabled`, background tasks
// (`UIApplication.shared.beginBackgroundTask(withName:expirationHandler:)`, `endBackgroundTask(_:)`,
// `UIBackgroundTaskIdentifier.invalid`), with the signatures of the iOS 17 SDK as Swift imports them
// (UIApplication is main-actor isolated). Only for type-checking on Linux; bodies are placeholders.

public struct UIBackgroundTaskIdentifier: RawRepresentable, Hashable, Sendable {
    public var rawValue: Int
    public init(rawValue: Int) { self.rawValue = rawValue }
    public static let invalid = UIBackgroundTaskIdentifier(rawValue: 0)
}

@MainActor
open class UIApplication {
    public static var shared: UIApplication { fatalError() }
    open func beginBackgroundTask(withName taskName: String?, expirationHandler handler: (@MainActor @Sendable () -> Void)? = nil)
        -> UIBackgroundTaskIdentifier { .invalid }
    open func endBackgroundTask(_ identifier: UIBackgroundTaskIdentifier) {}
    /// Keeps the screen from auto-locking while true.
    open var isIdleTimerDisabled: Bool = false
}
