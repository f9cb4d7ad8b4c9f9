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
            assertThrows<ContractError>(bad) { Json.parse(bad) }
        }
        assertEquals(1L, (Json.parse("1.0") as Json.Num).asLongOrNull) // JSON Schema counts 1.0 as an integer
        assertNull((Json.parse("1.5") as Json.Num).asLongOrNull)
        assertThrows<IllegalArgumentException> { Json.of(Double.NaN) }
    }

    @Test
    fun `manifest example (version 2) drives the schedule, the state layout, the method signatures and memory prediction`() {
        assumeTrue(Fixtures.manifestExample.isFile, "shared_schemas/examples/manifest_v2_tiny.json not generated yet")
        val m = Manifest.load(Fixtures.manifestExample)
        assertTrue(m.methods.all { it.kind == "train_step" })
        // every method takes ids, labels, lr and the whole state, and returns the loss and entries in state order
        val entryNames = m.stateEntries.map { it.name }
        for (method in m.methods) {
            assertEquals(listOf("input_ids", "labels", "lr") + entryNames, method.inputs.map { it.name }, method.name)
            assertEquals("loss", method.outputs[0].name)
            assertEquals(entryNames.filter { it in method.updatedEntries }, method.updatedEntries, method.name)
            if (m.optimizer == "adamw") assertEquals(entryNames, method.updatedEntries, "AdamW moves every entry")
            else if (m.lcsb != null) assertTrue(method.updatedEntries.size < entryNames.size, "SGD + LCSB: a phase returns a subset")
        }
        assertEquals(m.stateEntries.sumOf { it.numel }, m.stateNumel)
        assertEquals(4L * m.stateNumel, m.loraStateBytes)
        assertTrue(m.stateInitFile in m.files)
        val sched = Schedule.fromManifest(m)
        val l = m.lcsb
        for (s in 0L until 10L) {
            val (name, phase) = sched.methodForStep(s)
            if (l == null) assertEquals("train_step" to null, name to phase)
            else assertEquals(l.schedule[(s % l.schedule.size).toInt()], phase)
            assertTrue(name in m.methodNames, name)
        }
        // params tile a prefix of the state; every entry lies inside it
        val params = m.stateEntries.filter { it.role == "param" }
        assertEquals(params.sumOf { it.numel }, params.maxOf { it.offset + it.numel })
        assertTrue(m.stateEntries.all { it.offset + it.numel <= m.stateNumel })
        assertTrue(m.predictedStepBytes() >= 4L * m.stateNumel)
        assertTrue(m.padTokenId in 0 until m.vocab)
    }

    @Test
    fun `manifest inconsistencies are refused with the reason`() {
        val good = Fixtures.manifestJson()
        Manifest.parse(good)
        Manifest.parse(Fixtures.manifestJson(optimizer = "adamw"))
        Manifest.parse(Fixtures.manifestJson(lcsb = false))
        @Suppress("UNCHECKED_CAST")
        fun edit(f: (MutableMap<String, Any?>) -> Unit): String {
            fun plain(j: Json): Any? = when (j) {
                is Json.Obj -> LinkedHashMap<String, Any?>().also { m -> j.fields.forEach { (k, v) -> m[k] = plain(v) } }
                is Json.Arr -> j.items.mapTo(ArrayList()) { plain(it) }
                is Json.Str -> j.value
                else -> j // numbers, booleans, null: Json.of takes them as they are
            }
            val root = plain(Json.parse(good)) as MutableMap<String, Any?>
            f(root)
            return JsonWriter.write(Json.of(root))
        }
        fun MutableMap<String, Any?>.map(key: String) = this[key] as MutableMap<String, Any?>
        fun MutableMap<String, Any?>.list(key: String) = this[key] as MutableList<Any?>
        fun MutableMap<String, Any?>.method(i: Int) = list("methods")[i] as MutableMap<String, Any?>
        fun MutableList<Any?>.obj(i: Int) = this[i] as MutableMap<String, Any?>
        val cases = mapOf(
            "no method 'train_step_p1'" to good.replace("\"train_step_p1\"", "\"train_step_x\""),
            "schema_version 1 (state inside the program, get_state/set_state) is retired" to edit { it["schema_version"] = 1 },
            "schema_version 3 is not 2; update the app" to edit { it["schema_version"] = 3 },
            "method train_step_p1 has kind 'get_state'" to edit { it.method(1)["kind"] = "get_state" },
            "past state.numel" to edit { st -> st.map("state").let { it["numel"] = 4 } },
            "missing required field 'seq_len'" to edit { it.remove("seq_len") },
            "missing required field 'init_file'" to edit { it.map("state").remove("init_file") },
            "state.init_file 'state_init.bin' is not listed in files" to edit { it.map("files").remove("state_init.bin") },
            "input 18 of method train_step_p0 is lora_3_v_proj_x float32[4, 2], the contract says lora_3_v_proj_b float32[4, 2]" to
                edit { it.method(0).list("inputs").obj(18)["name"] = "lora_3_v_proj_x" },
            "method train_step_p0 takes 10 inputs, the contract 19" to edit { m -> m.method(0).list("inputs").let { while (it.size > 10) it.removeAt(it.size - 1) } },
            "input 2 of method train_step_p1 is lr int64[1]" to edit { it.method(1).list("inputs").obj(2)["dtype"] = "int64" },
            "the first output of method train_step_p0 must be loss float32[1]" to edit { it.method(0).list("outputs").obj(0)["shape"] = listOf(2) },
            "output 'lora_9_q_proj_a' of method train_step_p0 is not a state entry" to edit { it.method(0).list("outputs").obj(1)["name"] = "lora_9_q_proj_a" },
            "outputs of method train_step_p0 are not in state.entries order (or repeat): 'lora_0_q_proj_a'" to
                edit { m -> m.method(0).list("outputs").let { o -> val a = o[1]; o[1] = o[2]; o[2] = a } },
            "output 'lora_0_q_proj_a' of method train_step_p0 is float32[3], the state entry float32[2, 8]" to
                edit { it.method(0).list("outputs").obj(1)["shape"] = listOf(3) },
        )
        for ((why, text) in cases) {
            val e = assertThrows<ContractError>(why) { Manifest.parse(text) }
            assertTrue(e.message!!.contains(why), "expected '$why' in: ${e.message}")
        }
    }

    @Test
    fun `program files are checked against the manifest's sha256 (a partial adb push is caught)`() {
        val dir = Fixtures.tempDir()
        fun sha(f: java.io.File) = java.security.MessageDigest.getInstance("SHA-256").digest(f.readBytes()).joinToString("") { "%02x".format(it) }
        val pte = java.io.File(dir, "model.pte").apply { writeBytes(ByteArray(100_000) { (it % 251).toByte() }) }
        val init = java.io.File(dir, "state_init.bin").apply { writeBytes(ByteArray(4 * 200) { (it % 7).toByte() }) }
        val m = Manifest.parse(Fixtures.manifestJson().replace("0".repeat(64), sha(pte)).replace("1".repeat(64), sha(init)))
        m.verifyFiles(dir)
        init.writeBytes(init.readBytes().copyOf(400)) // the state's initial values are checked like the program
        assertTrue(assertThrows<ContractError> { m.verifyFiles(dir) }.message!!.contains("state_init.bin does not match its sha256"))
        init.writeBytes(ByteArray(4 * 200) { (it % 7).toByte() })
        m.verifyFiles(dir)
        pte.writeBytes(pte.readBytes().copyOf(50_000)) // truncated push
        assertTrue(assertThrows<ContractError> { m.verifyFiles(dir) }.message!!.contains("does not match its sha256"))
        pte.delete()
        assertTrue(assertThrows<ContractError> { m.verifyFiles(dir) }.message!!.contains("model.pte is missing"))
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
        for (f in bad) assertThrows<ContractError>(f.name) { StepPlan.parse(f.readText(), f.name) }
    }

    @Test
    fun `a step plan maps onto the program's methods or is refused`() {
        val m = Fixtures.manifest(layers = 4)
        val reversed = StepPlan(4, "cyclic", 2, null, listOf(listOf(2, 3), listOf(0, 1)), listOf(0, 1, 1))
        val s = Schedule.fromPlan(m, reversed)
        assertEquals(listOf("train_step_p1", "train_step_p0", "train_step_p0", "train_step_p1"), (0L until 4L).map { s.methodForStep(it).first })
        assertEquals(1, s.methodForStep(0).second)
        val strided = StepPlan(4, "strided", 2, null, listOf(listOf(0, 2), listOf(1, 3)), listOf(0, 1))
        val e = assertThrows<ContractError> { Schedule.fromPlan(m, strided) }
        assertTrue(e.message!!.contains("has no method"), e.message)
        val full = Schedule.fromManifest(Fixtures.manifest(lcsb = false))
        assertEquals("train_step" to null, full.methodForStep(7))
    }

    @Test
    fun `data rows follow the data_row schema and pad as the contract says`() {
        val ex = Fixtures.examples("data_row")
        assertTrue(ex.isNotEmpty())
        for (f in ex) DataRow.parse(f.readText().trim(), f.name, vocab = 264, seqLen = 8)
        for (f in Fixtures.invalid("data_row_")) assertThrows<ContractError>(f.name) { DataRow.parse(f.readText().trim(), f.name, 264, 8) }
        val row = DataRow.parse("""{"input_ids":[72,101,108],"labels":[-100,101,108]}""", "row", 264, 5)
        val (ids, labels) = row.padded(5, 258)
        assertEquals(listOf(72L, 101L, 108L, 258L, 258L), ids.toList())
        assertEquals(listOf(-100L, 101L, 108L, -100L, -100L), labels.toList())
        assertEquals(2, row.tokens)
        val e = assertThrows<ContractError> { DataRow.parse("""{"input_ids":[1,2,3,4,5,6]}""", "line 3", 264, 5) }
        assertTrue(e.message!!.contains("--seq-len"), e.message)
        assertThrows<ContractError> { DataRow.parse("""{"input_ids":[1,300]}""", "row", 264, 5) }
        assertThrows<ContractError> { DataRow.parse("""{"input_ids":[1,2],"labels":[1]}""", "row", 264, 5) }
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
