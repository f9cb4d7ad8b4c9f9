import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// `weights.safetensors` memory-mapped read-only (`mmap`, `PROT_READ`, `MAP_PRIVATE`): the frozen
/// weights stay clean file pages, and each tensor is handed to the runtime as a pointer into the
/// mapping (no copy). The mapping lives as long as this object.
public final class MappedWeights {
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

    public init(url: URL) throws {
        self.url = url
        func fail(_ why: String) -> TrainerError { .badInput("\(url.path) is not a valid weights file (\(why)); re-export or re-copy the program") }
        let fd = open(url.path, O_RDONLY)
        guard fd >= 0 else { throw TrainerError.badInput("cannot open the weights file \(url.path)") }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0 else { throw fail("fstat failed") }
        let size = Int(st.st_size)
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
