import Foundation

/// A v3 training run over rows: step s trains row `s % rows.count` (file order, as the host's program
/// trainer without `--shuffle`), backpropagating `plan.selected(forStep: s)` (LCSB at run time) or
/// every layer; the state is checkpointed every `checkpointEvery` steps and at the end (the host's
/// layout: tensor `state`, metadata `meta`), and a new session on the same checkpoint continues
/// where the last one stopped, bit for bit.
public final class LoopSession {
    public let loop: LayerLoop
    public let state: LoopState
    public let rows: [DataRow]
    public let lr: Float
    public let plan: StepPlan?
    public let padTokenId: Int64
    public let checkpoint: CheckpointStore?
    public let programSha256: String?
    public private(set) var step = 0
    public private(set) var losses: [Float?] = []
    public private(set) var runId: String

    /// Resumes from `checkpoint` when it exists (checked against the state size and the export's
    /// sha256), else starts from `initialState`.
    public init(loop: LayerLoop, initialState: LoopState, rows: [DataRow], lr: Float, plan: StepPlan? = nil,
                padTokenId: Int64 = 0, checkpoint: CheckpointStore? = nil, programSha256: String? = nil,
                runId: String = UUID().uuidString) throws {
        guard !rows.isEmpty else { throw TrainerError.badInput("no training rows") }
        if let plan, plan.layers != loop.layers {
            throw TrainerError.badInput("the LCSB plan is for \(plan.layers) layers, the program has \(loop.layers)")
        }
        (self.loop, self.rows, self.lr, self.plan, self.padTokenId) = (loop, rows, lr, plan, padTokenId)
        (self.checkpoint, self.programSha256, self.runId) = (checkpoint, programSha256, runId)
        if let checkpoint, checkpoint.exists {
            let (values, meta) = try checkpoint.load(expectedNumel: loop.manifest.state.numel, programSha256: programSha256)
            state = try LoopState(manifest: loop.manifest, values: values)
            (step, losses, self.runId) = (meta.step, meta.losses, meta.runId)
        } else {
            state = initialState
        }
    }

    /// Run until `totalSteps` steps are done or `shouldStop` says so (checked between steps); returns
    /// the losses of the steps run now.
    @discardableResult
    public func run(totalSteps: Int, checkpointEvery: Int = 10, shouldStop: () -> Bool = { false }) throws -> [Float] {
        var now: [Float] = []
        while step < totalSteps && !shouldStop() {
            let row = rows[step % rows.count]
            let loss = try loop.trainStep(inputIds: row.inputIds, labels: row.labels ?? row.inputIds, lr: lr, state: state,
                                          selected: plan?.selected(forStep: step), padTokenId: padTokenId)
            step += 1
            losses.append(loss.isFinite ? loss : nil)
            now.append(loss)
            if checkpointEvery > 0 && step % checkpointEvery == 0 { try save() }
        }
        try save()
        return now
    }

    public func save() throws {
        try checkpoint?.save(state: state.values, meta: CheckpointMeta(step: step, runId: runId, seq: step, losses: losses,
                                                                      stateNumel: loop.manifest.state.numel, programSha256: programSha256))
    }
}
