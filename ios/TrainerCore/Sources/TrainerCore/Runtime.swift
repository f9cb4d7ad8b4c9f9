import Foundation

/// What the trainer needs from an inference runtime that runs an exported training program.
/// Backends: ExecuTorch (`model.pte`, app target) and Core ML (`.mlpackage` with state, iOS 18,
/// app target); `FakeRuntime` here for tests. A backend is used from one thread at a time.
///
/// Contract (manifest description): `load(methods:)` with every method of the manifest before the
/// first call, because loading a method re-initializes the shared LoRA state on ExecuTorch; the
/// optimizer runs inside the program, so `trainStep` both computes the loss and updates the state.
public protocol TrainingRuntime: AnyObject {
    /// `executorch` or `coreml` (the telemetry `backend` field).
    var backendName: String { get }
    /// Load all methods, in the order given.
    func load(methods: [String]) throws
    /// Run one step: input_ids int64[T], labels int64[T], lr float32[1] -> loss float32[1].
    func trainStep(method: String, inputIds: [Int64], labels: [Int64], lr: Float) throws -> Float
    /// A copy of the flat float32 state (LoRA params, then optimizer moments; manifest order).
    func getState() throws -> [Float]
    /// Overwrite the state (resume). Call after `load(methods:)`.
    func setState(_ state: [Float]) throws
}

extension TrainingRuntime {
    /// Check that the methods share one state, as the contract needs: set a marked state through
    /// `set_state`, read it back through `get_state`, then restore the original. A runtime that gives
    /// each method its own copy of the mutable buffers (e.g. ExecuTorch's `Module` without shared
    /// memory arenas) would otherwise train silently without ever changing what `get_state` returns.
    public func verifySharedState(numel: Int) throws {
        let original = try getState()
        guard original.count == numel else {
            throw TrainerError.runtime("get_state returned \(original.count) values, the manifest says \(numel); re-export the program")
        }
        var marked = original
        marked[0] = original[0] == 1234.5 ? -1234.5 : 1234.5
        try setState(marked)
        let readBack = try getState()
        try setState(original)
        guard readBack.count == numel, readBack[0] == marked[0] else {
            throw TrainerError.runtime(
                "\(backendName): set_state is not seen by get_state, so the methods do not share the LoRA state; " +
                "use a runtime build that shares memory arenas across methods (see docs/ios.md)")
        }
    }
}

/// A deterministic stand-in for a training program, for tests and UI previews. It follows the
/// manifest: loading any method resets the state to its initial value (as ExecuTorch does), calling
/// a method that was not loaded fails, and a step only moves the parameters of the layers its LCSB
/// phase backpropagates (a toy quadratic loss pulls each parameter towards a target).
public final class FakeRuntime: TrainingRuntime {
    public let backendName: String
    public private(set) var loaded: [String] = []
    public private(set) var calls: [String] = []
    public private(set) var state: [Float]
    /// false: each method keeps its own state (the failure `verifySharedState` must catch).
    public let sharedState: Bool
    /// Fail the train step with this index (0-based, counted over this object's life), for error paths.
    public var failAtStep: Int?
    private var stepCalls = 0

    private let manifest: ProgramManifest
    private let initial: [Float]
    private var perMethodState: [String: [Float]] = [:]
    private let entryLayer: [Int?]

    public init(manifest: ProgramManifest, seed: UInt64 = 1, sharedState: Bool = true, backendName: String = "executorch") {
        self.manifest = manifest
        self.sharedState = sharedState
        self.backendName = backendName
        var rng = SplitMix64(state: seed)
        initial = (0..<manifest.state.numel).map { _ in Float(Double(rng.next() % 2000) / 1000.0 - 1.0) }
        state = initial
        entryLayer = manifest.state.entries.map { FakeRuntime.layer(ofKey: $0.key) }
    }

    static func layer(ofKey key: String) -> Int? {
        guard let r = key.range(of: "layers.") else { return nil }
        return Int(key[r.upperBound...].prefix { $0.isNumber })
    }

    public func load(methods: [String]) throws {
        for name in methods {
            guard manifest.methods.contains(where: { $0.name == name }) else {
                throw TrainerError.runtime("method \(name) is not in the program")
            }
            loaded.append(name)
            state = initial                      // loading re-initializes the shared state
            perMethodState = [:]
        }
    }

    private func requireLoaded(_ name: String) throws {
        guard loaded.contains(name) else { throw TrainerError.runtime("method \(name) was called before it was loaded") }
        calls.append(name)
    }

    private func read(_ method: String) -> [Float] { sharedState ? state : (perMethodState[method] ?? initial) }
    private func write(_ method: String, _ s: [Float]) {
        if sharedState { state = s } else { perMethodState[method] = s }
    }

    public func trainStep(method: String, inputIds: [Int64], labels: [Int64], lr: Float) throws -> Float {
        try requireLoaded(method)
        defer { stepCalls += 1 }
        if stepCalls == failAtStep { throw TrainerError.runtime("injected failure in \(method)") }
        guard inputIds.count == manifest.seqLen, labels.count == manifest.seqLen else {
            throw TrainerError.runtime("\(method) takes [\(manifest.seqLen)] inputs, got \(inputIds.count)/\(labels.count)")
        }
        let selected: Set<Int>? = manifest.methods.first { $0.name == method }?.backwardLayers.map(Set.init)
        let target = Float(labels.reduce(0) { $0 + ($1 < 0 ? 0 : $1 % 7) }) / Float(7 * labels.count)
        var s = read(method)
        var loss: Double = 0
        var n = 0
        for (i, e) in manifest.state.entries.enumerated() where e.role == "param" {
            let moves = selected == nil || entryLayer[i].map { selected!.contains($0) } ?? true
            for j in e.offset..<(e.offset + e.count) {
                let d = s[j] - target
                loss += Double(d * d)
                n += 1
                if moves { s[j] -= lr * 2 * d }
            }
        }
        write(method, s)
        return Float(loss / Double(max(n, 1)))
    }

    public func getState() throws -> [Float] {
        try requireLoaded("get_state")
        return read("get_state")
    }

    public func setState(_ newState: [Float]) throws {
        try requireLoaded("set_state")
        guard newState.count == manifest.state.numel else {
            throw TrainerError.runtime("set_state takes \(manifest.state.numel) values, got \(newState.count)")
        }
        write("set_state", newState)
    }
}
