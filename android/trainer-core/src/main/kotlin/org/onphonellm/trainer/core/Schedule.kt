package org.onphonellm.trainer.core

/**
 * An LCSB step plan (shared_schemas/step_plan.schema.json): step s backpropagates through
 * phases[schedule[s % len(schedule)]]; the other layers run forward only.
 */
data class StepPlan(
    val layers: Int,
    val policy: String,
    val k: Int,
    val seed: Long?,
    val phases: List<List<Int>>,
    val schedule: List<Int>,
) {
    companion object {
        val POLICIES = setOf("cyclic", "strided", "last", "random", "full")
        private val KEYS = setOf("schema_version", "layers", "policy", "k", "seed", "phases", "schedule")

        /** Parse and check a plan as its schema does, plus: every layer < layers, every schedule entry names a phase. */
        fun parse(text: String, where: String = "step plan"): StepPlan {
            val f = Fields.of(Json.parse(text), where)
            (f.obj.fields.keys - KEYS).firstOrNull()?.let { throw ContractError("$where: unknown field '$it'") }
            if (f.int("schema_version") != 1) throw ContractError("$where: schema_version must be 1")
            val layers = f.int("layers")
            val policy = f.string("policy")
            if (policy !in POLICIES) throw ContractError("$where: unknown policy '$policy'; one of ${POLICIES.sorted()}")
            val k = f.int("k")
            if (layers < 1 || k < 1) throw ContractError("$where: layers and k must be >= 1")
            val phases = f.arr("phases").mapIndexed { i, p ->
                val items = (p as? Json.Arr)?.items ?: throw ContractError("$where: phases[$i] must be an array")
                items.map { (it as? Json.Num)?.asLongOrNull?.toInt() ?: throw ContractError("$where: phases[$i] must hold integers") }
            }
            if (phases.isEmpty()) throw ContractError("$where: phases is empty")
            phases.forEachIndexed { i, p ->
                if (p.isEmpty()) throw ContractError("$where: phases[$i] is empty")
                if (p.toSet().size != p.size) throw ContractError("$where: phases[$i] repeats a layer")
                p.forEach { if (it !in 0 until layers) throw ContractError("$where: phases[$i] names layer $it of $layers") }
            }
            val schedule = f.ints("schedule")
            if (schedule.isEmpty()) throw ContractError("$where: schedule is empty")
            schedule.forEach { if (it !in phases.indices) throw ContractError("$where: schedule names phase $it of ${phases.size}") }
            return StepPlan(layers, policy, k, f.optLong("seed"), phases, schedule)
        }
    }
}

/**
 * Which program method runs at each step. By default the manifest's own `lcsb` schedule; a step plan
 * may replace the schedule (e.g. another order of the same phases), but only with phases the program
 * has a method for, since the selected layers are baked into each exported method.
 */
class Schedule private constructor(private val methodOfPhase: List<String>, private val phaseOfMethod: List<Int?>, val schedule: List<Int>) {
    /** Method name and LCSB phase (null: LCSB off) of 0-based step [step]. */
    fun methodForStep(step: Long): Pair<String, Int?> {
        val slot = schedule[(step % schedule.size).toInt()]
        return methodOfPhase[slot] to phaseOfMethod[slot]
    }

    companion object {
        fun fromManifest(m: Manifest): Schedule {
            val l = m.lcsb ?: return Schedule(listOf("train_step"), listOf(null), listOf(0))
            return Schedule(l.phases.indices.map { "train_step_p$it" }, l.phases.indices.toList(), l.schedule)
        }

        fun fromPlan(m: Manifest, plan: StepPlan, where: String = "step plan"): Schedule {
            if (plan.layers != m.layers) throw ContractError("$where is for ${plan.layers} layers, the program has ${m.layers}")
            val trainMethods = m.methods.filter { it.kind == "train_step" }
            val allLayers = (0 until m.layers).toList()
            val names = plan.phases.mapIndexed { i, phase ->
                val want = phase.sorted()
                trainMethods.firstOrNull { (it.backwardLayers.ifEmpty { m.lcsb?.phases?.getOrNull(it.phase ?: -1) ?: allLayers }).sorted() == want }
                    ?.name ?: throw ContractError("$where: phase $i $phase has no method in this program (its methods backpropagate " +
                        trainMethods.joinToString("; ") { "${it.name}: ${it.backwardLayers}" } + "); export the program with this plan")
            }
            val phases = names.map { n -> m.methods.first { it.name == n }.phase }
            return Schedule(names, phases, plan.schedule)
        }
    }
}
