import Foundation

/// Checkpoint groups (`toolchain/mesp/step.py` `checkpoint_groups`, `toolchain/runtime/loop.py`
/// `LayerLoop.train_step(layers_per_checkpoint=)`): the step's selected layers, ascending, in groups
/// of s; the forward keeps only each group's first layer's input, and when the backward reaches a
/// group's top layer it reruns `block_forward` from that input to rebuild the group's other inputs.
public enum CheckpointGroups {
    /// `selected` (ascending) in groups of `s`.
    public static func groups(_ selected: [Int], layersPerCheckpoint s: Int) throws -> [[Int]] {
        guard s >= 1 else {
            throw TrainerError.badInput("layers per checkpoint must be >= 1 (1 keeps every selected layer's input), got \(s)")
        }
        return stride(from: 0, to: selected.count, by: s).map { Array(selected[$0..<min($0 + s, selected.count)]) }
    }

    /// At most this many layer inputs ([T, d] each) are alive at once when `k` layers are selected:
    /// min(k, ceil(k / s) + s - 1) (the kept inputs below a group plus the group's own). What the
    /// budget guard plans with (`Manifest.plannedPeakBytes(target:selectedLayers:layersPerCheckpoint:)`).
    public static func maxAlive(selected k: Int, layersPerCheckpoint s: Int) -> Int {
        guard k > 0 else { return 0 }
        let s = max(1, s)
        return min(k, (k + s - 1) / s + s - 1)
    }

    /// Exactly how many are alive at most with these groups: the forward keeps one per group; at
    /// group g's top (0-based), the g kept inputs below it and the group's own.
    public static func peakAlive(_ groups: [[Int]]) -> Int {
        max(groups.count, groups.enumerated().map { $0.offset + $0.element.count }.max() ?? 0)
    }

    /// round(sqrt(k)): about the fewest inputs alive for k selected layers (the host's
    /// `sqrt_layers_per_checkpoint`).
    public static func suggested(selected k: Int) -> Int { max(1, Int(Double(max(k, 1)).squareRoot().rounded())) }
}
