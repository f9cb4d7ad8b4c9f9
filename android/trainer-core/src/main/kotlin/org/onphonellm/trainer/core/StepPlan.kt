package org.onphonellm.trainer.core

/**
 * An LCSB step plan (shared_schemas/step_plan.schema.json): step s backpropagates through
 * phases[schedule[s % len(schedule)]] ([layersAt]), except that a step s < [warmup] (a full-backprop warm-up)
 * backpropagates through every layer (the global step index: the schedule does not restart); the others run forward only (and `block_skip_update`
 * when the optimizer moves unselected layers). The app chooses the layers at run time: any plan
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

/**
 * The layers a step backpropagates under a plan (toolchain StepPlan.layers_at): every layer while step < warmup,
 * else phases[schedule[step % len]].
 */
fun StepPlan.layersAt(step: Long): Set<Int> =
    if (step < warmup) (0 until layers).toSet() else phases[schedule[(step % schedule.size).toInt()]].toSet()

/**
 * StepPlan of a policy, as toolchain/lcsb/plan.py `make_plan` builds it: cyclic, strided, last, anchored (the last k - 1
 * layers plus one of 0..L-k, ascending), full, and random
 * (step t < [period] selects the first k of `permutation(layers, seed + t)`, sorted; equal draws share one phase;
 * [seed] default 0, [period] default 4 * ceil(layers / k); the seed sum wraps modulo 2^64 as SplitMix64 takes it).
 * [warmup]: full-backprop steps before the plan (steps < warmup use every layer); default 0.
 */
fun StepPlan.Companion.make(layers: Int, k: Int?, policy: String, seed: Long? = null, period: Int? = null, warmup: Long = 0): StepPlan {
    if (warmup < 0) throw BadInput("an LCSB warm-up must be >= 0 steps, got $warmup")
    if (policy !in POLICIES) throw BadInput("unknown LCSB policy '$policy'; choose ${POLICIES.joinToString()}")
    if (layers < 1) throw BadInput("layers must be >= 1, got $layers")
    val kk = if (policy == "full") layers else k ?: throw BadInput("the $policy policy needs k (layers per step)")
    if (kk !in 1..layers) throw BadInput("k = $kk is outside 1..$layers (the model's layers); choose k <= $layers")
    if (policy != "random" && (seed != null || period != null)) throw BadInput("seed and period only apply to the random policy, not '$policy'")
    val groups = (layers + kk - 1) / kk
    val phases = when (policy) {
        "cyclic" -> (0 until groups).map { i -> (layers * i / groups until layers * (i + 1) / groups).toList() }
        "strided" -> (0 until groups).map { i -> (i until layers step groups).toList() }
        "last" -> listOf((layers - kk until layers).toList())
        "anchored" -> (0..layers - kk).map { j -> listOf(j) + (layers - kk + 1 until layers).toList() }
        "full" -> listOf((0 until layers).toList())
        else -> return randomPlan(layers, kk, seed ?: 0L, period ?: (4 * groups)).copy(warmup = warmup)
    }
    return StepPlan(layers, policy, kk, null, phases, phases.indices.toList(), warmup)
}

private fun randomPlan(layers: Int, k: Int, seed: Long, period: Int): StepPlan {
    if (period < 1) throw BadInput("period must be >= 1, got $period")
    val phases = ArrayList<List<Int>>()
    val schedule = ArrayList<Int>(period)
    for (step in 0 until period) {
        val draw = permutation(layers, seed + step).take(k).sorted()
        var at = phases.indexOf(draw)
        if (at < 0) { phases.add(draw); at = phases.size - 1 }
        schedule.add(at)
    }
    return StepPlan(layers, "random", k, seed, phases, schedule)
}
