package org.onphonellm.trainer.core

interface SessionListener {
    fun onStep(step: Long, steps: Long, loss: Double, anonBytes: Long?, budgetBytes: Long) {}
    /** [which]: "before" (initial adapter) or "after" (trained state). */
    fun onEval(which: String, result: LayerLoop.EvalResult) {}
    /** Before held-out row [row] (0-based) of [rows] of the [which] pass: "row i of N" progress. */
    fun onEvalRow(which: String, row: Int, rows: Int) {}
    fun onStatus(message: String) {}
    /** The evaluation gate decided after the last step ([GateDecision.reason]: the result screen's line). */
    fun onGate(decision: GateDecision) {}
    /** The working set was lowered under memory pressure (a `memory_adapted` event). */
    fun onMemoryAdapted(notch: Notch, trigger: String) {}
}
