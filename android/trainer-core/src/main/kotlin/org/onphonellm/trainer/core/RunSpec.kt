package org.onphonellm.trainer.core

/**
 * What a run is, fixed when it is created and kept in its run.json (so a resume needs nothing but the run
 * directory). [lcsbPolicy]/[lcsbK]: the layers each step backpropagates, chosen at run time ("full", or
 * cyclic / strided / last / random with k layers; null: the manifest's default plan, else full);
 * [lcsbSeed]/[lcsbPeriod]: the random policy's (null: 0 and 4 * ceil(L / k), as the host's make_plan).
 * [layersPerCheckpoint]: the loop's checkpoint groups ([LayerLoop.trainStep]; 1: every selected layer's input
 * kept; more: less memory, one more forward through the layers per step, the same result bit for bit).
 */
data class RunSpec(
    val runId: String,
    val program: String,
    val steps: Long,
    val lr: Double,
    val budgetBytes: Long,
    val checkpointEvery: Int = 10,
    val shuffleSeed: Long? = 0,
    val lcsbPolicy: String? = null,
    val lcsbK: Int? = null,
    val heldOut: Double = 0.0,
    val heldOutSeed: Long = 0,
    val source: String = "text",
    val runInfo: Map<String, Any?> = emptyMap(),
    val lcsbSeed: Long? = null,
    val lcsbPeriod: Int? = null,
    val layersPerCheckpoint: Int = 1,
    val lcsbWarmup: Long? = null,
) {
    init {
        if (lcsbWarmup != null && lcsbWarmup < 0) throw BadInput("an LCSB warm-up must be >= 0 steps, got $lcsbWarmup")
        require(EventSchema.RUN_ID.matches(runId)) { "run id '$runId' must match ${EventSchema.RUN_ID}" }
        require(steps >= 0 && checkpointEvery >= 1 && lr > 0 && budgetBytes > 0) { "bad run spec $this" }
        if (layersPerCheckpoint < 1) throw BadInput("layers_per_checkpoint must be >= 1 (1 keeps every selected layer's input), got $layersPerCheckpoint")
    }

    fun toJson(): Json = Json.of(linkedMapOf(
        "schema_version" to 1, "run_id" to runId, "program" to program, "steps" to steps, "lr" to lr, "budget_bytes" to budgetBytes,
        "checkpoint_every" to checkpointEvery, "shuffle_seed" to shuffleSeed, "lcsb_policy" to lcsbPolicy, "lcsb_k" to lcsbK,
        "held_out" to heldOut, "held_out_seed" to heldOutSeed, "source" to source, "run_info" to runInfo,
        "lcsb_seed" to lcsbSeed, "lcsb_period" to lcsbPeriod, "layers_per_checkpoint" to layersPerCheckpoint,
    ) + (if (lcsbWarmup != null) mapOf("lcsb_warmup" to lcsbWarmup) else emptyMap()))  // absent: older run.json stays the same

    /** The layer plan over [layers] (null: full backprop every step). */
    fun plan(p: Manifest): StepPlan? {
        if (lcsbPolicy != "random" && (lcsbSeed != null || lcsbPeriod != null))
            throw BadInput("an LCSB seed and period only apply to the random policy, not ${lcsbPolicy ?: "the default plan"}")
        if (lcsbWarmup != null && (lcsbPolicy == "full" || (lcsbPolicy == null && p.defaultPlan == null)))
            throw BadInput("an LCSB warm-up applies to an LCSB plan; full backprop has none")
        return when (lcsbPolicy) {
            null -> p.defaultPlan?.let { if (lcsbWarmup != null) it.copy(warmup = lcsbWarmup) else it }
            "full" -> null
            else -> StepPlan.make(p.layers, lcsbK, lcsbPolicy, lcsbSeed, lcsbPeriod, lcsbWarmup ?: 0L)
        }
    }

    companion object {
        fun parse(doc: Json, where: String): RunSpec {
            val f = Fields.of(doc, where)
            val info = if (f.has("run_info")) f.obj("run_info").obj.fields.mapValues { (_, v) -> plain(v) } else emptyMap()
            return RunSpec(f.string("run_id"), f.string("program"), f.long("steps"), f.double("lr"), f.long("budget_bytes"),
                f.int("checkpoint_every"), f.optLong("shuffle_seed"), f.optString("lcsb_policy"), f.optInt("lcsb_k"),
                f.double("held_out"), f.long("held_out_seed"), f.optString("source") ?: "text", info,
                f.optLong("lcsb_seed"), f.optInt("lcsb_period"), f.optInt("layers_per_checkpoint") ?: 1,  // older run.json: none
                f.optLong("lcsb_warmup"))
        }

        private fun plain(v: Json): Any? = when (v) {
            Json.Null -> null
            is Json.Bool -> v.value
            is Json.Num -> v.asLongOrNull ?: v.asDouble
            is Json.Str -> v.value
            is Json.Arr -> v.items.map { plain(it) }
            is Json.Obj -> v.fields.mapValues { (_, x) -> plain(x) }
        }
    }
}
