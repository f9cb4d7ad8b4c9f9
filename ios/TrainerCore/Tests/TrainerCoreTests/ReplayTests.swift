import Foundation
import XCTest
@testable import TrainerCore

/// A runtime that replays a recorded trace (`shared_schemas/traces/README.md`): call i must be the
/// recorded method and layer with every input's dtype, shape and sha256 as recorded; it returns the
/// recorded outputs (bytes of outputs.bin). The first mismatch is thrown and kept.
final class ReplayRuntime: ProgramRuntime {
    let backendName = "executorch"
    let calls: [[String: Any]]
    let outputs: Data
    var next = 0
    var inputsChecked = 0
    var mismatch: String?

    init(trace: [String: Any], outputs: Data) {
        calls = trace["calls"] as! [[String: Any]]
        self.outputs = outputs
    }

    func load(methods: [String]) throws {}

    func execute(method: String, layer: Int?, inputs: [LoopInput]) throws -> [Data] {
        func fail(_ why: String) -> TrainerError {
            let m = "call \(next) (\(method) layer \(layer.map(String.init) ?? "-")): \(why)"
            if mismatch == nil { mismatch = m }
            return .runtime(m)
        }
        guard next < calls.count else { throw fail("the trace has only \(calls.count) calls") }
        let c = calls[next]
        guard c["method"] as? String == method else { throw fail("the trace has \(c["method"] ?? "?") here") }
        guard (c["layer"] as? Int) == layer else { throw fail("the trace has layer \(c["layer"] ?? "nil")") }
        let recorded = c["inputs"] as! [[String: Any]]
        guard recorded.count == inputs.count else { throw fail("\(inputs.count) inputs, the trace has \(recorded.count)") }
        for (r, v) in zip(recorded, inputs) {
            guard r["name"] as? String == v.name, r["dtype"] as? String == v.dtype, r["shape"] as? [Int] == v.shape else {
                throw fail("input \(v.name) \(v.dtype)\(v.shape) is \(r["name"] ?? "?") \(r["dtype"] ?? "?")\(r["shape"] ?? "?") in the trace")
            }
            let sha = SHA256.hex(v.bytes)
            guard r["sha256"] as? String == sha else { throw fail("input \(v.name) (\(v.ref)) has sha256 \(sha.prefix(12)), the trace \(String(describing: r["sha256"]!).prefix(12))") }
            inputsChecked += 1
        }
        next += 1
        return (c["outputs"] as! [[String: Any]]).map { o in
            let off = o["offset"] as! Int, n = o["nbytes"] as! Int
            return outputs.subdata(in: off..<off + n)
        }
    }
}

final class ReplayTests: XCTestCase {
    static var traceDir: URL { Repo.root.appendingPathComponent("shared_schemas/traces/tiny") }
    static var groupsTraceDir: URL { Repo.root.appendingPathComponent("shared_schemas/traces/tiny_groups") }
    static var qwen3TraceDir: URL { Repo.root.appendingPathComponent("shared_schemas/traces/tiny_qwen3") }

    /// The Swift loop replays the host's recorded tiny trace (real ExecuTorch outputs): every train
    /// step (full and LCSB chosen at run time, AdamW with skip updates), the eval pass and greedy
    /// generation (the prompt in two prefill chunks, the last padded, then the KV-cache decode) with
    /// the stock methods (the replay runtime has no native kernel); every input bit for bit, the
    /// losses, each step's state and the final state.
    func testReplayTiny() throws {
        let (trace, calls) = try replay(Self.traceDir)
        XCTAssertNil(trace["layers_per_checkpoint"] as? Int)
        XCTAssertEqual(calls, 74)
    }

    /// The same program and steps with checkpoint groups (`layers_per_checkpoint: 2`): the forward
    /// keeps the inputs of l_0, l_2, ... of each step's selected layers and the backward reruns
    /// block_forward at each group's top; every call (the 4 reruns included) bit for bit, and the same
    /// losses, per-step states and final state as tiny.
    func testReplayTinyGroups() throws {
        let (trace, calls) = try replay(Self.groupsTraceDir)
        XCTAssertEqual(trace["layers_per_checkpoint"] as? Int, 2)
        XCTAssertEqual(calls, 78)
        let plain = try JSONSerialization.jsonObject(with: try Data(contentsOf: Self.traceDir.appendingPathComponent("trace.json"))) as! [String: Any]
        XCTAssertEqual(trace["losses"] as? [Double], plain["losses"] as? [Double])
        XCTAssertEqual(trace["final_state_sha256"] as? String, plain["final_state_sha256"] as? String)
        let states = { (t: [String: Any]) in (t["steps"] as! [[String: Any]]).compactMap { $0["state_sha256"] as? String } }
        XCTAssertEqual(states(trace), states(plain))
        let forwards = { (t: [String: Any]) in (t["calls"] as! [[String: Any]]).filter { $0["method"] as? String == "block_forward" }.count }
        XCTAssertEqual(forwards(trace), forwards(plain) + 4, "4 reruns")
    }

    /// The same recording on a Qwen3-shaped program (`record_trace.py --family qwen3`): per-head q/k
    /// norms bound in every block method, no q/k/v biases, head_dim 16 where hidden / heads is 8, GQA. The
    /// test reads `model.arch` to know the program is of that shape; the loop reads only the method specs
    /// (the KV cache is [kv_heads, seq_len, head_dim] from the cache inputs) and replays every call bit for bit.
    func testReplayTinyQwen3() throws {
        let dir = Self.qwen3TraceDir
        let program = dir.appendingPathComponent("program")
        let doc = try JSONSerialization.jsonObject(with: try Data(contentsOf: program.appendingPathComponent("manifest.json"))) as! [String: Any]
        let arch = (doc["model"] as! [String: Any])["arch"] as! [String: Any]
        let headDim = arch["head_dim"] as! Int, hidden = arch["hidden"] as! Int, heads = arch["heads"] as! Int, kvHeads = arch["kv_heads"] as! Int
        XCTAssertEqual(arch["qk_norm"] as? Bool, true)
        XCTAssertEqual(arch["qkv_bias"] as? Bool, false)
        XCTAssertEqual(headDim, 16)
        XCTAssertNotEqual(hidden / heads, headDim)
        XCTAssertLessThan(kvHeads, heads)
        let m = try Manifest.load(directory: program)
        for name in ["block_forward", "block_backward", "block_prefill", "block_decode"] {
            let inputs = try XCTUnwrap(m.methods.first { $0.name == name }).inputs.map(\.name)
            XCTAssertTrue(inputs.contains("w_q_norm") && inputs.contains("w_k_norm"), "\(name) binds the q/k norms: \(inputs)")
            XCTAssertFalse(inputs.contains { $0.hasSuffix("_bias") }, "\(name) binds no biases: \(inputs)")
        }
        let cache = try XCTUnwrap(m.methods.first { $0.name == "block_decode" }).inputs.first { $0.name == "k_cache" }
        XCTAssertEqual(cache?.shape, [kvHeads, m.seqLen, headDim])
        let (trace, calls) = try replay(dir)
        XCTAssertNil(trace["layers_per_checkpoint"] as? Int)
        XCTAssertEqual(calls, 74)
    }

    /// Replays a trace directory through `LayerLoop` (with its `layers_per_checkpoint`, default 1);
    /// returns the trace and the number of calls made.
    func replay(_ traceDir: URL) throws -> ([String: Any], Int) {
        let traceURL = traceDir.appendingPathComponent("trace.json")
        guard FileManager.default.fileExists(atPath: traceURL.path) else {
            XCTFail("no trace at \(traceURL.path) (scripts/record_trace.py records it)")
            return ([:], 0)
        }
        let trace = try JSONSerialization.jsonObject(with: try Data(contentsOf: traceURL)) as! [String: Any]
        XCTAssertEqual(trace["format"] as? String, "toolchain-trace")
        XCTAssertEqual(trace["format_version"] as? Int, 1)
        let groups = trace["layers_per_checkpoint"] as? Int ?? 1
        let program = traceDir.appendingPathComponent(trace["program"] as! String)
        let outputs = try Data(contentsOf: traceDir.appendingPathComponent(trace["outputs_file"] as! String), options: .alwaysMapped)
        let rt = ReplayRuntime(trace: trace, outputs: outputs)
        let loop = try LayerLoop(programDirectory: program, runtime: rt)
        let state = try StateBuffer.initial(manifest: loop.manifest, programDirectory: program)
        XCTAssertEqual(state.sha256, trace["initial_state_sha256"] as? String, "state_init.bin")
        let pad = Int64(trace["pad_token_id"] as! Int)
        let lr = Float(trace["lr"] as! Double)
        func rows(_ key: String) -> [(inputIds: [Int64], labels: [Int64])] {
            (trace[key] as! [[String: Any]]).map { r in
                ((r["input_ids"] as! [Int]).map(Int64.init), (r["labels"] as! [Int]).map(Int64.init))
            }
        }
        let train = rows("rows"), held = rows("eval_rows")
        var losses: [Float] = []
        var kinds: [String] = []
        for step in trace["steps"] as! [[String: Any]] {
            let kind = step["kind"] as! String
            kinds.append(kind)
            let range = step["calls"] as! [Int]
            XCTAssertEqual(rt.next, range[0], "\(kind) step starts at call \(range[0])")
            switch kind {
            case "train":
                let row = train[step["row"] as! Int]
                let sel = Set(step["selected"] as! [Int])
                let loss = try loop.trainStep(inputIds: row.inputIds, labels: row.labels, lr: lr, state: state, selected: sel, padTokenId: pad,
                                              layersPerCheckpoint: groups)
                XCTAssertEqual(loss, Float(step["loss"] as! Double), "loss of step \(step["step"]!)")
                XCTAssertEqual(state.sha256, step["state_sha256"] as? String, "state after step \(step["step"]!)")
                losses.append(loss)
            case "eval":
                let idx = step["rows"] as! [Int]
                let before = state.sha256
                let (loss, tokens) = try loop.evaluate(rows: idx.map { held[$0] }, state: state, padTokenId: pad)
                XCTAssertEqual(tokens, step["tokens"] as? Int)
                XCTAssertEqual(loss, step["loss"] as! Double, accuracy: 1e-9 * abs(loss))
                XCTAssertEqual(state.sha256, before, "eval wrote the state")
            case "generate":
                XCTAssertEqual(step["greedy"] as? Bool, true)
                let before = state.sha256
                let ids = try loop.generate(prompt: (step["prompt_ids"] as! [Int]).map(Int64.init), maxNewTokens: step["max_new_tokens"] as! Int,
                                            state: state, padTokenId: pad, stopIds: Set((step["stop_ids"] as! [Int]).map(Int64.init))).ids
                XCTAssertEqual(ids, (step["output_ids"] as! [Int]).map(Int64.init))
                XCTAssertEqual(state.sha256, before, "generate wrote the state")
            default:
                XCTFail("unknown step kind \(kind)")
            }
            XCTAssertEqual(rt.next, range[1], "\(kind) step ends at call \(range[1])")
        }
        XCTAssertNil(rt.mismatch)
        XCTAssertEqual(rt.next, rt.calls.count, "every recorded call was made")
        XCTAssertEqual(losses, (trace["losses"] as! [Double]).map(Float.init))
        XCTAssertEqual(state.sha256, trace["final_state_sha256"] as? String, "final state")
        XCTAssertTrue(kinds.contains("train") && kinds.contains("eval") && kinds.contains("generate"), "\(kinds)")
        XCTAssertGreaterThan(rt.inputsChecked, 1000)
        print("replay \(traceDir.lastPathComponent): \(rt.next) calls, \(rt.inputsChecked) inputs matched, \(losses.count) train steps, " +
              "layers per checkpoint \(groups), final state \(state.sha256.prefix(16))")
        return (trace, rt.next)
    }

    /// The trace's program exercises what the loop must handle: LCSB steps (k < L) and skip updates.
    func testTraceCoversLcsbAndSkipUpdates() throws {
        let traceURL = Self.traceDir.appendingPathComponent("trace.json")
        guard FileManager.default.fileExists(atPath: traceURL.path) else { XCTFail("no trace"); return }
        let trace = try JSONSerialization.jsonObject(with: try Data(contentsOf: traceURL)) as! [String: Any]
        let steps = (trace["steps"] as! [[String: Any]]).filter { $0["kind"] as? String == "train" }
        let m = try Manifest.load(directory: Self.traceDir.appendingPathComponent("program"))
        XCTAssertTrue(steps.contains { ($0["selected"] as! [Int]).count < m.loop.layers })
        XCTAssertTrue((trace["calls"] as! [[String: Any]]).contains { $0["method"] as? String == "block_skip_update" })
        // a replay of a tampered trace input fails at that call
        var calls = trace["calls"] as! [[String: Any]]
        var inputs = calls[3]["inputs"] as! [[String: Any]]
        inputs[0]["sha256"] = String(repeating: "0", count: 64)
        calls[3]["inputs"] = inputs
        var bad = trace
        bad["calls"] = calls
        let program = Self.traceDir.appendingPathComponent("program")
        let rt = ReplayRuntime(trace: bad, outputs: try Data(contentsOf: Self.traceDir.appendingPathComponent("outputs.bin")))
        let loop = try LayerLoop(programDirectory: program, runtime: rt)
        let state = try StateBuffer.initial(manifest: loop.manifest, programDirectory: program)
        let row = (trace["rows"] as! [[String: Any]])[0]
        XCTAssertThrowsError(try loop.trainStep(inputIds: (row["input_ids"] as! [Int]).map(Int64.init), labels: (row["labels"] as! [Int]).map(Int64.init),
                                                lr: Float(trace["lr"] as! Double), state: state, selected: Set(steps[0]["selected"] as! [Int])))
        XCTAssertEqual(rt.mismatch?.hasPrefix("call 3"), true, rt.mismatch ?? "no mismatch")
    }
}
