import Foundation

/// The initial state of a program: `state.init_file`, raw little-endian float32.
public enum StateFile {
    public static func loadInitial(manifest: Manifest, programDirectory: URL) throws -> [Float] {
        let url = programDirectory.appendingPathComponent(manifest.state.initFile)
        return try decode(try readFile(url, what: "initial state"), numel: manifest.state.numel, source: url.path)
    }

    /// `numel` float32 values from raw little-endian bytes; any other size is refused.
    public static func decode(_ data: Data, numel: Int, source: String) throws -> [Float] {
        guard data.count == 4 * numel else {
            throw TrainerError.badInput("\(source) holds \(data.count) bytes, the manifest's state needs \(numel) float32 values " +
                                        "(\(4 * numel) bytes); re-export or re-copy the program")
        }
        return data.withUnsafeBytes { raw in
            (0..<numel).map { Float(bitPattern: UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: 4 * $0, as: UInt32.self))) }
        }
    }

    /// Raw little-endian float32 bytes (what `toolchain export` writes as state_init.bin).
    public static func encode(_ values: [Float]) -> Data {
        var data = Data(capacity: 4 * values.count)
        for v in values { withUnsafeBytes(of: v.bitPattern.littleEndian) { data.append(contentsOf: $0) } }
        return data
    }
}
