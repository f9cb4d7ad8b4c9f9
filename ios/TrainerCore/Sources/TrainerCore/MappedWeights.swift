import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// What tells that a file changed without reading it: its size, modification time (ns), device and
/// inode (`stat`; nil where a source does not know them).
public struct FileIdentity: Equatable {
    public var size: Int64
    public var mtimeNanos: Int64
    public var device: UInt64?
    public var inode: UInt64?

    public init(size: Int64, mtimeNanos: Int64, device: UInt64? = nil, inode: UInt64? = nil) {
        (self.size, self.mtimeNanos, self.device, self.inode) = (size, mtimeNanos, device, inode)
    }

    /// A `stat`/`fstat` result's.
    public init(_ st: stat) {
        #if canImport(Glibc)
        let t = st.st_mtim
        #else
        let t = st.st_mtimespec
        #endif
        self.init(size: Int64(st.st_size), mtimeNanos: Int64(t.tv_sec) * 1_000_000_000 + Int64(t.tv_nsec),
                  device: UInt64(truncatingIfNeeded: st.st_dev), inode: UInt64(truncatingIfNeeded: st.st_ino))
    }

    /// Why `now` (nil: the file is gone) is not the file this identity was taken of; nil: the same.
    public func change(to now: FileIdentity?, path: String) -> String? {
        guard let now else { return "\(path) is gone" }
        if let d = device, let i = inode, let nd = now.device, let ni = now.inode, (d, i) != (nd, ni) { return "\(path) was replaced by another file" }
        if now.size != size { return "\(path) changed size from \(size) to \(now.size) bytes" }
        if now.mtimeNanos != mtimeNanos { return "\(path) was modified" }
        return nil
    }
}

/// Reads a file's identity (nil: gone, or it cannot be read).
public protocol FileIdentitySource: AnyObject {
    func identity(of url: URL) -> FileIdentity?
}

/// `stat(2)`: size, time to the nanosecond, device and inode.
public final class StatFileIdentity: FileIdentitySource {
    public init() {}
    public func identity(of url: URL) -> FileIdentity? {
        var st = stat()
        guard stat(url.path, &st) == 0 else { return nil }
        return FileIdentity(st)
    }
}

/// `weights.safetensors` memory-mapped read-only (`mmap`, `PROT_READ`, `MAP_PRIVATE`): the frozen
/// weights stay clean file pages, and each tensor is handed to the runtime as a pointer into the
/// mapping (no copy). The mapping lives as long as this object.
///
/// The file must not change while it is mapped: a page read past a new, shorter end is a SIGBUS,
/// which kills the app. `identity` is the file's when it was mapped (`fstat` of the descriptor mapped,
/// or what `identitySource` said); `checkChanged()` compares it with the file's now, and the training
/// session calls it at every step boundary. Once a change is seen the mapping is `stale` for good:
/// the layer loop over it refuses to call the program again.
public final class MappedWeights {
    /// What a message about a weights file changed under its mapping tells the user to do.
    public static let changedAdvice = "re-import the program (or put its files back as they were) and resume"
    public struct Tensor: Equatable {
        public var dtype: String          // safetensors dtype: F32, U8, I64, ...
        public var shape: [Int]
        public var offset: Int            // from the start of the file
        public var byteCount: Int
    }

    public let url: URL
    public let tensors: [String: Tensor]
    public let base: UnsafeRawPointer
    public let fileSize: Int
    /// The file's identity when it was mapped.
    public let identity: FileIdentity
    private let identitySource: FileIdentitySource
    private let staleLock = NSLock()
    private var staleReason: String?

    /// Why the mapping is no longer trusted (the first change `checkChanged()` saw), or nil.
    public var stale: String? { staleLock.lock(); defer { staleLock.unlock() }; return staleReason }

    /// Why the file is not the one mapped any more (another file in its place, another size, a newer
    /// modification time, gone), or nil; a change, once seen, is kept (`stale`) whatever the file does next.
    public func checkChanged() -> String? {
        if let s = stale { return s }
        guard let why = identity.change(to: identitySource.identity(of: url), path: url.path) else { return nil }
        staleLock.lock()
        defer { staleLock.unlock() }
        if staleReason == nil { staleReason = why }
        return staleReason
    }

    /// - Parameter identitySource: how the file's identity is read at each check (nil: `stat`, and the
    ///   identity at mapping time is the `fstat` of the descriptor mapped); tests pass a fake.
    public init(url: URL, identitySource: FileIdentitySource? = nil) throws {
        self.url = url
        func fail(_ why: String) -> TrainerError { .badInput("\(url.path) is not a valid weights file (\(why)); re-export or re-copy the program") }
        let fd = open(url.path, O_RDONLY)
        guard fd >= 0 else { throw TrainerError.badInput("cannot open the weights file \(url.path)") }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0 else { throw fail("fstat failed") }
        let size = Int(st.st_size)
        if let source = identitySource {
            guard let id = source.identity(of: url) else {
                throw TrainerError.badInput("cannot read the size and time of \(url.path); re-import the program")
            }
            (identity, self.identitySource) = (id, source)
        } else {
            (identity, self.identitySource) = (FileIdentity(st), StatFileIdentity())
        }
        guard size >= 8 else { throw fail("\(size) bytes") }
        guard let p = mmap(nil, size, PROT_READ, MAP_PRIVATE, fd, 0), p != MAP_FAILED else { throw fail("mmap failed") }
        let raw = UnsafeRawPointer(p)
        var ok = false
        defer { if !ok { munmap(p, size) } }
        let headerLen = Int(UInt64(littleEndian: raw.loadUnaligned(as: UInt64.self)))
        guard headerLen > 0, 8 + headerLen <= size else { throw fail("header length \(headerLen)") }
        let header = Data(bytes: raw + 8, count: headerLen)
        guard let json = try? JSONSerialization.jsonObject(with: header) as? [String: Any] else { throw fail("header is not a JSON object") }
        var table: [String: Tensor] = [:]
        let dataStart = 8 + headerLen
        for (name, value) in json where name != "__metadata__" {
            guard let t = value as? [String: Any], let dtype = t["dtype"] as? String,
                  let shape = (t["shape"] as? [Any])?.compactMap({ ($0 as? NSNumber)?.intValue }),
                  let offs = (t["data_offsets"] as? [Any])?.compactMap({ ($0 as? NSNumber)?.intValue }), offs.count == 2 else {
                throw fail("bad entry \(name)")
            }
            guard offs[0] >= 0, offs[1] >= offs[0], dataStart + offs[1] <= size else { throw fail("\(name) lies outside the file") }
            let need = shape.reduce(1, *) * (MappedWeights.elementSize(dtype) ?? -1)
            guard need == offs[1] - offs[0] else { throw fail("\(name) holds \(offs[1] - offs[0]) bytes for \(dtype)\(shape)") }
            table[name] = Tensor(dtype: dtype, shape: shape, offset: dataStart + offs[0], byteCount: need)
        }
        (tensors, base, fileSize) = (table, raw, size)
        ok = true
    }

    deinit { munmap(UnsafeMutableRawPointer(mutating: base), fileSize) }

    static func elementSize(_ dtype: String) -> Int? {
        switch dtype {
        case "F32", "I32", "U32": return 4
        case "F64", "I64", "U64": return 8
        case "U8", "I8", "BOOL": return 1
        case "F16", "BF16", "I16", "U16": return 2
        default: return nil
        }
    }

    /// The manifest dtype name of a safetensors dtype.
    static func manifestDtype(_ dtype: String) -> String? {
        ["F32": "float32", "U8": "uint8", "I8": "int8", "I64": "int64", "I32": "int32", "F16": "float16", "BF16": "bfloat16"][dtype]
    }

    /// The bytes of `key` (rows `[start, end)` of its first dimension when `rows` is given), as a view
    /// of the mapping.
    public func view(_ key: String, rows: [Int]? = nil) throws -> (dtype: String, shape: [Int], bytes: UnsafeRawBufferPointer) {
        guard let t = tensors[key] else { throw TrainerError.badInput("the weights file lacks \(key); re-export the program") }
        guard let dtype = MappedWeights.manifestDtype(t.dtype) else { throw TrainerError.badInput("weight \(key) has dtype \(t.dtype)") }
        guard let rows else { return (dtype, t.shape, UnsafeRawBufferPointer(start: base + t.offset, count: t.byteCount)) }
        guard let first = t.shape.first, rows.count == 2, rows[0] >= 0, rows[0] < rows[1], rows[1] <= first else {
            throw TrainerError.badInput("rows \(rows ) of weight \(key) \(t.shape) are out of range; re-export the program")
        }
        let rowBytes = t.byteCount / first
        var shape = t.shape
        shape[0] = rows[1] - rows[0]
        return (dtype, shape, UnsafeRawBufferPointer(start: base + t.offset + rows[0] * rowBytes, count: shape[0] * rowBytes))
    }
}
