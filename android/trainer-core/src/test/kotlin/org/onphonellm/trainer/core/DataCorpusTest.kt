package org.onphonellm.trainer.core

import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Assumptions.assumeTrue
import org.junit.jupiter.api.Test
import java.io.File
import java.math.BigInteger

/**
 * On-device data preparation against the host: every case of shared_schemas/data_corpus/cases.jsonl
 * (written by scripts/record_data_corpus.py from toolchain/shuffle.py, text_data.py, training/order.py):
 * SplitMix64 outputs, permutations, per-epoch row orders, held-out splits, LCSB plans of every policy
 * (toolchain/lcsb/plan.py make_plan, the random one included), text -> rows with the byte and Qwen2.5
 * tokenizers, chat -> rows with the Qwen chat template. The Qwen cases need the test-time Qwen2.5
 * tokenizer.json (android/test.sh writes it, as for TokenizerTest); without it they are skipped, counted.
 */
class DataCorpusTest {
    private val cases: List<Fields> = File(Fixtures.schemas, "data_corpus/cases.jsonl").readLines(Charsets.UTF_8)
        .filter { it.isNotBlank() }.mapIndexed { i, line -> Fields.of(Json.parse(line), "cases.jsonl:${i + 1}") }

    private fun qwen(): TextTokenizer? = TokenizerTest.loaded?.let { BpeTextTokenizer(it, "qwen2.5", 151643, 151643) }

    /** A JSON integer (any size, as Python writes it) modulo 2^64, as a Long. */
    private fun u64(v: Json): Long = BigInteger(when (v) { is Json.Str -> v.value; is Json.Num -> v.text; else -> error("$v") }).toLong()

    private fun ints(v: Json): List<Int> = (v as Json.Arr).items.map { (it as Json.Num).asLongOrNull!!.toInt() }

    /** Checks one case; false if it needs the Qwen tokenizer and it is absent. */
    private fun check(c: Fields, qwen: TextTokenizer?): Boolean {
        val where = c.where
        when (c.string("kind")) {
            "splitmix" -> {
                val rng = SplitMix64(u64(c.raw("seed")))
                assertEquals(c.strings("outputs"), c.strings("outputs").map { java.lang.Long.toUnsignedString(rng.next()) }, where)
            }
            "permutation" -> assertEquals(c.ints("perm"), permutation(c.int("n"), u64(c.raw("seed"))).toList(), where)
            "order" -> {
                val order = DataOrder(c.int("rows"), u64(c.raw("seed")))
                assertEquals(c.ints("order"), (0 until c.int("steps")).map { order.rowForStep(it.toLong()) }, where)
            }
            "lcsb_plan" -> {
                val seed = if (c.has("seed")) u64(c.raw("seed")) else null
                val warmup = c.optLong("warmup") ?: 0L  // absent: no warm-up
                val plan = StepPlan.make(c.int("layers"), c.int("k"), c.string("policy"), seed, c.optInt("period"), warmup)
                assertEquals(c.arr("phases").map { ints(it) }, plan.phases, "$where phases")
                assertEquals(c.ints("schedule"), plan.schedule, "$where schedule")
                assertEquals(warmup, plan.warmup, "$where warmup")
                if (c.has("layers_at")) c.obj("layers_at").obj.fields.forEach { (step, layers) ->
                    assertEquals(ints(layers).toSet(), plan.layersAt(step.toLong()), "$where layers_at[$step]")
                }
                assertEquals(c.string("policy"), plan.policy, where)
                assertEquals(if (c.string("policy") == "random") seed ?: 0L else null, plan.seed, "$where seed")
            }
            "split" -> assertEquals(c.ints("held"), TextRows.heldOutIndices(c.int("rows"), c.double("fraction"), u64(c.raw("seed"))), where)
            "text" -> {
                val tok = tokenizer(c.string("tokenizer"), qwen) ?: return false
                val rows = TextRows.textRows(c.string("text"), tok, c.int("seq_len"))
                assertEquals(c.arr("rows").map { ints(it) }, rows.map { it.inputIds.toList() }, where)
                rows.forEach { assertEquals(it.inputIds.toList(), it.labels.toList(), where) }
            }
            "chat" -> {
                val tok = tokenizer(c.string("tokenizer"), qwen) ?: return false
                val row = TextRows.chatRow(tok, TextRows.parseMessages(Json.Obj(mapOf("messages" to c.raw("messages"))), where), c.int("seq_len"), where)
                assertEquals(c.ints("input_ids"), row.inputIds.toList(), "$where input_ids")
                assertEquals(c.ints("labels"), row.labels.toList(), "$where labels")
            }
            else -> error("$where: unknown kind ${c.string("kind")}")
        }
        return true
    }

    private fun tokenizer(name: String, qwen: TextTokenizer?): TextTokenizer? = when (name) {
        "byte" -> ByteTokenizer()
        "qwen2.5" -> qwen
        else -> error("unknown tokenizer $name")
    }

    private fun needsQwen(c: Fields) = c.string("kind") in setOf("text", "chat") && c.string("tokenizer") == "qwen2.5"

    @Test fun `every case without the Qwen tokenizer equals the host`() {
        val mine = cases.filter { !needsQwen(it) }
        mine.forEach { assertTrue(check(it, null)) }
        // Every kind is there (a corpus that lost a kind would pass silently otherwise).
        assertEquals(setOf("splitmix", "permutation", "order", "split", "lcsb_plan", "text"), mine.map { it.string("kind") }.toSet())
        val plans = mine.filter { it.string("kind") == "lcsb_plan" }
        assertEquals(setOf("cyclic", "strided", "last", "anchored", "full", "random"), plans.map { it.string("policy") }.toSet())
        assertTrue(plans.any { it.string("policy") == "random" && !it.has("period") }, "a random case with the default period")
        assertTrue(plans.count { it.has("warmup") && it.has("layers_at") } >= 3, "plans with a warm-up and the layers around its end")
    }

    @Test fun `every Qwen25 text and chat case equals the host`() {
        val q = qwen()
        assumeTrue(q != null, "no Qwen2.5 tokenizer.json (android/test.sh writes it with .venv): ${cases.count { needsQwen(it) }} cases skipped")
        val mine = cases.filter { needsQwen(it) }
        assertTrue(mine.any { it.string("kind") == "chat" } && mine.any { it.string("kind") == "text" })
        mine.forEach { assertTrue(check(it, q)) }
    }

    @Test fun `a long conversation is an error naming its line, a chat line must be messages`() {
        val q = qwen()
        assumeTrue(q != null, "no Qwen2.5 tokenizer.json")
        val line = """{"messages": [{"role": "user", "content": "${"word ".repeat(40)}"}, {"role": "assistant", "content": "ok"}]}"""
        val e = assertThrows<BadInput> { TextRows.chatRows("\n$line\n", q!!, 16, "mine.jsonl") }
        assertTrue("mine.jsonl:2" in e.message!! && "seq_len 16" in e.message!!, e.message)
        val bad = assertThrows<BadInput> { TextRows.chatRows("""{"msgs": []}""", q!!, 64, "x.jsonl") }
        assertTrue("x.jsonl:1" in bad.message!!, bad.message)
        val noAssistant = assertThrows<BadInput> { TextRows.chatRows("""{"messages": [{"role": "user", "content": "hi"}]}""", q!!, 64, "y.jsonl") }
        assertTrue("assistant" in noAssistant.message!!, noAssistant.message)
        assertTrue(TextRows.looksLikeChat(line))
        assertTrue(!TextRows.looksLikeChat("just text {\"messages\"}"))
    }

    @Test fun `held-out split errors and file order`() {
        assertThrows<BadInput> { TextRows.heldOutIndices(3, 0.1, 0) }   // holds out 0
        assertThrows<BadInput> { TextRows.heldOutIndices(2, 0.9, 0) }   // holds out every row
        assertThrows<BadInput> { TextRows.heldOutIndices(10, 1.0, 0) }
        val (train, held) = TextRows.splitHeldOut((0 until 10).toList(), 0.3, 5)
        assertEquals(10, train.size + held.size)
        assertEquals(train.sorted(), train)
        assertEquals(held.sorted(), held)
        assertEquals(3, held.size)
    }

    @Test fun `byte tokenizer - text rows, BOM, a lone surrogate, windows share one token`() {
        val tok = ByteTokenizer()
        assertEquals(listOf(listOf(256, 97, 98, 99), listOf(99, 257)), TextRows.textRows("abc", tok, 4).map { it.inputIds.toList() })
        assertEquals(listOf(listOf(256, 97, 98, 257)), TextRows.textRows("ab", tok, 4).map { it.inputIds.toList() })  // 1-token remainder: none left
        assertEquals(listOf(0xEF, 0xBF, 0xBD), tok.encode("\uD800"))
        assertEquals("héllo", tok.decode(listOf(256) + tok.encode("héllo") + 257))
        val p = PreparedData.prepare("\uFEFFhello world, a few more words here", tok, 8, 264, 0.25, 1)
        assertEquals(p.rows, p.train.size + p.held.size)
        assertTrue(p.held.isNotEmpty() && !p.chat)
        assertEquals(TextRows.textRows("hello world, a few more words here", tok, 8).size, p.rows)  // the BOM is dropped
        val vocab = assertThrows<BadInput> { PreparedData.prepare("hi", tok, 8, 96, 0.0, 0) }
        assertTrue("vocabulary of 96" in vocab.message!!, vocab.message)
    }

    @Test fun `the program's tokenizer is chosen by the manifest's kind`() {
        val trace = Manifest.read(File(Fixtures.schemas, "traces/tiny/program"))
        val e = assertThrows<BadInput> { TextTokenizer.forProgram(trace) }
        assertTrue("without a tokenizer" in e.message!!, e.message)
        val doc = File(trace.dir, "manifest.json").readText().replace("\"kind\": \"none\"", "\"kind\": \"byte\"")
        val byte = Manifest.parse(trace.dir, Json.parse(doc), "byte manifest")
        assertEquals("byte", byte.tokenizerKind)
        assertTrue(TextTokenizer.forProgram(byte) is ByteTokenizer)
    }
}
