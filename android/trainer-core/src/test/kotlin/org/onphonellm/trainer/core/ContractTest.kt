package org.onphonellm.trainer.core

import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertNull
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Assumptions.assumeTrue
import org.junit.jupiter.api.Test

/** The JSON files of shared_schemas/ as the app reads them: examples accepted, invalid/ refused. */
class ContractTest {
    @Test
    fun `json parser is strict and round-trips`() {
        val text = """{"a":[1,-2.5e-3,true,null,"q\"\\\n\u00e9"],"b":{"c":12345678901234567890}}"""
        assertEquals(text.replace("\\u00e9", "\u00e9"), JsonWriter.write(Json.parse(text)))
        for (bad in listOf("""{"a":NaN}""", "[1,]", """{"a":1,"a":2}""", "[Infinity]", "01", "{\"a\":1} x", "[" .repeat(70))) {
            assertThrows<BadInput>(bad) { Json.parse(bad) }
        }
        assertEquals(1L, (Json.parse("1.0") as Json.Num).asLongOrNull) // JSON Schema counts 1.0 as an integer
        assertNull((Json.parse("1.5") as Json.Num).asLongOrNull)
        assertThrows<IllegalArgumentException> { Json.of(Double.NaN) }
    }

    @Test
    fun `step plan examples parse and invalid plans are refused`() {
        val plans = Fixtures.examples("step_plan_")
        assertTrue(plans.size >= 4)
        for (f in plans) {
            val p = StepPlan.parse(f.readText(), f.name)
            assertTrue(p.schedule.all { it in p.phases.indices }, f.name)
        }
        val bad = Fixtures.invalid("step_plan_")
        assertTrue(bad.size >= 5)
        for (f in bad) assertThrows<BadInput>(f.name) { StepPlan.parse(f.readText(), f.name) }
    }

    @Test
    fun `data rows follow the data_row schema and pad as the contract says`() {
        val ex = Fixtures.examples("data_row")
        assertTrue(ex.isNotEmpty())
        for (f in ex) DataRow.parse(f.readText().trim(), f.name, vocab = 264, seqLen = 8)
        for (f in Fixtures.invalid("data_row_")) assertThrows<BadInput>(f.name) { DataRow.parse(f.readText().trim(), f.name, 264, 8) }
        val row = DataRow.parse("""{"input_ids":[72,101,108],"labels":[-100,101,108]}""", "row", 264, 5)
        val (ids, labels) = row.padded(5, 258)
        assertEquals(listOf(72L, 101L, 108L, 258L, 258L), ids.toList())
        assertEquals(listOf(-100L, 101L, 108L, -100L, -100L), labels.toList())
        assertEquals(2, row.tokens)
        val e = assertThrows<BadInput> { DataRow.parse("""{"input_ids":[1,2,3,4,5,6]}""", "line 3", 264, 5) }
        assertTrue(e.message!!.contains("--seq-len"), e.message)
        assertThrows<BadInput> { DataRow.parse("""{"input_ids":[1,300]}""", "row", 264, 5) }
        assertThrows<BadInput> { DataRow.parse("""{"input_ids":[1,2],"labels":[1]}""", "row", 264, 5) }
    }

    @Test
    fun `data order cycles the file, or a seeded permutation per epoch, as a function of the step`() {
        assertEquals(listOf(0, 1, 2, 0, 1, 2, 0), (0L until 7L).map { DataOrder(3, null).rowForStep(it) })
        val a = DataOrder(10, 5L)
        val epochs = (0 until 3).map { e -> (0 until 10).map { a.rowForStep(e * 10L + it) } }
        epochs.forEach { assertEquals((0 until 10).toList(), it.sorted()) }
        assertTrue(epochs[0] != epochs[1] && epochs[0] != (0 until 10).toList())
        // random access (a resumed run) sees the same rows as a sequential pass
        assertEquals(epochs[2][4], DataOrder(10, 5L).rowForStep(24))
        assertTrue(DataOrder(10, 6L).let { b -> (0 until 10).map { b.rowForStep(it.toLong()) } } != epochs[0])
    }
}
