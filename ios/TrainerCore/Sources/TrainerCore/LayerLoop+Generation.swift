import Foundation

/// Generation on the layer loop: chunked prefill and KV-cache decode (`toolchain/runtime/generate.py`).
extension LayerLoop {
    /// Whether generation calls fused methods (the native int4 kernel) on this runtime.
    public var generationIsFused: Bool { generationMethods.values.contains { !($0.kernels ?? []).isEmpty } }

    private func generationMethod(_ role: String) throws -> MethodSpec {
        guard let m = generationMethods[role] else { throw TrainerError.badInput("the program has no \(role) method; re-export it") }
        return m
    }

    /// Load every method generation calls (`generationMethods`: fused or stock), once per loop.
    public func loadGeneration() throws {
        gate.lock()
        defer { gate.unlock() }
        guard !generationLoaded else { return }
        guard manifest.canGenerate else { throw TrainerError.badInput("this program was exported without the generation methods; re-export it") }
        try runtime.load(methods: try Contract.generationRoles.map { try generationMethod($0).name })
        generationLoaded = true
    }

    /// The state entries the generation methods read (every layer's), for `StateBuffer.snapshot`.
    public var generationStateEntries: Set<String> {
        var names: Set<String> = []
        let ph = manifest.weights.layerPlaceholder
        for role in Contract.generationRoles {
            guard let m = generationMethods[role] else { continue }
            let layered = m.role.hasPrefix("block_")
            for io in m.inputs where io.bind == .state {
                for layer in (layered ? (0..<layers).map { Optional($0) } : [nil]) as [Int?] { names.insert(io.ref(layer: layer, placeholder: ph)) }
            }
        }
        return names
    }

    /// A copy of the entries of `state` generation reads (`generationStateEntries`): what a generation
    /// running beside training reads while the training thread keeps updating `state` in place.
    /// The caller takes it at a step boundary (`TrainingSession` does, under its state lock).
    public func generationSnapshot(of state: StateBuffer) throws -> StateBuffer {
        try state.snapshot(entries: generationStateEntries)
    }

    /// The KV cache of one generation: per layer `k_{layer}`, `v_{layer}` zeros of the [Hk, S, D] shape
    /// `block_decode` takes (the manifest's; rows >= pos are never read).
    func newCache() throws -> [String: TensorBuffer] {
        let decode = try generationMethod("block_decode")
        var cache: [String: TensorBuffer] = [:]
        for io in decode.inputs where io.bind == .cache {
            for i in 0..<layers { cache[io.ref(layer: i, placeholder: manifest.weights.layerPlaceholder)] = TensorBuffer(byteCount: io.byteCount) }
        }
        guard !cache.isEmpty else { throw TrainerError.badInput("block_decode binds no KV cache; re-export the program") }
        return cache
    }

    /// Greedy generation (argmax, the first of equal maxima) of up to `maxNewTokens` after `prompt`,
    /// with the KV cache per layer `k_{layer}`, `v_{layer}` [Hk, S, D] owned here; the state is read
    /// only. The generation driver (the manifest's `generate.steps`, `toolchain/runtime/generate.py`):
    /// every method call of a generation is made here.
    ///
    /// Prefill: the prompt of n tokens in chunks of C = `generate.prefill_chunk` (the last padded with
    /// `padTokenId`): per chunk at pos = 0, C, 2C, ...: `embed_prefill`, then per layer `block_prefill`
    /// (x, pos, the layer's cache), whose k_new / v_new [Hk, C, D] go to cache rows pos ..< pos + C (those
    /// < S); then `head_logits` of row (n - 1) mod C of the last chunk's output. Decode: `embed_token`,
    /// per layer `block_decode` (k_new / v_new at row pos), `head_logits`. The methods are
    /// `generationMethods`' (fused where the runtime has the kernel).
    ///
    /// Streams: `onToken` gets each new id as soon as its logits are read, before the next decode
    /// step runs, in the order of the result's `ids`. Stops after a token of `stopIds` (kept in `ids`:
    /// `.eos`), after `maxNewTokens` (`.maxNewTokens`), or when `cancel` is set (`.cancelled`): it is
    /// checked before the prefill, before each prefill chunk and each of its layers, before the
    /// prompt's head_logits and before each decode step, so a cancel made while token k is reported
    /// (in `onToken`) ends with exactly those k tokens and no further method call; a cancel before the
    /// start makes no call and returns no token.
    public func generate(prompt: [Int64], maxNewTokens: Int, state: StateBuffer, padTokenId: Int64 = 0,
                         stopIds: Set<Int64> = [], cancel: GenerationCancel? = nil,
                         onToken: ((Int64) -> Void)? = nil) throws -> GenerationResult {
        let s = manifest.seqLen
        guard !prompt.isEmpty, maxNewTokens >= 1, prompt.count + maxNewTokens <= s else {
            throw TrainerError.badInput("prompt (\(prompt.count) tokens) + \(maxNewTokens) new tokens must fit seq_len \(s)")
        }
        guard let c = manifest.prefillChunk, c >= 1 else {
            throw TrainerError.badInput("this program has no generate.prefill_chunk (exported before chunked prefill); re-export it")
        }
        let vocab = manifest.model.arch.vocab
        if let bad = prompt.first(where: { $0 < 0 || $0 >= Int64(vocab) }) {
            throw TrainerError.badInput("prompt token id \(bad) is outside the vocabulary of \(vocab)")
        }
        var out: [Int64] = []
        func cancelled() -> Bool { cancel?.isCancelled == true }
        if cancelled() { return GenerationResult(ids: out, stop: .cancelled) }
        priority.beginGeneration()
        defer { priority.endGeneration() }
        let (embedPrefill, blockPrefill, embedToken, blockDecode, headLogits) = (
            try generationMethod("embed_prefill"), try generationMethod("block_prefill"), try generationMethod("embed_token"),
            try generationMethod("block_decode"), try generationMethod("head_logits"))
        let cache = try newCache()
        // Prefill, chunk by chunk.
        var x = TensorBuffer.empty
        for start in stride(from: 0, to: prompt.count, by: c) {
            if cancelled() { return GenerationResult(ids: out, stop: .cancelled) }
            let chunk = Array(prompt[start..<min(start + c, prompt.count)])
            let tokens = buffers.take(values: (chunk + Array(repeating: padTokenId, count: c - chunk.count)).map { $0.littleEndian })
            guard let e = try run(embedPrefill, layer: nil, values: ["tokens": tokens], state: state, generation: true)["x"] else {
                throw TrainerError.runtime("\(embedPrefill.name) returned no x")
            }
            x = e
            let p = buffers.take(values: [Int64(start).littleEndian])
            for i in 0..<layers {
                if cancelled() { return GenerationResult(ids: out, stop: .cancelled) }
                guard let next = try run(blockPrefill, layer: i, values: ["x": x, "pos": p], state: state, cache: cache, pos: start, generation: true)["x"] else {
                    throw TrainerError.runtime("\(blockPrefill.name) returned no x")
                }
                x = next
            }
        }
        let rowBytes = x.byteCount / c
        var last = TensorBuffer(copying: x.slice(((prompt.count - 1) % c) * rowBytes, rowBytes))
        x = .empty
        if cancelled() { return GenerationResult(ids: out, stop: .cancelled) }
        guard var logits = try run(headLogits, layer: nil, values: ["x": last], state: state, generation: true)["logits"] else {
            throw TrainerError.runtime("\(headLogits.name) returned no logits")
        }
        var pos = prompt.count
        while true {
            let f = logits.floats
            var best = 0
            for i in 1..<f.count where f[i] > f[best] { best = i }
            let token = Int64(best)
            out.append(token)
            if let onToken { priority.consumer { onToken(token) } }
            if stopIds.contains(token) { return GenerationResult(ids: out, stop: .eos) }
            if out.count == maxNewTokens { return GenerationResult(ids: out, stop: .maxNewTokens) }
            if cancelled() { return GenerationResult(ids: out, stop: .cancelled) }
            // One decode step.
            guard var h = try run(embedToken, layer: nil, values: ["token": buffers.take(values: [token.littleEndian])], state: state, generation: true)["x"] else {
                throw TrainerError.runtime("\(embedToken.name) returned no x")
            }
            let p = buffers.take(values: [Int64(pos).littleEndian])
            for i in 0..<layers {
                guard let next = try run(blockDecode, layer: i, values: ["x": h, "pos": p], state: state, cache: cache, pos: pos, generation: true)["x"] else {
                    throw TrainerError.runtime("\(blockDecode.name) returned no x")
                }
                h = next
            }
            last = h
            guard let l = try run(headLogits, layer: nil, values: ["x": last], state: state, generation: true)["logits"] else {
                throw TrainerError.runtime("\(headLogits.name) returned no logits")
            }
            logits = l
            pos += 1
        }
    }
}
