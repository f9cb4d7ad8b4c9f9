import Foundation

/// Greedy, streaming, cancellable generation with a session's initial or live adapter, also beside its running step loop.
extension TrainingSession {
    /// The state a generation reads: state_init.bin's (never written), or a copy of the live state's
    /// generation entries taken between two steps (`LayerLoop.generationSnapshot`), with the steps it holds.
    private func generationState(initial: Bool) throws -> (StateBuffer, Int?) {
        if initial { return (try initialAdapterState(), nil) }
        return try stateLock.withLock {
            guard let live = liveStateStorage else { throw TrainerError.badInput("call start() first") }
            return (try loop.generationSnapshot(of: live), stepsInState)
        }
    }

    /// The ids that end a generation: EOS and `<|im_end|>` (none without a tokenizer).
    public var stopIds: Set<Int64> {
        guard let t = tokenizer else { return [] }
        var stop: Set<Int64> = [Int64(t.eosId)]
        if let e = t.base.tokenId(Contract.imEnd) { stop.insert(Int64(e)) }
        return stop
    }

    /// Greedy generation of up to `maxNewTokens` ids after `promptIds` with the initial or the live
    /// adapter; stops at EOS (and `<|im_end|>`), or when `cancel` is set (checked before each decode
    /// step); `onToken` gets each id as it is decoded. Loads the generation methods the first time.
    ///
    /// May run on its own thread while another thread trains this session (`run`/`trainStep`): it
    /// reads state_init.bin's state or a snapshot of the live one taken at a step boundary (the
    /// entries the generation methods bind), and its method calls interleave with the step's one by
    /// one (the loop serializes every runtime call, FIFO), so neither waits for the other to finish.
    public func generate(promptIds: [Int64], maxNewTokens: Int, initial: Bool, cancel: GenerationCancel? = nil,
                         onToken: ((Int64) -> Void)? = nil) throws -> GenerationResult {
        try runGeneration(promptIds: promptIds, maxNewTokens: maxNewTokens, initial: initial, cancel: cancel, onToken: onToken).result
    }

    private func runGeneration(promptIds: [Int64], maxNewTokens: Int, initial: Bool, cancel: GenerationCancel?,
                          onToken: ((Int64) -> Void)?, started: ((Int?) -> Void)? = nil) throws -> (result: GenerationResult, adapterStep: Int?) {
        guard manifest.canGenerate else { throw TrainerError.badInput("this program was exported without the generation methods; re-export it") }
        if cancel?.isCancelled == true {
            started?(nil)
            return (GenerationResult(ids: [], stop: .cancelled), nil)
        }
        // The weights file checked as at a step boundary: now if no step is in progress (idle, or between two
        // steps); else the training thread checks it after its step, and every program call after a change refuses.
        if stateLock.tryLock() {
            defer { stateLock.unlock() }
            if let m = try weightsCheck() { throw RuntimeFailure(message: m, code: "weights_changed") }
        } else if let why = loop.weights.stale {
            throw RuntimeFailure(message: "\(why) while it was memory-mapped: \(MappedWeights.changedAdvice)", code: "weights_changed")
        }
        try loop.loadGeneration()
        let (s, adapterStep) = try generationState(initial: initial)
        started?(adapterStep)
        let r = try loop.generate(prompt: promptIds, maxNewTokens: maxNewTokens, state: s, padTokenId: padTokenId, stopIds: stopIds,
                                  cancel: cancel, onToken: onToken)
        return (r, adapterStep)
    }

    /// The prompt as the program's tokenizer encodes it (BOS first for the byte tokenizer; `chat`: as
    /// a user turn of Qwen's ChatML followed by the assistant header), cut from the front so that
    /// `maxNewTokens` fit in seq_len; generated and decoded with the initial or the live adapter.
    ///
    /// Streams: `.generationStarted`, then per token `.token` (the id and the text it completed, decoded
    /// incrementally: never a broken UTF-8 character) to `onEvent` and `onToken`, then `.generated`
    /// with the whole text and how it stopped (`cancel`: `.cancelled` with the tokens so far). Safe
    /// beside a training run of this session on another thread (see `generate(promptIds:...)`).
    public func generate(prompt: String, maxNewTokens: Int = 32, initial: Bool, chat: Bool = false,
                         cancel: GenerationCancel? = nil, onToken: ((GeneratedToken) -> Void)? = nil) throws -> Generation {
        guard let t = tokenizer else { throw TrainerError.badInput("this program was exported without a tokenizer; re-export it with one") }
        let ids = try promptIds(prompt, maxNewTokens: maxNewTokens, chat: chat)
        let n = newTokens(maxNewTokens)
        let stop = stopIds
        let decoder = IncrementalTextDecoder(tokenizer: t.base, hidden: Set(stop.map { Int($0) }))
        var index = 0
        let (r, adapterStep) = try runGeneration(
            promptIds: ids.map(Int64.init), maxNewTokens: n, initial: initial, cancel: cancel,
            onToken: { [onEvent] id in
                let piece = GeneratedToken(initial: initial, index: index, id: id, text: (try? decoder.append(Int(id))) ?? "")
                index += 1
                onToken?(piece)
                onEvent?(.token(piece))
            },
            started: { [onEvent] step in onEvent?(.generationStarted(initial: initial, prompt: prompt, adapterStep: step)) })
        let visible = r.ids.map(Int.init).filter { !stop.contains(Int64($0)) }
        let g = Generation(initial: initial, prompt: prompt, ids: r.ids, text: (try? t.decode(visible)) ?? "", stop: r.stop,
                           adapterStep: adapterStep)
        onEvent?(.generated(g))
        return g
    }

    private func newTokens(_ maxNewTokens: Int) -> Int {
        let cap = manifest.generate?.maxTokens ?? manifest.seqLen
        return max(1, min(maxNewTokens, cap, manifest.seqLen - 1))
    }

    /// The prompt's ids (see `generate(prompt:...)`), cut from the front to leave room for the new tokens.
    public func promptIds(_ prompt: String, maxNewTokens: Int, chat: Bool = false) throws -> [Int] {
        guard let t = tokenizer else { throw TrainerError.badInput("this program was exported without a tokenizer; re-export it with one") }
        var ids: [Int] = t.bosId.map { [$0] } ?? []
        if chat, let start = t.base.tokenId(Contract.imStart), let end = t.base.tokenId(Contract.imEnd) {
            let nl: [Int] = t.encode("\n")
            ids.append(start)
            ids += t.encode("user\n")
            ids += t.encode(prompt)
            ids.append(end)
            ids += nl
            ids.append(start)
            ids += t.encode("assistant\n")
        } else {
            ids += t.encode(prompt)
        }
        let n = newTokens(maxNewTokens)
        if ids.count + n > manifest.seqLen { ids = Array(ids.suffix(manifest.seqLen - n)) }
        guard !ids.isEmpty else { throw TrainerError.badInput("the prompt is empty") }
        return ids
    }
}
