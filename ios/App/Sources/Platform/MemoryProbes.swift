import Darwin
import Foundation
import os
import TrainerCore

/// `ios_phys_footprint`: task_vm_info's phys_footprint (the number jetsam holds against the app:
/// dirty + compressed memory, not clean memory-mapped weight pages) and its lifetime peak
/// (ledger_phys_footprint_peak).
final class FootprintProbe: MemoryProbe {
    func sample() -> MemorySample? {
        var info = task_vm_info_data_t()
        var count = mach_msg_type_number_t(MemoryLayout<task_vm_info_data_t>.size / MemoryLayout<natural_t>.size)
        let kr = withUnsafeMutablePointer(to: &info) {
            $0.withMemoryRebound(to: integer_t.self, capacity: Int(count)) {
                task_info(mach_task_self_, task_flavor_t(TASK_VM_INFO), $0, &count)
            }
        }
        guard kr == KERN_SUCCESS else { return nil }
        let peak = info.ledger_phys_footprint_peak > 0 ? UInt64(info.ledger_phys_footprint_peak) : nil
        return MemorySample(probe: "ios_phys_footprint", anonBytes: UInt64(info.phys_footprint), peakBytes: peak)
    }
}

/// `ios_os_proc_available`: os_proc_available_memory(), what the app may still allocate before it
/// reaches its jetsam limit (raised by the increased-memory-limit entitlement), with the latest
/// memory-pressure level and whether a memory warning arrived.
final class AvailableProbe: MemoryProbe {
    private let monitor: MemoryPressureMonitor

    init(monitor: MemoryPressureMonitor) { self.monitor = monitor }

    static func availableBytes() -> Int { os_proc_available_memory() }

    func sample() -> MemorySample? {
        let available = Self.availableBytes()
        guard available > 0 else { return nil }    // 0 on the simulator and macOS
        return MemorySample(probe: "ios_os_proc_available", availableBytes: UInt64(available),
                            pressure: monitor.level, lowMemory: monitor.receivedWarning ? true : nil)
    }
}
