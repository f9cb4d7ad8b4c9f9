import Foundation

/// The layer loop, exactly as `toolchain/runtime/loop.py` `LayerLoop` runs it: binds every method
/// input from the manifest (app inputs, activations, views of the memory-mapped weights, views of the
/// state), calls the runtime, copies state outputs into their slices and keeps the checkpoints of the
/// selected layers only (with checkpoint groups, of each group's first layer). Train steps, held-out loss (`runtime/evaluate.py`) and generation with the
/// KV cache (`runtime/generate.py`).
public final class LayerLoop {
    public let manifest: Manifest
    public let weights: MappedWeights
    public let runtime: ProgramRuntime
    public var layers: Int { manifest.loop.layers }
    private var methodsByRole: [String: MethodSpec] = [:]
    /// Serializes every use of the runtime (load, and each call from `execute` until its outputs are
    /// copied out), so a generation on its own thread and the training thread may share one loop and one
    /// runtime: a runtime is never called from two threads at once (an ExecuTorch `Module` is not
    /// thread-safe, and a call's outputs alias the method's arena until its next call). FIFO, so the
    /// two alternate call by call.
    let gate = FairLock()
    /// A generation goes first: while one is in progress (`generate`) the other calls wait before they
    /// queue for `gate`, so its tokens come at the idle speed (`RuntimeGate`).
    public let priority: RuntimeGate
    var generationLoaded = false
    /// Every output buffer and per-call input the loop makes (`BufferPool`): allocated in the first
    /// step, reused by every later one.
    public let buffers = BufferPool()

    /// `priority`: the gate that gives a generation the runtime first (a test passes one with its own clock).
    public init(manifest: Manifest, weights: MappedWeights, runtime: ProgramRuntime, priority: RuntimeGate = RuntimeGate()) throws {
        (self.manifest, self.weights, self.runtime, self.priority) = (manifest, weights, runtime, priority)
        generationMethods = manifest.generationMethods(registeredKernels: runtime.registeredKernels)
        for m in manifest.methods where methodsByRole[m.role] == nil { methodsByRole[m.role] = m }
        // Every weight binding of every layer exists with the manifest's shape and dtype.
        for m in manifest.methods {
            let layered = m.role.hasPrefix("block_")
            for io in m.inputs where io.bind == .weight {
                for layer in (layered ? (0..<manifest.loop.layers).map { Optional($0) } : [nil]) as [Int?] {
                    let ref = io.ref(layer: layer, placeholder: manifest.weights.layerPlaceholder)
                    let v = try weights.view(ref, rows: io.rows)
                    guard v.shape == io.shape, v.dtype == io.dtype else {
                        throw TrainerError.badInput("\(m.name) input \(io.name) (\(ref)) is \(v.dtype)\(v.shape) in the weights file, " +
                                                    "the manifest says \(io.dtype)\(io.shape); re-export the program")
                    }
                }
            }
        }
    }

    /// Open a program directory: manifest, memory-mapped weights (`identitySource`: see `MappedWeights`).
    public convenience init(programDirectory: URL, runtime: ProgramRuntime, identitySource: FileIdentitySource? = nil,
                            priority: RuntimeGate = RuntimeGate()) throws {
        let m = try Manifest.load(directory: programDirectory)
        try self.init(manifest: m, weights: try MappedWeights(url: programDirectory.appendingPathComponent(m.weights.file), identitySource: identitySource),
                      runtime: runtime, priority: priority)
    }

    public func method(role: String) throws -> MethodSpec {
        guard let m = methodsByRole[role] else { throw TrainerError.badInput("the program has no \(role) method; re-export it") }
        return m
    }

    /// Load the training methods (and `block_skip_update` when the loop moves unselected layers).
    public func loadTraining() throws {
        let roles = Contract.trainingRoles.filter { $0 != "block_skip_update" || manifest.loop.movesUnselected }
        let names = try roles.map { try method(role: $0).name }
        try gate.withLock { try runtime.load(methods: names) }
    }

    // MARK: binding

    /// Run the method of `role` (the stock one; see `run`).
    @discardableResult
    func call(_ role: String, layer: Int?, values: [String: TensorBuffer], state: StateBuffer,
              cache: [String: TensorBuffer]? = nil, pos: Int? = nil, into: [String: TensorBuffer] = [:]) throws -> [String: TensorBuffer] {
        try run(try method(role: role), layer: layer, values: values, state: state, cache: cache, pos: pos, into: into)
    }

    /// Run method `m`; state outputs go into their slices, cache outputs of C rows into the layer's
    /// cache at rows pos ..< pos + C (those < S), the others are returned (copied out of the runtime).
    ///
    /// `into`: destinations for activation outputs, by the output's ref (e.g. "d"), used instead of a
    /// pooled buffer and returned as that output (the host's `into=` of `_outputs` / `call_bound`). Each
    /// must have the output's byte count, and when it is the buffer of one of this call's inputs (how
    /// `trainStep` uses it) that input must have the output's dtype and element count; a ref that names
    /// no activation output is refused. A destination may be one of the call's inputs: runtimes write
    /// outputs only after the method has run (`ProgramRuntime.execute(method:layer:inputs:into:)`).
    @discardableResult
    func run(_ m: MethodSpec, layer: Int?, values: [String: TensorBuffer], state: StateBuffer,
             cache: [String: TensorBuffer]? = nil, pos: Int? = nil, into dests: [String: TensorBuffer] = [:],
             generation: Bool = false) throws -> [String: TensorBuffer] {
        let ph = manifest.weights.layerPlaceholder
        var inputs: [LoopInput] = []
        inputs.reserveCapacity(m.inputs.count)
        for io in m.inputs {
            let ref = io.ref(layer: layer, placeholder: ph)
            let bytes: UnsafeRawBufferPointer
            switch io.bind {
            case .weight:
                bytes = try weights.view(ref, rows: io.rows).bytes
            case .state:
                bytes = UnsafeRawBufferPointer(try state.view(ref))
            case .cache:
                guard let b = cache?[ref] else { throw TrainerError.badInput("\(m.name) input \(io.name): no cache \(ref)") }
                bytes = b.bytes
            case .input, .activation, .result:
                guard let b = values[ref] else { throw TrainerError.badInput("\(m.name) input \(io.name): the loop has no \(ref)") }
                bytes = b.bytes
            }
            guard bytes.count == io.byteCount else {
                throw TrainerError.badInput("\(m.name) input \(io.name) (\(ref)) has \(bytes.count) bytes, the manifest says " +
                                            "\(io.dtype)\(io.shape); re-export the program")
            }
            inputs.append(LoopInput(name: io.name, bind: io.bind, ref: ref, dtype: io.dtype, shape: io.shape, bytes: bytes))
        }
        for ref in dests.keys where !m.outputs.contains(where: { $0.bind != .state && $0.bind != .cache && $0.ref == ref }) {
            throw TrainerError.badInput("\(m.name) has no activation output '\(ref)' to write into the buffer given for it")
        }
        // Where each output goes: state outputs into their slices of the state array, activations into
        // the caller's destination for them or pooled buffers the caller keeps, KV-cache rows into the
        // layer's cache at rows pos ..< pos + C: the runtime's one copy is the only one.
        var outputs: [LoopOutput] = []
        outputs.reserveCapacity(m.outputs.count)
        var kept: [String: TensorBuffer] = [:]
        for io in m.outputs {
            let ref = io.ref(layer: layer, placeholder: ph)
            switch io.bind {
            case .state:
                let v = try state.view(ref)
                guard v.count * 4 == io.byteCount else {
                    throw TrainerError.badInput("\(m.name) output \(io.name) (\(ref)) is \(io.dtype)\(io.shape), its state entry holds \(v.count) values; re-export the program")
                }
                outputs.append(LoopOutput(name: io.name, bind: io.bind, ref: ref, dtype: io.dtype, shape: io.shape, bytes: UnsafeMutableRawBufferPointer(v)))
            case .cache:
                guard let target = cache?[ref] else { throw TrainerError.runtime("\(m.name) output \(io.name): no cache \(ref)") }
                // S from the method's own cache input of that ref ([Hk, S, D]), else from the cache's size
                let rows = m.inputs.first { $0.bind == .cache && $0.ref == io.ref }.flatMap { $0.shape.count == 3 ? $0.shape[1] : nil }
                outputs.append(try LoopOutput(name: io.name, bind: io.bind, ref: ref, dtype: io.dtype, shape: io.shape, byteCount: io.byteCount,
                                              cache: target.raw, cacheRows: rows, pos: pos, what: "\(m.name) \(io.name)"))
            default:
                let b: TensorBuffer
                if let d = dests[io.ref] {
                    guard d.byteCount == io.byteCount else {
                        throw TrainerError.badInput("\(m.name): the buffer given for \(io.name) (\(io.ref)) has \(d.byteCount) bytes, " +
                                                    "the manifest says \(io.dtype)\(io.shape)")
                    }
                    for (i, bound) in zip(m.inputs, inputs) where values[bound.ref] === d && (i.dtype != io.dtype || i.count != io.count) {
                        throw TrainerError.badInput("\(m.name): the buffer given for \(io.name) (\(io.ref)) is input \(i.name), " +
                                                    "\(i.dtype)\(i.shape); the manifest says \(io.dtype)\(io.shape) for the output")
                    }
                    b = d
                } else {
                    b = buffers.take(byteCount: io.byteCount)
                }
                kept[io.ref] = b
                outputs.append(LoopOutput(name: io.name, bind: io.bind, ref: ref, dtype: io.dtype, shape: io.shape, bytes: b.raw))
            }
        }
        if !generation { priority.awaitTrainingTurn() }
        gate.lock()
        defer { gate.unlock() }
        // The weights file changed under its mapping (`MappedWeights.checkChanged`): never read it again.
        if let why = weights.stale {
            throw RuntimeFailure(message: "\(why) while it was memory-mapped; the program is not run again: \(MappedWeights.changedAdvice)",
                                 code: "weights_changed")
        }
        try runtime.execute(method: m.name, layer: layer, inputs: inputs, into: outputs)
        return kept
    }

    // MARK: training

    /// embed + every block_forward; the last hidden state and the checkpoints (inputs) of `keep`.
    func forward(inputIds: TensorBuffer, keep: Set<Int>, state: StateBuffer) throws -> (TensorBuffer, [Int: TensorBuffer]) {
        guard var x = try call("embed", layer: nil, values: ["input_ids": inputIds], state: state)["x"] else {
            throw TrainerError.runtime("embed returned no x")
        }
        var checkpoints: [Int: TensorBuffer] = [:]
        for i in 0..<layers {
            if keep.contains(i) { checkpoints[i] = x }      // x is the loop's own copy; never written again
            // An input that is not kept is read by this call only: the output goes into its buffer (the
            // host's forward does the same), one [T, d] besides the checkpoints, not two.
            let dest: [String: TensorBuffer] = keep.contains(i) ? [:] : ["x": x]
            guard let next = try call("block_forward", layer: i, values: ["x": x], state: state, into: dest)["x"] else {
                throw TrainerError.runtime("block_forward returned no x")
            }
            x = next
        }
        return (x, checkpoints)
    }

    func padded(_ ids: [Int64], pad: Int64) throws -> TensorBuffer {
        let t = manifest.seqLen
        guard ids.count <= t else { throw TrainerError.badInput("a row of \(ids.count) tokens is longer than seq_len \(t)") }
        return buffers.take(values: (ids + Array(repeating: pad, count: t - ids.count)).map { $0.littleEndian })
    }

    /// One training step on `state` (updated in place); returns the loss. `selected`: the layers that
    /// get `block_backward` this step (LCSB, chosen at run time); nil = all. Rows shorter than seq_len
    /// are padded: ids with `padTokenId`, labels with -100.
    ///
    /// `layersPerCheckpoint` s (the host's `LayerLoop.train_step(layers_per_checkpoint=)`): the
    /// selected layers, ascending, in groups of s (`CheckpointGroups`); the forward keeps only the
    /// input of each group's first layer; walking the layers top-down, at a group's top layer (before
    /// any layer of the group is updated) `block_forward` reruns from the group's kept input through
    /// the layers below the top (unselected ones included), keeping the inputs of the group's layers;
    /// then backward / skip update as usual. Same losses and state bit for bit, at most
    /// min(k, ceil(k/s) + s - 1) layer inputs alive instead of k. Each checkpoint is freed right after
    /// its layer's backward. Default 1: every selected layer's input kept, no rerun.
    ///
    /// `head_loss` writes its d into the buffer of its input x, and each `block_backward` its d into the
    /// buffer of the incoming d (`run`'s `into`; neither input is read after its call): at those calls
    /// the loop holds the layer inputs alive and one [T, d] buffer besides them, not two, so a step with
    /// every layer selected peaks at the checkpoints alive + 1 [T, d] buffers instead of + 2.
    public func trainStep(inputIds: [Int64], labels: [Int64], lr: Float, state: StateBuffer,
                          selected: Set<Int>? = nil, padTokenId: Int64 = 0, layersPerCheckpoint: Int = 1) throws -> Float {
        let sel = selected ?? Set(0..<layers)
        guard !sel.isEmpty, sel.allSatisfy({ (0..<layers).contains($0) }) else {
            throw TrainerError.badInput("selected layers must be a non-empty subset of 0..\(layers - 1), got \(sel.sorted())")
        }
        guard inputIds.count == labels.count else { throw TrainerError.badInput("input_ids and labels differ in length") }
        let groups = try CheckpointGroups.groups(sel.sorted(), layersPerCheckpoint: layersPerCheckpoint)
        var topOf: [Int: [Int]] = [:]
        for g in groups { topOf[g[g.count - 1]] = g }
        let ids = try padded(inputIds, pad: padTokenId)
        let lab = try padded(labels, pad: -100)
        if let step = manifest.state.stepEntry {
            let v = try state.view(step)
            v[v.startIndex] += 1      // AdamW step counter (the state is little-endian float32 on every target)
        }
        var (x, checkpoints) = try forward(inputIds: ids, keep: Set(groups.map { $0[0] }), state: state)
        // d goes into x's buffer (x is not read after head_loss; runtimes write outputs after the method
        // has run): one [T, d] buffer fewer at the step's peak (the host's train_step does the same).
        var out = try call("head_loss", layer: nil, values: ["x": x, "labels": lab], state: state, into: ["d": x])
        x = .empty
        guard let lossBuf = out["loss"], out["d"] != nil else { throw TrainerError.runtime("head_loss returned no loss or d") }
        var values: [String: TensorBuffer] = ["d": out.removeValue(forKey: "d")!, "lr": buffers.take(values: [lr.bitPattern.littleEndian])]
        out.removeAll()
        var alive = checkpoints.count
        for i in stride(from: layers - 1, through: 0, by: -1) {
            if let group = topOf[i], group.count > 1 {
                guard let first = checkpoints.removeValue(forKey: group[0]) else { throw TrainerError.runtime("no checkpoint of layer \(group[0])") }
                try rerun(group, from: first, state: state, into: &checkpoints)
                alive = max(alive, checkpoints.count)
            }
            if sel.contains(i) {
                guard let checkpoint = checkpoints.removeValue(forKey: i) else { throw TrainerError.runtime("no checkpoint of layer \(i)") }
                values["checkpoint"] = checkpoint
                // the new d into the incoming d's buffer (read by this call only)
                guard let d = values["d"], let next = try call("block_backward", layer: i, values: values, state: state, into: ["d": d])["d"] else {
                    throw TrainerError.runtime("block_backward returned no d")
                }
                values["d"] = next
                values["checkpoint"] = nil      // freed now: no layer needs it again
            } else if manifest.loop.movesUnselected {
                try call("block_skip_update", layer: i, values: values, state: state)
            }
        }
        lastStepPeakCheckpoints = alive
        return lossBuf.floatValue(0)
    }

    /// Layer inputs ([T, d] checkpoints) the last `trainStep` held at most at once.
    public private(set) var lastStepPeakCheckpoints = 0

    /// The inputs of `group`'s layers into `checkpoints`, rebuilt from the first one's input by
    /// `block_forward` through layers group[0] ..< group.last (the unselected ones between included;
    /// an output not kept is freed as soon as the next layer has run).
    private func rerun(_ group: [Int], from first: TensorBuffer, state: StateBuffer, into checkpoints: inout [Int: TensorBuffer]) throws {
        let wanted = Set(group)
        checkpoints[group[0]] = first
        var x = first
        for j in group[0]..<group[group.count - 1] {
            // A group layer's input is kept (first is group[0]'s): the output needs its own buffer; any other
            // input is read by this call only, and the output goes into its buffer (the host's _rerun).
            let dest: [String: TensorBuffer] = wanted.contains(j) ? [:] : ["x": x]
            guard let next = try call("block_forward", layer: j, values: ["x": x], state: state, into: dest)["x"] else {
                throw TrainerError.runtime("block_forward returned no x")
            }
            x = next
            if wanted.contains(j + 1) { checkpoints[j + 1] = x }
        }
    }

    // MARK: held-out loss

    /// The mean next-token cross-entropy over all target tokens of `rows` (rows pooled: each row's
    /// loss weighted by its targets, labels[1:] != -100); rows without a target are skipped. The
    /// state is read, never written. Returns (loss, tokens).
    ///
    /// `cancelled` is asked before each row: true ends the pass with `EvalCancelled` (no result);
    /// `onRow(i, n)` comes before row i (0-based) of the n ("row i of N"). The caller caps the rows
    /// (`Contract.heldOutEvalRows`).
    public func evaluate(rows: [(inputIds: [Int64], labels: [Int64])], state: StateBuffer, padTokenId: Int64 = 0,
                         cancelled: () -> Bool = { false }, onRow: (Int, Int) -> Void = { _, _ in }) throws -> (loss: Double, tokens: Int) {
        var total = 0.0
        var tokens = 0
        for (index, row) in rows.enumerated() {
            if cancelled() { throw EvalCancelled(row: index, rows: rows.count) }
            onRow(index, rows.count)
            let lab = try padded(row.labels, pad: -100)
            let n = lab.raw.bindMemory(to: Int64.self).dropFirst().filter { $0 != -100 }.count
            if n == 0 { continue }
            let (x, _) = try forward(inputIds: try padded(row.inputIds, pad: padTokenId), keep: [], state: state)
            let out = try call("head_loss", layer: nil, values: ["x": x, "labels": lab], state: state)
            guard let loss = out["loss"] else { throw TrainerError.runtime("head_loss returned no loss") }
            total += Double(loss.floatValue(0)) * Double(n)
            tokens += n
        }
        return (tokens > 0 ? total / Double(tokens) : .nan, tokens)
    }

    // MARK: generation

    /// The method called for each generation role on this runtime: the fused variant where the
    /// runtime has the manifest's `generate.fused.kernels` registered, else the stock one
    /// (`Manifest.generationMethods(registeredKernels:)`).
    public let generationMethods: [String: MethodSpec]
}

/// A held-out pass stopped before row `row` of `rows` (`LayerLoop.evaluate`'s `cancelled`).
public struct EvalCancelled: Error, CustomStringConvertible {
    public let row: Int, rows: Int
    public var description: String { "held-out loss stopped before row \(row + 1) of \(rows)" }
}
