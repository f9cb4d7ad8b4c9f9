import Foundation

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
