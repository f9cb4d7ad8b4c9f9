import Foundation

/// Memory the loop owns at a fixed address (64-byte aligned, zeroed), so its bytes can be handed to a
/// runtime in place (ExecuTorch `Tensor(bytesNoCopy:)`) for the length of a call.
public final class TensorBuffer {
    public let raw: UnsafeMutableRawBufferPointer

    public init(byteCount: Int) {
        raw = UnsafeMutableRawBufferPointer.allocate(byteCount: max(byteCount, 1), alignment: 64)
        raw.initializeMemory(as: UInt8.self, repeating: 0)
        TensorMemory.allocated(raw.count)
    }

    /// One shared empty buffer: what a variable is set to when the loop lets go of an activation
    /// (never written; no allocation per use).
    public static let empty = TensorBuffer(byteCount: 0)

    public convenience init(copying bytes: UnsafeRawBufferPointer) {
        self.init(byteCount: bytes.count)
        if bytes.count > 0 { raw.baseAddress!.copyMemory(from: bytes.baseAddress!, byteCount: bytes.count) }
    }

    public convenience init(copying data: Data) {
        self.init(byteCount: data.count)
        data.withUnsafeBytes { if $0.count > 0 { raw.baseAddress!.copyMemory(from: $0.baseAddress!, byteCount: $0.count) } }
    }

    public convenience init<T>(values: [T]) {
        self.init(byteCount: values.count * MemoryLayout<T>.stride)
        values.withUnsafeBytes { if $0.count > 0 { raw.baseAddress!.copyMemory(from: $0.baseAddress!, byteCount: $0.count) } }
    }

    deinit {
        TensorMemory.freed(raw.count)
        raw.deallocate()
    }

    public var byteCount: Int { raw.count }
    public var bytes: UnsafeRawBufferPointer { UnsafeRawBufferPointer(raw) }
    public var floats: UnsafeMutableBufferPointer<Float> { raw.bindMemory(to: Float.self) }
    public func slice(_ byteOffset: Int, _ count: Int) -> UnsafeRawBufferPointer {
        UnsafeRawBufferPointer(rebasing: bytes[byteOffset..<byteOffset + count])
    }
}

/// Bytes held by live `TensorBuffer`s (the loop's own memory: the state array, activations,
/// checkpoints, KV caches), and the most held at once since `resetPeak()`; what the tests use to see
/// that a step really frees what it no longer needs (checkpoint groups).
public enum TensorMemory {
    private static let lock = NSLock()
    private static var liveBytes = 0
    private static var peakBytes = 0
    private static var allocationCount = 0

    static func allocated(_ n: Int) {
        lock.lock()
        liveBytes += n
        allocationCount += 1
        if liveBytes > peakBytes { peakBytes = liveBytes }
        lock.unlock()
    }

    static func freed(_ n: Int) {
        lock.lock()
        liveBytes -= n
        lock.unlock()
    }

    public static var live: Int { lock.lock(); defer { lock.unlock() }; return liveBytes }
    public static var peak: Int { lock.lock(); defer { lock.unlock() }; return peakBytes }
    /// `TensorBuffer`s allocated since the process started (what the tests use to see that a step
    /// after the first allocates nothing: `BufferPool`).
    public static var allocations: Int { lock.lock(); defer { lock.unlock() }; return allocationCount }
    /// Start a new peak from what is live now.
    public static func resetPeak() { lock.lock(); peakBytes = liveBytes; lock.unlock() }
}

/// The loop's output and input buffers, reused: `take(byteCount:)` hands out an idle buffer of that
/// size (one the pool alone references: its user let go of it) or allocates one. The first step
/// allocates as many buffers of each size as it holds at once; every later step of the same shape
/// allocates none (no allocation per method call). A buffer kept by its user (a checkpoint, the
/// activation the next layer reads) is never handed out twice. Thread-safe (a generation beside a
/// training step takes from the same pool). The pool keeps its idle buffers until the loop goes:
/// what it holds is the step's peak, which the budget guard measures anyway.
public final class BufferPool: @unchecked Sendable {
    private let lock = NSLock()
    private var buffers: [Int: [TensorBuffer]] = [:]
    public private(set) var allocations = 0

    public init() {}

    /// A buffer of exactly `byteCount` bytes nobody else holds; its bytes are whatever its last user
    /// left (every caller overwrites all of them).
    public func take(byteCount: Int) -> TensorBuffer {
        lock.lock()
        defer { lock.unlock() }
        var list = buffers.removeValue(forKey: byteCount) ?? []
        defer { buffers[byteCount] = list }
        for i in list.indices where isKnownUniquelyReferenced(&list[i]) { return list[i] }
        let b = TensorBuffer(byteCount: byteCount)
        list.append(b)
        allocations += 1
        return b
    }

    /// A pooled buffer holding `values` (little-endian on every target the app runs on).
    public func take<T>(values: [T]) -> TensorBuffer {
        let b = take(byteCount: values.count * MemoryLayout<T>.stride)
        values.withUnsafeBytes { if $0.count > 0 { b.raw.baseAddress!.copyMemory(from: $0.baseAddress!, byteCount: $0.count) } }
        return b
    }

    /// Whether `address` lies inside one of the pool's buffers (what the tests check a destination against).
    public func owns(address: Int) -> Bool {
        lock.lock()
        defer { lock.unlock() }
        return buffers.values.contains { list in list.contains { b in
            let start = Int(bitPattern: b.raw.baseAddress)
            return address >= start && address < start + b.raw.count
        } }
    }

    /// Buffers of exactly `byteCount` bytes the pool holds (idle or in use): since it allocates only when
    /// none of that size is idle, the most of that size alive at once so far (for [T, d] = 4 x seq_len x
    /// hidden bytes: a training step's peak of checkpoints, running x or d and call outputs).
    public func count(byteCount: Int) -> Int { lock.lock(); defer { lock.unlock() }; return buffers[byteCount]?.count ?? 0 }

    /// Bytes of every buffer the pool holds (idle or in use).
    public var bytes: Int { lock.lock(); defer { lock.unlock() }; return buffers.reduce(0) { $0 + $1.key * $1.value.count } }

    /// Bytes of the buffers someone besides the pool still holds.
    public var inUseBytes: Int {
        lock.lock()
        defer { lock.unlock() }
        var n = 0
        for key in Array(buffers.keys) {
            var list = buffers.removeValue(forKey: key)!
            for i in list.indices where !isKnownUniquelyReferenced(&list[i]) { n += key }
            buffers[key] = list
        }
        return n
    }
}

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

/// The app's flat float32 LoRA/optimizer state (`state.numel` values), owned once: every method gets
/// its entries as views of it, and state outputs are copied into their slices.
public final class StateBuffer {
    public let manifest: Manifest
    public let buffer: TensorBuffer
    private let index: [String: StateEntry]

    public init(manifest: Manifest, values: [Float]) throws {
        guard values.count == manifest.state.numel else {
            throw TrainerError.badInput("the state holds \(values.count) values, the manifest's \(manifest.state.numel)")
        }
        self.manifest = manifest
        buffer = TensorBuffer(values: values.map { $0.bitPattern.littleEndian })
        index = Dictionary(manifest.state.entries.map { ($0.name, $0) }, uniquingKeysWith: { a, _ in a })
    }

    private init(manifest: Manifest, buffer: TensorBuffer, index: [String: StateEntry]) {
        (self.manifest, self.buffer, self.index) = (manifest, buffer, index)
    }

    /// A copy of the entries `names` only, packed in one new buffer (their offsets renumbered): what a
    /// reader that binds only those entries needs (a generation beside training: the LoRA params, not
    /// the optimizer moments). `values` / `sha256` of a snapshot are of the packed entries.
    public func snapshot(entries names: Set<String>) throws -> StateBuffer {
        let kept = try names.sorted().map { try entry($0) }.sorted { $0.offset < $1.offset }
        let total = kept.reduce(0) { $0 + $1.count }
        let copy = TensorBuffer(byteCount: 4 * total)
        var newIndex: [String: StateEntry] = [:]
        var at = 0
        for e in kept {
            (copy.raw.baseAddress! + 4 * at).copyMemory(from: buffer.raw.baseAddress! + 4 * e.offset, byteCount: 4 * e.count)
            var moved = e
            moved.offset = at
            newIndex[e.name] = moved
            at += e.count
        }
        return StateBuffer(manifest: manifest, buffer: copy, index: newIndex)
    }

    /// `state.init_file` (raw little-endian float32) of a program directory.
    public static func initial(manifest: Manifest, programDirectory: URL) throws -> StateBuffer {
        let url = programDirectory.appendingPathComponent(manifest.state.initFile)
        let values = try StateFile.decode(try readFile(url, what: "initial state"), numel: manifest.state.numel, source: url.path)
        return try StateBuffer(manifest: manifest, values: values)
    }

    public var values: [Float] { Array(buffer.floats) }

    public func entry(_ name: String) throws -> StateEntry {
        guard let e = index[name] else { throw TrainerError.badInput("no state entry \(name); re-export the program") }
        return e
    }

    /// The entry's slice of the state (a view: no copy).
    public func view(_ name: String) throws -> UnsafeMutableBufferPointer<Float> {
        let e = try entry(name)
        return UnsafeMutableBufferPointer(rebasing: buffer.floats[e.offset..<e.offset + e.count])
    }

    public var sha256: String { SHA256.hex(buffer.bytes) }
}

/// One bound input as the runtime receives it: the bytes are a view (of the weights mapping, of the
/// state, of an activation the loop keeps), valid for the length of the `execute` call only.
public struct LoopInput {
    public let name: String
    public let bind: IoSpec.Bind
    public let ref: String
    public let dtype: String
    public let shape: [Int]
    public let bytes: UnsafeRawBufferPointer
}

/// Where one output of a call goes: the loop's own memory (a state entry's slice of the state array, a
/// pooled activation buffer, or the rows of a layer's KV cache), so the runtime's copy out of its arena
/// is the only one. Valid for the length of the call only.
///
/// A contiguous destination (`bytes`) takes all `byteCount` bytes. A KV-cache output [Hk, n, D] (a
/// prefill chunk's, or decode's one row) goes to rows pos ..< pos + n of each head of the layer's cache
/// [Hk, S, D], rows at or past S (the padding of a last chunk that reaches the end of the cache) dropped,
/// as the host's `LayerLoop._call` does: `cacheRows`, Hk strided segments. Runtimes write with
/// `write(from:)` (one memcpy per segment) or walk `forEachSegment` (Core ML's element reads).
public struct LoopOutput {
    public let name: String
    public let bind: IoSpec.Bind
    /// The state entry, activation or cache the output is bound to (`{layer}` replaced).
    public let ref: String
    public let dtype: String
    public let shape: [Int]
    /// What the runtime produces for it: the manifest's dtype and shape, in bytes.
    public let byteCount: Int
    private let base: UnsafeMutableRawBufferPointer
    /// Set for a KV-cache output: where its rows go in the layer's cache.
    public let cacheRows: CacheRows?

    /// Rows [heads, rows, rowBytes] of an output written at row `pos` of a cache [heads, cacheRows, rowBytes].
    public struct CacheRows: Equatable {
        public let heads: Int
        public let rows: Int
        public let rowBytes: Int
        public let cacheRows: Int
        public let pos: Int
        /// The rows stored (the others lie past the end of the cache).
        public var kept: Int { max(0, min(rows, cacheRows - pos)) }
    }

    /// A contiguous destination of exactly the output's size.
    public init(name: String, bind: IoSpec.Bind, ref: String = "", dtype: String, shape: [Int], bytes: UnsafeMutableRawBufferPointer) {
        (self.name, self.bind, self.ref, self.dtype, self.shape) = (name, bind, ref, dtype, shape)
        (byteCount, base, cacheRows) = (bytes.count, bytes, nil)
    }

    /// A KV-cache output [Hk, n, D] written straight into `cache` [Hk, S, D] at row `pos` (checked: the
    /// shapes agree, with S = `cacheRows` when given, else from the cache's size; 0 <= pos < S; else the
    /// error names `what`).
    public init(name: String, bind: IoSpec.Bind, ref: String, dtype: String, shape: [Int], byteCount: Int,
                cache: UnsafeMutableRawBufferPointer, cacheRows: Int? = nil, pos: Int?, what: String) throws {
        guard shape.count == 3, dtype == "float32" else { throw TrainerError.runtime("\(what) has shape \(dtype)\(shape), not float32 [Hk, C, D]") }
        let (hk, n, dim) = (shape[0], shape[1], shape[2])
        guard hk > 0, dim > 0, byteCount == 4 * hk * n * dim, cache.count % (4 * hk * dim) == 0,
              cacheRows.map({ cache.count == 4 * hk * $0 * dim }) ?? true else {
            throw TrainerError.runtime("\(what) \(shape) does not fit the KV cache of \(cache.count) bytes; re-export the program")
        }
        let s = cache.count / (4 * hk * dim)
        guard let pos, pos >= 0, pos < s else { throw TrainerError.runtime("\(what): row \(pos ?? -1) is outside the cache of \(s)") }
        (self.name, self.bind, self.ref, self.dtype, self.shape) = (name, bind, ref, dtype, shape)
        (self.byteCount, base) = (byteCount, cache)
        self.cacheRows = CacheRows(heads: hk, rows: n, rowBytes: 4 * dim, cacheRows: s, pos: pos)
    }

    /// The contiguous destination (nil for KV-cache rows: use `write(from:)` or `forEachSegment`).
    public var bytes: UnsafeMutableRawBufferPointer? { cacheRows == nil ? base : nil }

    /// The bytes `write(from:)` stores: all of them, or a cache output's kept rows.
    public var storedBytes: Int { cacheRows.map { $0.heads * $0.kept * $0.rowBytes } ?? byteCount }

    /// Each contiguous run of the destination, with the byte offset in the runtime's output it takes its
    /// bytes from (in order; one run for a contiguous destination, one per head for cache rows).
    public func forEachSegment(_ body: (_ sourceOffset: Int, _ destination: UnsafeMutableRawBufferPointer) throws -> Void) rethrows {
        guard let c = cacheRows else { try body(0, base); return }
        let run = c.kept * c.rowBytes
        guard run > 0, let b = base.baseAddress else { return }
        for h in 0..<c.heads {
            try body(h * c.rows * c.rowBytes, UnsafeMutableRawBufferPointer(start: b + (h * c.cacheRows + c.pos) * c.rowBytes, count: run))
        }
    }

    /// The one copy: the runtime's output (`byteCount` bytes, row-major) into the destination.
    public func write(from source: UnsafeRawBufferPointer) throws {
        guard source.count == byteCount else {
            throw TrainerError.runtime("\(name): \(source.count) bytes, the manifest says \(dtype)\(shape); re-export the program")
        }
        guard let from = source.baseAddress else { return }
        forEachSegment { offset, dst in dst.baseAddress!.copyMemory(from: from + offset, byteCount: dst.count) }
    }

    /// Copies `data` (a runtime's outputs, in the manifest's order) into `outputs`, after checking
    /// every count and size first (nothing is written on a mismatch).
    public static func copy(_ data: [Data], into outputs: [LoopOutput], method: String) throws {
        guard data.count == outputs.count else {
            throw TrainerError.runtime("\(method) returned \(data.count) outputs, the manifest lists \(outputs.count); re-export the program")
        }
        for (d, o) in zip(data, outputs) where d.count != o.byteCount {
            throw TrainerError.runtime("\(method) returned \(d.count) bytes for \(o.name), the manifest says \(o.dtype)\(o.shape); re-export the program")
        }
        for (d, o) in zip(data, outputs) where d.count > 0 {
            try d.withUnsafeBytes { try o.write(from: $0) }
        }
    }
}

/// What the layer loop needs from a runtime (ExecuTorch `Module`, Core ML, the replay fake): run one
/// method on inputs in the manifest's order and write its outputs, in the manifest's order, as raw
/// little-endian bytes into the loop's buffers (`execute(method:layer:inputs:into:)`: the runtime's
/// one copy, out of its arena; a state output lands in its slice of the state array directly). A
/// runtime that only returns Data (`execute(method:layer:inputs:)`, the test fakes) gets the default,
/// which copies each Data into its destination.
public protocol ProgramRuntime: AnyObject {
    var backendName: String { get }
    /// Custom kernels registered with this runtime beyond its stock operators (ExecuTorch:
    /// `toolchain::int4_linear_a8.out` when the app links toolchain/native/kernels.cpp). Generation
    /// calls the manifest's fused methods (`generate.fused`) when it has all of theirs
    /// (`Manifest.generationMethods(registeredKernels:)`). Default: none.
    var registeredKernels: Set<String> { get }
    func load(methods: [String]) throws
    /// `layer`: the index `{layer}` was replaced by (nil for embed, head methods); informational.
    func execute(method: String, layer: Int?, inputs: [LoopInput]) throws -> [Data]
    /// Run the method and write output i into `outputs[i]` (exactly its byte count; throw on another
    /// count or size, before writing). Write only after the method has run: a destination may be one
    /// of the call's inputs (a state entry updated in place: `block_backward`'s params and moments; the
    /// KV cache a block reads; in a training step the activation buffer of `head_loss`'s x or of
    /// `block_backward`'s incoming d, which `LayerLoop.trainStep` gives the new d). Every conformer
    /// (the app's ExecuTorch and Core ML runtimes, the test fakes, the default below) computes all of
    /// its outputs from the inputs before it writes the first one.
    func execute(method: String, layer: Int?, inputs: [LoopInput], into outputs: [LoopOutput]) throws
}

extension ProgramRuntime {
    public var registeredKernels: Set<String> { [] }

    public func execute(method: String, layer: Int?, inputs: [LoopInput], into outputs: [LoopOutput]) throws {
        try LoopOutput.copy(try execute(method: method, layer: layer, inputs: inputs), into: outputs, method: method)
    }
}

/// The v3 layer loop, exactly as `toolchain/runtime/loop.py` `LayerLoop` runs it: binds every method
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
    private let gate = FairLock()
    /// A generation goes first: while one is in progress (`generate`) the other calls wait before they
    /// queue for `gate`, so its tokens come at the idle speed (`RuntimeGate`).
    public let priority = RuntimeGate()
    private var generationLoaded = false
    /// Every output buffer and per-call input the loop makes (`BufferPool`): allocated in the first
    /// step, reused by every later one.
    public let buffers = BufferPool()

    public init(manifest: Manifest, weights: MappedWeights, runtime: ProgramRuntime) throws {
        (self.manifest, self.weights, self.runtime) = (manifest, weights, runtime)
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
    public convenience init(programDirectory: URL, runtime: ProgramRuntime, identitySource: FileIdentitySource? = nil) throws {
        let m = try Manifest.load(directory: programDirectory)
        try self.init(manifest: m, weights: try MappedWeights(url: programDirectory.appendingPathComponent(m.weights.file), identitySource: identitySource),
                      runtime: runtime)
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

    /// Whether generation calls fused methods (the native int4 kernel) on this runtime.
    public var generationIsFused: Bool { generationMethods.values.contains { !($0.kernels ?? []).isEmpty } }

    private func generationMethod(_ role: String) throws -> MethodSpec {
        guard let m = generationMethods[role] else { throw TrainerError.badInput("the program has no \(role) method; re-export it") }
        return m
    }

    /// Load every method generation calls (`generationMethods`: fused or stock), once per loop.
    public func loadGeneration() throws {
        gate.lock()
        defer { gate.unlock() }
        guard !generationLoaded else { return }
        guard manifest.canGenerate else { throw TrainerError.badInput("this program was exported without the generation methods; re-export it") }
        try runtime.load(methods: try Contract.generationRoles.map { try generationMethod($0).name })
        generationLoaded = true
    }

    /// The state entries the generation methods read (every layer's), for `StateBuffer.snapshot`.
    public var generationStateEntries: Set<String> {
        var names: Set<String> = []
        let ph = manifest.weights.layerPlaceholder
        for role in Contract.generationRoles {
            guard let m = generationMethods[role] else { continue }
            let layered = m.role.hasPrefix("block_")
            for io in m.inputs where io.bind == .state {
                for layer in (layered ? (0..<layers).map { Optional($0) } : [nil]) as [Int?] { names.insert(io.ref(layer: layer, placeholder: ph)) }
            }
        }
        return names
    }

    /// A copy of the entries of `state` generation reads (`generationStateEntries`): what a generation
    /// running beside training reads while the training thread keeps updating `state` in place.
    /// The caller takes it at a step boundary (`TrainingSession` does, under its state lock).
    public func generationSnapshot(of state: StateBuffer) throws -> StateBuffer {
        try state.snapshot(entries: generationStateEntries)
    }

    /// The KV cache of one generation: per layer `k_{layer}`, `v_{layer}` zeros of the [Hk, S, D] shape
    /// `block_decode` takes (the manifest's; rows >= pos are never read).
    func newCache() throws -> [String: TensorBuffer] {
        let decode = try generationMethod("block_decode")
        var cache: [String: TensorBuffer] = [:]
        for io in decode.inputs where io.bind == .cache {
            for i in 0..<layers { cache[io.ref(layer: i, placeholder: manifest.weights.layerPlaceholder)] = TensorBuffer(byteCount: io.byteCount) }
        }
        guard !cache.isEmpty else { throw TrainerError.badInput("block_decode binds no KV cache; re-export the program") }
        return cache
    }

    /// Greedy generation (argmax, the first of equal maxima) of up to `maxNewTokens` after `prompt`,
    /// with the KV cache per layer `k_{layer}`, `v_{layer}` [Hk, S, D] owned here; the state is read
    /// only. The generation driver (the manifest's `generate.steps`, `toolchain/runtime/generate.py`):
    /// every method call of a generation is made here.
    ///
    /// Prefill: the prompt of n tokens in chunks of C = `generate.prefill_chunk` (the last padded with
    /// `padTokenId`): per chunk at pos = 0, C, 2C, ...: `embed_prefill`, then per layer `block_prefill`
    /// (x, pos, the layer's cache), whose k_new / v_new [Hk, C, D] go to cache rows pos ..< pos + C (those
    /// < S); then `head_logits` of row (n - 1) mod C of the last chunk's output. Decode: `embed_token`,
    /// per layer `block_decode` (k_new / v_new at row pos), `head_logits`. The methods are
    /// `generationMethods`' (fused where the runtime has the kernel).
    ///
    /// Streams: `onToken` gets each new id as soon as its logits are read, before the next decode
    /// step runs, in the order of the result's `ids`. Stops after a token of `stopIds` (kept in `ids`:
    /// `.eos`), after `maxNewTokens` (`.maxNewTokens`), or when `cancel` is set (`.cancelled`): it is
    /// checked before the prefill, before each prefill chunk and each of its layers, before the
    /// prompt's head_logits and before each decode step, so a cancel made while token k is reported
    /// (in `onToken`) ends with exactly those k tokens and no further method call; a cancel before the
    /// start makes no call and returns no token.
    public func generate(prompt: [Int64], maxNewTokens: Int, state: StateBuffer, padTokenId: Int64 = 0,
                         stopIds: Set<Int64> = [], cancel: GenerationCancel? = nil,
                         onToken: ((Int64) -> Void)? = nil) throws -> GenerationResult {
        let s = manifest.seqLen
        guard !prompt.isEmpty, maxNewTokens >= 1, prompt.count + maxNewTokens <= s else {
            throw TrainerError.badInput("prompt (\(prompt.count) tokens) + \(maxNewTokens) new tokens must fit seq_len \(s)")
        }
        guard let c = manifest.prefillChunk, c >= 1 else {
            throw TrainerError.badInput("this program has no generate.prefill_chunk (exported before chunked prefill); re-export it")
        }
        let vocab = manifest.model.arch.vocab
        if let bad = prompt.first(where: { $0 < 0 || $0 >= Int64(vocab) }) {
            throw TrainerError.badInput("prompt token id \(bad) is outside the vocabulary of \(vocab)")
        }
        var out: [Int64] = []
        func cancelled() -> Bool { cancel?.isCancelled == true }
        if cancelled() { return GenerationResult(ids: out, stop: .cancelled) }
        priority.beginGeneration()
        defer { priority.endGeneration() }
        let (embedPrefill, blockPrefill, embedToken, blockDecode, headLogits) = (
            try generationMethod("embed_prefill"), try generationMethod("block_prefill"), try generationMethod("embed_token"),
            try generationMethod("block_decode"), try generationMethod("head_logits"))
        let cache = try newCache()
        // Prefill, chunk by chunk.
        var x = TensorBuffer.empty
        for start in stride(from: 0, to: prompt.count, by: c) {
            if cancelled() { return GenerationResult(ids: out, stop: .cancelled) }
            let chunk = Array(prompt[start..<min(start + c, prompt.count)])
            let tokens = buffers.take(values: (chunk + Array(repeating: padTokenId, count: c - chunk.count)).map { $0.littleEndian })
            guard let e = try run(embedPrefill, layer: nil, values: ["tokens": tokens], state: state, generation: true)["x"] else {
                throw TrainerError.runtime("\(embedPrefill.name) returned no x")
            }
            x = e
            let p = buffers.take(values: [Int64(start).littleEndian])
            for i in 0..<layers {
                if cancelled() { return GenerationResult(ids: out, stop: .cancelled) }
                guard let next = try run(blockPrefill, layer: i, values: ["x": x, "pos": p], state: state, cache: cache, pos: start, generation: true)["x"] else {
                    throw TrainerError.runtime("\(blockPrefill.name) returned no x")
                }
                x = next
            }
        }
        let rowBytes = x.byteCount / c
        var last = TensorBuffer(copying: x.slice(((prompt.count - 1) % c) * rowBytes, rowBytes))
        x = .empty
        if cancelled() { return GenerationResult(ids: out, stop: .cancelled) }
        guard var logits = try run(headLogits, layer: nil, values: ["x": last], state: state, generation: true)["logits"] else {
            throw TrainerError.runtime("\(headLogits.name) returned no logits")
        }
        var pos = prompt.count
        while true {
            let f = logits.floats
            var best = 0
            for i in 1..<f.count where f[i] > f[best] { best = i }
            let token = Int64(best)
            out.append(token)
            if let onToken { priority.consumer { onToken(token) } }
            if stopIds.contains(token) { return GenerationResult(ids: out, stop: .eos) }
            if out.count == maxNewTokens { return GenerationResult(ids: out, stop: .maxNewTokens) }
            if cancelled() { return GenerationResult(ids: out, stop: .cancelled) }
            // One decode step.
            guard var h = try run(embedToken, layer: nil, values: ["token": buffers.take(values: [token.littleEndian])], state: state, generation: true)["x"] else {
                throw TrainerError.runtime("\(embedToken.name) returned no x")
            }
            let p = buffers.take(values: [Int64(pos).littleEndian])
            for i in 0..<layers {
                guard let next = try run(blockDecode, layer: i, values: ["x": h, "pos": p], state: state, cache: cache, pos: pos, generation: true)["x"] else {
                    throw TrainerError.runtime("\(blockDecode.name) returned no x")
                }
                h = next
            }
            last = h
            guard let l = try run(headLogits, layer: nil, values: ["x": last], state: state, generation: true)["logits"] else {
                throw TrainerError.runtime("\(headLogits.name) returned no logits")
            }
            logits = l
            pos += 1
        }
    }
}

/// Why a generation ended.
public enum GenerationStop: String, Equatable, Codable {
    /// A stop id came (EOS, `<|im_end|>`): the last id of the result.
    case eos
    /// `maxNewTokens` ids were generated.
    case maxNewTokens
    /// `GenerationCancel.cancel()` was called: the ids generated before it.
    case cancelled
}

/// The ids a generation produced (in the order `onToken` reported them) and how it stopped.
public struct GenerationResult: Equatable {
    public var ids: [Int64]
    public var stop: GenerationStop
    public init(ids: [Int64], stop: GenerationStop) { (self.ids, self.stop) = (ids, stop) }
}

/// Cancels a generation from any thread: `LayerLoop.generate` checks it before each decode step
/// (and before and during the prefill). Once cancelled it stays cancelled; one token per generation
/// request (the app makes a new one for each "Generate").
public final class GenerationCancel: @unchecked Sendable {
    private let lock = NSLock()
    private var flag = false
    public init() {}
    public func cancel() { lock.lock(); flag = true; lock.unlock() }
    public var isCancelled: Bool { lock.lock(); defer { lock.unlock() }; return flag }
}

/// A FIFO lock (a ticket lock over `NSCondition`): threads get it in the order they asked for it, so
/// two threads that each take it for one short call after another (the training step's method calls
/// and a generation's) alternate instead of one starving the other, as an unfair lock allows.
/// Not reentrant.
/// A held-out pass stopped before row `row` of `rows` (`LayerLoop.evaluate`'s `cancelled`).
public struct EvalCancelled: Error, CustomStringConvertible {
    public let row: Int, rows: Int
    public var description: String { "held-out loss stopped before row \(row + 1) of \(rows)" }
}

/// Who gets the runtime next when a generation runs beside training: the generation. A training call
/// takes ~0.3 s on a phone, a decode call ~1 ms and a token is L + 2 calls; alternating call by call,
/// each token would wait L + 2 training calls (~8 s). While a generation is in progress
/// (`beginGeneration` ... `endGeneration`) a training-side call waits (`awaitTrainingTurn`) before it
/// queues for the runtime, so the generation waits at most for the training call already running.
/// A generation whose consumer (its token callback) holds it for `grace` seconds or more lets training
/// go on meanwhile (re-checked call by call).
public final class RuntimeGate: @unchecked Sendable {
    private let condition = NSCondition()
    private var generating = 0
    private var inConsumer = false
    private var consumerSince = 0.0
    public let grace: Double
    /// Training-side calls that waited for a generation.
    public private(set) var trainingWaits = 0

    public init(grace: Double = 0.05) { self.grace = grace }

    private static func now() -> Double { Double(DispatchTime.now().uptimeNanoseconds) / 1e9 }

    public func beginGeneration() {
        condition.lock(); generating += 1; condition.unlock()
    }

    public func endGeneration() {
        condition.lock(); generating -= 1; inConsumer = false; condition.broadcast(); condition.unlock()
    }

    /// The generation's consumer (its token callback) runs `body`: after `grace` of it, training may go on.
    public func consumer<T>(_ body: () throws -> T) rethrows -> T {
        condition.lock(); inConsumer = true; consumerSince = Self.now(); condition.broadcast(); condition.unlock()
        defer { condition.lock(); inConsumer = false; condition.unlock() }
        return try body()
    }

    /// Before a training-side call queues for the runtime: wait while a generation is in progress (outside
    /// its consumer, however long its thread is not scheduled; inside it, for at most `grace`).
    public func awaitTrainingTurn() {
        condition.lock()
        defer { condition.unlock() }
        var waited = false
        while generating > 0 {
            waited = true
            if inConsumer {
                let held = Self.now() - consumerSince
                if held >= grace { break }
                _ = condition.wait(until: Date().addingTimeInterval(grace - held))
            } else {
                condition.wait()  // broadcast when a consumer starts and when the generation ends
            }
        }
        if waited { trainingWaits += 1 }
    }
}

public final class FairLock: @unchecked Sendable {
    private let condition = NSCondition()
    private var nextTicket: UInt64 = 0
    private var serving: UInt64 = 0

    public init() {}

    public func lock() {
        condition.lock()
        let ticket = nextTicket
        nextTicket &+= 1
        while serving != ticket { condition.wait() }
        condition.unlock()
    }

    public func unlock() {
        condition.lock()
        serving &+= 1
        condition.broadcast()
        condition.unlock()
    }

    public func withLock<T>(_ body: () throws -> T) rethrows -> T {
        lock()
        defer { unlock() }
        return try body()
    }

    /// Take it if no thread holds it or waits for it; false (not taken) otherwise.
    public func tryLock() -> Bool {
        condition.lock()
        defer { condition.unlock() }
        guard serving == nextTicket else { return false }
        nextTicket &+= 1
        return true
    }
}

extension TensorBuffer {
    /// Float `i` (little-endian) of the buffer.
    func floatValue(_ i: Int) -> Float { Float(bitPattern: UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: 4 * i, as: UInt32.self))) }
}

extension StepPlan {
    /// The layers to backpropagate at `step` as a set (LCSB chosen at run time).
    public func selected(forStep step: Int) -> Set<Int> { Set(layers(forStep: step)) }
}
