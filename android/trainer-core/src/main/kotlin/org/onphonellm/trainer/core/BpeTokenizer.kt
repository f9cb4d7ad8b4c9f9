package org.onphonellm.trainer.core

import java.io.File
import java.text.Normalizer
import java.util.regex.Pattern

/**
 * Byte-level BPE from a Hugging Face `tokenizer.json` (what toolchain/text/tokenizer.py writes into a program:
 * Qwen2.5's, or a checkpoint's own): NFC normalizer, Split(regex, Isolated) + ByteLevel pre-tokenizer,
 * a BPE model (vocab + merges, `ignore_merges`), added tokens, ByteLevel decoder. Equal to the Python
 * reference (Hugging Face `tokenizers`, itself checked against tiktoken) on
 * shared_schemas/tokenizer_corpus (ids with and without the added tokens, and decode).
 *
 * The pre-tokenizer regex is the file's, rewritten for java.util.regex and Android's ICU regex alike:
 * `\s` / `\S` become explicit classes of Unicode White_Space (what Rust / Oniguruma mean by `\s`; Java's
 * `\s` is ASCII-only), and the case-insensitive contractions `(?i:'s|...)` become explicit case classes,
 * including U+017F (long s), which Unicode case folding maps to `s`.
 */
class BpeTokenizer private constructor(
    private val vocab: Map<String, Int>,
    private val mergeRank: Map<String, Int>,
    private val added: List<Pair<String, Int>>,   // (content, id), longest first
    private val pattern: Pattern,
    private val nfc: Boolean,
    private val ignoreMerges: Boolean,
) {
    private val idToToken: Array<String?>
    private val addedById: Map<Int, String> = added.associate { it.second to it.first }
    private val cache = HashMap<String, IntArray>()

    init {
        val max = maxOf(vocab.values.maxOrNull() ?: 0, added.maxOfOrNull { it.second } ?: 0)
        idToToken = arrayOfNulls(max + 1)
        for ((t, id) in vocab) idToToken[id] = t
    }

    val vocabSize: Int get() = idToToken.size

    fun tokenId(token: String): Int? = added.firstOrNull { it.first == token }?.second ?: vocab[token]

    /** Token ids of [text]; with [allowSpecial] the added tokens' texts become their ids, else ordinary text. */
    fun encode(text: String, allowSpecial: Boolean = true): List<Int> {
        val t = normalize(sanitize(text))
        val out = ArrayList<Int>()
        if (!allowSpecial || added.isEmpty()) { encodeOrdinary(t, out); return out }
        var start = 0
        var i = 0
        while (i < t.length) {
            val hit = added.firstOrNull { t.startsWith(it.first, i) }  // longest first: leftmost-longest
            if (hit == null) { i++; continue }
            if (i > start) encodeOrdinary(normalize(t.substring(start, i)), out)
            out.add(hit.second)
            i += hit.first.length
            start = i
        }
        if (start < t.length) encodeOrdinary(normalize(t.substring(start)), out)
        return out
    }

    fun decode(ids: List<Int>): String = String(decodeBytes(ids), Charsets.UTF_8)

    /** The bytes of [ids] (the ByteLevel decoder's, before UTF-8 decoding): a token may end inside a character. */
    fun decodeBytes(ids: List<Int>): ByteArray {
        val bytes = java.io.ByteArrayOutputStream()
        for (id in ids) {
            val tok = addedById[id] ?: idToToken.getOrNull(id) ?: throw BadInput("token id $id is outside the vocabulary")
            val mapped = ByteArray(tok.length)
            var ok = true
            var n = 0
            var k = 0
            while (k < tok.length) {
                val cp = tok.codePointAt(k)
                val b = if (cp < CHAR_TO_BYTE.size) CHAR_TO_BYTE[cp] else -1
                if (b < 0) { ok = false; break }
                mapped[n++] = b.toByte()
                k += Character.charCount(cp)
            }
            if (ok) bytes.write(mapped, 0, n) else tok.toByteArray(Charsets.UTF_8).let { bytes.write(it, 0, it.size) }
        }
        return bytes.toByteArray()
    }

    private fun normalize(s: String): String = if (nfc) Normalizer.normalize(s, Normalizer.Form.NFC) else s

    private fun encodeOrdinary(text: String, out: MutableList<Int>) {
        val m = pattern.matcher(text)
        var last = 0
        while (m.find()) {
            if (m.start() > last) piece(text.substring(last, m.start()), out)
            if (m.end() > m.start()) piece(m.group(), out)
            last = m.end()
        }
        if (last < text.length) piece(text.substring(last), out)
    }

    private fun piece(p: String, out: MutableList<Int>) {
        val ids = cache[p] ?: bpe(p).also { if (cache.size < 50_000) cache[p] = it }
        for (id in ids) out.add(id)
    }

    private fun bpe(p: String): IntArray {
        val utf8 = p.toByteArray(Charsets.UTF_8)
        val word = StringBuilder(utf8.size)
        for (b in utf8) word.append(BYTE_TO_CHAR[b.toInt() and 0xff])
        val whole = word.toString()
        if (ignoreMerges) vocab[whole]?.let { return intArrayOf(it) }
        val parts = ArrayList<String>(utf8.size)
        var k = 0
        while (k < whole.length) { val n = Character.charCount(whole.codePointAt(k)); parts.add(whole.substring(k, k + n)); k += n }
        while (parts.size > 1) {
            var best = -1
            var bestRank = Int.MAX_VALUE
            for (i in 0 until parts.size - 1) {
                val r = mergeRank[parts[i] + SEP + parts[i + 1]] ?: continue
                if (r < bestRank) { bestRank = r; best = i }
            }
            if (best < 0) break
            parts[best] = parts[best] + parts[best + 1]
            parts.removeAt(best + 1)
        }
        return IntArray(parts.size) { vocab[parts[it]] ?: throw BadInput("token '${parts[it]}' is not in the vocabulary (a merge without its token)") }
    }

    companion object {
        private const val SEP = "\u0000"
        /** GPT-2's bytes_to_unicode: printable bytes map to themselves, the others to U+0100 + n. */
        val BYTE_TO_CHAR: Array<String> = run {
            val table = arrayOfNulls<String>(256)
            var n = 0
            for (b in 0 until 256) {
                val printable = b in 33..126 || b in 161..172 || b in 174..255
                table[b] = String(Character.toChars(if (printable) b else 256 + n++))
            }
            table.requireNoNulls()
        }
        private val CHAR_TO_BYTE: IntArray = IntArray(512) { -1 }.also { t -> for (b in 0 until 256) t[BYTE_TO_CHAR[b].codePointAt(0)] = b }

        /** Unicode White_Space (Rust regex and Oniguruma `\s`). */
        private const val WS = "\\t\\n\\u000B\\f\\r \\u0085\\u00A0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000"

        /** A tokenizers regex made portable to java.util.regex / ICU (see the class comment). */
        fun portableRegex(src: String): String {
            var r = src.replace("(?i:'s|'t|'re|'ve|'m|'ll|'d)", "(?:'[sS\\u017F]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])")
            // Inside a class: [^\s...] -> [^WS...]; outside: \s -> [WS], \S -> [^WS].
            val sb = StringBuilder()
            var i = 0
            var inClass = false
            while (i < r.length) {
                val c = r[i]
                if (c == '\\' && i + 1 < r.length) {
                    val n = r[i + 1]
                    when {
                        n == 's' -> sb.append(if (inClass) WS else "[$WS]")
                        n == 'S' && !inClass -> sb.append("[^$WS]")
                        n == 'S' -> throw BadInput("tokenizer regex: \\S inside a class is not supported")
                        else -> sb.append(c).append(n)
                    }
                    i += 2
                    continue
                }
                if (c == '[' && !inClass) inClass = true else if (c == ']' && inClass) inClass = false
                sb.append(c)
                i++
            }
            r = sb.toString()
            return r
        }

        /** Unpaired UTF-16 surrogates become U+FFFD (they have no UTF-8; toolchain.tokenizer.sanitize). */
        fun sanitize(s: String): String {
            var sb: StringBuilder? = null
            var i = 0
            while (i < s.length) {
                val c = s[i]
                val bad = (Character.isHighSurrogate(c) && (i + 1 >= s.length || !Character.isLowSurrogate(s[i + 1]))) ||
                    (Character.isLowSurrogate(c) && (i == 0 || !Character.isHighSurrogate(s[i - 1])))
                if (bad && sb == null) sb = StringBuilder(s.substring(0, i))
                sb?.append(if (bad) '\uFFFD' else c)
                i++
            }
            return sb?.toString() ?: s
        }

        fun load(file: File): BpeTokenizer = parse(Json.parse(file.readText(Charsets.UTF_8)), file.path)

        fun parse(doc: Json, where: String): BpeTokenizer {
            val root = Fields.of(doc, where)
            val model = root.obj("model")
            if (model.string("type") != "BPE") throw BadInput("$where: model.type ${model.string("type")} is not BPE")
            val vocab = HashMap<String, Int>(model.obj("vocab").obj.fields.size * 2)
            for ((k, v) in model.obj("vocab").obj.fields) vocab[k] = (v as? Json.Num)?.asLongOrNull?.toInt() ?: throw BadInput("$where: vocab[$k]")
            val merges = HashMap<String, Int>(model.arr("merges").size * 2)
            for ((rank, mj) in model.arr("merges").withIndex()) {
                val (a, b) = when (mj) {
                    is Json.Arr -> Pair((mj.items[0] as Json.Str).value, (mj.items[1] as Json.Str).value)
                    is Json.Str -> mj.value.split(' ', limit = 2).let { Pair(it[0], it[1]) }
                    else -> throw BadInput("$where: merges[$rank] is neither a pair nor a string")
                }
                val key = a + SEP + b
                if (key !in merges) merges[key] = rank  // the first merge of a pair wins (Map.putIfAbsent is API 24)
            }
            val added = if (root.has("added_tokens")) root.arr("added_tokens").map {
                val f = Fields.of(it, "$where.added_tokens")
                Pair(f.string("content"), f.int("id"))
            }.sortedByDescending { it.first.length } else emptyList()
            val nfc = root.has("normalizer") && Fields.of(root.raw("normalizer"), "$where.normalizer").let { n ->
                when (n.string("type")) {
                    "NFC" -> true
                    else -> throw BadInput("$where: normalizer ${n.string("type")} is not supported (NFC or none)")
                }
            }
            val pre = root.obj("pre_tokenizer")
            val steps = if (pre.string("type") == "Sequence") pre.arr("pretokenizers").map { Fields.of(it, "${pre.where}[]") } else listOf(pre)
            var regex: String? = null
            for (s in steps) when (s.string("type")) {
                "Split" -> {
                    if (s.string("behavior") != "Isolated" || s.bool("invert")) throw BadInput("${s.where}: only Split Isolated is supported")
                    regex = s.obj("pattern").string("Regex")
                }
                "ByteLevel" -> if (s.has("use_regex") && s.bool("use_regex")) throw BadInput("${s.where}: ByteLevel with its own regex is not supported")
                else -> throw BadInput("${s.where}: pre-tokenizer ${s.string("type")} is not supported")
            }
            val pattern = Pattern.compile(portableRegex(regex ?: throw BadInput("$where: no Split pre-tokenizer")))
            val ignore = model.has("ignore_merges") && model.bool("ignore_merges")
            return BpeTokenizer(vocab, merges, added, pattern, nfc, ignore)
        }
    }
}
