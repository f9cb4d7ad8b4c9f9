import Foundation
import XCTest
@testable import TrainerCore

/// A runtime around another one that counts calls in flight at once (the loop must never call a
/// runtime from two threads at a time), widens each call a little so an overlap would show, and
/// lets a test act after a call (`afterCall`: method and layer).
final class CheckedRuntime: ProgramRuntime {
    let inner: ProgramRuntime
    var backendName: String { inner.backendName }
    var registeredKernels: Set<String> { inner.registeredKernels }
    var afterCall: ((String, Int?) -> Void)?
    private let lock = NSLock()
    private var inFlight = 0
    private var maxSeen = 0
    private(set) var executed = 0

    init(_ inner: ProgramRuntime) { self.inner = inner }

    var maxInFlight: Int { lock.lock(); defer { lock.unlock() }; return maxSeen }

    func load(methods: [String]) throws { try inner.load(methods: methods) }

    func execute(method: String, layer: Int?, inputs: [LoopInput]) throws -> [Data] {
        lock.lock()
        inFlight += 1
        maxSeen = max(maxSeen, inFlight)
        executed += 1
        lock.unlock()
        usleep(50)
        defer { lock.lock(); inFlight -= 1; lock.unlock() }
        let out = try inner.execute(method: method, layer: layer, inputs: inputs)
        afterCall?(method, layer)
        return out
    }
}

/// A runtime that claims the native int4 kernel (`registeredKernels`), records the calls made to it
/// (method, each input's name and sha256), and runs each on `inner` under the stock method's name with
/// the stock method's input names (positionally; the same count): so a replay of a trace recorded with
/// the stock methods checks that every fused call got exactly the stock call's input bytes.
final class FusedKernelRuntime: ProgramRuntime {
    let inner: ProgramRuntime
    let manifest: Manifest
    let registeredKernels: Set<String>
    var backendName: String { inner.backendName }
    private(set) var called: [(method: String, inputs: [(name: String, sha: String)])] = []
    private(set) var loaded: [String] = []
    private let toStock: [String: String]

    init(_ inner: ProgramRuntime, manifest: Manifest, kernels: Set<String>? = nil) {
        (self.inner, self.manifest) = (inner, manifest)
        registeredKernels = kernels ?? Set(manifest.generate?.fused?.kernels ?? [])
        toStock = Dictionary((manifest.generate?.fused?.methods ?? [:]).map { ($1, $0) }, uniquingKeysWith: { a, _ in a })
    }

    func load(methods: [String]) throws { loaded += methods; try inner.load(methods: methods.map { toStock[$0] ?? $0 }) }

    func execute(method: String, layer: Int?, inputs: [LoopInput]) throws -> [Data] {
        called.append((method, inputs.map { ($0.name, SHA256.hex($0.bytes)) }))
        guard let stockName = toStock[method] else { return try inner.execute(method: method, layer: layer, inputs: inputs) }
        guard let stock = manifest.method(named: stockName), stock.inputs.count == inputs.count else {
            throw TrainerError.runtime("\(method) and \(stockName) take different inputs")
        }
        let renamed = zip(inputs, stock.inputs).map { LoopInput(name: $1.name, bind: $0.bind, ref: $0.ref, dtype: $0.dtype, shape: $0.shape, bytes: $0.bytes) }
        return try inner.execute(method: stockName, layer: layer, inputs: renamed)
    }
}

/// A counter other threads can wait on (the training thread's step events).
final class ProgressLog {
    private let condition = NSCondition()
    private var n = 0
    var count: Int { condition.lock(); defer { condition.unlock() }; return n }
    func add() { condition.lock(); n += 1; condition.broadcast(); condition.unlock() }
    /// Waits until at least `target` were added; false after `timeout` seconds.
    func wait(atLeast target: Int, timeout: TimeInterval) -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        condition.lock()
        defer { condition.unlock() }
        while n < target { if !condition.wait(until: deadline) { return n >= target } }
        return true
    }
}

/// Streaming, cancellable generation: `LayerLoop.generate` on the replay of the host's tiny trace
/// (real ExecuTorch outputs), incremental text with the byte and the Qwen2.5 tokenizers, the session's
/// token events and view state, and a generation beside a training run.
final class GenerationTests: XCTestCase {
    var dir: URL!

    override func setUpWithError() throws { dir = try tempDir("generation") }
    override func tearDownWithError() throws { try? FileManager.default.removeItem(at: dir) }

    // MARK: the trace

    /// The tiny trace with the state its train steps leave (what its generate step starts from).
    struct TraceAtGeneration {
        let trace: [String: Any]
        let outputs: Data
        let program: URL
        let state: StateBuffer
        let pad: Int64
        let prompt: [Int64]
        let maxNewTokens: Int
        let stopIds: Set<Int64>
        let outputIds: [Int64]
        let firstCall: Int
        let endCall: Int
        let layers: Int
        let prefillChunk: Int
        /// Prefill chunks of the prompt (ceil(n / C)).
        var chunks: Int { (prompt.count + prefillChunk - 1) / prefillChunk }
        /// Calls of the prefill (per chunk embed_prefill + block_prefill per layer, then head_logits) and
        /// of one decode step (embed_token, block_decode per layer, head_logits).
        var prefillCalls: Int { chunks * (1 + layers) + 1 }
        var decodeStepCalls: Int { 2 + layers }
    }

    static let traced: Result<TraceAtGeneration, Error> = Result {
        let dir = ReplayTests.traceDir
        let trace = try JSONSerialization.jsonObject(with: try Data(contentsOf: dir.appendingPathComponent("trace.json"))) as! [String: Any]
        let outputs = try Data(contentsOf: dir.appendingPathComponent(trace["outputs_file"] as! String), options: .alwaysMapped)
        let program = dir.appendingPathComponent(trace["program"] as! String)
        let rt = ReplayRuntime(trace: trace, outputs: outputs)
        let loop = try LayerLoop(programDirectory: program, runtime: rt)
        let state = try StateBuffer.initial(manifest: loop.manifest, programDirectory: program)
        let pad = Int64(trace["pad_token_id"] as! Int)
        let rows = (trace["rows"] as! [[String: Any]]).map { r in ((r["input_ids"] as! [Int]).map(Int64.init), (r["labels"] as! [Int]).map(Int64.init)) }
        let steps = trace["steps"] as! [[String: Any]]
        for step in steps where step["kind"] as? String == "train" {
            let row = rows[step["row"] as! Int]
            _ = try loop.trainStep(inputIds: row.0, labels: row.1, lr: Float(trace["lr"] as! Double), state: state,
                                   selected: Set(step["selected"] as! [Int]), padTokenId: pad)
        }
        guard rt.mismatch == nil, state.sha256 == trace["final_state_sha256"] as? String else {
            throw TrainerError.runtime("the trace's train steps did not replay: \(rt.mismatch ?? "final state differs")")
        }
        let gen = steps.first { $0["kind"] as? String == "generate" }!
        let calls = gen["calls"] as! [Int]
        return TraceAtGeneration(trace: trace, outputs: outputs, program: program, state: state, pad: pad,
                                 prompt: (gen["prompt_ids"] as! [Int]).map(Int64.init), maxNewTokens: gen["max_new_tokens"] as! Int,
                                 stopIds: Set((gen["stop_ids"] as! [Int]).map(Int64.init)), outputIds: (gen["output_ids"] as! [Int]).map(Int64.init),
                                 firstCall: calls[0], endCall: calls[1], layers: loop.layers,
                                 prefillChunk: try XCTUnwrap(loop.manifest.prefillChunk))
    }

    /// A loop whose runtime replays the trace from its generate step's first call.
    func loopAtGeneration(_ t: TraceAtGeneration) throws -> (LayerLoop, ReplayRuntime, CheckedRuntime) {
        let rt = ReplayRuntime(trace: t.trace, outputs: t.outputs)
        rt.next = t.firstCall
        let checked = CheckedRuntime(rt)
        return (try LayerLoop(programDirectory: t.program, runtime: checked), rt, checked)
    }

    /// The ids reach `onToken` in the result's order, each before the next decode step's calls; the
    /// greedy ids are the trace's, with every recorded call bit for bit and nothing more.
    func testStreamedIdsAreTheResultAndTheTrace() throws {
        let t = try Self.traced.get()
        XCTAssertEqual(t.endCall - t.firstCall, t.prefillCalls + (t.maxNewTokens - 1) * t.decodeStepCalls)
        XCTAssertGreaterThan(t.chunks, 1, "the trace's prompt takes more than one prefill chunk")
        XCTAssertNotEqual(t.prompt.count % t.prefillChunk, 0, "and its last chunk is padded")
        let recorded = (t.trace["calls"] as! [[String: Any]])[t.firstCall..<t.endCall].map { $0["method"] as! String }
        let chunk = ["embed_prefill"] + Array(repeating: "block_prefill", count: t.layers)
        let step = ["embed_token"] + Array(repeating: "block_decode", count: t.layers) + ["head_logits"]
        XCTAssertEqual(Array(recorded), Array(repeating: chunk, count: t.chunks).flatMap { $0 } + ["head_logits"]
                       + Array(repeating: step, count: t.maxNewTokens - 1).flatMap { $0 })
        let (loop, rt, _) = try loopAtGeneration(t)
        var streamed: [Int64] = []
        var callsAtToken: [Int] = []
        let r = try loop.generate(prompt: t.prompt, maxNewTokens: t.maxNewTokens, state: t.state, padTokenId: t.pad, stopIds: t.stopIds,
                                  cancel: GenerationCancel(), onToken: { streamed.append($0); callsAtToken.append(rt.next) })
        XCTAssertEqual(streamed, r.ids)
        XCTAssertEqual(r.ids, t.outputIds, "greedy ids = the trace's")
        XCTAssertEqual(r.stop, t.outputIds.count == t.maxNewTokens ? .maxNewTokens : .eos)
        XCTAssertEqual(callsAtToken, (0..<r.ids.count).map { t.firstCall + t.prefillCalls + $0 * t.decodeStepCalls },
                       "each token is reported as soon as its logits are read")
        XCTAssertNil(rt.mismatch)
        XCTAssertEqual(rt.next, t.endCall)
        XCTAssertEqual(t.state.sha256, t.trace["final_state_sha256"] as? String, "generation does not write the state")
    }

    /// A cancel made while token k is reported ends with exactly those k tokens (`.cancelled`), after
    /// the trace's calls up to token k and no further call; at the last token the generation ends by
    /// itself (`.maxNewTokens`).
    func testCancelAfterKTokensStopsWithExactlyThose() throws {
        let t = try Self.traced.get()
        for k in 1...t.maxNewTokens {
            let (loop, rt, _) = try loopAtGeneration(t)
            let cancel = GenerationCancel()
            var streamed: [Int64] = []
            let r = try loop.generate(prompt: t.prompt, maxNewTokens: t.maxNewTokens, state: t.state, padTokenId: t.pad, stopIds: t.stopIds,
                                      cancel: cancel, onToken: { id in
                                          streamed.append(id)
                                          if streamed.count == k { cancel.cancel() }
                                      })
            XCTAssertEqual(r.ids, Array(t.outputIds.prefix(k)), "k = \(k)")
            XCTAssertEqual(streamed, r.ids)
            XCTAssertEqual(r.stop, k < t.maxNewTokens ? .cancelled : .maxNewTokens, "k = \(k)")
            XCTAssertEqual(rt.next, t.firstCall + t.prefillCalls + (k - 1) * t.decodeStepCalls, "no call after the cancel (k = \(k))")
            XCTAssertNil(rt.mismatch)
        }
    }

    /// Cancelled from another thread while token 2 is reported: the same, 2 tokens.
    func testCancelFromAnotherThread() throws {
        let t = try Self.traced.get()
        let (loop, rt, _) = try loopAtGeneration(t)
        let cancel = GenerationCancel()
        let done = DispatchSemaphore(value: 0)
        var n = 0
        let r = try loop.generate(prompt: t.prompt, maxNewTokens: t.maxNewTokens, state: t.state, padTokenId: t.pad, stopIds: t.stopIds,
                                  cancel: cancel, onToken: { _ in
                                      n += 1
                                      if n == 2 {
                                          DispatchQueue.global().async { cancel.cancel(); done.signal() }
                                          done.wait()
                                      }
                                  })
        XCTAssertEqual(r, GenerationResult(ids: Array(t.outputIds.prefix(2)), stop: .cancelled))
        XCTAssertEqual(rt.next, t.firstCall + t.prefillCalls + t.decodeStepCalls)
    }

    /// Cancelled before the start: no call, no token. Cancelled inside the prefill (after layer 1's
    /// block_prefill of the first chunk, and after the first chunk's last layer): no token, and the
    /// calls made are the trace's first ones.
    func testCancelBeforeStartAndDuringPrefill() throws {
        let t = try Self.traced.get()
        let (loop, rt, checked) = try loopAtGeneration(t)
        let cancel = GenerationCancel()
        cancel.cancel()
        XCTAssertTrue(cancel.isCancelled)
        var tokens = 0
        let r = try loop.generate(prompt: t.prompt, maxNewTokens: t.maxNewTokens, state: t.state, padTokenId: t.pad,
                                  cancel: cancel, onToken: { _ in tokens += 1 })
        XCTAssertEqual(r, GenerationResult(ids: [], stop: .cancelled))
        XCTAssertEqual(tokens, 0)
        XCTAssertEqual(checked.executed, 0)
        XCTAssertEqual(rt.next, t.firstCall)

        let (loop2, rt2, checked2) = try loopAtGeneration(t)
        let cancel2 = GenerationCancel()
        checked2.afterCall = { method, layer in if method == "block_prefill" && layer == 1 { cancel2.cancel() } }
        let r2 = try loop2.generate(prompt: t.prompt, maxNewTokens: t.maxNewTokens, state: t.state, padTokenId: t.pad,
                                    cancel: cancel2, onToken: { _ in tokens += 1 })
        XCTAssertEqual(r2, GenerationResult(ids: [], stop: .cancelled))
        XCTAssertEqual(tokens, 0)
        XCTAssertEqual(rt2.next, t.firstCall + 1 + 2, "embed_prefill, layers 0 and 1 of chunk 0, then stopped before layer 2")
        XCTAssertNil(rt2.mismatch)

        let (loop3, rt3, checked3) = try loopAtGeneration(t)
        let cancel3 = GenerationCancel()
        var prefills = 0
        checked3.afterCall = { method, _ in
            if method == "block_prefill" { prefills += 1; if prefills == t.layers { cancel3.cancel() } }
        }
        let r3 = try loop3.generate(prompt: t.prompt, maxNewTokens: t.maxNewTokens, state: t.state, padTokenId: t.pad, cancel: cancel3)
        XCTAssertEqual(r3, GenerationResult(ids: [], stop: .cancelled))
        XCTAssertEqual(rt3.next, t.firstCall + 1 + t.layers, "the first chunk only: no embed_prefill of the second")
        XCTAssertNil(rt3.mismatch)
    }

    /// The snapshot a generation beside training reads: the generation methods' entries only, the same
    /// bytes; the generation on it makes the same calls (the trace's) as on the whole state.
    func testGenerationSnapshotHoldsTheBoundEntries() throws {
        let t = try Self.traced.get()
        let (loop, rt, _) = try loopAtGeneration(t)
        let names = loop.generationStateEntries
        XCTAssertFalse(names.isEmpty)
        XCTAssertFalse(names.contains("step"), "the optimizer's step is not read by generation")
        let snap = try loop.generationSnapshot(of: t.state)
        XCTAssertLessThan(snap.buffer.byteCount, t.state.buffer.byteCount)
        for n in names { XCTAssertEqual(Array(try snap.view(n)), Array(try t.state.view(n)), n) }
        XCTAssertThrowsError(try snap.view("step"))
        let r = try loop.generate(prompt: t.prompt, maxNewTokens: t.maxNewTokens, state: snap, padTokenId: t.pad, stopIds: t.stopIds)
        XCTAssertEqual(r.ids, t.outputIds)
        XCTAssertNil(rt.mismatch)
        XCTAssertEqual(rt.next, t.endCall)
    }

    // MARK: fused methods

    /// A runtime that has the manifest's native kernel registered gets the fused generation methods
    /// (`generate.fused`: block_prefill_fused, block_decode_fused, head_logits_fused) loaded and called
    /// instead of the stock ones, with the same inputs: replayed against the trace recorded with the
    /// stock methods, every fused call's inputs are the stock call's bit for bit (head_logits_fused's
    /// whole head = the one head chunk), the greedy ids are the trace's. Without the kernel (or with
    /// another one) the stock names are called.
    func testFusedMethodsWhenTheRuntimeHasTheKernel() throws {
        let t = try Self.traced.get()
        let m = try Manifest.load(directory: t.program)
        let fused = try XCTUnwrap(m.generate?.fused)
        XCTAssertEqual(fused.kernels, ["toolchain::int4_linear_a8.out", "toolchain::attention_decode.out", "toolchain::rms_norm.out", "toolchain::lora_linear_a8.out", "toolchain::rope_heads.out", "toolchain::swiglu.out"])
        XCTAssertEqual(fused.methods, ["block_decode": "block_decode_fused", "block_prefill": "block_prefill_fused", "head_logits": "head_logits_fused"])
        XCTAssertEqual(m.method(named: "head_logits_fused")?.kernels, fused.kernels)
        XCTAssertNil(m.method(named: "head_logits")?.kernels)

        let rt = ReplayRuntime(trace: t.trace, outputs: t.outputs)
        rt.next = t.firstCall
        let k = FusedKernelRuntime(rt, manifest: m)
        let loop = try LayerLoop(programDirectory: t.program, runtime: k)
        XCTAssertTrue(loop.generationIsFused)
        try loop.loadGeneration()
        XCTAssertEqual(k.loaded, ["embed_token", "embed_prefill", "block_prefill_fused", "block_decode_fused", "head_logits_fused"])
        let r = try loop.generate(prompt: t.prompt, maxNewTokens: t.maxNewTokens, state: t.state, padTokenId: t.pad, stopIds: t.stopIds)
        XCTAssertEqual(r.ids, t.outputIds, "greedy ids = the trace's")
        XCTAssertNil(rt.mismatch, "every fused call's inputs are the recorded stock call's")
        XCTAssertEqual(rt.next, t.endCall)
        let recorded = (t.trace["calls"] as! [[String: Any]])[t.firstCall..<t.endCall].map { $0["method"] as! String }
        XCTAssertEqual(k.called.map(\.method), recorded.map { fused.methods[$0] ?? $0 }, "the stock names mapped to the fused ones")
        XCTAssertTrue(k.called.contains { $0.method == "head_logits_fused" && $0.inputs.map(\.name) == ["x", "final_norm", "head_q", "head_scale"] })

        // a runtime without the kernel, or with some other kernel: the stock methods
        for kernels in [Set<String>(), ["toolchain::other.out"]] {
            let rt2 = ReplayRuntime(trace: t.trace, outputs: t.outputs)
            rt2.next = t.firstCall
            let k2 = FusedKernelRuntime(rt2, manifest: m, kernels: kernels)
            let loop2 = try LayerLoop(programDirectory: t.program, runtime: k2)
            XCTAssertFalse(loop2.generationIsFused)
            try loop2.loadGeneration()
            XCTAssertEqual(k2.loaded, Contract.generationRoles)
            XCTAssertEqual(try loop2.generate(prompt: t.prompt, maxNewTokens: t.maxNewTokens, state: t.state, padTokenId: t.pad).ids, t.outputIds)
            XCTAssertEqual(k2.called.map(\.method), Array(recorded))
            XCTAssertNil(rt2.mismatch)
        }
    }

    /// The same on the tiny generation program (8 layers, fake outputs of the inputs' hashes): the
    /// kernel-claiming runtime's calls are the stock runtime's call for call, names mapped through
    /// generate.fused.methods and every input's sha256 equal (so the same ids); a prompt of several
    /// prefill chunks, the last padded, fills the cache rows below n only.
    func testFusedCallsHaveTheStockCallsInputs() throws {
        let (p, m) = try program()
        let fused = try XCTUnwrap(m.generate?.fused)
        let chunk = try XCTUnwrap(m.prefillChunk)
        let prompt = (0..<(2 * chunk + 3)).map { Int64(($0 * 11 + 5) % m.model.arch.vocab) }
        func run(_ kernels: Set<String>) throws -> (HashRuntime, GenerationResult) {
            let rt = HashRuntime(manifest: m, kernels: kernels)
            let loop = try LayerLoop(programDirectory: p, runtime: rt)
            try loop.loadGeneration()
            let state = try StateBuffer.initial(manifest: m, programDirectory: p)
            return (rt, try loop.generate(prompt: prompt, maxNewTokens: 6, state: state, padTokenId: 258))
        }
        let (stock, a) = try run([])
        let (withKernel, b) = try run(Set(fused.kernels))
        XCTAssertEqual(b, a)
        XCTAssertEqual(stock.loaded, Contract.generationRoles)
        XCTAssertEqual(withKernel.loaded, Contract.generationRoles.map { fused.methods[$0] ?? $0 })
        XCTAssertEqual(withKernel.calls.map(\.method), stock.calls.map { fused.methods[$0.method] ?? $0.method })
        XCTAssertEqual(withKernel.calls.map { $0.inputs.map(\.sha) }, stock.calls.map { $0.inputs.map(\.sha) }, "the same input bytes")
        XCTAssertEqual(withKernel.calls.map(\.layer), stock.calls.map(\.layer))
        let chunks = stock.calls.filter { $0.method == "embed_prefill" }
        XCTAssertEqual(chunks.count, 3)
        // the last chunk: 3 prompt tokens, then the pad id
        let last = (Array(prompt.suffix(3)) + Array(repeating: 258, count: chunk - 3)).map { $0.littleEndian }
        XCTAssertEqual(chunks[2].inputs[0].sha, SHA256.hex(last.withUnsafeBytes { Data($0) }))
        // block_prefill of chunk c gets pos = c * C
        let positions = stock.calls.filter { $0.method == "block_prefill" && $0.layer == 0 }.map { $0.inputs.first { $0.name == "pos" }!.sha }
        XCTAssertEqual(positions, (0..<3).map { c in SHA256.hex([Int64(c * chunk).littleEndian].withUnsafeBytes { Data($0) }) })
        // the prompt's head_logits reads row (n - 1) mod C of the last chunk's x
        let lastPrefill = try XCTUnwrap(stock.calls.lastIndex { $0.method == "block_prefill" })
        let head = stock.calls[lastPrefill + 1]
        XCTAssertEqual(head.method, "head_logits")
        let rowBytes = 4 * m.model.arch.hidden
        let row = (prompt.count - 1) % chunk
        XCTAssertEqual(head.inputs[0].sha, SHA256.hex(stock.calls[lastPrefill].outputs[0].subdata(in: row * rowBytes..<(row + 1) * rowBytes)))
    }

    /// The KV cache: chunk c's k_new / v_new rows land at cache rows c*C ..< c*C + C, those < S (a last
    /// chunk reaching past the cache is cut, as the host's `_call` does); what block_decode reads at
    /// its first step holds exactly those rows and zeros elsewhere. The tiny program's C = 16 (S = 64,
    /// 2 chunks) and the same manifest with C = 24 (3 chunks, the last one's rows 64 ..< 72 dropped).
    func testPrefillChunksFillTheirCacheRows() throws {
        let (p, base) = try program()
        for (chunk, n) in [(try XCTUnwrap(base.prefillChunk), 18), (24, 50)] {
            var m = base
            m.generate?.prefillChunk = chunk
            for (i, method) in m.methods.enumerated() where method.role == "embed_prefill" || method.role == "block_prefill" {
                for (j, io) in method.inputs.enumerated() where io.bind == .input && io.ref == "tokens" { m.methods[i].inputs[j].shape = [chunk] }
                for (j, io) in method.inputs.enumerated() where io.bind == .activation { m.methods[i].inputs[j].shape[0] = chunk }
                for (j, io) in method.outputs.enumerated() {
                    if io.bind == .activation { m.methods[i].outputs[j].shape[0] = chunk }
                    if io.bind == .cache { m.methods[i].outputs[j].shape[1] = chunk }
                }
            }
            try m.validate()
            let rt = HashRuntime(manifest: m)
            let loop = try LayerLoop(manifest: m, weights: try MappedWeights(url: p.appendingPathComponent(m.weights.file)), runtime: rt)
            let state = try StateBuffer.initial(manifest: m, programDirectory: p)
            let r = try loop.generate(prompt: (0..<n).map { Int64($0 % 200 + 40) }, maxNewTokens: 2, state: state)
            XCTAssertEqual(r.ids.count, 2)
            let decode = try XCTUnwrap(m.method(role: "block_decode"))
            let kIn = try XCTUnwrap(decode.inputs.firstIndex { $0.name == "k_cache" })
            let (hk, s, d) = (decode.inputs[kIn].shape[0], decode.inputs[kIn].shape[1], decode.inputs[kIn].shape[2])
            XCTAssertEqual(s, m.seqLen)
            XCTAssertEqual(m.generate?.cacheBytes, 2 * m.loop.layers * hk * s * d * 4)
            let prefills = rt.calls.filter { $0.method == "block_prefill" && $0.layer == 0 }
            XCTAssertEqual(prefills.count, (n + chunk - 1) / chunk, "C = \(chunk)")
            let kOut = try XCTUnwrap(m.method(role: "block_prefill")?.outputs.firstIndex { $0.name == "k_new" })
            var want = [Float](repeating: 0, count: hk * s * d)
            for (c, call) in prefills.enumerated() {
                let rows = call.outputs[kOut].withUnsafeBytes { Array($0.bindMemory(to: Float.self)) }
                for h in 0..<hk {
                    for row in 0..<chunk where c * chunk + row < s {
                        for j in 0..<d { want[(h * s + c * chunk + row) * d + j] = rows[(h * chunk + row) * d + j] }
                    }
                }
            }
            // rows n ..< ceil(n/C)*C hold the padding's keys, as on the host (block_decode masks rows >= pos,
            // and each decode step writes its row first)
            let firstDecode = try XCTUnwrap(rt.calls.first { $0.method == "block_decode" && $0.layer == 0 })
            XCTAssertEqual(firstDecode.inputs[kIn].sha, SHA256.hex(want.withUnsafeBytes { Data($0) }), "C = \(chunk)")
        }
    }

    // MARK: incremental text

    /// Byte tokens, one per UTF-8 byte: a character's first bytes show nothing, its last one the
    /// whole character; no piece ever holds U+FFFD for valid text, and the pieces are the decode.
    func testIncrementalTextWithByteTokens() throws {
        let tok = ByteTokenizer()
        let text = "Grüße 🙂 日本語 e\u{301} — 𝄞!"
        let ids = tok.encode(text)
        let dec = IncrementalTextDecoder(tokenizer: tok, hidden: [ByteTokenizer.eos])
        var pieces: [String] = []
        for id in ids + [ByteTokenizer.eos] { pieces.append(try dec.append(id)) }
        pieces.append(dec.finish())
        XCTAssertEqual(Array(pieces.joined().utf8), Array(text.utf8))
        XCTAssertFalse(pieces.contains { $0.unicodeScalars.contains("\u{FFFD}") })
        // 🙂 = F0 9F 99 82: three empty pieces, then the emoji
        let at = Array(text.utf8).firstIndex(of: 0xF0)!
        XCTAssertEqual(Array(pieces[at..<at + 4]), ["", "", "", "🙂"])
        XCTAssertEqual(pieces[ids.count], "", "a hidden stop id adds no text")

        // Random bytes (much invalid UTF-8, cut anywhere): the pieces + finish() are the whole decode
        // exactly, U+FFFD where String(decoding:) puts one and nowhere else.
        var rng = SplitMix64(state: 23)
        let alphabet: [UInt8] = [0x41, 0x20, 0xC3, 0xA9, 0xE2, 0x82, 0xAC, 0xF0, 0x9F, 0x99, 0x82, 0xE0, 0xED, 0xF4, 0x90, 0x80, 0xBF, 0xC0, 0xFF, 0xF5]
        for _ in 0..<500 {
            let n = Int(rng.next() % 16) + 1
            let bytes = (0..<n).map { _ in rng.next() % 3 == 0 ? UInt8(truncatingIfNeeded: rng.next()) : alphabet[Int(rng.next() % UInt64(alphabet.count))] }
            let d = IncrementalTextDecoder(tokenizer: tok)
            var out = ""
            for b in bytes { out += try d.append(Int(b)) }
            out += d.finish()
            XCTAssertEqual(Array(out.utf8), Array(String(decoding: bytes, as: UTF8.self).utf8), "\(bytes.map { String($0, radix: 16) })")
        }
    }

    /// The Qwen2.5 byte-level BPE: every corpus case (valid text, with tokens that end inside a
    /// character) and the 400 random id sequences of the reference: the pieces + finish() equal the
    /// whole decode; for valid text no piece holds U+FFFD.
    func testIncrementalTextWithQwenTokenizer() throws {
        guard let qwen = TokenizerTests.tokenizer else {
            XCTFail("no Qwen2.5 tokenizer.json at \(TokenizerTests.referenceDir.path): run .venv/bin/python ios/hostcheck/tokenizer_reference.py DIR (ios/test.sh does)")
            return
        }
        var cutInside = 0
        for text in try TokenizerTests.cases() {
            let ids = qwen.encode(text, allowSpecial: true)
            let dec = IncrementalTextDecoder(tokenizer: qwen)
            var out = ""
            for id in ids {
                let piece = try dec.append(id)
                XCTAssertFalse(piece.unicodeScalars.contains("\u{FFFD}") && !text.unicodeScalars.contains("\u{FFFD}"), "broken character in \(text.debugDescription)")
                out += piece
                if dec.pendingBytes > 0 { cutInside += 1 }
            }
            out += dec.finish()
            XCTAssertEqual(Array(out.utf8), Array(try qwen.decode(ids).utf8), text.debugDescription)
        }
        XCTAssertGreaterThan(cutInside, 20, "the corpus has tokens that end inside a character")
        let doc = try JSONSerialization.jsonObject(with: try Data(contentsOf: TokenizerTests.referenceDir.appendingPathComponent("decode.json"))) as! [String: Any]
        let randoms = (doc["random"] as! [[String: Any]]).map { $0["ids"] as! [Int] }
        XCTAssertEqual(randoms.count, 400)
        for ids in randoms {
            let dec = IncrementalTextDecoder(tokenizer: qwen)
            var out = ""
            for id in ids { out += try dec.append(id) }
            out += dec.finish()
            XCTAssertEqual(Array(out.utf8), Array(try qwen.decode(ids).utf8), "\(ids)")
        }
    }

    // MARK: the session

    /// A program for the tiny generation manifest (`Repo.manifest`, byte tokenizer, int4 with fused
    /// methods) with synthetic weights and state_init.bin.
    func program() throws -> (URL, Manifest) {
        try syntheticProgram(in: dir)
    }

    func session(_ p: URL, _ m: Manifest, runtime: ProgramRuntime, steps: Int) throws -> TrainingSession {
        let data = try TrainingData.prepare(.text(SessionTests.text), tokenizer: .byte(), manifest: m, heldOutFraction: 0, seed: 0)
        let clock = TickClock()
        return try TrainingSession(programDirectory: p, programName: "tiny", runtime: runtime, data: data,
                                   config: SessionConfig(steps: steps, lr: 0.01, checkpointEvery: 1_000_000, selection: .cyclic(k: 3)),
                                   device: testDevice, clock: clock.read, monotonic: clock.read)
    }

    /// The session streams `.generationStarted`, one `.token` per id (the ids of the result, their
    /// texts the result's text), `.generated`; the view model shows the text as it grows, then the
    /// final one with how it stopped, and leaves the run's phase and message alone. Cancel before
    /// the start: no call, an empty `.cancelled` generation.
    func testSessionStreamsTokensIntoTheViewModel() throws {
        let (p, m) = try program()
        let rt = HashRuntime(manifest: m)
        let s = try session(p, m, runtime: rt, steps: 2)
        let vm = TrainingViewModel()
        var events: [SessionEvent] = []
        var texts: [String] = []
        s.onEvent = { e in
            events.append(e)
            vm.handle(e)
            if case .token = e { texts.append(vm.state.streamAfter?.text ?? "?") }
        }
        try s.start(runId: "ios-stream")
        XCTAssertEqual(try s.run().status, .completed)
        vm.generationRequested()
        XCTAssertTrue(vm.state.generating)
        XCTAssertFalse(vm.state.canGenerate)
        XCTAssertFalse(vm.state.canStartRun)
        let phase = vm.state.phase, message = vm.state.message
        events.removeAll()
        var direct: [GeneratedToken] = []
        let g = try s.generate(prompt: "The lamp", maxNewTokens: 12, initial: false, onToken: { direct.append($0) })
        XCTAssertEqual(g.ids.count, 12)
        XCTAssertEqual(g.stop, .maxNewTokens)
        XCTAssertEqual(g.adapterStep, 2)
        XCTAssertEqual(events.first, .generationStarted(initial: false, prompt: "The lamp", adapterStep: 2))
        XCTAssertEqual(events.last, .generated(g))
        let tokens = events.compactMap { e -> GeneratedToken? in if case .token(let t) = e { return t } else { return nil } }
        XCTAssertEqual(tokens, direct)
        XCTAssertEqual(events.count, 2 + g.ids.count)
        XCTAssertEqual(tokens.map(\.id), g.ids)
        XCTAssertEqual(tokens.map(\.index), Array(0..<g.ids.count))
        XCTAssertEqual(tokens.map(\.text).joined(), g.text)
        XCTAssertEqual(texts.last, g.text)
        XCTAssertEqual(texts, (1...tokens.count).map { tokens.prefix($0).map(\.text).joined() }, "the text grows token by token")
        XCTAssertEqual(vm.state.generationAfter, g)
        XCTAssertEqual(vm.state.streamAfter, .init(prompt: "The lamp", text: g.text, tokens: 12, stop: .maxNewTokens, adapterStep: 2))
        XCTAssertEqual(vm.state.phase, phase)
        XCTAssertEqual(vm.state.message, message)
        vm.generationFinished("Generated")
        XCTAssertFalse(vm.state.generating)
        XCTAssertTrue(vm.state.canStartRun)
        XCTAssertEqual(vm.state.generationMessage, "Generated")
        // Generate is offered while a run trains (not while its session loads); Train is not while one runs.
        vm.setPhase(.training)
        XCTAssertTrue(vm.state.canGenerate)
        XCTAssertFalse(vm.state.canStartRun)
        vm.setPhase(.loading)
        XCTAssertFalse(vm.state.canGenerate)
        vm.setPhase(phase, message)
        // the same greedy ids as the non-streaming call
        XCTAssertEqual(try s.generate(promptIds: try s.promptIds("The lamp", maxNewTokens: 12).map(Int64.init), maxNewTokens: 12, initial: false).ids, g.ids)

        let calls = rt.calls.count
        events.removeAll()
        let cancel = GenerationCancel()
        cancel.cancel()
        let none = try s.generate(prompt: "The lamp", maxNewTokens: 12, initial: true, cancel: cancel)
        XCTAssertEqual(none.ids, [])
        XCTAssertEqual(none.text, "")
        XCTAssertEqual(none.stop, .cancelled)
        XCTAssertEqual(rt.calls.count, calls, "no method call")
        XCTAssertEqual(events, [.generationStarted(initial: true, prompt: "The lamp", adapterStep: nil), .generated(none)])
    }

    /// A generation beside a training run of the same session, as the app runs them (training on its
    /// queue, generation on another, the events folded on one serial "main" queue): while the
    /// generation is in progress (held at its first token longer than `RuntimeGate.grace`) training steps
    /// keep arriving, once it decodes training waits, the runtime is never called from two threads at
    /// once, the view model's progress moves during the generation and its phase stays `training`;
    /// the generation read the state at a step boundary (a run of that many steps alone generates
    /// the same ids).
    func testGenerationBesideTrainingKeepsProgressComing() throws {
        let (p, m) = try program()
        let inner = HashRuntime(manifest: m)
        let rt = CheckedRuntime(inner)
        let s = try session(p, m, runtime: rt, steps: 100_000)
        let ui = DispatchQueue(label: "test.ui")
        let vm = TrainingViewModel()
        let progress = ProgressLog()
        let seen = Seen()
        s.onEvent = { e in
            if case .step = e { progress.add() }
            ui.async {
                vm.handle(e)
                if case .generationStarted = e { seen.doneAtStart = vm.state.stepsDone }
                if case .generated = e { (seen.doneAtEnd, seen.phaseAtEnd) = (vm.state.stepsDone, vm.state.phase) }
            }
        }
        try s.start(runId: "ios-beside")
        let stopTraining = GenerationCancel()
        let trained = DispatchSemaphore(value: 0)
        DispatchQueue(label: "test.work").async {
            seen.status = try? s.run(interrupt: { stopTraining.isCancelled ? .cancelled : nil }).status
            trained.signal()
        }
        XCTAssertTrue(progress.wait(atLeast: 1, timeout: 60), "training runs")
        var kept = false
        var stepsDuring = 0
        let g = try s.generate(prompt: "The lamp", maxNewTokens: 10, initial: false, onToken: { t in
            if t.index == 0 {
                let n = progress.count
                kept = progress.wait(atLeast: n + 2, timeout: 60)
                stepsDuring = progress.count - n
            }
        })
        stopTraining.cancel()
        XCTAssertEqual(trained.wait(timeout: .now() + 60), .success)
        ui.sync {}
        let (doneAtStart, doneAtEnd, phaseAtEnd, status) = (seen.doneAtStart, seen.doneAtEnd, seen.phaseAtEnd, seen.status)
        XCTAssertTrue(kept, "training steps kept arriving while a generation was in progress")
        XCTAssertGreaterThanOrEqual(stepsDuring, 2)
        XCTAssertEqual(status, .cancelled)
        XCTAssertEqual(g.ids.count, 10)
        XCTAssertEqual(g.stop, .maxNewTokens)
        XCTAssertEqual(rt.maxInFlight, 1, "the runtime is never called from two threads at once")
        let methods = inner.calls.map(\.method)
        let first = try XCTUnwrap(methods.firstIndex(of: "embed_token")), last = try XCTUnwrap(methods.lastIndex(of: "embed_token"))
        // The generation goes first (RuntimeGate): once it decodes, at most the training call in flight runs among its calls.
        XCTAssertLessThanOrEqual(methods[first...last].filter { !Contract.generationRoles.contains($0) }.count, 1, "training waits while the generation decodes")
        XCTAssertGreaterThan(try XCTUnwrap(doneAtEnd), try XCTUnwrap(doneAtStart), "the progress display moved during the generation")
        XCTAssertEqual(phaseAtEnd, .training)
        XCTAssertEqual(vm.state.generationAfter, g)

        // The snapshot is a step boundary: a session that trained exactly that many steps generates the same.
        let at = try XCTUnwrap(g.adapterStep)
        XCTAssertGreaterThanOrEqual(at, 1)
        let ref = try session(p, m, runtime: HashRuntime(manifest: m), steps: at)
        try ref.start(runId: "ios-reference")
        XCTAssertEqual(try ref.run().status, .completed)
        XCTAssertEqual(try ref.generate(prompt: "The lamp", maxNewTokens: 10, initial: false).ids, g.ids)
    }

    /// What the other threads of `testGenerationBesideTrainingKeepsProgressComing` leave for it
    /// (written before the semaphore / `ui.sync` it waits on).
    final class Seen: @unchecked Sendable {
        var doneAtStart: Int?, doneAtEnd: Int?
        var phaseAtEnd: TrainingPhase?
        var status: RunStatus?
    }
}
