import Foundation

/// Facts about the phone for the `run_start` event (the app fills them in).
public struct DeviceInfo: Equatable {
    public var platform: String
    public var deviceModel: String
    public var os: String
    public var totalRamBytes: UInt64
    public var budgetBytes: UInt64
    public var deviceProfile: String?
    public var appVersion: String?
    /// Free-form `config` of run_start (e.g. background task, power requirement).
    public var config: [String: JSONValue]

    public init(platform: String = "ios", deviceModel: String, os: String, totalRamBytes: UInt64, budgetBytes: UInt64,
                deviceProfile: String? = nil, appVersion: String? = nil, config: [String: JSONValue] = [:]) {
        (self.platform, self.deviceModel, self.os, self.totalRamBytes) = (platform, deviceModel, os, totalRamBytes)
        (self.budgetBytes, self.deviceProfile, self.appVersion, self.config) = (budgetBytes, deviceProfile, appVersion, config)
    }
}

/// Memory readings the session takes around each step (any may be nil: probe not available).
public struct MemoryProbes {
    public var footprint: MemoryProbe?
    public var available: MemoryProbe?
    /// The latest memory-pressure level (the app's dispatch source updates it).
    public var pressure: () -> MemoryPressure

    public init(footprint: MemoryProbe? = nil, available: MemoryProbe? = nil,
                pressure: @escaping () -> MemoryPressure = { .normal }) {
        (self.footprint, self.available, self.pressure) = (footprint, available, pressure)
    }
}
