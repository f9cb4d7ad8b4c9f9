// Stand-ins for the app's own Darwin-only platform files (ios/App/Sources/Platform/*.swift: they call
// task_vm_info, os_proc_available_memory, sysctlbyname, UIDevice, DispatchSource memory pressure,
// BGTaskScheduler, URLSession), with the same declarations, so that TrainingController.swift can be
// type-checked on Linux together with the two runtimes (ios/test.sh). Keep in step with those files.
import Foundation
import TrainerCore

final class MemoryPressureMonitor {
    var level: MemoryPressure { .normal }
    var receivedWarning: Bool { false }
    func start() {}
}

final class FootprintProbe: MemoryProbe {
    func sample() -> MemorySample? { nil }
}

final class AvailableProbe: MemoryProbe {
    init(monitor: MemoryPressureMonitor) {}
    static func availableBytes() -> Int { 0 }
    func sample() -> MemorySample? { nil }
}

enum DeviceFacts {
    static func info(budgetBytes: UInt64, background: Bool) -> DeviceInfo { fatalError() }
    static var thermalState: String { "nominal" }
    static var fp16Support: Compute.Fp16Support { .unknown }
    static func batteryFields() -> [String: JSONValue]? { nil }
    static var onExternalPower: Bool { true }
}

enum BackgroundTraining {
    static let identifier = ChargingSchedule.identifier
    static let enabledKey = "trainWhileCharging"
    static var enabled: Bool { false }
    static func register(controller: TrainingController) {}
    static func schedule(savedRun: SavedRun?, checkpointExists: Bool) {}
    static func cancel() {}
}

final class URLSessionTransport: TelemetryTransport {
    init(timeout: TimeInterval = 10) {}
    func post(_ request: TelemetryRequest) -> TransportResult { .failure("stand-in") }
}

#if !canImport(Darwin)
// Darwin Foundation API that swift-corelibs-foundation lacks (used for files picked with fileImporter).
extension URL {
    func startAccessingSecurityScopedResource() -> Bool { false }
    func stopAccessingSecurityScopedResource() {}
}
#endif

enum BackupExclusion {
    static func exclude(_ url: URL) throws {}
}
