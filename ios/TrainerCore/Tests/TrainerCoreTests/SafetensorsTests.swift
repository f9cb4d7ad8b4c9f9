import Foundation
import XCTest
@testable import TrainerCore

final class SafetensorsTests: XCTestCase {
    /// Fixtures/python_f32.safetensors was written by the Python safetensors package (see Fixtures/README.md).
    func testEncoderWritesTheBytesOfThePythonPackage() throws {
        let python = try Data(contentsOf: Repo.fixtures.appendingPathComponent("python_f32.safetensors"))
        let ours = try Safetensors.encode([
            NamedTensor(name: "b.w", shape: [2, 3], values: [0, 1, 2, 3, 4, 5]),
            NamedTensor(name: "a.w", shape: [2], values: [1.5, -2.0]),
        ], metadata: ["note": "q\"\\x/é"])
        XCTAssertEqual([UInt8](ours), [UInt8](python))
        let decoded = try Safetensors.decode(python)
        XCTAssertEqual(decoded.tensors["b.w"], NamedTensor(name: "b.w", shape: [2, 3], values: [0, 1, 2, 3, 4, 5]))
        XCTAssertEqual(decoded.tensors["a.w"]?.values, [1.5, -2.0])
        XCTAssertEqual(decoded.metadata["note"], "q\"\\x/é")
    }

    func testHeaderLayoutAndRefusals() throws {
        let data = try Safetensors.encode([NamedTensor(name: "x", shape: [3], values: [1, 2, 3])])
        let headerLen = Int(data[0]) | Int(data[1]) << 8
        XCTAssertEqual(headerLen % 8, 0, "header padded to 8 bytes")
        XCTAssertEqual(data.count, 8 + headerLen + 12)
        XCTAssertEqual(Array(data.suffix(4)), [0x00, 0x00, 0x40, 0x40], "3.0f little-endian")
        XCTAssertThrowsError(try Safetensors.encode([NamedTensor(name: "x", shape: [2], values: [1])]))
        XCTAssertThrowsError(try Safetensors.encode([NamedTensor(name: "x", shape: [1], values: [1]),
                                                     NamedTensor(name: "x", shape: [1], values: [2])]))
        XCTAssertThrowsError(try Safetensors.decode(data.prefix(data.count - 1)), "truncated data")
        XCTAssertThrowsError(try Safetensors.decode(Data([255, 0, 0, 0, 0, 0, 0, 0, 123])), "header longer than the file")
    }

    /// The trained adapter holds the "param" slices only, under PEFT keys, next to adapter.config.
    func testAdapterExportWritesParamSlicesAndTheManifestConfig() throws {
        let m = try TinyManifest.manifest(layers: 2, lcsb: false, adamw: true)
        let state = (0..<m.state.numel).map { Float($0) }
        let dir = try tempDir().appendingPathComponent("adapter")
        try AdapterExporter.write(state: state, manifest: m, to: dir)
        try AdapterExporter.write(state: state, manifest: m, to: dir)      // replacing an existing adapter works
        let files = try FileManager.default.contentsOfDirectory(atPath: dir.path).sorted()
        XCTAssertEqual(files, ["adapter_config.json", "adapter_model.safetensors"])
        let decoded = try Safetensors.decode(try Data(contentsOf: dir.appendingPathComponent("adapter_model.safetensors")))
        let params = m.state.entries.filter { $0.role == "param" }
        XCTAssertEqual(decoded.tensors.count, params.count)
        XCTAssertEqual(decoded.metadata, ["format": "pt"])
        for e in params {
            XCTAssertEqual(decoded.tensors[e.key]?.shape, e.shape)
            XCTAssertEqual(decoded.tensors[e.key]?.values, Array(state[e.offset..<(e.offset + e.count)]), e.key)
        }
        let config = try JSONValue.parse(try Data(contentsOf: dir.appendingPathComponent("adapter_config.json")))
        XCTAssertEqual(config, m.adapter.config)
        XCTAssertThrowsError(try AdapterExporter.write(state: [1, 2], manifest: m, to: dir))
    }
}
