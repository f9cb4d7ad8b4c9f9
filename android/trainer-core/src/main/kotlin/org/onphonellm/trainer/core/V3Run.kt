package org.onphonellm.trainer.core

import java.io.File

/** The layers a step backpropagates under a plan: phases[schedule[step % len]] (toolchain StepPlan.layers_at). */
fun StepPlan.layersAt(step: Long): Set<Int> = phases[schedule[(step % schedule.size).toInt()]].toSet()

/**
 * Checkpoint and adapter of a contract-v3 run, from the loop's [StateBuffer]: the same checkpoint file as the
 * host runner (`toolchain/training/checkpoint.py`: safetensors, tensor `state` [N], `__metadata__.meta`), so
 * either side can resume the other's run. Writing a checkpoint reads the state buffer once (4 x numel bytes);
 * nothing else copies the whole state.
 */
object V3Checkpoints {
    fun save(store: CheckpointStore, state: StateBuffer, step: Long, runId: String, seq: Long, losses: List<Double?>) =
        store.save(Checkpoint(state.toFloatArray(), step, runId, seq, losses))

    /** Load [store] into [state]; returns the checkpoint's position (its state array is dropped). */
    fun restore(store: CheckpointStore, state: StateBuffer): Checkpoint {
        val c = store.load(state.program.stateNumel)
        val b = state.buffer
        for ((i, v) in c.state.withIndex()) b.putFloat(4 * i, v)
        return c
    }

    /** The trained adapter: the state's `param` slices under their PEFT keys + the manifest's adapter config. */
    fun writeAdapter(dir: File, state: StateBuffer) {
        val p = state.program
        val config = p.adapterConfig ?: throw ContractError("the manifest has no adapter.config; re-export the program")
        val flat = state.toFloatArray()
        val slices = p.stateEntries.filter { it.role == "param" }.map { Safetensors.Slice(it.key, it.shape, flat, it.offset) }
        AtomicFiles.replaceDir(dir) { tmp ->
            File(tmp, "adapter_model.safetensors").outputStream().buffered(1 shl 16).use { Safetensors.write(it, slices, mapOf("format" to "pt")) }
            File(tmp, "adapter_config.json").writeText(JsonWriter.write(config) + "\n")
        }
    }
}
