package org.onphonellm.trainer.core

/**
 * An LCSB step plan (shared_schemas/step_plan.schema.json): step s backpropagates through
 * phases[schedule[s % len(schedule)]] ([layersAt]), except that a step s < [warmup] (a full-backprop warm-up)
 * backpropagates through every layer (the global step index: the schedule does not restart); the others run forward only (and `block_skip_update`
 * when the optimizer moves unselected layers). Contract v3 chooses the layers at run time: any plan
 * fits any program with as many layers.
 */
data class StepPlan(
    val layers: Int,
    val policy: String,
    val k: Int,
    val seed: Long?,
    val phases: List<List<Int>>,
    val schedule: List<Int>,
    val warmup: Long = 0,
) {
    init {
        if (warmup < 0) throw BadInput("an LCSB warm-up must be >= 0 steps, got $warmup")
    }

    /** Most layers one step backpropagates: every layer with a warm-up, else the largest phase (memory, checkpoints). */
    val maxLayers: Int get() = if (warmup > 0) layers else phases.maxOf { it.size }

    /** The phase index of [step]; null during the warm-up (every layer, no phase: telemetry has no lcsb_phase). */
    fun phaseAt(step: Long): Int? = if (step < warmup) null else schedule[(step % schedule.size).toInt()]

    companion object {
        val POLICIES = setOf("cyclic", "strided", "last", "anchored", "random", "full")
        private val KEYS = setOf("schema_version", "layers", "policy", "k", "seed", "phases", "schedule", "warmup")

        /** Parse and check a plan as its schema does, plus: every layer < layers, every schedule entry names a phase. */
        fun parse(text: String, where: String = "step plan"): StepPlan {
            val f = Fields.of(Json.parse(text), where)
            (f.obj.fields.keys - KEYS).firstOrNull()?.let { throw BadInput("$where: unknown field '$it'") }
            if (f.int("schema_version") != 1) throw BadInput("$where: schema_version must be 1")
            val layers = f.int("layers")
            val policy = f.string("policy")
            if (policy !in POLICIES) throw BadInput("$where: unknown policy '$policy'; one of ${POLICIES.sorted()}")
            val k = f.int("k")
            if (layers < 1 || k < 1) throw BadInput("$where: layers and k must be >= 1")
            val phases = f.arr("phases").mapIndexed { i, p ->
                val items = (p as? Json.Arr)?.items ?: throw BadInput("$where: phases[$i] must be an array")
                items.map { (it as? Json.Num)?.asLongOrNull?.toInt() ?: throw BadInput("$where: phases[$i] must hold integers") }
            }
            if (phases.isEmpty()) throw BadInput("$where: phases is empty")
            phases.forEachIndexed { i, p ->
                if (p.isEmpty()) throw BadInput("$where: phases[$i] is empty")
                if (p.toSet().size != p.size) throw BadInput("$where: phases[$i] repeats a layer")
                p.forEach { if (it !in 0 until layers) throw BadInput("$where: phases[$i] names layer $it of $layers") }
            }
            val schedule = f.ints("schedule")
            if (schedule.isEmpty()) throw BadInput("$where: schedule is empty")
            schedule.forEach { if (it !in phases.indices) throw BadInput("$where: schedule names phase $it of ${phases.size}") }
            val warmup = f.optLong("warmup") ?: 0L
            if (warmup < 0) throw BadInput("$where: warmup must be >= 0, got $warmup")
            return StepPlan(layers, policy, k, f.optLong("seed"), phases, schedule, warmup)
        }
    }
}
