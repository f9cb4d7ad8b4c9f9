package org.onphonellm.trainer.core

import java.io.File

/**
 * The layers a step backpropagates under a plan (toolchain StepPlan.layers_at): every layer while step < warmup,
 * else phases[schedule[step % len]].
 */
fun StepPlan.layersAt(step: Long): Set<Int> =
    if (step < warmup) (0 until layers).toSet() else phases[schedule[(step % schedule.size).toInt()]].toSet()

/**
 * Checkpoint and adapter of a contract-v3 run, from the loop's [StateBuffer]: the same checkpoint file as the
 * host runner (`toolchain/training/checkpoint.py`: safetensors, tensor `state` [N], `__metadata__.meta`), so
 * either side can resume the other's run. Writing a checkpoint reads the state buffer once (4 x numel bytes);
 * nothing else copies the whole state.
 */
object StateCheckpoints {
    fun save(store: CheckpointStore, state: StateBuffer, step: Long, runId: String, seq: Long, losses: List<Double?>) {
        state.requireWhole("a checkpoint")
        store.saveBuffer(state.buffer, state.numel, step, runId, seq, losses)  // from the direct buffer: no heap copy
    }

    /** Load [store] into [state]; returns the checkpoint's position (its state array is dropped). */
    fun restore(store: CheckpointStore, state: StateBuffer): Checkpoint {
        state.requireWhole("restoring a checkpoint")
        return store.loadInto(state.buffer, state.program.stateNumel)  // into the direct buffer: no heap copy
    }

    /**
     * The trained adapter, as the host writes it (toolchain/lora/peft_io.py `save_adapter`): the state's `param`
     * slices under their PEFT keys in adapter_model.safetensors (keys sorted, as safetensors' writer orders
     * them; metadata {"format": "pt"}) and adapter_config.json = the manifest's adapter.config as
     * `json.dumps(indent=2, sort_keys=True)`. Written into a directory that replaces [dir] whole. For the
     * initial state both files are byte-identical to the program's adapter_init/.
     */
    fun writeAdapter(dir: File, state: StateBuffer) {
        state.requireWhole("an adapter")
        val p = state.program
        val config = p.adapterConfig ?: throw BadInput("the manifest has no adapter.config; re-export the program")
        val flat = state.toFloatArray()
        val slices = p.stateEntries.filter { it.role == "param" }.sortedBy { it.key }.map { Safetensors.Slice(it.key, it.shape, flat, it.offset) }
        AtomicFiles.replaceDir(dir) { tmp ->
            File(tmp, ADAPTER_WEIGHTS).outputStream().buffered(1 shl 16).use { Safetensors.write(it, slices, mapOf("format" to "pt")) }
            File(tmp, ADAPTER_CONFIG).writeText(PythonJson.dumps(config), Charsets.UTF_8)
        }
    }

    const val ADAPTER_CONFIG = "adapter_config.json"
    const val ADAPTER_WEIGHTS = "adapter_model.safetensors"
}

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
