package org.onphonellm.trainer.core

import java.io.File

/**
 * Checkpoint and adapter of a run, from the loop's [StateBuffer]: the same checkpoint file as the
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
