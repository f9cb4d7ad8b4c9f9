import Foundation

/// The OS's memory-pressure level (iOS: DispatchSource.makeMemoryPressureSource).
public enum MemoryPressure: String, Equatable {
    case normal, warning, critical
}

/// One reading of one probe, in bytes. iOS probes: `ios_phys_footprint` (anon = task_vm_info
/// phys_footprint, peak = ledger_phys_footprint_peak) and `ios_os_proc_available`
/// (available = os_proc_available_memory()).
public struct MemorySample: Equatable {
    public var probe: String
    public var anonBytes: UInt64?
    public var peakBytes: UInt64?
    public var availableBytes: UInt64?
    public var pressure: MemoryPressure?
    public var lowMemory: Bool?

    public init(probe: String, anonBytes: UInt64? = nil, peakBytes: UInt64? = nil, availableBytes: UInt64? = nil,
                pressure: MemoryPressure? = nil, lowMemory: Bool? = nil) {
        (self.probe, self.anonBytes, self.peakBytes, self.availableBytes) = (probe, anonBytes, peakBytes, availableBytes)
        (self.pressure, self.lowMemory) = (pressure, lowMemory)
    }

    /// The telemetry `memory` event fields of this sample.
    public func eventFields(step: Int?) -> [String: JSONValue] {
        var f: [String: JSONValue] = ["probe": .string(probe)]
        if let step { f["step"] = .int(Int64(step)) }
        if let anonBytes { f["anon_bytes"] = .int(Int64(anonBytes)) }
        if let peakBytes { f["peak_bytes"] = .int(Int64(peakBytes)) }
        if let availableBytes { f["available_bytes"] = .int(Int64(availableBytes)) }
        if let pressure { f["pressure"] = .string(pressure.rawValue) }
        if let lowMemory { f["low_memory"] = .bool(lowMemory) }
        return f
    }
}

/// A source of memory readings (the app's task_vm_info and os_proc_available_memory probes).
public protocol MemoryProbe: AnyObject {
    func sample() -> MemorySample?
}

/// What the guard wants done before the next step.
public enum GuardDecision: Equatable {
    case proceed
    /// Checkpoint and wait (pressure, or too little memory left right now); resume later.
    case pause(reason: String)
    /// The run cannot fit its budget: checkpoint and end it (telemetry error `budget_exceeded`).
    case stop(reason: String)
}

/// Keeps a run inside its memory budget. Before each step it predicts the step's peak footprint:
/// until a step has been measured, the larger of the footprint now and the manifest's planned peak
/// (`Manifest.plannedPeakBytes(target:)`); afterwards, the footprint now plus the largest growth one
/// step has shown. Then it
/// - stops when the prediction exceeds the budget (the run does not fit; waiting will not help);
/// - pauses when the OS reports critical pressure (or warning, if `pauseOnWarning`), or when
///   os_proc_available_memory is below the predicted growth plus a safety margin;
/// - otherwise lets the step run.
public final class MemoryGuard {
    public let budgetBytes: UInt64
    public private(set) var plannedPeakBytes: UInt64
    public let availableMarginBytes: UInt64
    public let pauseOnWarning: Bool
    /// Largest footprint growth measured during one step (nil until a step was measured).
    public private(set) var stepGrowthBytes: UInt64?
    public private(set) var peakFootprintBytes: UInt64 = 0
    private var beforeStep: UInt64?

    public init(budgetBytes: UInt64, plannedPeakBytes: UInt64, availableMarginBytes: UInt64 = 64 << 20,
                pauseOnWarning: Bool = false) {
        (self.budgetBytes, self.plannedPeakBytes) = (budgetBytes, plannedPeakBytes)
        (self.availableMarginBytes, self.pauseOnWarning) = (availableMarginBytes, pauseOnWarning)
    }

    /// The working set changed (memory pressure): plan with `plannedPeakBytes` and learn the growth per step again.
    public func replan(plannedPeakBytes p: UInt64) {
        plannedPeakBytes = p
        stepGrowthBytes = nil
    }

    /// The footprint the next step is expected to reach, from the footprint before it.
    public func predictedPeak(footprint: UInt64) -> UInt64 {
        if let g = stepGrowthBytes { return footprint + g }
        return max(footprint, plannedPeakBytes)
    }

    /// Decide before a step. `footprint`: the ios_phys_footprint sample; `available`: the
    /// ios_os_proc_available sample; `pressure`: the latest memory-pressure event.
    public func decide(footprint: UInt64?, available: UInt64?, pressure: MemoryPressure) -> GuardDecision {
        var growth = stepGrowthBytes ?? 0
        if let footprint {
            beforeStep = footprint
            peakFootprintBytes = max(peakFootprintBytes, footprint)
            let predicted = predictedPeak(footprint: footprint)
            growth = predicted - footprint
            if predicted > budgetBytes {
                return .stop(reason: "predicted peak \(mb(predicted)) exceeds the \(mb(budgetBytes)) budget " +
                                     "(footprint now \(mb(footprint))); export with a shorter --seq-len, " +
                                     "LCSB or int4, or raise the budget")
            }
        }
        if pressure == .critical || (pressure == .warning && pauseOnWarning) {
            return .pause(reason: "memory pressure is \(pressure.rawValue)")
        }
        if let available, available < growth + availableMarginBytes {
            return .pause(reason: "only \(mb(available)) available; a step needs \(mb(growth)) + \(mb(availableMarginBytes)) margin")
        }
        return .proceed
    }

    /// Learn from a finished step. `peakAfter` (iOS: the lifetime footprint peak) counts only when
    /// it rose above every footprint seen before, i.e. during this step.
    public func observeStep(footprintAfter: UInt64?, peakAfter: UInt64?) {
        guard let before = beforeStep else { return }
        var top = footprintAfter ?? before
        if let peakAfter, peakAfter > peakFootprintBytes { top = max(top, peakAfter) }
        peakFootprintBytes = max(peakFootprintBytes, top)
        let growth = top > before ? top - before : 0
        stepGrowthBytes = max(stepGrowthBytes ?? 0, growth)
        beforeStep = nil
    }
}

func mb(_ bytes: UInt64) -> String { String(format: "%.1f MB", Double(bytes) / 1_048_576) }
