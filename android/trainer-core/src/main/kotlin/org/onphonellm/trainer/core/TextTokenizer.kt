package org.onphonellm.trainer.core

import java.io.File

/**
 * A tokenizer as data preparation and generation need it (toolchain/text/tokenizer.py `Tokenizer`): `encode`
 * never adds BOS/EOS; with allowSpecial = false the added tokens' texts are ordinary text.
 */
interface TextTokenizer {
    val kind: String
    val bosId: Int?
    val eosId: Int
    val padId: Int
    fun encode(text: String, allowSpecial: Boolean = true): List<Int>
    fun decode(ids: List<Int>): String
    /**
     * The UTF-8 bytes [decode] makes text of (`decode(ids) == String(decodeBytes(ids), UTF_8)`): a token may hold
     * part of a character, which [IncrementalTextDecoder] keeps until the rest arrives. Default: [decode]'s text encoded
     * (a tokenizer that cannot split characters).
     */
    fun decodeBytes(ids: List<Int>): ByteArray = decode(ids).toByteArray(Charsets.UTF_8)
    /** The id of a single added token ("<|im_start|>"), or null. */
    fun tokenId(token: String): Int?

    companion object {
        /**
         * The tokenizer of a program (manifest `tokenizer`): kind "byte" -> [ByteTokenizer]; "qwen2.5" /
         * "huggingface" -> [BpeTokenizer] from the program's tokenizer.json (no BOS, EOS = eos_token_id);
         * "none" (or no file) -> an error: the program cannot take text.
         */
        fun forProgram(p: Manifest): TextTokenizer = when (p.tokenizerKind) {
            "byte" -> ByteTokenizer()
            "qwen2.5", "huggingface" -> {
                val file = p.tokenizerFile ?: throw BadInput("the program's tokenizer (${p.tokenizerKind}) has no file; re-export the program")
                val f = File(p.dir, file)
                if (!f.isFile) throw BadInput("$f is missing from the program directory; push the program again")
                BpeTextTokenizer(BpeTokenizer.load(f), p.tokenizerKind,
                    p.eosTokenId ?: throw BadInput("the manifest's tokenizer has no eos_token_id; re-export the program"), p.padTokenId)
            }
            else -> throw BadInput("the program was exported without a tokenizer (kind ${p.tokenizerKind}); it cannot take text. " +
                "Re-export it with a tokenizer, or train on pre-tokenized rows")
        }
    }
}

/** The byte tokenizer of the tiny/demo presets: UTF-8 bytes 0..255, BOS 256, EOS 257, PAD 258 (no text encodes to those). */
class ByteTokenizer : TextTokenizer {
    override val kind = "byte"
    override val bosId: Int = BOS
    override val eosId: Int = EOS
    override val padId: Int = PAD

    override fun encode(text: String, allowSpecial: Boolean): List<Int> =
        BpeTokenizer.sanitize(text).toByteArray(Charsets.UTF_8).map { it.toInt() and 0xff }

    override fun decode(ids: List<Int>): String = String(decodeBytes(ids), Charsets.UTF_8)

    override fun decodeBytes(ids: List<Int>): ByteArray = ids.filter { it in 0..255 }.map { it.toByte() }.toByteArray()

    override fun tokenId(token: String): Int? = null

    companion object {
        const val BOS = 256
        const val EOS = 257
        const val PAD = 258
    }
}

/** A Hugging Face byte-level BPE (Qwen2.5's or a checkpoint's own tokenizer.json) with the manifest's EOS/PAD; no BOS. */
class BpeTextTokenizer(val bpe: BpeTokenizer, override val kind: String, override val eosId: Int, override val padId: Int) : TextTokenizer {
    override val bosId: Int? = null
    override fun encode(text: String, allowSpecial: Boolean): List<Int> = bpe.encode(text, allowSpecial)
    override fun decode(ids: List<Int>): String = bpe.decode(ids)
    override fun decodeBytes(ids: List<Int>): ByteArray = bpe.decodeBytes(ids)
    override fun tokenId(token: String): Int? = bpe.encode(token, allowSpecial = true).singleOrNull()
}
