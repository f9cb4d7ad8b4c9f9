package org.onphonellm.trainer.core

import java.io.File

/**
 * The evaluation gate (docs/training.md "The evaluation gate", the host's toolchain/training/gate.py): the held-out
 * loss of the starting adapter, of the live state at the run's evaluations and after the last step; at the end the
 * last adapter is kept only when its loss is finite and below the start's and no earlier evaluation was lower
 * (`kept`), else the lowest finite one below the start's (`kept_best`), else the starting adapter is restored
 * (`rolled_back`). "Below" is strictly lower; a non-finite start loss counts as +inf.
 */
data class GateDecision(
    val decision: String,
    val startLoss: Double,
    val endLoss: Double,
    /** Lowest finite loss after the start (null: none finite). */
    val bestLoss: Double?,
    val bestStep: Long?,
    /** Steps in the adapter that is kept: the last step, [bestStep], or the start's. */
    val keptStep: Long,
    /** One line for people: "rolled back: held-out 2.3100 -> 2.4000". */
    val reason: String,
) {
    /** The `gate` telemetry event's fields (non-finite losses as null; the apps ship no forgetting probe yet). */
    fun eventFields(): Map<String, Any?> = linkedMapOf(
        "decision" to decision, "start_loss" to finite(startLoss), "end_loss" to finite(endLoss), "best_loss" to (bestLoss ?: Json.Null),
        "best_step" to (bestStep ?: Json.Null), "kept_step" to keptStep, "reason" to reason, "probe" to "no_probe",
    )

    fun toJson(): Json = Json.of(eventFields())

    companion object {
        const val KEPT = "kept"
        const val KEPT_BEST = "kept_best"
        const val ROLLED_BACK = "rolled_back"

        private fun finite(x: Double): Any = if (x.isFinite()) x else Json.Null

        /** As Python formats it: 4 decimals, or nan / inf / -inf. */
        fun fmt(x: Double): String = when {
            x.isNaN() -> "nan"
            x == Double.POSITIVE_INFINITY -> "inf"
            x == Double.NEGATIVE_INFINITY -> "-inf"
            else -> String.format(java.util.Locale.ROOT, "%.4f", x)
        }

        /**
         * The decision from the start's held-out loss and the later evaluations (step, loss), the last of them after
         * the last step (a pure function, gate.py's `decide`; ties go to the later step).
         */
        fun decide(startStep: Long, startLoss: Double, later: List<Pair<Long, Double>>): GateDecision {
            require(later.isNotEmpty()) { "the gate needs the evaluation after the last step" }
            val (endStep, endLoss) = later.last()
            val best = later.filter { it.second.isFinite() }.minWithOrNull(compareBy<Pair<Long, Double>> { it.second }.thenByDescending { it.first })
            val start = if (startLoss.isFinite()) startLoss else Double.POSITIVE_INFINITY
            if (endLoss.isFinite() && endLoss < start && endLoss <= best!!.second)
                return GateDecision(KEPT, startLoss, endLoss, best.second, best.first, endStep, "kept: held-out ${fmt(startLoss)} -> ${fmt(endLoss)}")
            if (best != null && best.second < start)
                return GateDecision(KEPT_BEST, startLoss, endLoss, best.second, best.first, best.first,
                    "kept best: held-out ${fmt(startLoss)} -> ${fmt(best.second)} at step ${best.first} (last ${fmt(endLoss)})")
            return GateDecision(ROLLED_BACK, startLoss, endLoss, best?.second, best?.first, startStep,
                "rolled back: held-out ${fmt(startLoss)} -> ${fmt(endLoss)}")
        }

        fun parse(doc: Json, where: String): GateDecision {
            val f = Fields.of(doc, where)
            return GateDecision(f.string("decision"), f.optDouble("start_loss") ?: Double.NaN, f.optDouble("end_loss") ?: Double.NaN,
                f.optDouble("best_loss"), f.optLong("best_step"), f.long("kept_step"), f.string("reason"))
        }
    }
}

/**
 * One run's gate as trainer-core keeps it across sessions (a phone run is paused and resumed often: charging
 * windows, the background): `gate.json` in the run directory holds the evaluations after the start, and
 * `gate_best.safetensors` the state of the lowest finite one so far (on disk, not in memory: the state with its
 * optimizer moments is tens of MB at 0.5B). The start is the run's: the held-out loss of state_init.bin at step 0
 * (results.json `eval_before`), the starting adapter state_init.bin itself (a phone run always starts from it), so a
 * run resumed in a charging window is gated against where it began (the host gates a resumed run against where it
 * resumed). [evalEvery]: the steps between evaluations (the run's `checkpoint_every`: the regular checkpoints, not the
 * per-step ones of a background window).
 */
class GateRecord(private val dir: File, val evalEvery: Long) {
    private val file = File(dir, "gate.json")
    val bestStore = CheckpointStore(File(dir, "gate_best.safetensors"))
    /** (steps done, held-out loss) of each evaluation after the start, in order. */
    val points: MutableList<Pair<Long, Double>> = ArrayList()
    var decision: GateDecision? = null
        private set

    init {
        if (file.isFile) {
            val f = Fields.of(Json.parse(file.readText()), file.path)
            f.arr("points").forEach { p ->
                val a = (p as Json.Arr).items
                points.add(Pair((a[0] as Json.Num).asLongOrNull!!, (a[1] as? Json.Num)?.asDouble ?: Double.NaN))
            }
            if (f.has("decision")) decision = GateDecision.parse(f.raw("decision"), "${file.path} decision")
        }
    }

    /** Lowest finite loss so far (+inf: none). */
    val bestLoss: Double get() = points.map { it.second }.filter { it.isFinite() }.minOrNull() ?: Double.POSITIVE_INFINITY

    /** An evaluation is due after [done] steps of [steps] (the last one always). */
    fun due(done: Long, steps: Long): Boolean = done == steps || (evalEvery > 0 && done % evalEvery == 0L)

    /** Record the evaluation after [done] steps; true when it is the best so far (finite, <= every earlier one: save its state). */
    fun add(done: Long, loss: Double): Boolean {
        val best = loss.isFinite() && loss <= bestLoss
        points.removeAll { it.first == done }  // an evaluation repeated after a resume replaces the earlier one
        points.add(Pair(done, loss))
        save()
        return best
    }

    /** A new gate (training continues after a decision, e.g. a failed run resumed): the points and the decision cleared. */
    fun reset() {
        points.clear()
        decision = null
        file.delete()
        bestStore.file.delete()
    }

    fun decided(d: GateDecision) {
        decision = d
        save()
        bestStore.file.delete()  // the kept state is in the checkpoint and the adapter now
    }

    private fun save() = AtomicFiles.writeText(file, JsonWriter.write(Json.of(linkedMapOf(
        "points" to points.map { listOf(it.first, if (it.second.isFinite()) it.second else null) },
        "decision" to decision?.toJson(),
    ))) + "\n")
}
