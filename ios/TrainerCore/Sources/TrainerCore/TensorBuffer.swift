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

extension TensorBuffer {
    /// Float `i` (little-endian) of the buffer.
    func floatValue(_ i: Int) -> Float { Float(bitPattern: UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: 4 * i, as: UInt32.self))) }
}
