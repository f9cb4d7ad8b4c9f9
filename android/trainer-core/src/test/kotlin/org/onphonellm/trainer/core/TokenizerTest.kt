package org.onphonellm.trainer.core

import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Assumptions.assumeTrue
import org.junit.jupiter.api.Test
import java.io.File
import java.text.Normalizer

/**
 * The Kotlin byte-level BPE against the Python reference on the shared corpus
 * (shared_schemas/tokenizer_corpus: 984 cases, ids from tiktoken over the same ranks, = toolchain's
 * Hugging Face tokenizer). The Qwen2.5 tokenizer.json (4.6 MB) is not in the repository: android/test.sh
 * writes it with the venv's toolchain (`load_tokenizer('qwen2.5').to_json()`) and passes -Dqwen.tokenizer.
 */
class TokenizerTest {
    private val corpus = File(Fixtures.schemas, "tokenizer_corpus")

    companion object {
        internal val loaded: BpeTokenizer? by lazy {
            System.getProperty("qwen.tokenizer")?.let { File(it) }?.takeIf { it.isFile }?.let { BpeTokenizer.load(it) }
        }
    }

    private fun tokenizer(): BpeTokenizer {
        assumeTrue(loaded != null, "no Qwen2.5 tokenizer.json (android/test.sh writes it with .venv)")
        return loaded!!
    }

    private fun cases(): List<String> = File(corpus, "cases.jsonl").readLines(Charsets.UTF_8).filter { it.isNotBlank() }
        .map { (Json.parse(it) as Json.Str).value }

    private fun ids(key: String): List<List<Int>> {
        val doc = Fields.of(Json.parse(File(corpus, "qwen2.5_ids.json").readText()), "qwen2.5_ids.json")
        return doc.arr(key).map { row -> (row as Json.Arr).items.map { (it as Json.Num).asLongOrNull!!.toInt() } }
    }

    private fun compare(allowSpecial: Boolean, key: String) {
        val tok = tokenizer()
        val cases = cases()
        val want = ids(key)
        assertEquals(want.size, cases.size)
        val bad = cases.indices.filter { tok.encode(cases[it], allowSpecial) != want[it] }
        assertTrue(bad.isEmpty(), "${bad.size} of ${cases.size} cases differ ($key), first: case ${bad.firstOrNull()} " +
            bad.firstOrNull()?.let { "${Json.of(cases[it])}: got ${tok.encode(cases[it], allowSpecial)}, want ${want[it]}" })
    }

    @Test fun `ids equal the reference on the whole corpus`() = compare(true, "ids")

    @Test fun `ids without the added tokens equal the reference`() = compare(false, "ids_ordinary")

    @Test fun `decode gives the NFC text back on the whole corpus`() {
        val tok = tokenizer()
        val cases = cases()
        val want = ids("ids")
        val bad = cases.indices.filter {
            tok.decode(want[it]) != Normalizer.normalize(BpeTokenizer.sanitize(cases[it]), Normalizer.Form.NFC)
        }
        assertTrue(bad.isEmpty(), "${bad.size} cases decode differently, first: ${bad.firstOrNull()}")
    }

    @Test fun `special tokens, a lone surrogate, a partial UTF-8 sequence`() {
        val tok = tokenizer()
        assertEquals(listOf(151644), tok.encode("<|im_start|>"))
        assertEquals(151645, tok.tokenId("<|im_end|>"))
        val e = tok.encode("é")
        assertEquals("é", tok.decode(e))
        assertEquals("\uFFFD", tok.decode(tok.encode("\uD800")))
        val lead = tok.tokenId(BpeTokenizer.BYTE_TO_CHAR[0xC3])!!  // the first byte of "é" alone
        assertEquals("\uFFFD", tok.decode(listOf(lead)))
        assertEquals("a\uFFFDb", tok.decode(tok.encode("a") + lead + tok.encode("b")))
    }
}
