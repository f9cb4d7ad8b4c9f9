package org.onphonellm.trainer.core

/** One chat message ({"role", "content"}). */
data class ChatMessage(val role: String, val content: String)

/**
 * The user's own text as training rows, exactly as the host makes them (toolchain/text_data.py), so the
 * same text gives the same rows on the host and on the phone (shared_schemas/data_corpus/cases.jsonl).
 */
object TextRows {
    val CHAT_ROLES = listOf("system", "user", "assistant")

    /** A UTF-8 text with a leading BOM dropped. */
    fun stripBom(text: String): String = if (text.startsWith("\uFEFF")) text.substring(1) else text

    /** [ids] cut into windows of at most [seqLen], stride seqLen - 1 (text_data.windows); a 1-token remainder is dropped. */
    fun windows(ids: List<Int>, seqLen: Int): List<List<Int>> {
        if (seqLen < 2) throw BadInput("seq_len must be at least 2, got $seqLen")
        val out = ArrayList<List<Int>>()
        var start = 0
        while (start < maxOf(ids.size - 1, 0)) {
            out.add(ids.subList(start, minOf(start + seqLen, ids.size)).toList())
            start += seqLen - 1
        }
        return out
    }

    /** Plain text: [BOS if any] + encode(text, no special tokens) + [EOS], in windows; labels = ids. */
    fun textRows(text: String, tok: TextTokenizer, seqLen: Int): List<DataRow> {
        val stream = ArrayList<Int>()
        tok.bosId?.let { stream.add(it) }
        stream.addAll(tok.encode(text, allowSpecial = false))
        stream.add(tok.eosId)
        val rows = windows(stream, seqLen).map { w -> DataRow(w.toIntArray(), w.toIntArray()) }
        if (rows.isEmpty()) throw BadInput("the text has no token to train on")
        return rows
    }

    /**
     * Qwen's ChatML (toolchain.tokenizer.apply_chat_template): each turn `<|im_start|>{role}\n{content}<|im_end|>\n`,
     * the pieces encoded one by one, special-token text in contents kept as text. Returns ids and the mask
     * (true on each assistant content and its <|im_end|>).
     */
    fun chatTemplate(tok: TextTokenizer, messages: List<ChatMessage>): Pair<List<Int>, List<Boolean>> {
        val imStart = tok.tokenId(Contract.IM_START) ?: throw BadInput("the ${tok.kind} tokenizer has no ${Contract.IM_START} token, so no chat template; use plain text")
        val imEnd = tok.tokenId(Contract.IM_END) ?: throw BadInput("the ${tok.kind} tokenizer has no ${Contract.IM_END} token, so no chat template; use plain text")
        if (messages.isEmpty()) throw BadInput("messages must be a non-empty list of {\"role\", \"content\"} objects")
        val newline = tok.encode("\n", allowSpecial = false)
        val ids = ArrayList<Int>()
        val mask = ArrayList<Boolean>()
        for ((i, m) in messages.withIndex()) {
            if (m.role !in CHAT_ROLES) throw BadInput("message ${i + 1}: role must be one of ${CHAT_ROLES.joinToString()} and content a string, got role '${m.role}'")
            val header = listOf(imStart) + tok.encode("${m.role}\n", allowSpecial = false)
            val body = tok.encode(m.content, allowSpecial = false) + imEnd
            ids += header; ids += body; ids += newline
            repeat(header.size) { mask.add(false) }
            repeat(body.size) { mask.add(m.role == "assistant") }
            repeat(newline.size) { mask.add(false) }
        }
        return Pair(ids, mask)
    }

    /** One JSONL line's messages ({"messages": [{"role", "content"}, ...]}, exactly those keys). */
    fun parseMessages(doc: Json, where: String): List<ChatMessage> {
        val o = doc as? Json.Obj
        if (o == null || o.fields.keys != setOf("messages")) throw BadInput("$where: expected {\"messages\": [{\"role\": ..., \"content\": ...}, ...]}")
        val items = (o["messages"] as? Json.Arr)?.items
        if (items == null || items.isEmpty()) throw BadInput("$where: messages must be a non-empty list of {\"role\", \"content\"} objects")
        return items.mapIndexed { i, m ->
            val mo = m as? Json.Obj
            if (mo == null || mo.fields.keys != setOf("role", "content")) throw BadInput("$where: message ${i + 1} must be an object with exactly the keys role and content")
            val role = (mo["role"] as? Json.Str)?.value
            val content = (mo["content"] as? Json.Str)?.value
            if (role == null || role !in CHAT_ROLES || content == null)
                throw BadInput("$where: message ${i + 1}: role must be one of ${CHAT_ROLES.joinToString()} and content a string, got role ${mo["role"]}")
            ChatMessage(role, content)
        }
    }

    /** A chat row: labels = ids on the assistant's tokens, -100 elsewhere; an error naming [where] if longer than [seqLen]. */
    fun chatRow(tok: TextTokenizer, messages: List<ChatMessage>, seqLen: Int, where: String): DataRow {
        val (ids, mask) = try { chatTemplate(tok, messages) } catch (e: BadInput) { throw BadInput("$where: ${e.message}") }
        if (mask.none { it }) throw BadInput("$where: the conversation has no assistant message with a token to learn")
        if (ids.size > seqLen) throw BadInput("$where: the conversation is ${ids.size} tokens, longer than the program's seq_len $seqLen; " +
            "shorten or split it, or export with a larger --seq-len")
        return DataRow(ids.toIntArray(), IntArray(ids.size) { if (mask[it]) ids[it] else DataRow.IGNORE })
    }

    /** Rows of a chat JSONL text, one conversation per non-blank line ([name]:line in errors). */
    fun chatRows(text: String, tok: TextTokenizer, seqLen: Int, name: String = "chat.jsonl"): List<DataRow> {
        val rows = ArrayList<DataRow>()
        for ((i, line) in stripBom(text).lines().withIndex()) {
            if (line.isBlank()) continue
            val where = "$name:${i + 1}"
            val doc = try { Json.parse(line) } catch (e: BadInput) { throw BadInput("$where: ${e.message}") }
            rows.add(chatRow(tok, parseMessages(doc, where), seqLen, where))
        }
        if (rows.isEmpty()) throw BadInput("$name has no conversation")
        return rows
    }

    /** Every token id < [vocab] (a tokenizer larger than the model's embedding is refused before training). */
    fun checkRows(rows: List<DataRow>, vocab: Int, where: String) {
        for ((i, r) in rows.withIndex()) r.inputIds.firstOrNull { it !in 0 until vocab }?.let {
            throw BadInput("$where: row ${i + 1}: token id $it is outside the model's vocabulary of $vocab")
        }
    }

    /** Indices held out: the first floor(fraction * n + 0.5) entries of permutation(n, seed), sorted (file order). */
    fun heldOutIndices(n: Int, fraction: Double, seed: Long): List<Int> {
        if (!(fraction > 0 && fraction < 1)) throw BadInput("the held-out fraction must be strictly between 0 and 1, got $fraction")
        val nHeld = Math.floor(fraction * n + 0.5).toInt()
        if (nHeld < 1 || nHeld >= n) throw BadInput("a held-out fraction of $fraction of $n rows holds out $nHeld; need at least one row on " +
            "each side (more text, or another fraction)")
        return permutation(n, seed).take(nHeld).sorted()
    }

    /** (train, held-out), both in file order (text_data.split_held_out). */
    fun <T> splitHeldOut(rows: List<T>, fraction: Double, seed: Long): Pair<List<T>, List<T>> {
        val held = heldOutIndices(rows.size, fraction, seed).toHashSet()
        return Pair(rows.filterIndexed { i, _ -> i !in held }, rows.filterIndexed { i, _ -> i in held })
    }

    /** Looks like chat JSONL: the first non-blank line parses as {"messages": [...]}. */
    fun looksLikeChat(text: String): Boolean {
        val first = stripBom(text).lineSequence().firstOrNull { it.isNotBlank() } ?: return false
        return try { (Json.parse(first) as? Json.Obj)?.fields?.containsKey("messages") == true } catch (e: BadInput) { false }
    }
}

/** Rows of a user's text or chat file with its held-out split (what the UI shows before training). */
class PreparedData(val train: List<DataRow>, val held: List<DataRow>, val chat: Boolean) {
    val rows: Int get() = train.size + held.size

    companion object {
        /** [text] as plain text or, with [chat] (null: guess), chat JSONL; [heldOut] 0 keeps every row for training. */
        fun prepare(text: String, tok: TextTokenizer, seqLen: Int, vocab: Int, heldOut: Double, seed: Long,
                    chat: Boolean? = null, name: String = "text"): PreparedData {
            val isChat = chat ?: TextRows.looksLikeChat(text)
            val rows = if (isChat) TextRows.chatRows(text, tok, seqLen, name) else TextRows.textRows(TextRows.stripBom(text), tok, seqLen)
            TextRows.checkRows(rows, vocab, name)
            if (heldOut == 0.0) return PreparedData(rows, emptyList(), isChat)
            val (train, held) = TextRows.splitHeldOut(rows, heldOut, seed)
            return PreparedData(train, held, isChat)
        }
    }
}
