import Foundation

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
