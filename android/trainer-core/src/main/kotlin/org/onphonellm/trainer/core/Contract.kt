package org.onphonellm.trainer.core

/**
 * The program directory contract, as toolchain/contract names it (docs/architecture.md maps every name across
 * Python, Kotlin and Swift): the file names (contract/files.py), the method roles (contract/methods.py), the chat markers (contract/chat.py). The
 * typed manifest is [Manifest] (contract/manifest.py), its methods [MethodSpec] with [IoSpec]s, its state
 * layout [StateEntry]s (contract/state.py), its generate.fused section [FusedSection].
 */
object Contract {
    /** files.py MANIFEST_NAME. */
    const val MANIFEST_NAME = "manifest.json"
    /** files.py MANIFEST_SCHEMA_VERSION: the manifest version this app runs (3: layer-generic methods, weights as inputs). */
    const val MANIFEST_SCHEMA_VERSION = 3
    /** files.py LAYER: the placeholder in the manifest's per-layer names, replaced by the layer index. */
    const val LAYER = "{layer}"
    /** methods.py TRAINING_ROLES: the training methods, in the order one step calls them. */
    val TRAINING_ROLES = listOf("embed", "block_forward", "head_loss", "block_backward", "block_skip_update")
    /**
     * methods.py GENERATION_ROLES: the stock generation methods [LayerLoop.generateStream] calls (a program can
     * generate when it has them all; [LayerLoop.generationStateEntries] reads their bindings).
     */
    val GENERATION_ROLES = listOf("embed_token", "embed_prefill", "block_prefill", "block_decode", "head_logits")
    /** chat.py IM_START / IM_END: the ChatML turn markers (`<|im_start|>{role}\n{content}<|im_end|>\n`). */
    const val IM_START = "<|im_start|>"
    const val IM_END = "<|im_end|>"
    /** chat.py ASSISTANT_HEADER: the generation prompt after the last turn; generation stops at [IM_END] (or eos). */
    const val ASSISTANT_HEADER = IM_START + "assistant\n"
    /**
     * The held-out rows a held-out loss reads: the first this many of the run's held-out rows (they are a seeded
     * random draw of the text's rows already, so the first N are a random sample). A phone's forward pass of the
     * 0.5B program is seconds per row: uncapped, 10% of a 16 MB text is hours before the first step. The iOS app
     * (Contract.heldOutEvalRows) uses the same number; docs/android.md "held-out loss".
     */
    const val HELD_OUT_EVAL_ROWS = 32
    /**
     * A run's lr and steps when neither the user nor the manifest (`defaults`, toolchain/export/app_defaults.py; an
     * older program: `optimizer.default_lr`) gives them: the toolchain's values before the measured defaults
     * ([Manifest.runLr], [Manifest.runSteps]; iOS: Contract.fallbackLr / fallbackSteps).
     */
    const val FALLBACK_LR = 1e-4
    const val FALLBACK_STEPS = 100L
}

/**
 * One input or output of a method and where the app gets (or puts) it (methods.py IoSpec): `bind` input |
 * result | activation | weight | state | cache; `ref` may contain [Contract.LAYER]; `rows` [a, b) of a weight.
 */
class IoSpec(val name: String, val dtype: ElemType, val shape: List<Int>, val bind: String, val ref: String, val rows: Pair<Int, Int>?) {
    val numel: Int = shape.fold(1) { a, b -> a * b }
    fun refAt(layer: Int?): String = if (layer == null) ref else ref.replace(Contract.LAYER, layer.toString())
}

/**
 * One method (methods.py MethodSpec): its role (a fused variant has its stock method's role), inputs and outputs in
 * call order; [kernels]: the custom kernels it calls beyond stock ExecuTorch (methods[].kernels; empty: stock operators only).
 */
class MethodSpec(val name: String, val role: String, val inputs: List<IoSpec>, val outputs: List<IoSpec>, val kernels: List<String> = emptyList())

/**
 * generate.fused (manifest.py FusedSection): [methods] maps a stock generation method to its variant calling
 * [kernels] (same inputs and outputs, except head_logits_fused, which takes the whole head instead of its chunks).
 * A runtime that has the kernels registered calls the fused names, any other the stock ones ([LayerLoop.generationNames]).
 */
class FusedSection(val kernels: List<String>, val source: String, val methods: Map<String, String>)

/**
 * generate.xnnpack (manifest.py XnnpackSection): the XNNPACK generation variant (`export --xnnpack-generation`), for a
 * runtime without the fused kernels (the published AAR): [methods] maps a generation role to the method called instead;
 * `{layer}` in a name is the layer index (the block methods are per layer, that layer's weights inside; XNNPACK packs
 * them, about [weightBytes] of anonymous memory, when they load). Chosen fused > xnnpack > stock ([LayerLoop.generationNames]).
 */
class XnnpackSection(val methods: Map<String, String>, val weightBytes: Long)

/** One tensor of the flat state vector (state.py StateEntry): its name, PEFT key, role, shape, offset in elements, layer. */
class StateEntry(val name: String, val key: String, val role: String, val shape: List<Int>, val offset: Int, val layer: Int?) {
    val numel: Int = shape.fold(1) { a, b -> a * b }
}
