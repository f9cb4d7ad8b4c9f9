import Foundation

/// The held-out loss of a session before and after its run (capped, cancellable between rows) and the
/// evaluation gate's decision after the last step.
extension TrainingSession {
    /// The rows a held-out loss reads: the first `Contract.heldOutEvalRows` of the held-out rows.
    public var evalRows: ArraySlice<DataRow> { data.heldOut.prefix(Contract.heldOutEvalRows) }

    /// state_init.bin's adapter (what the program starts from), loaded once.
    public func initialAdapterState() throws -> StateBuffer {
        initialLock.lock()
        defer { initialLock.unlock() }
        if let initialState { return initialState }
        let s = try StateBuffer.initial(manifest: manifest, programDirectory: programDirectory)
        initialState = s
        return s
    }

    /// Held-out loss with the initial adapter (`initial`, telemetry step 0) or the live one (step =
    /// steps done); nil without held-out rows. Emits an `eval` event.
    ///
    /// Reads the first `Contract.heldOutEvalRows` held-out rows (`evalRows`); `cancelled` is asked before
    /// each row (true: `EvalCancelled` is thrown, no event), `.evalRow` reports "row i of N".
    @discardableResult
    public func evaluate(initial: Bool, cancelled: () -> Bool = { false }) throws -> EvalResult? {
        guard !data.heldOut.isEmpty else { return nil }
        if let m = try weightsCheck() { throw RuntimeFailure(message: m, code: "weights_changed") }
        let s = initial ? try initialAdapterState() : try liveState()
        let t0 = monotonic()
        let rows = evalRows.map { (inputIds: $0.inputIds, labels: $0.labels ?? $0.inputIds) }
        let (loss, tokens) = try loop.evaluate(rows: rows, state: s, padTokenId: padTokenId, cancelled: cancelled,
                                               onRow: { [onEvent] i, n in onEvent?(.evalRow(initial: initial, row: i, rows: n)) })
        guard tokens > 0 else { return nil }
        let r = EvalResult(initial: initial, step: initial ? 0 : step, loss: loss, rows: rows.count, tokens: tokens,
                           seconds: max(0, monotonic() - t0))
        try emit("eval", ["step": .int(Int64(r.step)), "loss": .number(loss), "rows": .int(Int64(r.rows)),
                          "tokens": .int(Int64(tokens)), "eval_time_s": .double(r.seconds)])
        onEvent?(.eval(r))
        // The gate: the start's loss is the initial adapter's before the first step; after the last step it decides.
        if initial, step == 0 { gateRecord.started(loss: loss) }
        if !initial, step >= config.steps { try decideGate(endLoss: loss) }
        return r
    }

}
