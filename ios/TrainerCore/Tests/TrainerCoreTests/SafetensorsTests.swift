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

    /// The adapter export of the tiny program's initial state is its `adapter_init/` (what
    /// `toolchain export` wrote with PEFT's key names, `toolchain/lora/peft_io.py`): same keys, shapes and
    /// tensor bytes; only "param" entries (no AdamW moments, no step counter); the config is the
    /// manifest's `adapter.config`.
    func testAdapterExportOfTheInitialStateIsAdapterInit() throws {
        try adapterExportIsAdapterInit(Repo.root.appendingPathComponent("shared_schemas/traces/tiny/program"))
    }

    /// ... and for the Qwen3-shaped trace program (LoRA on q, k, o and up: other PEFT keys and shapes).
    func testAdapterExportOfTheInitialStateIsAdapterInitQwen3() throws {
        try adapterExportIsAdapterInit(Repo.root.appendingPathComponent("shared_schemas/traces/tiny_qwen3/program"))
    }

    func adapterExportIsAdapterInit(_ program: URL) throws {
        let m = try Manifest.load(directory: program)
        let state = try StateFile.loadInitial(manifest: m, programDirectory: program)
        let dir = try tempDir().appendingPathComponent("adapter")
        try AdapterExporter.write(state: state, manifest: m, to: dir)
        try AdapterExporter.write(state: state, manifest: m, to: dir)      // replacing an existing adapter works
        XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: dir.path).sorted(), ["adapter_config.json", "adapter_model.safetensors"])
        let ours = try Data(contentsOf: dir.appendingPathComponent("adapter_model.safetensors"))
        let theirs = try Data(contentsOf: program.appendingPathComponent("adapter_init/adapter_model.safetensors"))
        let a = try Safetensors.decode(ours), b = try Safetensors.decode(theirs)
        XCTAssertEqual(Set(a.tensors.keys), Set(b.tensors.keys))
        XCTAssertEqual(a.tensors.count, m.state.entries.filter { $0.role == "param" }.count)
        for (k, t) in b.tensors {
            XCTAssertEqual(a.tensors[k]?.shape, t.shape, k)
            XCTAssertEqual(a.tensors[k]?.values.map(\.bitPattern), t.values.map(\.bitPattern), k)
        }
        XCTAssertEqual(a.metadata, ["format": "pt"])
        XCTAssertEqual(ours, theirs, "the file is byte for byte the one the Python safetensors package wrote")
        let config = try JSONValue.parse(try Data(contentsOf: dir.appendingPathComponent("adapter_config.json")))
        XCTAssertEqual(config, m.adapter?.config)
        XCTAssertEqual(config, try JSONValue.parse(try Data(contentsOf: program.appendingPathComponent("adapter_init/adapter_config.json"))))
        XCTAssertThrowsError(try AdapterExporter.write(state: [1, 2], manifest: m, to: dir))
    }
}
