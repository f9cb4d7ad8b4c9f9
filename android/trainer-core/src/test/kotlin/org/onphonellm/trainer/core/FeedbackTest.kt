package org.onphonellm.trainer.core

import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertNull
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import java.io.File
import java.time.Instant
import kotlin.random.Random

class FeedbackTest {
    private val schema = Fields.of(Json.parse(File(Fixtures.schemas, "feedback.schema.json").readText()), "feedback.schema.json")

    @Test
    fun `the schema tables match feedback schema json`() {
        assertEquals(schema.strings("required"), FeedbackSchema.REQUIRED)
        val props = schema.obj("properties")
        assertEquals(props.obj.fields.keys.toList(), FeedbackSchema.FIELDS)
        assertEquals(props.obj("action").strings("enum"), FeedbackAction.WIRE)
        assertEquals(props.obj("messages").obj("items").obj("properties").obj("role").strings("enum"), FeedbackSchema.ROLES)
        assertEquals(props.obj("schema_version").long("const"), FeedbackSchema.VERSION.toLong())
        // The same pattern, spelled with \d here: equal on a spread of times, valid and not.
        val pattern = Regex(props.obj("time").string("pattern"))
        for (t in listOf("2026-12-07T09:30:00Z", "2026-12-07t10:31:07.250+01:00", "2026-02-31T23:59:60-05:30", "2026-12-07T24:00:00Z",
                "2026-13-07T09:30:00Z", "2026-12-07 09:30:00Z", "2026-12-07T09:30Z", "2026-12-07T09:30:00+0100", "2026-12-07T09:30:00.Z")) {
            assertEquals(pattern.matches(t), FeedbackSchema.RFC3339.matches(t), t)
        }
    }

    @Test
    fun `the schema's valid examples parse and every invalid one is refused`() {
        val lines = File(Fixtures.examples, "feedback.jsonl").readLines().filter { it.isNotBlank() }
        assertTrue(lines.size >= 3)
        lines.forEachIndexed { i, l -> FeedbackRecord.parse(l, "feedback.jsonl line ${i + 1}") }
        val bad = Fixtures.invalid("feedback_")
        assertTrue(bad.size >= 8, "${bad.size} invalid examples")
        for (f in bad) {
            val e = assertThrows<BadInput>(f.name) { FeedbackRecord.parse(f.readText().trim(), f.name) }
            assertTrue(e.message!!.startsWith(f.name), e.message)
        }
        // The two rules the schema states in words (toolchain data --feedback checks them too).
        assertThrows<BadInput> { FeedbackRecord.parse("""{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}],"response":"c","action":"accept","time":"2026-12-07T09:30:00Z"}""", "x") }
        assertThrows<BadInput> { FeedbackRecord.parse("""{"prompt":"a","response":"b","action":"edit","edited":"b","time":"2026-12-07T09:30:00Z"}""", "x") }
        assertThrows<BadInput> { FeedbackRecord.parse("""{"prompt":"","response":"b","action":"accept","time":"2026-12-07T09:30:00Z"}""", "x") }
    }

    @Test
    fun `RFC 3339 UTC times equal java time's for random instants`() {
        val rnd = Random(43)
        val cases = listOf(0L, -1L, 951_782_400_000L /* 2000-02-29 */, 4_107_542_399_999L /* 2099-12-31T23:59:59.999 */, -2_208_988_800_000L) +
            List(2000) { rnd.nextLong(-5_000_000_000_000L, 10_000_000_000_000L) }
        for (ms in cases) {
            val want = Instant.ofEpochMilli(ms).toString().let { s ->  // java.time drops a zero fraction: add it back
                val t = s.removeSuffix("Z")
                val frac = t.substringAfter('.', "")
                (if (frac.isEmpty()) "$t.000" else t.substringBefore('.') + "." + frac.padEnd(3, '0')) + "Z"
            }
            assertEquals(want, Rfc3339.utc(ms), "epoch ms $ms")
            assertTrue(FeedbackSchema.RFC3339.matches(Rfc3339.utc(ms)), "$ms")
        }
    }

    /** Where the records are left for android/test.sh's check with the schema itself (scripts/apps/check_feedback.py). */
    private fun interopFile(): File {
        val dir = System.getProperty("interop.dir")?.takeIf { it.isNotBlank() }?.let { File(it) } ?: Fixtures.tempDir()
        return File(dir.also { it.mkdirs() }, "feedback.jsonl").also { it.delete() }
    }

    @Test
    fun `keep, edit and discard under a generation each append one valid record, once per generation`() {
        val file = interopFile()
        var now = 1_796_636_400_250L  // 2026-12-07T09:40:00.250Z
        val fb = GenerationFeedback(FeedbackLog(file)) { now }
        assertNull(fb.pending)
        assertThrows<BadInput>("no generation yet") { fb.record(FeedbackAction.ACCEPT) }

        fb.generated("Dear Sam, thanks for", chat = false, response = " the quick reply.", complete = true)
        assertEquals(" the quick reply.", fb.pending!!.response)
        val keep = fb.record(FeedbackAction.ACCEPT)
        assertNull(fb.pending, "answered: the buttons go away")
        assertThrows<BadInput>("a second tap") { fb.record(FeedbackAction.REJECT) }
        assertEquals(1, file.readLines().size)

        now += 60_000
        fb.generated("Can we meet on Friday?", chat = true, response = "Yes, Friday works for me.", complete = true)
        assertThrows<BadInput>("an empty edit") { fb.record(FeedbackAction.EDIT, "") }
        assertEquals(1, file.readLines().size, "nothing written for a refused edit")
        val edit = fb.record(FeedbackAction.EDIT, "Friday works, see you at ten.")

        now += 60_000
        fb.generated("Notes for Monday:", chat = false, response = " buy milk", complete = true)
        val discard = fb.record(FeedbackAction.REJECT)

        now += 60_000
        fb.generated("Notes for Monday:", chat = false, response = " call Ann", complete = true)
        val unchanged = fb.record(FeedbackAction.EDIT, " call Ann")
        assertEquals(FeedbackAction.ACCEPT, unchanged.action, "an edit saved unchanged is a keep")
        assertNull(unchanged.edited)

        // Nothing to answer: a cancelled generation, an empty response, an empty prompt.
        fb.generated("Hi", chat = false, response = " there", complete = false)
        assertNull(fb.pending)
        fb.generated("Hi", chat = false, response = "", complete = true)
        assertNull(fb.pending)
        fb.generated("", chat = false, response = " there", complete = true)
        assertNull(fb.pending)

        val lines = file.readLines()
        assertEquals(4, lines.size)
        assertEquals("""{"schema_version":1,"prompt":"Dear Sam, thanks for","response":" the quick reply.","action":"accept","time":"2026-12-07T09:40:00.250Z"}""", lines[0])
        assertEquals("""{"schema_version":1,"messages":[{"role":"user","content":"Can we meet on Friday?"}],"response":"Yes, Friday works for me.","action":"edit","edited":"Friday works, see you at ten.","time":"2026-12-07T09:41:00.250Z"}""", lines[1])
        assertEquals(listOf(keep, edit, discard, unchanged), FeedbackLog(file).records())
        assertEquals("2 kept, 1 edited, 1 discarded", FeedbackLog.summary(FeedbackLog(file).counts()))
        lines.forEach { assertEquals(emptyList<String>(), FeedbackSchema.problems(Json.parse(it)), it) }
    }

    @Test
    fun `a line torn by a kill is cut off when the log is opened, and the next record is whole`() {
        val file = File(Fixtures.tempDir(), "feedback.jsonl")
        val fb = GenerationFeedback(FeedbackLog(file)) { 0L }
        fb.generated("a", chat = false, response = "b", complete = true)
        fb.record(FeedbackAction.ACCEPT)
        file.appendText("""{"schema_version":1,"prompt":"c","resp""")
        val log = FeedbackLog(file)
        assertEquals(1, log.records().size)
        val fb2 = GenerationFeedback(log) { 1000L }
        fb2.generated("c", chat = false, response = "d", complete = true)
        fb2.record(FeedbackAction.REJECT)
        assertEquals(listOf(FeedbackAction.ACCEPT, FeedbackAction.REJECT), FeedbackLog(file).records().map { it.action })
        file.appendText("not json\n")
        val e = assertThrows<BadInput> { FeedbackLog(file).records() }
        assertTrue(e.message!!.startsWith("feedback.jsonl line 3"), e.message)
    }
}
