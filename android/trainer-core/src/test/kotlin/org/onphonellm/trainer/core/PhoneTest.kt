package org.onphonellm.trainer.core

import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertFalse
import org.junit.jupiter.api.Assertions.assertNotNull
import org.junit.jupiter.api.Assertions.assertNull
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import java.io.ByteArrayInputStream
import java.io.File
import java.io.InputStream

/** Issue 25, the app as a person meets it: import, verify once, saved screen state, capped reads, errors, charging runs. */
class PhoneTest {
    private val programSrc = File(Fixtures.schemas, "traces/tiny/program")

    /** The trace program as a picked folder that counts the bytes read (the import hashes as it copies: one read per file). */
    private class CountingSource(root: File) : ImportSource {
        val dir = ImportSource.Directory(root)
        var bytesRead = 0L
        val opened = ArrayList<String>()
        override fun list() = dir.list()
        override fun open(path: String): InputStream {
            opened.add(path)
            val ins = dir.open(path)
            return object : InputStream() {
                override fun read(): Int = ins.read().also { if (it >= 0) bytesRead++ }
                override fun read(b: ByteArray, off: Int, len: Int): Int = ins.read(b, off, len).also { if (it > 0) bytesRead += it }
                override fun close() = ins.close()
            }
        }
    }

    private fun copyOf(src: File): File = Fixtures.tempDir().also { src.copyRecursively(File(it, "p")) }.let { File(it, "p") }

    @Test fun `import copies the program folder, checks it as it copies, reports progress, and its first start hashes nothing`() {
        val apps = Fixtures.tempDir()
        val programs = File(apps, "programs")
        val cache = VerifyCache(File(apps, "verified"))
        val src = CountingSource(programSrc)
        val seen = ArrayList<Pair<Long, Long>>()
        val p = ProgramImport.import(src, programs, "tiny", cache, freeBytes = 1L shl 40, progress = { c, t -> seen.add(Pair(c, t)) })
        assertEquals(File(programs, "tiny"), p.dir)
        val total = p.files.keys.sumOf { File(programSrc, it).length() }
        assertEquals(total + File(programSrc, "manifest.json").length(), src.bytesRead, "every file read exactly once")
        for (f in p.files.keys) assertEquals(File(programSrc, f).readBytes().toList(), File(p.dir, f).readBytes().toList(), f)
        assertEquals(Pair(0L, total), seen.first())
        assertEquals(Pair(total, total), seen.last())
        assertTrue(seen.zipWithNext().all { (a, b) -> b.first >= a.first }, "progress only grows")
        assertEquals(listOf("tiny"), ProgramImport.list(programs), "no temporary directory listed")
        // Verified by the import: the start does not hash the files again.
        assertTrue(cache.isVerified(p))
        assertFalse(cache.verifyOnce(Manifest.read(p.dir)), "already verified")
    }

    @Test fun `a folder that is not a program, or lacks or changes a file, is refused and leaves nothing behind`() {
        val programs = File(Fixtures.tempDir(), "programs")
        val cache = VerifyCache(File(programs.parentFile, "verified"))
        // Not a program: the folder above it is named.
        val parent = programSrc.parentFile
        val e0 = assertThrows<BadInput> { ProgramImport.import(ImportSource.Directory(parent), programs, "x", cache) }
        assertTrue("pick its folder program" in e0.message!!, e0.message)
        // A file missing.
        val missing = copyOf(programSrc).also { File(it, "model.pte").delete() }
        val e1 = assertThrows<BadInput> { ProgramImport.import(ImportSource.Directory(missing), programs, "x", cache) }
        assertTrue("lacks model.pte" in e1.message!!, e1.message)
        // A file changed (a partial copy): refused after hashing it, no program and no temporary directory left.
        val changed = copyOf(programSrc).also { f -> File(f, "state_init.bin").let { it.writeBytes(it.readBytes().also { b -> b[0] = (b[0] + 1).toByte() }) } }
        val e2 = assertThrows<BadInput> { ProgramImport.import(ImportSource.Directory(changed), programs, "x", cache) }
        assertTrue("state_init.bin does not match" in e2.message!!, e2.message)
        assertEquals(emptyList<String>(), programs.list()!!.toList())
        // Too little space: refused before copying.
        val e3 = assertThrows<java.io.IOException> { ProgramImport.import(ImportSource.Directory(programSrc), programs, "x", cache, freeBytes = 1000) }
        assertTrue("only 0 MB are free" in e3.message!!, e3.message)
        // Cancelled: nothing left.
        assertThrows<ProgramImport.Cancelled> { ProgramImport.import(ImportSource.Directory(programSrc), programs, "x", cache, cancelled = { true }) }
        assertEquals(emptyList<String>(), programs.list()!!.toList())
        // A bad name.
        assertThrows<BadInput> { ProgramImport.import(ImportSource.Directory(programSrc), programs, "../x", cache) }
        assertEquals("my_program_2", ProgramImport.safeName("my program 2"))
    }

    @Test fun `a failed re-import keeps the program already there, a good one replaces it`() {
        val programs = File(Fixtures.tempDir(), "programs")
        val cache = VerifyCache(File(programs.parentFile, "verified"))
        ProgramImport.import(ImportSource.Directory(programSrc), programs, "tiny", cache)
        val broken = copyOf(programSrc).also { File(it, "weights.safetensors").appendBytes(byteArrayOf(1)) }
        assertThrows<BadInput> { ProgramImport.import(ImportSource.Directory(broken), programs, "tiny", cache) }
        assertTrue(cache.isVerified(Manifest.read(File(programs, "tiny"))), "the old copy and its record stand")
        ProgramImport.import(ImportSource.Directory(programSrc), programs, "tiny", cache)
        assertEquals(listOf("tiny"), ProgramImport.list(programs))
    }

    @Test fun `verify once - keyed on the manifest's checksums, again when a file or the manifest changes`() {
        val dir = copyOf(programSrc)
        val cache = VerifyCache(File(Fixtures.tempDir(), "verified"))
        val p = Manifest.read(dir)
        assertFalse(cache.isVerified(p))
        assertTrue(cache.verifyOnce(p), "first start hashes")
        assertFalse(cache.verifyOnce(Manifest.read(dir)), "second start does not")
        // A file pushed again (size / time changed): hashed again, and a mismatch is caught, leaving no record.
        val st = File(dir, "state_init.bin")
        st.writeBytes(st.readBytes().also { it[0] = (it[0] + 1).toByte() })
        st.setLastModified(st.lastModified() + 5000)
        assertThrows<BadInput> { cache.verifyOnce(Manifest.read(dir)) }
        assertFalse(cache.recordFile(dir).exists())
        File(programSrc, "state_init.bin").copyTo(st, overwrite = true)
        assertTrue(cache.verifyOnce(Manifest.read(dir)))
        // A re-export with other checksums: the key differs, the record does not hold.
        val m = File(dir, "manifest.json")
        val sha = p.files.getValue("model.pte")
        m.writeText(m.readText().replace(sha, "0".repeat(64)))
        assertFalse(cache.isVerified(Manifest.read(dir)))
        assertThrows<BadInput> { cache.verifyOnce(Manifest.read(dir)) }
        assertTrue(VerifyCache.key(p) != VerifyCache.key(Manifest.read(dir)))
    }

    @Test fun `the screen state survives a round trip, a long text through a file`() {
        val spill = Fixtures.tempDir()
        val picked = File(spill, "picked.txt").also { it.writeText("my notes") }
        val s = ScreenState("tiny", "pasted", picked.path, "notes.txt", "200", "0.2", "2", "strided", true, "Once", "12 rows", true)
        val saved = s.save(spill)
        assertEquals(s, ScreenState.restore(saved))
        assertEquals("my notes", ScreenState.restore(saved).pickedText())
        assertEquals(ScreenState(), ScreenState.restore(emptyMap()))
        val long = "x".repeat(ScreenState.SPILL_CHARS + 1)
        val saved2 = s.copy(input = long).save(spill)
        assertNull(saved2["input"])
        assertTrue(saved2.values.sumOf { it.length } < 10_000, "the Bundle stays small")
        assertEquals(long, ScreenState.restore(saved2).input)
        // The picked file gone (cache cleared): restored without it, not failing.
        picked.delete()
        assertNull(ScreenState.restore(saved).pickedPath)
    }

    @Test fun `picked text is capped with a clear message, counted when the size is unknown, and must be UTF-8`() {
        assertEquals("héllo", TextImport.read(ByteArrayInputStream("héllo".toByteArray()), 6, capBytes = 100))
        val e = assertThrows<TextImport.TooLarge> { TextImport.read(ByteArrayInputStream(ByteArray(10)), 50L shl 20, capBytes = 16L shl 20, what = "notes.txt") }
        assertTrue(e.message!!.startsWith("notes.txt is 50.0 MB; the app reads texts up to 16 MB"), e.message)
        var read = 0
        val endless = object : InputStream() {
            override fun read(): Int = 65.also { read++ }
            override fun read(b: ByteArray, off: Int, len: Int): Int { java.util.Arrays.fill(b, off, off + len, 65); read += len; return len }
        }
        assertThrows<TextImport.TooLarge> { TextImport.read(endless, null, capBytes = 1L shl 20) }
        assertTrue(read <= (1 shl 20) + (1 shl 16), "stopped reading at the cap ($read bytes)")
        assertThrows<IllegalArgumentException> { TextImport.read(ByteArrayInputStream(byteArrayOf(0xff.toByte(), 0xfe.toByte())), 2, 100) }
    }

    @Test fun `errors carry ExecuTorch's log lines, on screen and as telemetry error events valid against the schema`() {
        val lines = (1..100).map { "E 00:00:12.$it method.cpp:1304] Error setting input $it" } + listOf("", "x".repeat(5000))
        val r = ErrorReport("ExecutorchRuntimeException: block_backward failed (0x12)", lines, StartPhase.LOADING)
        assertEquals(EventSchema.MAX_LOG_LINES, r.kept.size)
        assertEquals(EventSchema.MAX_LOG_LINE, r.kept.last().length)
        val shown = r.display(3)
        assertTrue(shown.startsWith("failed while loading the methods: ExecutorchRuntimeException"), shown)
        assertEquals(1 + 1 + 3, shown.lines().size)
        val runDir = RunDir(Fixtures.tempDir())
        val ev = r.record(runDir, FakeClock(), fatal = true, step = 3)
        assertEquals(emptyList<String>(), EventSchema.problems(ev))
        assertEquals(0L, (ev["seq"] as Json.Num).asLongOrNull)
        assertEquals(r.kept, (ev["log"] as Json.Arr).items.map { (it as Json.Str).value })
        val ev2 = ErrorReport("no log").record(runDir, FakeClock(), fatal = false)
        assertEquals(1L, (ev2["seq"] as Json.Num).asLongOrNull)
        assertNull(ev2["log"])
        assertEquals(emptyList<String>(), EventSchema.problems(ev2))
        // The schema refuses what the report never writes.
        val tooMany = Json.of(ErrorReport("m").eventFields(true) + mapOf("schema_version" to 1, "type" to "error", "run_id" to "r", "seq" to 0, "timestamp" to 1.0,
            "log" to (1..65).map { "l" }))
        assertTrue(EventSchema.problems(tooMany).isNotEmpty())
    }

    @Test fun `a charging window resumes the latest unfinished run and stops at a step boundary when it ends`() {
        val base = Fixtures.tempDir()
        val runs = Runs(base)
        assertEquals(ChargingRuns.Decision.Skip("no run to resume: start one in the app"), ChargingRuns.decide(true, runs, false, true, 80.0))
        val spec = RunSpec("run-a", "tiny", 10, 1e-3, 1L shl 30)
        val run = runs.create(spec, PreparedData(emptyList(), emptyList(), false))
        assertEquals(ChargingRuns.Decision.Resume("run-a"), ChargingRuns.decide(true, runs, false, true, 80.0))
        assertTrue(ChargingRuns.decide(false, runs, false, true, 80.0) is ChargingRuns.Decision.Skip, "switch off")
        assertTrue(ChargingRuns.decide(true, runs, true, true, 80.0) is ChargingRuns.Decision.Skip, "already training")
        assertTrue(ChargingRuns.decide(true, runs, false, false, 80.0) is ChargingRuns.Decision.Skip, "not charging")
        assertTrue(ChargingRuns.decide(true, runs, false, true, 5.0) is ChargingRuns.Decision.Skip, "battery low")
        // Paused (a window ended): resumed next time; completed: not.
        val rec = TelemetryRecorder("run-a", EventLog(run.telemetry), FakeClock(), 0)
        rec.emit("run_end", mapOf("status" to "paused", "steps_completed" to 4))
        assertEquals(ChargingRuns.Decision.Resume("run-a"), ChargingRuns.decide(true, runs, false, true, null))
        rec.emit("run_end", mapOf("status" to "completed", "steps_completed" to 10))
        assertTrue(ChargingRuns.decide(true, runs, false, true, null) is ChargingRuns.Decision.Skip)
        // The control: the window's end or the user's stop, whichever first.
        var ended = false
        var user = false
        val c = ChargingRuns.control({ ended }, { user })
        assertFalse(c.stopRequested())
        ended = true
        assertTrue(c.stopRequested())
        ended = false; user = true
        assertTrue(c.stopRequested())
        assertTrue(ChargingRuns.REQUIRES_CHARGING && ChargingRuns.REQUIRES_IDLE)
    }
}
