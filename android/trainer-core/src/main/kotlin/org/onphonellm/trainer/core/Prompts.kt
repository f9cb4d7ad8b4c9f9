package org.onphonellm.trainer.core

/** Prompts for generation, as the host builds them (toolchain/demo.py, toolchain/cli/generate.py --chat). */
object Prompts {
    /** Plain: [BOS if any] + encode(prompt, no special tokens), stop at EOS. Chat: the user turn + `<|im_start|>assistant\n`, stop at <|im_end|> or EOS. */
    fun encode(tok: TextTokenizer, prompt: String, chat: Boolean): Pair<List<Int>, Set<Int>> {
        if (!chat) return Pair((listOfNotNull(tok.bosId) + tok.encode(prompt, allowSpecial = false)), setOf(tok.eosId))
        val (ids, _) = TextRows.chatTemplate(tok, listOf(ChatMessage("user", prompt)))
        val imEnd = tok.tokenId(Contract.IM_END)!!
        return Pair(ids + tok.encode(Contract.ASSISTANT_HEADER, allowSpecial = true), setOf(imEnd, tok.eosId))
    }

    /** Generated ids as text, without a trailing stop token. */
    fun decode(tok: TextTokenizer, ids: List<Int>, stop: Set<Int>): String = tok.decode(if (ids.isNotEmpty() && ids.last() in stop) ids.dropLast(1) else ids)
}
