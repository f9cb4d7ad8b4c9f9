import Darwin
import Foundation
import TrainerCore
import UIKit

/// The run_start facts of this phone, and its thermal and battery state for telemetry.
enum DeviceFacts {
    /// The hardware identifier, e.g. "iPhone16,1" (sysctl hw.machine).
    static var machine: String {
        var size = 0
        sysctlbyname("hw.machine", nil, &size, nil, 0)
        var buffer = [CChar](repeating: 0, count: max(size, 1))
        sysctlbyname("hw.machine", &buffer, &size, nil, 0)
        let name = String(cString: buffer)
        return name.isEmpty ? "iPhone" : name
    }

    /// Whether XNNPACK has float16 GEMMs here: the CPU's ARMv8.2 FP16 arithmetic (sysctl hw.optional.arm.FEAT_FP16,
    /// which every A11 and later has; absent on older systems: unknown).
    static var fp16Support: Compute.Fp16Support {
        var value: Int32 = 0
        var size = MemoryLayout<Int32>.size
        let ok = sysctlbyname("hw.optional.arm.FEAT_FP16", &value, &size, nil, 0) == 0
        return Compute.fp16Support(featFP16: ok ? Int(value) : nil)
    }

    static var osName: String {
        let v = ProcessInfo.processInfo.operatingSystemVersion
        return "iOS \(v.majorVersion).\(v.minorVersion)" + (v.patchVersion > 0 ? ".\(v.patchVersion)" : "")
    }

    static func info(budgetBytes: UInt64, background: Bool) -> DeviceInfo {
        let version = Bundle.main.object(forInfoDictionaryKey: "CFBundleShortVersionString") as? String
        return DeviceInfo(platform: "ios", deviceModel: machine, os: osName,
                          totalRamBytes: ProcessInfo.processInfo.physicalMemory, budgetBytes: budgetBytes,
                          appVersion: version,
                          config: ["background_task": .string(background ? "BGProcessingTask" : "foreground"),
                                   "requires_external_power": .bool(background)])
    }

    /// ProcessInfo.ThermalState as the telemetry schema spells it.
    static var thermalState: String {
        switch ProcessInfo.processInfo.thermalState {
        case .nominal: return "nominal"
        case .fair: return "fair"
        case .serious: return "serious"
        case .critical: return "critical"
        @unknown default: return "critical"
        }
    }

    /// The `battery` event fields, or nil when the level is unknown (simulator).
    static func batteryFields() -> [String: JSONValue]? {
        let device = UIDevice.current
        device.isBatteryMonitoringEnabled = true
        guard device.batteryLevel >= 0 else { return nil }
        let charging = device.batteryState == .charging || device.batteryState == .full
        return ["level_pct": .double(Double(device.batteryLevel) * 100), "charging": .bool(charging),
                "low_power_mode": .bool(ProcessInfo.processInfo.isLowPowerModeEnabled)]
    }

    /// On the charger (charging or full): what a background run needs to go on (`BackgroundRunGate`).
    /// Unknown (simulator): true.
    static var onExternalPower: Bool {
        let device = UIDevice.current
        device.isBatteryMonitoringEnabled = true
        return device.batteryState != .unplugged
    }
}
