import Foundation
import XCTest
@testable import TrainerCore

/// A counting fake runtime that writes into the loop's memory (`execute(method:layer:inputs:into:)`,
/// as `ExecuTorchRuntime` does): the outputs are `HashRuntime`'s, each written once into the
/// destination the loop gave (`LoopOutput.write(from:)`); every call's destinations are recorded
/// (address of the first byte written, bind, bytes stored), and each KV-cache output's runs are checked
/// against the call's own cache input of the same ref: head h's rows must land at rows pos ..< pos + kept
/// of head h of that cache, and nowhere else.
final class CountingRuntime: ProgramRuntime {
    struct Destination: Hashable { let method: String; let output: String; let bind: String; let address: Int; let bytes: Int }
    let backendName = "executorch"
    let inner: HashRuntime
    var destinations: [[Destination]] = []
    /// Bytes this runtime wrote (its one copy per output).
    var bytesWritten = 0
    var writes = 0
    var dataPathCalls = 0
    /// KV-cache outputs written, the bytes of their rows, and the runs that were not where the rows belong.
    var cacheWrites = 0
    var cacheBytes = 0
    var misplacedCacheRuns: [String] = []

    init(manifest: Manifest) { inner = HashRuntime(manifest: manifest) }

    func load(methods: [String]) throws { try inner.load(methods: methods) }

    func execute(method: String, layer: Int?, inputs: [LoopInput]) throws -> [Data] {
        dataPathCalls += 1
        return try inner.execute(method: method, layer: layer, inputs: inputs)
    }

    func execute(method: String, layer: Int?, inputs: [LoopInput], into outputs: [LoopOutput]) throws {
        let data = try inner.execute(method: method, layer: layer, inputs: inputs)      // computed first (outputs may alias inputs)
        destinations.append(outputs.map { o in
            var first = 0
            o.forEachSegment { _, run in if first == 0 { first = Int(bitPattern: run.baseAddress) } }
            return Destination(method: method, output: o.name, bind: o.bind.rawValue, address: first, bytes: o.storedBytes)
        })
        for o in outputs where o.bind == .cache {
            guard let rows = o.cacheRows, let cache = inputs.first(where: { $0.bind == .cache && $0.ref == o.ref }),
                  let pos = inputs.first(where: { $0.name == "pos" })?.bytes.load(as: Int64.self) else {
                misplacedCacheRuns.append("\(method) \(o.name): no cache rows, cache input or pos"); continue
            }
            XCTAssertEqual(rows.pos, Int(pos), "\(method) \(o.name): the row the program was told")
            var h = 0
            o.forEachSegment { offset, run in
                let want = Int(bitPattern: cache.bytes.baseAddress) + (h * rows.cacheRows + rows.pos) * rows.rowBytes
                if Int(bitPattern: run.baseAddress) != want || run.count != rows.kept * rows.rowBytes || offset != h * rows.rows * rows.rowBytes {
                    misplacedCacheRuns.append("\(method) \(o.name) head \(h)")
                }
                h += 1
            }
            if h != rows.heads { misplacedCacheRuns.append("\(method) \(o.name): \(h) runs for \(rows.heads) heads") }
            cacheWrites += 1
            cacheBytes += o.storedBytes
        }
        try LoopOutput.copy(data, into: outputs, method: method)
        writes += outputs.count
        bytesWritten += outputs.reduce(0) { $0 + $1.storedBytes }
    }
}

final class BufferReuseTests: XCTestCase {
    var dir: URL!
    override func setUpWithError() throws { dir = try tempDir("buffer-reuse") }
    override func tearDownWithError() throws { try? FileManager.default.removeItem(at: dir) }

    func loop(_ m: Manifest, _ rt: ProgramRuntime) throws -> (LayerLoop, StateBuffer) {
        let url = dir.appendingPathComponent("weights-\(UUID().uuidString.prefix(6)).safetensors")
        try SyntheticWeights.write(for: m, to: url)
        let loop = try LayerLoop(manifest: m, weights: try MappedWeights(url: url), runtime: rt)
        try loop.loadTraining()
        return (loop, try StateBuffer(manifest: m, values: (0..<m.state.numel).map { Float($0 % 13) / 100 }))
    }

    /// Output buffers are allocated in the first step and reused: steps 2.. allocate no TensorBuffer
    /// (outputs, padded ids / labels, lr), every activation output goes to one of the first step's
    /// buffers, every state output is written by the runtime straight into its slice of the state
    /// array (the one copy: nothing is copied again by the loop), each output written once; the
    /// losses and the state equal the Data path's (HashRuntime through the default copy).
    func testStepsReuseTheirBuffersAndWriteStateInPlace() throws {
        let m = try Manifest.decode(try Repo.data(Repo.manifest("manifest_tiny.json")), source: "manifest_tiny.json")
        let ids = (0..<m.seqLen - 5).map { Int64(($0 * 7) % m.model.arch.vocab) }
        let labels = ids.enumerated().map { $0.offset < 3 ? Int64(-100) : $0.element }
        let rt = CountingRuntime(manifest: m)
        let (loopA, stateA) = try loop(m, rt)
        let reference = HashRuntime(manifest: m)
        let (loopB, stateB) = try loop(m, reference)
        let selections: [Set<Int>?] = [nil, [0, 1], [2, 3, 4], nil, [5, 6, 7]]
        var stepDestinations: [Set<CountingRuntime.Destination>] = []
        var allocationsAfterFirst = 0
        for (i, sel) in selections.enumerated() {
            let before = rt.destinations.count
            let allocations = TensorMemory.allocations
            let a = try loopA.trainStep(inputIds: ids, labels: labels, lr: 0.01, state: stateA, selected: sel, layersPerCheckpoint: i % 2 + 1)
            let b = try loopB.trainStep(inputIds: ids, labels: labels, lr: 0.01, state: stateB, selected: sel, layersPerCheckpoint: i % 2 + 1)
            XCTAssertEqual(a, b, "step \(i): the loss of the Data path")
            XCTAssertEqual(stateA.sha256, stateB.sha256, "step \(i): the state of the Data path")
            if i > 0 { allocationsAfterFirst += TensorMemory.allocations - allocations }
            stepDestinations.append(Set(rt.destinations[before...].flatMap { $0 }))
        }
        XCTAssertEqual(rt.dataPathCalls, 0, "the loop asks for the outputs in its buffers")
        XCTAssertEqual(allocationsAfterFirst, 0, "steps after the first allocate nothing")
        XCTAssertEqual(loopA.buffers.inUseBytes, 0)
        // activations: the first step's buffers, nothing new (a selection of fewer layers uses a subset)
        let firstActivations = Set(stepDestinations[0].filter { $0.bind != "state" }.map(\.address))
        for (i, d) in stepDestinations.enumerated().dropFirst() {
            XCTAssertTrue(Set(d.filter { $0.bind != "state" }.map(\.address)).isSubset(of: firstActivations), "step \(i)")
        }
        // state outputs: the address of their slice of the state array, always
        let ph = m.weights.layerPlaceholder
        for call in rt.destinations {
            for d in call where d.bind == "state" {
                let method = try XCTUnwrap(m.method(named: d.method))
                let io = try XCTUnwrap(method.outputs.first { $0.name == d.output })
                let inState = (0..<m.loop.layers).contains { layer in
                    (try? stateA.view(io.ref(layer: layer, placeholder: ph)).baseAddress.map { Int(bitPattern: $0) }) == d.address
                } || (try? stateA.view(io.ref).baseAddress.map { Int(bitPattern: $0) }) == d.address
                XCTAssertTrue(inState, "\(d.method) \(d.output) is not written into the state")
            }
        }
        // one write per output of every call, and no more
        XCTAssertEqual(rt.writes, rt.destinations.reduce(0) { $0 + $1.count })
        XCTAssertEqual(rt.bytesWritten, rt.destinations.joined().reduce(0) { $0 + $1.bytes })
    }

    /// What the reuse is, call by call (CountingRuntime: every input read before any output is written,
    /// as the app's runtimes do): in a train step the destination of head_loss's d is its input x's
    /// buffer and that of each block_backward's d the incoming d's; a block_forward writes over its x
    /// where x is not kept (the forward's layers that are no group's first, the groups' rerun through
    /// layers outside the group, every layer of the held-out loss); no other activation destination is
    /// one of its call's inputs (a kept x, a checkpoint, the held-out head_loss's x). The losses and
    /// state equal the Data path's, whose default copy writes after the run too.
    func testTrainStepWritesDIntoItsInputsBuffer() throws {
        let m = try Manifest.decode(try Repo.data(Repo.manifest("manifest_tiny.json")), source: "manifest_tiny.json")
        let L = m.loop.layers
        let ids = (0..<m.seqLen - 5).map { Int64(($0 * 7) % m.model.arch.vocab) }
        let labels = ids.enumerated().map { $0.offset < 3 ? Int64(-100) : $0.element }
        let rt = CountingRuntime(manifest: m)
        let (loopA, stateA) = try loop(m, rt)
        let (loopB, stateB) = try loop(m, HashRuntime(manifest: m))
        for (sel, s) in [(nil, 1), (Set([1, 4, 6]), 2)] as [(Set<Int>?, Int)] {
            let a = try loopA.trainStep(inputIds: ids, labels: labels, lr: 0.01, state: stateA, selected: sel, layersPerCheckpoint: s)
            let b = try loopB.trainStep(inputIds: ids, labels: labels, lr: 0.01, state: stateB, selected: sel, layersPerCheckpoint: s)
            XCTAssertEqual(a, b)
            XCTAssertEqual(stateA.sha256, stateB.sha256)
        }
        _ = try loopA.evaluate(rows: [(ids, labels)], state: stateA)
        XCTAssertEqual(rt.inner.calls.count, rt.destinations.count)
        var shared: [String] = []
        for (call, dests) in zip(rt.inner.calls, rt.destinations) {
            for d in dests where d.bind != "state" && d.bind != "cache" {
                for i in call.inputs where i.address.map({ Int(bitPattern: $0) }) == d.address { shared.append("\(call.method) \(i.name) -> \(d.output)") }
            }
        }
        XCTAssertEqual(L, 8, "the layers the expected calls below are written for")
        let bf = "block_forward x -> x_out", bb = "block_backward dout -> dx", head = "head_loss x -> dx"
        let full = [head] + Array(repeating: bb, count: L)              // every input a checkpoint
        // layers {1, 4, 6} in groups [1, 4], [6]: kept 1 and 6; the forward writes over 0, 2, 3, 4, 5, 7; at
        // layer 4 the rerun from 1 writes over 2 and 3 (layer 1's output is 2's input: its own buffer)
        let lcsb = Array(repeating: bf, count: 6) + [head, bb, bf, bf, bb, bb]
        let eval = Array(repeating: bf, count: L)                      // nothing kept
        XCTAssertEqual(shared, full + lcsb + eval)
    }

    /// Generation: the buffers of a decode step are reused by the next: a generation of 8 new tokens
    /// allocates as many TensorBuffers as one of 3 (the KV cache and the prompt's last row: per
    /// generation, not per call), and the ids equal the Data path's.
    func testDecodeStepsAllocateNothing() throws {
        let (p, m) = try syntheticProgram(in: dir)
        let prompt = (0..<20).map { Int64(($0 * 11 + 5) % m.model.arch.vocab) }
        let rt = CountingRuntime(manifest: m)
        let loop = try LayerLoop(programDirectory: p, runtime: rt)
        try loop.loadGeneration()
        let state = try StateBuffer.initial(manifest: m, programDirectory: p)
        _ = try loop.generate(prompt: prompt, maxNewTokens: 4, state: state, padTokenId: 258)      // the pool fills (>= 2 decode steps)
        var counts: [Int] = []
        var results: [GenerationResult] = []
        for n in [3, 8] {
            let before = TensorMemory.allocations
            results.append(try loop.generate(prompt: prompt, maxNewTokens: n, state: state, padTokenId: 258))
            counts.append(TensorMemory.allocations - before)
        }
        XCTAssertEqual(counts[0], counts[1], "allocations per generation, not per decode step")
        XCTAssertEqual(counts[1], 2 * m.loop.layers + 1, "the KV cache (k, v per layer) and the last prompt row")
        let reference = try LayerLoop(programDirectory: p, runtime: HashRuntime(manifest: m))
        try reference.loadGeneration()
        XCTAssertEqual(results[1], try reference.generate(prompt: prompt, maxNewTokens: 8, state: state, padTokenId: 258))
        XCTAssertEqual(rt.dataPathCalls, 0)
    }

    /// The KV cache is written once: every k_new / v_new of block_prefill and block_decode goes from the
    /// runtime straight into the layer's cache rows (no scratch buffer, no second copy by the loop): each
    /// head's run at exactly rows pos ..< pos + C of that head of the cache the call was given; per
    /// generation the runtime stores exactly the prompt's chunks and the decoded rows, once; the ids and
    /// the cache bytes equal the Data path's (HashRuntime through `LoopOutput.copy`).
    func testKVCacheRowsAreWrittenOnceIntoTheCache() throws {
        let (p, m) = try syntheticProgram(in: dir)
        let prompt = (0..<20).map { Int64(($0 * 11 + 5) % m.model.arch.vocab) }
        let rt = CountingRuntime(manifest: m)
        let loop = try LayerLoop(programDirectory: p, runtime: rt)
        try loop.loadGeneration()
        let state = try StateBuffer.initial(manifest: m, programDirectory: p)
        let newTokens = 5
        let ids = try loop.generate(prompt: prompt, maxNewTokens: newTokens, state: state, padTokenId: 258)
        XCTAssertEqual(rt.misplacedCacheRuns, [])
        XCTAssertEqual(rt.dataPathCalls, 0)
        // what each call's k_new / v_new hold, per layer: 2 chunks of C = 16 rows (the 20-token prompt), then
        // one row per decode step (the last token is not decoded again)
        let decode = try XCTUnwrap(m.method(named: "block_decode"))
        let kv = try XCTUnwrap(decode.inputs.first { $0.bind == .cache })
        let (hk, dim) = (kv.shape[0], kv.shape[2])
        let chunk = try XCTUnwrap(m.prefillChunk)
        let chunks = (prompt.count + chunk - 1) / chunk
        let decodeSteps = rt.destinations.filter { $0.first?.method == "block_decode" }.count / m.loop.layers
        XCTAssertGreaterThan(decodeSteps, 0)
        XCTAssertEqual(rt.cacheWrites, 2 * m.loop.layers * (chunks + decodeSteps))
        XCTAssertEqual(rt.cacheBytes, 2 * m.loop.layers * (chunks * chunk + decodeSteps) * hk * dim * 4, "each row stored once")
        // no cache output went through a pooled buffer
        for call in rt.destinations { for d in call where d.bind == "cache" { XCTAssertFalse(loop.buffers.owns(address: d.address), "\(d.method) \(d.output)") } }
        let reference = try LayerLoop(programDirectory: p, runtime: HashRuntime(manifest: m))
        try reference.loadGeneration()
        XCTAssertEqual(ids, try reference.generate(prompt: prompt, maxNewTokens: newTokens, state: state, padTokenId: 258))
    }

    /// A cache output's rows past the end of the cache are dropped (a last prefill chunk reaching S), the
    /// rows before pos and the other heads' rows untouched; a size or row out of range is refused before
    /// anything is written.
    func testCacheRowsPastTheEndAreDroppedAndBadRowsRefused() throws {
        let (hk, s, n, d) = (2, 8, 4, 3)
        let cache = TensorBuffer(byteCount: 4 * hk * s * d)
        let out = (0..<(hk * n * d)).map { Float($0 + 1) }
        let o = try LoopOutput(name: "k_new", bind: .cache, ref: "k_0", dtype: "float32", shape: [hk, n, d], byteCount: 4 * out.count,
                               cache: cache.raw, pos: 6, what: "block_prefill k_new")
        XCTAssertEqual(o.cacheRows?.kept, 2)
        XCTAssertNil(o.bytes)
        XCTAssertEqual(o.storedBytes, 4 * hk * 2 * d)
        try out.withUnsafeBytes { try o.write(from: $0) }
        let c = Array(cache.floats)
        for h in 0..<hk {
            for r in 0..<s {
                for j in 0..<d {
                    let want: Float = r >= 6 ? out[(h * n + (r - 6)) * d + j] : 0
                    XCTAssertEqual(c[(h * s + r) * d + j], want, "head \(h) row \(r) col \(j)")
                }
            }
        }
        XCTAssertThrowsError(try out.dropLast().withUnsafeBytes { try o.write(from: $0) })
        XCTAssertThrowsError(try LoopOutput(name: "k_new", bind: .cache, ref: "k_0", dtype: "float32", shape: [hk, n, d], byteCount: 4 * out.count,
                                            cache: cache.raw, pos: s, what: "x"))
        XCTAssertThrowsError(try LoopOutput(name: "k_new", bind: .cache, ref: "k_0", dtype: "float32", shape: [hk, n, d + 1], byteCount: 4 * hk * n * (d + 1),
                                            cache: cache.raw, cacheRows: s, pos: 0, what: "x"), "rows of another width than the cache's")
        XCTAssertThrowsError(try LoopOutput(name: "k_new", bind: .cache, ref: "k_0", dtype: "float32", shape: [hk, n, d], byteCount: 4 * hk * n * d + 4,
                                            cache: cache.raw, cacheRows: s, pos: 0, what: "x"), "a byte count that is not the shape's")
        XCTAssertNoThrow(try LoopOutput(name: "k_new", bind: .cache, ref: "k_0", dtype: "float32", shape: [hk, n, d], byteCount: 4 * hk * n * d,
                                        cache: cache.raw, cacheRows: s, pos: s - 1, what: "x"))
    }
}
