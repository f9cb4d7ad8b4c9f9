import Foundation

/// A float32 tensor by name, for safetensors files.
public struct NamedTensor: Equatable {
    public var name: String
    public var shape: [Int]
    public var values: [Float]
    public init(name: String, shape: [Int], values: [Float]) { (self.name, self.shape, self.values) = (name, shape, values) }
}

/// The safetensors format (https://huggingface.co/docs/safetensors): 8-byte little-endian header
/// length, a JSON header `{name: {"dtype", "shape", "data_offsets": [begin, end]}}` with an optional
/// `__metadata__` string map, padded with spaces to a multiple of 8, then the raw little-endian data.
/// The writer emits exactly the bytes of the Python `safetensors` package (metadata first, tensors
/// by name, keys in its order), which a test checks against a file that package wrote.
public enum Safetensors {
    public static func encode(_ tensors: [NamedTensor], metadata: [String: String]? = nil) throws -> Data {
        var seen = Set<String>()
        for t in tensors {
            guard t.name != "__metadata__", seen.insert(t.name).inserted else {
                throw TrainerError.badInput("tensor name '\(t.name)' is reserved or repeated")
            }
            guard t.shape.reduce(1, *) == t.values.count else {
                throw TrainerError.badInput("tensor \(t.name): shape \(t.shape) does not hold \(t.values.count) values")
            }
        }
        let sorted = tensors.sorted { $0.name < $1.name }
        var parts: [String] = []
        if let metadata, !metadata.isEmpty {
            let items = metadata.keys.sorted().map { "\(quote($0)):\(quote(metadata[$0]!))" }
            parts.append("\"__metadata__\":{\(items.joined(separator: ","))}")
        }
        var offset = 0
        for t in sorted {
            let end = offset + 4 * t.values.count
            let shape = t.shape.map(String.init).joined(separator: ",")
            parts.append("\(quote(t.name)):{\"dtype\":\"F32\",\"shape\":[\(shape)],\"data_offsets\":[\(offset),\(end)]}")
            offset = end
        }
        var header = Array("{\(parts.joined(separator: ","))}".utf8)
        header += Array(repeating: UInt8(ascii: " "), count: (8 - header.count % 8) % 8)
        var out = Data(capacity: 8 + header.count + offset)
        withUnsafeBytes(of: UInt64(header.count).littleEndian) { out.append(contentsOf: $0) }
        out.append(contentsOf: header)
        for t in sorted {
            let le = t.values.map { $0.bitPattern.littleEndian }
            le.withUnsafeBytes { out.append(contentsOf: $0) }
        }
        return out
    }

    /// Read a file of float32 tensors (any other dtype is refused).
    public static func decode(_ data: Data) throws -> (tensors: [String: NamedTensor], metadata: [String: String]) {
        let bytes = [UInt8](data)
        func fail(_ why: String) -> TrainerError { .badInput("not a valid safetensors file: \(why)") }
        guard bytes.count >= 8 else { throw fail("shorter than its 8-byte header length") }
        let headerLen = bytes[0..<8].enumerated().reduce(UInt64(0)) { $0 | UInt64($1.element) << (8 * UInt64($1.offset)) }
        guard headerLen <= UInt64(bytes.count - 8) else { throw fail("header length \(headerLen) exceeds the file") }
        let dataStart = 8 + Int(headerLen)
        guard let header = (try? JSONValue.parse(Data(bytes[8..<dataStart])))?.objectValue else {
            throw fail("header is not a JSON object")
        }
        var metadata: [String: String] = [:]
        var tensors: [String: NamedTensor] = [:]
        for (name, value) in header {
            if name == "__metadata__" {
                for (k, v) in value.objectValue ?? [:] { metadata[k] = v.stringValue }
                continue
            }
            guard let info = value.objectValue, info["dtype"]?.stringValue == "F32",
                  let shape = info["shape"]?.arrayValue?.compactMap(\.intValue).map(Int.init),
                  let offs = info["data_offsets"]?.arrayValue?.compactMap(\.intValue).map(Int.init), offs.count == 2
            else { throw fail("tensor \(name) is not a float32 entry with shape and data_offsets") }
            let count = shape.reduce(1, *)
            guard offs[0] >= 0, offs[1] - offs[0] == 4 * count, dataStart + offs[1] <= bytes.count else {
                throw fail("tensor \(name) has data_offsets \(offs) that do not fit shape \(shape) or the file")
            }
            var values = [Float](repeating: 0, count: count)
            let base = dataStart + offs[0]
            for i in 0..<count {
                let p = base + 4 * i
                let bits = UInt32(bytes[p]) | UInt32(bytes[p + 1]) << 8 | UInt32(bytes[p + 2]) << 16 | UInt32(bytes[p + 3]) << 24
                values[i] = Float(bitPattern: bits)
            }
            tensors[name] = NamedTensor(name: name, shape: shape, values: values)
        }
        return (tensors, metadata)
    }

    /// A JSON string literal escaped as serde_json does (quote, backslash, control characters).
    static func quote(_ s: String) -> String {
        var out = "\""
        for u in s.unicodeScalars {
            switch u {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case "\u{08}": out += "\\b"
            case "\u{0C}": out += "\\f"
            case _ where u.value < 0x20: out += String(format: "\\u%04x", u.value)
            default: out.unicodeScalars.append(u)
            }
        }
        return out + "\""
    }
}

/// Writes the trained adapter the PEFT way: the state's "param" slices under their PEFT keys in
/// `adapter_model.safetensors`, and the manifest's `adapter.config` as `adapter_config.json` (`toolchain/lora/peft_io.py`: PEFT keys, loadable
/// with `PeftModel.from_pretrained`).
public enum AdapterExporter {
    public static let weightsName = "adapter_model.safetensors"
    public static let configName = "adapter_config.json"

    /// The adapter tensors of a flat state (role "param" entries only; optimizer moments are dropped).
    public static func tensors(state: [Float], manifest: Manifest) throws -> [NamedTensor] {
        guard state.count == manifest.state.numel else {
            throw TrainerError.badInput("state has \(state.count) values, the program \(manifest.state.numel)")
        }
        return manifest.state.entries.filter { $0.role == "param" }.map {
            NamedTensor(name: $0.key, shape: $0.shape, values: Array(state[$0.offset..<($0.offset + $0.count)]))
        }
    }

    /// Write the adapter into `directory` (created or replaced as a whole: a crash leaves either the
    /// old directory or the new one).
    public static func write(state: [Float], manifest: Manifest, to directory: URL) throws {
        guard let adapter = manifest.adapter else { throw TrainerError.badInput("the manifest has no adapter section; re-export the program") }
        let weights = try Safetensors.encode(try tensors(state: state, manifest: manifest),
                                             metadata: ["format": "pt"])
        let config = try adapter.config.jsonData(pretty: true)
        try AtomicFiles.replaceDirectory(directory) { tmp in
            try AtomicFiles.write(weights, to: tmp.appendingPathComponent(weightsName))
            try AtomicFiles.write(config, to: tmp.appendingPathComponent(configName))
        }
    }
}
