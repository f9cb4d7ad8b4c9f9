import Foundation
import XCTest
@testable import TrainerCore

/// A fake runtime for the loop's unit tests: each output is a deterministic function of the sha256
/// of all the call's inputs (so a wrong binding changes everything downstream), every call recorded
/// (method, layer, each input's sha256 and address, each output's bytes).
final class HashRuntime: ProgramRuntime {
    struct Call { let method: String; let layer: Int?; let inputs: [(name: String, bind: IoSpec.Bind, ref: String, sha: String, address: UnsafeRawPointer?)]; let outputs: [Data] }
    let backendName = "executorch"
    let manifest: Manifest
    var calls: [Call] = []
    var loaded: [String] = []
    var wrongOutputCount = false
    /// The native kernels this fake claims to have registered (generation then calls the fused methods).
    let registeredKernels: Set<String>

    init(manifest: Manifest, kernels: Set<String> = []) { (self.manifest, registeredKernels) = (manifest, kernels) }

    func load(methods: [String]) throws { loaded += methods }

    func execute(method: String, layer: Int?, inputs: [LoopInput]) throws -> [Data] {
        guard let m = manifest.methods.first(where: { $0.name == method }) else { throw TrainerError.runtime("no \(method)") }
        for (v, io) in zip(inputs, m.inputs) where v.name != io.name || v.shape != io.shape || v.dtype != io.dtype {
            throw TrainerError.runtime("\(method) input \(v.name) does not match \(io.name)")
        }
        let shas = inputs.map { SHA256.hex($0.bytes) }
        let seed = Data(shas.joined().utf8).withUnsafeBytes { SHA256.digest($0) }
        var outputs: [Data] = []
        for (j, io) in m.outputs.enumerated() {
            let n = io.count
            var values = [Float](repeating: 0, count: n)
            for i in 0..<n { values[i] = Float(Int(seed[(i + 7 * j) % 32]) - 128) / 256 + Float(i % 5) / 1000 }
            outputs.append(values.withUnsafeBytes { Data($0) })
        }
        if wrongOutputCount { outputs.removeLast() }
        calls.append(Call(method: method, layer: layer,
                          inputs: zip(inputs, shas).map { ($0.name, $0.bind, $0.ref, $1, $0.bytes.baseAddress.map { UnsafeRawPointer($0) }) },
                          outputs: outputs))
        return outputs
    }
}

/// A weights file for a manifest: every weight key its methods bind (all layers), with the shape
/// they name, filled with a pattern; 64-byte aligned tensors as `program/weights_file.py` writes them.
enum SyntheticWeights {
    static func write(for manifest: Manifest, to url: URL) throws {
        var shapes: [String: (String, [Int])] = [:]
        for m in manifest.methods {
            for io in m.inputs where io.bind == .weight {
                for layer in (m.role.hasPrefix("block_") ? (0..<manifest.loop.layers).map { Optional($0) } : [nil]) as [Int?] {
                    let key = io.ref(layer: layer, placeholder: manifest.weights.layerPlaceholder)
                    if io.rows == nil || shapes[key] == nil {
                        var shape = io.shape
                        if let rows = io.rows { shape[0] = rows[1] }
                        if io.rows == nil || shapes[key] == nil { shapes[key] = (io.dtype, shape) }
                    }
                }
            }
        }
        let st = ["float32": "F32", "uint8": "U8", "int8": "I8", "int64": "I64"]
        var header: [String: Any] = [:]
        var blob = Data()
        for key in shapes.keys.sorted() {
            let (dtype, shape) = shapes[key]!
            let size = shape.reduce(1, *) * (dtype == "float32" ? 4 : dtype == "int64" ? 8 : 1)
            while blob.count % 64 != 0 { blob.append(0) }
            let start = blob.count
            if dtype == "float32" {
                for i in 0..<(size / 4) { withUnsafeBytes(of: Float(i % 17) / 17 - 0.5) { blob.append(contentsOf: $0) } }
            } else {
                for i in 0..<size { blob.append(UInt8(truncatingIfNeeded: i &* 31 &+ key.count)) }
            }
            header[key] = ["dtype": st[dtype]!, "shape": shape, "data_offsets": [start, blob.count]]
        }
        var json = try JSONSerialization.data(withJSONObject: header, options: [.sortedKeys])
        while (8 + json.count) % 64 != 0 { json.append(0x20) }
        var file = Data()
        withUnsafeBytes(of: UInt64(json.count).littleEndian) { file.append(contentsOf: $0) }
        file.append(json)
        file.append(blob)
        try file.write(to: url)
    }
}

final class LayerLoopTests: XCTestCase {
    var dir: URL!

    override func setUpWithError() throws {
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("layerloop-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
    }

    override func tearDownWithError() throws { try? FileManager.default.removeItem(at: dir) }

    func tinyManifest() throws -> Manifest {
        try Manifest.decode(try Repo.data(Repo.examples.appendingPathComponent("manifest_tiny.json")), source: "manifest_tiny.json")
    }

    func makeLoop(_ m: Manifest) throws -> (LayerLoop, HashRuntime, StateBuffer) {
        let url = dir.appendingPathComponent("weights.safetensors")
        try SyntheticWeights.write(for: m, to: url)
        let rt = HashRuntime(manifest: m)
        let loop = try LayerLoop(manifest: m, weights: try MappedWeights(url: url), runtime: rt)
        try loop.loadTraining()
        let values = (0..<m.state.numel).map { Float($0 % 13) / 100 }
        return (loop, rt, try StateBuffer(manifest: m, values: values))
    }

    func row(_ m: Manifest) -> ([Int64], [Int64]) {
        let ids = (0..<m.seqLen - 5).map { Int64(($0 * 7) % m.model.arch.vocab) }
        return (ids, ids.enumerated().map { $0.offset < 3 ? -100 : $0.element })
    }

    func testTinyManifestDecodes() throws {
        let m = try tinyManifest()
        XCTAssertEqual(m.loop.layers, 8)
        XCTAssertTrue(m.loop.movesUnselected)
        XCTAssertEqual(m.state.stepEntry, "adam_step")
        XCTAssertEqual(m.weights.layerPlaceholder, "{layer}")
        XCTAssertEqual(m.method(role: "head_loss")?.inputs.last?.rows, [0, 264])
    }

    /// The generation contract of the tiny generation manifest: chunked prefill (prefill_chunk), the int4
    /// embedding and head (quant.head; embed_q / embed_scale, head chunks with rows), the fused methods
    /// and their kernels; which methods a runtime calls with and without the kernel; a program exported
    /// before chunked prefill (generate without prefill_chunk, block_kv) is refused: re-export.
    func testGenerationContractDecodes() throws {
        let data = try Repo.data(Repo.manifest("manifest_tiny_generate.json"))
        let m = try Manifest.decode(data)
        XCTAssertTrue(m.canGenerate)
        XCTAssertEqual(m.prefillChunk, 16)
        XCTAssertEqual(m.quant?.head, true)
        XCTAssertEqual(m.quant?.kind, "int4")
        XCTAssertEqual(m.generate?.fused?.kernels, ["toolchain::int4_linear_a8.out", "toolchain::attention_decode.out", "toolchain::rms_norm.out", "toolchain::lora_linear_a8.out", "toolchain::rope_heads.out", "toolchain::swiglu.out"])
        XCTAssertEqual(m.generate?.fused?.source, "toolchain/native/kernels.cpp")
        XCTAssertEqual(m.method(named: "block_decode_fused")?.kernels, ["toolchain::int4_linear_a8.out", "toolchain::attention_decode.out", "toolchain::rms_norm.out", "toolchain::lora_linear_a8.out", "toolchain::rope_heads.out", "toolchain::swiglu.out"])
        XCTAssertNil(m.method(named: "block_decode")?.kernels)
        XCTAssertEqual(m.method(role: "block_decode")?.name, "block_decode", "a role's first method is the stock one")
        let embed = try XCTUnwrap(m.method(role: "embed_token"))
        XCTAssertEqual(embed.inputs.map(\.name), ["token", "embed_q", "embed_scale"])
        XCTAssertEqual(embed.inputs.map(\.ref), ["token", "embed.qweight", "embed.scales"])
        XCTAssertEqual(embed.inputs[1].dtype, "uint8")
        let head = try XCTUnwrap(m.method(role: "head_logits"))
        XCTAssertEqual(head.inputs.filter { $0.rows != nil }.map(\.name), ["head_0_q", "head_0_scale"])
        XCTAssertEqual(m.method(named: "head_logits_fused")?.inputs.map(\.name), ["x", "final_norm", "head_q", "head_scale"])
        XCTAssertEqual(m.cacheShapes.map(\.ref), ["k_{layer}", "v_{layer}"])
        XCTAssertEqual(m.cacheShapes.first?.shape, [2, 64, 16])

        let stock = m.generationMethods(registeredKernels: [])
        XCTAssertEqual(Contract.generationRoles.map { stock[$0]!.name }, Contract.generationRoles)
        let withKernel = m.generationMethods(registeredKernels: ["toolchain::int4_linear_a8.out", "toolchain::attention_decode.out", "toolchain::rms_norm.out", "toolchain::lora_linear_a8.out", "toolchain::rope_heads.out", "toolchain::swiglu.out", "other::op.out"])
        XCTAssertEqual(Contract.generationRoles.map { withKernel[$0]!.name },
                       ["embed_token", "embed_prefill", "block_prefill_fused", "block_decode_fused", "head_logits_fused"])
        XCTAssertEqual(m.generationMethods(registeredKernels: ["other::op.out"]).mapValues(\.name), stock.mapValues(\.name))
        // a runtime with only some of the kernels (an older kernel library) runs the stock methods
        XCTAssertEqual(m.generationMethods(registeredKernels: ["toolchain::int4_linear_a8.out", "toolchain::attention_decode.out"]).mapValues(\.name), stock.mapValues(\.name))

        // the row views of uint8 weights: rows of the tensor's own row size (bytes per row of its dtype)
        let url = dir.appendingPathComponent("w.safetensors")
        try SyntheticWeights.write(for: m, to: url)
        let w = try MappedWeights(url: url)
        let q = try w.view("embed.qweight"), part = try w.view("embed.qweight", rows: [8, 40])
        XCTAssertEqual(q.dtype, "uint8")
        XCTAssertEqual(part.shape, [32, q.shape[1]])
        XCTAssertEqual(part.bytes.baseAddress!, q.bytes.baseAddress! + 8 * q.shape[1])
        XCTAssertEqual(part.bytes.count, 32 * q.shape[1])
        let sc = try w.view("embed.scales", rows: [8, 40])
        XCTAssertEqual(sc.bytes.count, 32 * sc.shape[1] * 4)

        // a program from before chunked prefill: refused, also for training (as the toolchain does)
        var obj = try JSONSerialization.jsonObject(with: data) as! [String: Any]
        var gen = obj["generate"] as! [String: Any]
        gen.removeValue(forKey: "prefill_chunk")
        obj["generate"] = gen
        XCTAssertThrowsError(try Manifest.decode(try JSONSerialization.data(withJSONObject: obj))) { e in
            XCTAssertTrue("\(e)".contains("re-export") && "\(e)".contains("chunked prefill"), "\(e)")
        }
        // a fused map to a method of another role is refused
        gen["prefill_chunk"] = 16
        gen["fused"] = ["kernels": ["toolchain::int4_linear_a8.out"], "source": "x", "methods": ["block_decode": "head_logits_fused"]]
        obj["generate"] = gen
        XCTAssertThrowsError(try Manifest.decode(try JSONSerialization.data(withJSONObject: obj))) { e in
            XCTAssertTrue("\(e)".contains("generate.fused"), "\(e)")
        }
        // exported without the generation methods: decodes, cannot generate
        obj["generate"] = NSNull()
        XCTAssertFalse(try Manifest.decode(try JSONSerialization.data(withJSONObject: obj)).canGenerate)
    }

    func testVersion2Refused() throws {
        var obj = try JSONSerialization.jsonObject(with: try Repo.data(Repo.examples.appendingPathComponent("manifest_tiny.json"))) as! [String: Any]
        obj["schema_version"] = 2
        XCTAssertThrowsError(try Manifest.decode(try JSONSerialization.data(withJSONObject: obj))) { e in
            XCTAssertTrue("\(e)".contains("re-export"), "\(e)")
        }
        obj["schema_version"] = 3
        var methods = obj["methods"] as! [[String: Any]]
        methods.removeAll { ($0["role"] as? String) == "block_backward" }
        obj["methods"] = methods
        XCTAssertThrowsError(try Manifest.decode(try JSONSerialization.data(withJSONObject: obj))) { e in
            XCTAssertTrue("\(e)".contains("block_backward"), "\(e)")
        }
    }

    func testFullStepOrderBindingsAndNoCopies() throws {
        let m = try tinyManifest()
        let (loop, rt, state) = try makeLoop(m)
        let before = state.values
        let (ids, labels) = row(m)
        let loss = try loop.trainStep(inputIds: ids, labels: labels, lr: 0.01, state: state, padTokenId: 258)
        let L = m.loop.layers
        let want = ["embed"] + Array(repeating: "block_forward", count: L) + ["head_loss"] + Array(repeating: "block_backward", count: L)
        XCTAssertEqual(rt.calls.map(\.method), want)
        XCTAssertEqual(rt.calls.map(\.layer), [nil] + (0..<L).map { $0 } + [nil] + (0..<L).reversed().map { $0 })
        // loss = the head's first output
        XCTAssertEqual(loss, rt.calls[L + 1].outputs[0].withUnsafeBytes { $0.loadUnaligned(as: Float.self) })
        // ids padded with the pad id, labels with -100
        let padded = (ids + Array(repeating: 258, count: m.seqLen - ids.count)).map { $0 }
        XCTAssertEqual(rt.calls[0].inputs[0].sha, SHA256.hex(padded.withUnsafeBytes { Data($0) }))
        let paddedLabels = labels + Array(repeating: -100, count: m.seqLen - labels.count)
        XCTAssertEqual(rt.calls[L + 1].inputs.first { $0.name == "labels" }!.sha, SHA256.hex(paddedLabels.withUnsafeBytes { Data($0) }))
        // chaining: x of block_forward i = output of the previous call; checkpoint of block_backward i = x of block_forward i
        for i in 0..<L {
            let fwd = rt.calls[1 + i]
            XCTAssertEqual(fwd.inputs[0].sha, SHA256.hex(rt.calls[i].outputs[0]))
            let bwd = rt.calls[L + 2 + (L - 1 - i)]
            XCTAssertEqual(bwd.inputs.first { $0.ref == "checkpoint" }!.sha, fwd.inputs[0].sha, "checkpoint of layer \(i)")
            let prev = rt.calls[L + 1 + (L - 1 - i)]
            let dIndex = prev.method == "head_loss" ? 1 : 0
            XCTAssertEqual(bwd.inputs.first { $0.ref == "d" }!.sha, SHA256.hex(prev.outputs[dIndex]), "d into layer \(i)")
            // every state input is the layer's entry and is passed in place (an address inside the state)
            let lo = UnsafeRawPointer(state.buffer.raw.baseAddress!), hi = lo + state.buffer.byteCount
            for inp in bwd.inputs where inp.bind == .state {
                XCTAssertTrue(inp.ref == "adam_step" || inp.ref.contains("_\(i)_"), inp.ref)
                XCTAssertTrue(inp.address! >= lo && inp.address! < hi, "\(inp.ref) was copied")
            }
            // weights are views of the mapping
            let wlo = loop.weights.base, whi = wlo + loop.weights.fileSize
            for inp in fwd.inputs where inp.bind == .weight {
                XCTAssertTrue(inp.ref.hasPrefix("layers.\(i)."), inp.ref)
                XCTAssertTrue(inp.address! >= wlo && inp.address! < whi, "\(inp.ref) was copied")
            }
        }
        // step counter: +1 before the step, seen by every backward
        let step = try state.view("adam_step")[0]
        XCTAssertEqual(step, before[try state.entry("adam_step").offset] + 1)
        let stepBytes = withUnsafeBytes(of: step) { Data($0) }
        XCTAssertEqual(rt.calls[L + 2].inputs.first { $0.ref == "adam_step" }!.sha, SHA256.hex(stepBytes))
        // state outputs landed in their slices
        let bb = m.method(role: "block_backward")!
        for (j, io) in bb.outputs.enumerated() where io.bind == .state {
            for i in 0..<L {
                let call = rt.calls[L + 2 + (L - 1 - i)]
                let slice = try state.view(io.ref(layer: i))
                XCTAssertEqual(SHA256.hex(UnsafeRawBufferPointer(slice)), SHA256.hex(call.outputs[j]), "\(io.ref) layer \(i)")
            }
        }
        // entries no method returns (the LoRA params are returned here too: AdamW) keep their bytes elsewhere
        let written = Set(bb.outputs.filter { $0.bind == .state }.flatMap { io in (0..<L).map { io.ref(layer: $0) } })
        for e in m.state.entries where !written.contains(e.name) && e.name != "adam_step" {
            XCTAssertEqual(Array(try state.view(e.name)), Array(before[e.offset..<e.offset + e.count]), e.name)
        }
    }

    func testLcsbChosenAtRunTime() throws {
        let m = try tinyManifest()
        let (loop, rt, state) = try makeLoop(m)
        let (ids, labels) = row(m)
        _ = try loop.trainStep(inputIds: ids, labels: labels, lr: 0.01, state: state, selected: [2, 5])
        let L = m.loop.layers
        let back = rt.calls.dropFirst(L + 2)
        XCTAssertEqual(back.map(\.method), (0..<L).reversed().map { [2, 5].contains($0) ? "block_backward" : "block_skip_update" })
        XCTAssertEqual(back.map(\.layer), (0..<L).reversed().map { $0 })
        // checkpoints: the forward inputs of layers 5 and 2
        XCTAssertEqual(back.first { $0.layer == 5 }!.inputs.first { $0.ref == "checkpoint" }!.sha, rt.calls[1 + 5].inputs[0].sha)
        XCTAssertEqual(back.first { $0.layer == 2 }!.inputs.first { $0.ref == "checkpoint" }!.sha, rt.calls[1 + 2].inputs[0].sha)
        // d of layer 2 = d output of layer 5's backward (skip updates take no d)
        XCTAssertEqual(back.first { $0.layer == 2 }!.inputs.first { $0.ref == "d" }!.sha,
                       SHA256.hex(back.first { $0.layer == 5 }!.outputs[0]))
        // frozen unselected: no skip updates
        var frozen = m
        frozen.loop.movesUnselected = false
        let (loop2, rt2, state2) = try makeLoop(frozen)
        _ = try loop2.trainStep(inputIds: ids, labels: labels, lr: 0.01, state: state2, selected: [6])
        XCTAssertEqual(rt2.calls.dropFirst(L + 2).map(\.method), ["block_backward"])
        XCTAssertEqual(rt2.loaded, ["embed", "block_forward", "head_loss", "block_backward"])
        XCTAssertThrowsError(try loop.trainStep(inputIds: ids, labels: labels, lr: 0.01, state: state, selected: [8]))
        XCTAssertThrowsError(try loop.trainStep(inputIds: ids, labels: labels, lr: 0.01, state: state, selected: []))
        // a plan's phases are the run-time selection
        let plan = try StepPlan(layers: L, policy: "cyclic", k: 4, phases: m.lcsb!.phases, schedule: m.lcsb!.schedule)
        XCTAssertEqual(plan.selected(forStep: 1), Set([4, 5, 6, 7]))
    }

    /// Checkpoint groups (the host's `LayerLoop.train_step(layers_per_checkpoint=)`): the forward keeps
    /// each group's first input; at a group's top, before any of its layers is updated, block_forward
    /// reruns from it (through unselected layers too); the same inputs, losses and state as s = 1.
    func testCheckpointGroupsRerunAndSameState() throws {
        let m = try tinyManifest()
        let L = m.loop.layers
        let (ids, labels) = row(m)
        func run(_ selected: Set<Int>?, _ s: Int) throws -> (Float, String, HashRuntime, LayerLoop) {
            let (loop, rt, state) = try makeLoop(m)
            let loss = try loop.trainStep(inputIds: ids, labels: labels, lr: 0.01, state: state, selected: selected, layersPerCheckpoint: s)
            return (loss, state.sha256, rt, loop)
        }
        // {1, 4, 6} with s = 2: groups [1, 4], [6]; at layer 4 the forward reruns 1, 2, 3 (2 and 3 unselected)
        let (l1, sha1, rt1, _) = try run([1, 4, 6], 1)
        let (l2, sha2, rt2, loop2) = try run([1, 4, 6], 2)
        XCTAssertEqual(l2, l1)
        XCTAssertEqual(sha2, sha1, "same state bit for bit")
        let back = rt2.calls.dropFirst(L + 2).map { "\($0.method)@\($0.layer!)" }
        XCTAssertEqual(back, ["block_skip_update@7", "block_backward@6", "block_skip_update@5",
                              "block_forward@1", "block_forward@2", "block_forward@3", "block_backward@4",
                              "block_skip_update@3", "block_skip_update@2", "block_backward@1", "block_skip_update@0"])
        for j in 1...3 {
            XCTAssertEqual(rt2.calls[L + 2 + 2 + j].inputs[0].sha, rt2.calls[1 + j].inputs[0].sha, "rerun input of layer \(j)")
        }
        for i in [1, 4, 6] {
            let ckpt = { (rt: HashRuntime) in rt.calls.first { $0.method == "block_backward" && $0.layer == i }!.inputs.first { $0.ref == "checkpoint" }!.sha }
            XCTAssertEqual(ckpt(rt2), ckpt(rt1), "checkpoint of layer \(i)")
            XCTAssertEqual(ckpt(rt2), rt2.calls[1 + i].inputs[0].sha)
        }
        XCTAssertEqual(loop2.lastStepPeakCheckpoints, 2)
        // every layer, s = 1, 2, 3, 8 (one group): same loss and state; the forward count grows by the reruns
        let (lf, shaf, rtf, loopf) = try run(nil, 1)
        XCTAssertEqual(loopf.lastStepPeakCheckpoints, L)
        for s in [2, 3, 8] {
            let (l, sha, rt, loop) = try run(nil, s)
            XCTAssertEqual(l, lf, "s = \(s)")
            XCTAssertEqual(sha, shaf, "s = \(s)")
            let groups = try CheckpointGroups.groups(Array(0..<L), layersPerCheckpoint: s)
            let reruns = groups.map { $0.last! - $0.first! }.reduce(0, +)
            XCTAssertEqual(rt.calls.count, rtf.calls.count + reruns, "s = \(s)")
            XCTAssertEqual(loop.lastStepPeakCheckpoints, CheckpointGroups.peakAlive(groups), "s = \(s)")
            XCTAssertLessThanOrEqual(loop.lastStepPeakCheckpoints, CheckpointGroups.maxAlive(selected: L, layersPerCheckpoint: s))
        }
        XCTAssertThrowsError(try run(nil, 0))
    }

    /// The checkpoints a step does not keep are really let go of: the loop's peak memory (live TensorBuffer
    /// bytes) during a step is (checkpoints alive at most + 1) [T, d] rows plus the small inputs, so
    /// fewer with larger groups: besides the checkpoints, one row is passed along and overwritten by the
    /// call's output (head_loss writes d into x's buffer, block_backward d into the incoming d's; + 2
    /// before that reuse). The pool holds exactly that many [T, d] buffers; they go back to it, and the
    /// next step reuses them without allocating.
    func testCheckpointGroupsFreeMemory() throws {
        let m = try tinyManifest()
        let L = m.loop.layers
        let rowBytes = 4 * m.seqLen * m.model.arch.hidden
        let (ids, labels) = row(m)
        var peaks: [Int: Int] = [:]
        for s in [1, 2, 3, 8] {
            let (loop, _, state) = try makeLoop(m)
            let base = TensorMemory.live
            TensorMemory.resetPeak()
            _ = try loop.trainStep(inputIds: ids, labels: labels, lr: 0.01, state: state, layersPerCheckpoint: s)
            let grown = TensorMemory.peak - base
            let alive = CheckpointGroups.peakAlive(try CheckpointGroups.groups(Array(0..<L), layersPerCheckpoint: s))
            XCTAssertEqual(grown / rowBytes, alive + 1, "s = \(s): \(grown) bytes at the peak")
            XCTAssertEqual(loop.buffers.count(byteCount: rowBytes), alive + 1, "s = \(s): [T, d] buffers in the pool")
            // what the step let go of is idle in the loop's pool (no buffer is held outside it), and the
            // next step reuses it: no allocation, no higher peak
            XCTAssertEqual(loop.buffers.inUseBytes, 0, "s = \(s): the step left buffers alive")
            XCTAssertLessThanOrEqual(TensorMemory.live, base + loop.buffers.bytes + 64, "s = \(s)")
            let allocations = TensorMemory.allocations
            _ = try loop.trainStep(inputIds: ids, labels: labels, lr: 0.01, state: state, layersPerCheckpoint: s)
            XCTAssertEqual(TensorMemory.allocations, allocations, "s = \(s): the second step allocated")
            XCTAssertEqual(TensorMemory.peak - base, grown, "s = \(s): the second step raised the peak")
            peaks[s] = grown
        }
        XCTAssertEqual(peaks[1]! - peaks[2]!, (L - 5) * rowBytes, "8 layers in groups of 2: 5 inputs alive instead of 8")
        XCTAssertEqual(peaks[1]! / rowBytes, L + 1, "every layer's input + the one row passed along")
    }

    /// A destination given for an output (`into`) must be the output's size, name an activation output
    /// by its ref, and, when it is one of the call's inputs, be of the output's dtype and element count;
    /// the output written into it is the one a pooled buffer gets, also when it is the call's own input.
    func testDestinationsAreChecked() throws {
        let m = try tinyManifest()
        let (loop, _, state) = try makeLoop(m)
        let row = 4 * m.seqLen * m.model.arch.hidden
        let x = TensorBuffer(values: (0..<(row / 4)).map { Float($0 % 11) / 50 })
        let labels = TensorBuffer(values: (0..<m.seqLen).map { Int64($0 % 3) })
        func headLoss(into: [String: TensorBuffer], x: TensorBuffer = x) throws -> [String: TensorBuffer] {
            try loop.call("head_loss", layer: nil, values: ["x": x, "labels": labels], state: state, into: into)
        }
        XCTAssertThrowsError(try headLoss(into: ["d": TensorBuffer(byteCount: row - 4)])) { XCTAssertTrue("\($0)".contains("bytes"), "\($0)") }
        XCTAssertThrowsError(try headLoss(into: ["dx": TensorBuffer(byteCount: row)])) { XCTAssertTrue("\($0)".contains("no activation output 'dx'"), "\($0)") }
        let entry = try XCTUnwrap(m.method(role: "block_backward")?.outputs.first { $0.bind == .state })
        XCTAssertThrowsError(try loop.call("block_backward", layer: 0, values: ["d": x, "checkpoint": x, "lr": TensorBuffer(values: [Float(0.01)])],
                                           state: state, into: [entry.ref: TensorBuffer(byteCount: entry.byteCount)])) {
            XCTAssertTrue("\($0)".contains("no activation output"), "\($0)")
        }
        let plain = try XCTUnwrap(try headLoss(into: [:])["d"]).floats.map { $0 }
        let given = TensorBuffer(byteCount: row)
        let out = try headLoss(into: ["d": given])
        XCTAssertTrue(out["d"] === given)
        XCTAssertEqual(given.floats.map { $0 }, plain)
        let own = TensorBuffer(copying: x.bytes)
        XCTAssertTrue(try headLoss(into: ["d": own], x: own)["d"] === own)
        XCTAssertEqual(own.floats.map { $0 }, plain, "into its own input x: the same d")
        // an input of another dtype with the output's byte count is refused as its destination
        var other = m
        let h = try XCTUnwrap(other.methods.firstIndex { $0.role == "head_loss" })
        let xi = try XCTUnwrap(other.methods[h].inputs.firstIndex { $0.name == "x" })
        other.methods[h].inputs[xi].dtype = "int32"
        let url2 = dir.appendingPathComponent("weights-int32-x.safetensors")
        try SyntheticWeights.write(for: other, to: url2)
        let loop2 = try LayerLoop(manifest: other, weights: try MappedWeights(url: url2), runtime: HashRuntime(manifest: other))
        XCTAssertThrowsError(try loop2.call("head_loss", layer: nil, values: ["x": own, "labels": labels], state: state, into: ["d": own])) {
            XCTAssertTrue("\($0)".contains("is input x"), "\($0)")
        }
    }

    /// What the budget guard plans with: the manifest's peak with the checkpoints of min(k, ceil(k/s) + s - 1)
    /// layers instead of every layer's (toolchain/memory/fit.py).
    func testPlannedCheckpointsOfTheMemoryGuard() throws {
        for (k, s, want) in [(1, 1, 1), (8, 1, 8), (8, 2, 5), (8, 3, 5), (8, 8, 8), (24, 5, 9), (24, 1, 24), (3, 2, 3), (2, 5, 2), (9, 3, 5)] {
            XCTAssertEqual(CheckpointGroups.maxAlive(selected: k, layersPerCheckpoint: s), min(k, (k + s - 1) / s + s - 1), "k \(k) s \(s)")
            XCTAssertEqual(CheckpointGroups.maxAlive(selected: k, layersPerCheckpoint: s), want, "k \(k) s \(s)")
        }
        XCTAssertEqual((1...30).map { CheckpointGroups.suggested(selected: $0) }.prefix(10), [1, 1, 2, 2, 2, 2, 3, 3, 3, 3])
        XCTAssertEqual(CheckpointGroups.suggested(selected: 24), 5)
        let m = try tinyManifest()
        let L = m.loop.layers
        let all = UInt64(m.memoryPlan!.checkpointBytes!), row = all / UInt64(L)
        let estimate = UInt64(m.memoryPlan!.peakEstimateBytes!["executorch"]!)
        XCTAssertEqual(m.plannedPeakBytes(), estimate, "defaults: the manifest's figure")
        XCTAssertEqual(m.plannedCheckpoints(), L)
        for (k, s) in [(8, 2), (8, 3), (4, 2), (3, 1), (8, 8), (20, 2)] {
            let kept = min(min(k, L), (min(k, L) + s - 1) / s + s - 1)
            XCTAssertEqual(m.plannedCheckpoints(selectedLayers: k, layersPerCheckpoint: s), kept)
            XCTAssertEqual(m.plannedPeakBytes(selectedLayers: k, layersPerCheckpoint: s), estimate - all + UInt64(kept) * row, "k \(k) s \(s)")
        }
        // without the manifest's estimate: arenas + state + the planned checkpoints
        var bare = m
        bare.memoryPlan?.peakEstimateBytes = nil
        let arenas = UInt64(m.memoryPlan!.plannedArenaBytes!["executorch"]!.values.reduce(0, +))
        XCTAssertEqual(bare.plannedPeakBytes(selectedLayers: 8, layersPerCheckpoint: 2), arenas + UInt64(4 * m.state.numel) + 5 * row)
        // a session's plan: LCSB cyclic k = 3 of 8 with s = 2 keeps min(3, 2 + 1) = 3; every layer with s = 3: 5
        let cfg = SessionConfig(steps: 1, lr: 0.1, selection: .cyclic(k: 3), layersPerCheckpoint: 2)
        XCTAssertEqual(try cfg.selectedLayers(layers: L), 3)
        XCTAssertEqual(try cfg.plannedPeakBytes(manifest: m, target: "executorch"), estimate - all + 3 * row)
        let cfg2 = SessionConfig(steps: 1, lr: 0.1, layersPerCheckpoint: 3)
        XCTAssertEqual(try cfg2.plannedPeakBytes(manifest: m, target: "executorch"), estimate - all + 5 * row)
        // and the guard stops or lets the step run on that figure
        let tight = estimate - all + 6 * row
        XCTAssertEqual(MemoryGuard(budgetBytes: tight, plannedPeakBytes: try cfg2.plannedPeakBytes(manifest: m, target: "executorch"))
            .decide(footprint: 0, available: nil, pressure: .normal), .proceed)
        XCTAssertNotEqual(MemoryGuard(budgetBytes: tight, plannedPeakBytes: m.plannedPeakBytes())
            .decide(footprint: 0, available: nil, pressure: .normal), .proceed)
    }

    func testBadOutputsRefused() throws {
        let m = try tinyManifest()
        let (loop, rt, state) = try makeLoop(m)
        rt.wrongOutputCount = true
        let (ids, labels) = row(m)
        XCTAssertThrowsError(try loop.trainStep(inputIds: ids, labels: labels, lr: 0.01, state: state)) { e in
            XCTAssertTrue("\(e)".contains("outputs"), "\(e)")
        }
        XCTAssertThrowsError(try loop.trainStep(inputIds: ids + ids + ids, labels: labels + labels + labels, lr: 0.01, state: state))
    }

    func testWeightViewsAndRows() throws {
        let m = try tinyManifest()
        let url = dir.appendingPathComponent("w.safetensors")
        try SyntheticWeights.write(for: m, to: url)
        let w = try MappedWeights(url: url)
        let full = try w.view("embed")
        XCTAssertEqual(full.shape, [264, 64])
        XCTAssertEqual(Int(bitPattern: full.bytes.baseAddress!) % 64, 0)
        let part = try w.view("embed", rows: [10, 20])
        XCTAssertEqual(part.shape, [10, 64])
        XCTAssertEqual(part.bytes.baseAddress!, full.bytes.baseAddress! + 10 * 64 * 4)
        XCTAssertEqual(part.bytes.count, 10 * 64 * 4)
        XCTAssertEqual(try w.view("layers.3.q_proj.qweight").dtype, "uint8")
        XCTAssertThrowsError(try w.view("embed", rows: [200, 300]))
        XCTAssertThrowsError(try w.view("nope"))
        try Data([1, 2, 3]).write(to: url)
        XCTAssertThrowsError(try MappedWeights(url: url))
        // a weights file lacking a key the methods bind is refused before anything runs
        var m2 = m
        m2.methods[0].inputs[1].ref = "embed_missing"
        XCTAssertThrowsError(try LayerLoop(manifest: m2, weights: try MappedWeights(url: { try! SyntheticWeights.write(for: m, to: url); return url }()),
                                           runtime: HashRuntime(manifest: m2)))
    }

    func testSHA256() {
        func h(_ b: [UInt8]) -> String { SHA256.hex(Data(b)) }
        XCTAssertEqual(h([]), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        XCTAssertEqual(h(Array("abc".utf8)), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        XCTAssertEqual(h(Array(0...255) + Array(0...255) + Array(0...255)), "f3a25aa93aa2fbba28d79260535bbd6a5eb0fc1c24a8b0f04e12b484c1dfe363")
        XCTAssertEqual(h(Array(0..<55)), "463eb28e72f82e0a96c0a4cc53690c571281131f672aa229e0d45ae59b598b59")
        XCTAssertEqual(h(Array(0..<56)), "da2ae4d6b36748f2a318f23e7ab1dfdf45acdc9d049bd80e59de82a60895f562")
    }
}
