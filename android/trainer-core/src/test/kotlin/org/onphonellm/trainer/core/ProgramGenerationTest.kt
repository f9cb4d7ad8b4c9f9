package org.onphonellm.trainer.core

import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertNull
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import java.io.File
import java.util.Collections

/**
 * Generate without a run (issue 42): which source a Generate request runs on ([GenerateTarget]), and a program's own
 * adapter generating the "before" side ([ProgramGeneration]) with the ids a training session's "before" gives on the
 * same program (SessionTest's runtime: outputs a pure function of the inputs' bytes, so equal ids mean equal state).
 */
class ProgramGenerationTest {
    private val programDir = File(Fixtures.schemas, "traces/tiny/program")
    private val program = Manifest.read(programDir)
    private val weights = MappedWeights.map(File(programDir, program.weightsFile))
    private val prompt = listOf(5, 7, 9)

    private fun run(base: File, runId: String, programName: String): RunDir {
        val rows = (0 until 4).map { i -> IntArray(10) { j -> (i * 7 + j * 3) % program.vocab }.let { DataRow(it, it.copyOf()) } }
        val spec = RunSpec(runId, programName, 2, 0.05, 1L shl 30, runInfo = mapOf("platform" to "android", "device_model" to "test",
            "os" to "Android 15 (API 35)", "total_ram_bytes" to 8_000_000_000L))
        return Runs(base).create(spec, PreparedData(rows, emptyList(), false))
    }

    @Test fun `a generate request takes the chosen program's latest run, else the program alone`() {
        val base = Fixtures.tempDir()
        val a = run(base, "run-a", "progA")
        assertTrue((GenerateTarget.resolve(a, "progA", "progA") as GenerateTarget.Run).dir === a)
        // A run's program may be written as a path (adb): its name is compared.
        assertTrue(GenerateTarget.resolve(a, "/sdcard/files/programs/progA", "progA") is GenerateTarget.Run)
        assertEquals("progB", (GenerateTarget.resolve(a, "progA", "progB") as GenerateTarget.Program).name, "the latest run is of another program")
        assertEquals("progB", (GenerateTarget.resolve(null, null, "progB") as GenerateTarget.Program).name, "no run at all")
        assertTrue(GenerateTarget.resolve(a, "progA", null) is GenerateTarget.Run, "adb without a program: the latest run")
        val e = assertThrows<BadInput> { GenerateTarget.resolve(null, null, null) }
        assertTrue("import a program" in e.message!!, e.message)
    }

    /** Every listener call, in order. */
    private class Recorder : GenerationListener {
        val events: MutableList<String> = Collections.synchronizedList(ArrayList())
        override fun onStart(which: String, stateStep: Long) { events.add("start $which $stateStep") }
        override fun onToken(which: String, token: GeneratedToken) { events.add("token $which ${token.index} ${token.id}") }
        override fun onDone(which: String, result: Generation) { events.add("done $which ${result.stopReason}") }
        override fun onSkipped(which: String, reason: String) { events.add("skipped $which") }
        override fun onError(error: Exception) { events.add("error $error") }
    }

    @Test fun `a program without a run generates before on its own adapter, the ids a session's before gives, and skips after`() {
        val g = ProgramGeneration(program, weights, SessionTest.HashRuntime(program))
        val rec = Recorder()
        val tok = ByteTokenizer()
        val c = g.compare(prompt, 4, emptySet(), tok, listener = rec)
        // The reference: a training session of a new run on the same program (its before is state_init.bin too).
        val s = TrainingSession(program, weights, SessionTest.HashRuntime(program), run(Fixtures.tempDir(), "ref", "tiny"),
            ScriptedProbe(listOf(50_000_000L)), FakeClock())
        val ref = s.compare(prompt, 4, emptySet(), tok)
        assertEquals(ref.before.ids, c.before.ids)
        assertEquals(4, c.before.ids.size)
        assertEquals(Prompts.decode(tok, c.before.ids, emptySet()), c.before.text)
        assertEquals(Pair(0L, StopReason.MAX_NEW_TOKENS), Pair(c.before.stateStep, c.before.stopReason))
        assertEquals(listOf("start before 0") + c.before.ids.mapIndexed { i, id -> "token before $i $id" } +
            "done before max_new_tokens" + "skipped after", rec.events)
        assertEquals(ProgramGeneration.NO_RUN, c.afterSkipped)
        assertEquals(emptyList<Int>(), c.after.ids)
        assertNull(ref.afterSkipped, "a session generates its after")
        // A second comparison on the same object: the same ids (the program's state is never trained).
        assertEquals(c.before.ids, g.compare(prompt, 4, emptySet()).before.ids)
    }

    @Test fun `on its own thread - a job streams, cancels within a token, and the thread closes`() {
        val runtime = SessionTest.HashRuntime(program)
        val g = ProgramGeneration(program, weights, runtime)
        val full = g.compare(prompt, 4, emptySet()).before.ids
        val threads = Collections.synchronizedSet(HashSet<String>())
        lateinit var job: GenerationJob
        val seen = Collections.synchronizedList(ArrayList<Int>())
        val started = java.util.concurrent.CountDownLatch(1)
        job = g.startComparison(prompt, 4, emptySet(), null, object : GenerationListener {
            override fun onToken(which: String, token: GeneratedToken) {
                started.await()
                threads.add(Thread.currentThread().name)
                seen.add(token.id)
                if (token.index == 1) job.cancel()
            }
        })
        started.countDown()
        val c = job.await(60_000)
        assertEquals(setOf("generate"), threads)
        assertEquals(StopReason.CANCELLED, c.before.stopReason)
        assertEquals(full.take(2), c.before.ids)
        assertEquals(c.before.ids, seen)
        assertTrue(g.closeGeneration(drainMs = 60_000))
        // Cancelled before it starts: no program call.
        val calls = runtime.calls
        val none = g.compare(prompt, 4, emptySet(), null, GenerationControl().also { it.cancel() })
        assertEquals(Pair(emptyList<Int>(), StopReason.CANCELLED), Pair(none.before.ids, none.before.stopReason))
        assertEquals(calls, runtime.calls)
        // A prompt with no room: the caller and the listener hear it.
        val errors = ArrayList<String>()
        val bad = g.startComparison(List(program.seqLen) { 1 }, 4, emptySet(), null, object : GenerationListener {
            override fun onError(error: Exception) { errors.add(error.javaClass.simpleName) }
        })
        assertTrue(assertThrows<BadInput> { bad.await(60_000) }.message!!.contains("no room"))
        assertEquals(listOf("BadInput"), errors)
        assertTrue(g.closeGeneration())
    }
}
