package org.onphonellm.trainer.core

/** Why a generation stopped; [wire]: the name the host's driver uses (toolchain/runtime/generate.py `stopped`), plus "cancelled". */
enum class StopReason(val wire: String) {
    /** A stop id was chosen (EOS, a chat's `<|im_end|>`); it is the last id. */
    EOS("eos"),
    /** max_new_tokens ids were generated. */
    MAX_NEW_TOKENS("max_new_tokens"),
    /** [GenerationControl.cancel]: the ids chosen before the cancel was seen, nothing after. */
    CANCELLED("cancelled");

    override fun toString(): String = wire
}

/** The new ids (a stop id included, as the host's generate returns them) and why generation stopped. */
class GenerationResult(val ids: List<Int>, val stopReason: StopReason) {
    override fun toString(): String = "GenerationResult($ids, $stopReason)"
}

/** One generated token as it streams: [index] in the output, [id], [text] the characters it completed (may be empty), [textSoFar]. */
class GeneratedToken(val index: Int, val id: Int, val text: String, val textSoFar: String)
