package org.onphonellm.trainer.core

import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertFalse
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Assumptions.assumeTrue
import org.junit.jupiter.api.Test
import java.io.File
import java.util.Collections
import java.util.concurrent.CountDownLatch
import java.util.concurrent.TimeUnit
import java.util.concurrent.atomic.AtomicBoolean
import java.util.concurrent.atomic.AtomicInteger
import java.util.concurrent.atomic.AtomicLong
import java.util.concurrent.atomic.AtomicReference
import kotlin.random.Random

/**
 * Streaming generation: the text of the ids as they come ([IncrementalTextDecoder]: never a character half decoded, the
 * pieces add up to the whole decode), and the session's before / after comparison streamed, cancelled, and
 * run on its own thread while the session trains (progress keeps coming; "after" runs on the state of a whole
 * step). The program is the trace's, with SessionTest's runtime (outputs a pure function of the inputs'
 * bytes), so a generation's ids say exactly which state it read. The loop's own streaming and cancel against
 * the host's recorded ExecuTorch calls are ReplayTest's.
 */
class GenerationTest {
    private val programDir = File(Fixtures.schemas, "traces/tiny/program")
    private val program = Manifest.read(programDir)
    private val weights = MappedWeights.map(File(programDir, program.weightsFile))
    private val prompt = listOf(5, 7, 9)

    /** Ids are byte strings (any bytes): characters split across tokens as a byte-level BPE splits them, and invalid UTF-8. */
    private class PieceTokenizer(val pieces: List<ByteArray>) : TextTokenizer {
        override val kind = "pieces"
        override val bosId: Int? = null
        override val eosId = pieces.size
        override val padId = pieces.size
        override fun encode(text: String, allowSpecial: Boolean): List<Int> = error("decode only")
        override fun decode(ids: List<Int>): String = String(decodeBytes(ids), Charsets.UTF_8)
        override fun decodeBytes(ids: List<Int>): ByteArray = ids.filter { it < pieces.size }.flatMap { pieces[it].toList() }.toByteArray()
        override fun tokenId(token: String): Int? = null
    }

    /** A piece shows a broken character: U+FFFD, or half a surrogate pair at either end. */
    private fun broken(piece: String) = '\uFFFD' in piece || (piece.isNotEmpty() && (piece.last().isHighSurrogate() || piece.first().isLowSurrogate()))

    /** The pieces of [ids] (one per id, then finish's) and the stream's text. */
    private fun stream(tok: TextTokenizer, ids: List<Int>, skip: Set<Int> = emptySet()): Pair<List<String>, String> {
        val s = IncrementalTextDecoder(tok, skip)
        val pieces = ids.map { s.push(it) } + s.finish()
        return Pair(pieces, s.textSoFar)
    }

    @Test fun `byte tokens - each character shows when its last byte arrives, never broken`() {
        val tok = ByteTokenizer()
        for (text in listOf("plain ascii", "h\u00e9llo w\u00f6rld", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8", "emoji \ud83c\udf89\ud83d\udc4d\ud83c\udffd and \ud834\udd1e", "mix \u00e9\u65e5\ud83c\udf89a")) {
            val ids = tok.encode(text, allowSpecial = false)
            val (pieces, all) = stream(tok, ids)
            assertEquals(text, all)
            assertEquals(text, pieces.joinToString(""))
            assertEquals("", pieces.last(), "nothing left at the end of valid text")
            pieces.forEach { assertFalse(broken(it), "piece ${Json.of(it)} of ${Json.of(text)}") }
            // Text comes exactly at the last byte of each character (the next byte is not a continuation byte).
            val bytes = text.toByteArray(Charsets.UTF_8)
            val ends = bytes.indices.filter { i -> i + 1 == bytes.size || (bytes[i + 1].toInt() and 0xC0) != 0x80 }
            assertEquals(ends, pieces.dropLast(1).indices.filter { pieces[it].isNotEmpty() }, Json.of(text).toString())
        }
    }

    @Test fun `random tokens - valid text is never broken, any bytes concatenate to the whole decode`() {
        val rng = Random(20260501)
        val chars = listOf("a", "Z", " ", "\n", "\u00e9", "\u00df", "\u20ac", "\u65e5", "\ud83c\udf89", "\ud834\udd1e", "\u0301")
        var splits = 0
        repeat(400) { round ->
            val valid = round % 2 == 0
            val bytes = if (valid) (0 until rng.nextInt(1, 40)).joinToString("") { chars[rng.nextInt(chars.size)] }.toByteArray(Charsets.UTF_8)
                else ByteArray(rng.nextInt(1, 40)) { rng.nextInt(256).toByte() }
            // Cut into tokens of 1 to 4 bytes.
            val pieces = ArrayList<ByteArray>()
            var at = 0
            while (at < bytes.size) { val n = minOf(bytes.size - at, rng.nextInt(1, 5)); pieces.add(bytes.copyOfRange(at, at + n)); at += n }
            val tok = PieceTokenizer(pieces)
            val ids = pieces.indices.toList()
            val (out, all) = stream(tok, ids)
            val whole = String(bytes, Charsets.UTF_8)
            assertEquals(whole, out.joinToString(""), "round $round")
            assertEquals(whole, all)
            assertEquals(tok.decode(ids), all)
            if (valid) {
                out.forEach { assertFalse(broken(it), "round $round: piece ${Json.of(it)}") }
                splits += out.count { it.isEmpty() }
            }
        }
        assertTrue(splits > 100, "characters split across tokens: $splits")
    }

    @Test fun `a stop id adds no text - the stream equals Prompts decode`() {
        val tok = ByteTokenizer()
        val ids = tok.encode("ab \u65e5", allowSpecial = false) + ByteTokenizer.EOS
        val (pieces, all) = stream(tok, ids, setOf(ByteTokenizer.EOS))
        assertEquals(Prompts.decode(tok, ids, setOf(ByteTokenizer.EOS)), all)
        assertEquals("ab \u65e5", pieces.joinToString(""))
        assertEquals(tok.decode(ids), String(tok.decodeBytes(ids), Charsets.UTF_8))
    }

    @Test fun `Qwen2_5 BPE - the corpus streamed token by token equals decode, characters never broken`() {
        val bpe = TokenizerTest.loaded
        assumeTrue(bpe != null, "no Qwen2.5 tokenizer.json (android/test.sh writes it with .venv)")
        val tok = BpeTextTokenizer(bpe!!, "qwen2.5", 151643, 151643)
        val doc = Fields.of(Json.parse(File(Fixtures.schemas, "tokenizer_corpus/qwen2.5_ids.json").readText()), "qwen2.5_ids.json")
        val all = doc.arr("ids").map { row -> (row as Json.Arr).items.map { (it as Json.Num).asLongOrNull!!.toInt() } }
        var split = 0
        for ((i, ids) in all.withIndex()) {
            val whole = tok.decode(ids)
            assertEquals(whole, String(tok.decodeBytes(ids), Charsets.UTF_8), "case $i: decode = decodeBytes")
            val (pieces, text) = stream(tok, ids)
            assertEquals(whole, text, "case $i")
            assertEquals(whole, pieces.joinToString(""), "case $i")
            if ('\uFFFD' !in whole) pieces.forEach { assertFalse(broken(it), "case $i: piece ${Json.of(it)}") }
            split += ids.indices.count { pieces[it].isEmpty() && tok.decodeBytes(listOf(ids[it])).isNotEmpty() }
        }
        assertTrue(split > 0, "the corpus has characters split across tokens")
    }

    @Test fun `a prefill chunk's cache rows go to rows pos to pos + C - 1 of each kv head, those past seq_len dropped`() {
        // k_new / v_new [Hk, C, D] valued 1000 h + 10 r + (0 for k, 5 for v) + 1 (r the chunk's row); the rest zero.
        val runtime = object : ProgramRuntime {
            override fun execute(method: String, inputs: List<TensorBuffer>): List<TensorBuffer> = program.method(method).outputs.map { io ->
                val b = java.nio.ByteBuffer.allocateDirect(4 * io.numel).order(java.nio.ByteOrder.LITTLE_ENDIAN)
                if (io.bind == "cache") for (h in 0 until io.shape[0]) for (r in 0 until io.shape[1]) for (d in 0 until io.shape[2])
                    b.putFloat(4 * ((h * io.shape[1] + r) * io.shape[2] + d), 1000f * h + 10f * r + (if (io.name == "k_new") 0f else 5f) + 1f)
                TensorBuffer(io.name, io.dtype, io.shape, b)
            }
        }
        val loop = LayerLoop(program, weights, runtime)
        val c = program.prefillChunk
        val s = program.seqLen
        val xShape = program.method("block_prefill").inputs.first { it.name == "x" }.shape
        assertEquals(c, xShape[0])
        val x = TensorBuffer.floats("x", xShape, FloatArray(xShape[0] * xShape[1]))
        for (pos in listOf(4, s - 1)) {
            val cache = loop.newCache()
            loop.call("block_prefill", 1, mapOf("x" to x, "pos" to TensorBuffer.longs("pos", listOf(1), longArrayOf(pos.toLong()))), cache, pos)
            for ((name, off) in listOf("k_1" to 1f, "v_1" to 6f)) {
                val t = cache.getValue(name)
                val (hk, dh) = Pair(t.shape[0], t.shape[2])
                for (h in 0 until hk) for (row in 0 until s) for (d in 0 until dh) {
                    val r = row - pos
                    val want = if (r in 0 until c) 1000f * h + 10f * r + off else 0f
                    assertEquals(want, t.float((h * s + row) * dh + d), "$name head $h row $row (chunk at $pos)")
                }
                assertTrue(cache.keys.filter { !it.endsWith("_1") }.all { k -> cache.getValue(k).floats().all { it == 0f } }, "other layers untouched")
            }
        }
    }

    // --- the session -----------------------------------------------------------------------------------

    private fun rows(n: Int, seed: Int): List<DataRow> = (0 until n).map { i ->
        val ids = IntArray(10 + (i % 5)) { j -> (seed * 31 + i * 7 + j * 3) % program.vocab }
        DataRow(ids, ids.copyOf())
    }

    private fun newRun(runId: String, steps: Long): RunDir {
        val spec = RunSpec(runId, "tiny", steps, 0.05, 1L shl 30, checkpointEvery = 2, shuffleSeed = 7, lcsbPolicy = "cyclic", lcsbK = 1,
            heldOut = 0.25, heldOutSeed = 3, runInfo = mapOf("platform" to "android", "device_model" to "test", "os" to "Android 15 (API 35)",
                "total_ram_bytes" to 8_000_000_000L))
        val (train, held) = TextRows.splitHeldOut(rows(8, 1), 0.25, 3)
        return Runs(Fixtures.tempDir()).create(spec, PreparedData(train, held, false))
    }

    private fun session(dir: RunDir, runtime: ProgramRuntime = SessionTest.HashRuntime(program), listener: SessionListener = object : SessionListener {}) =
        TrainingSession(program, weights, runtime, dir, ScriptedProbe(listOf(50_000_000L)), FakeClock(), listener)

    /** What a fresh loop generates on [state] (null: state_init.bin), with its own runtime. */
    private fun expected(state: StateBuffer?, n: Int = 4): List<Int> =
        LayerLoop(program, weights, SessionTest.HashRuntime(program), state ?: StateBuffer(program).also { it.loadInit() }).generate(prompt, n)

    /** Every listener call, in order. */
    private class Recorder : GenerationListener {
        val events: MutableList<String> = Collections.synchronizedList(ArrayList())
        val tokens: MutableList<Pair<String, GeneratedToken>> = Collections.synchronizedList(ArrayList())
        override fun onStart(which: String, stateStep: Long) { events.add("start $which $stateStep") }
        override fun onToken(which: String, token: GeneratedToken) { events.add("token $which ${token.index}"); tokens.add(Pair(which, token)) }
        override fun onDone(which: String, result: Generation) { events.add("done $which ${result.stopReason}") }
        override fun onError(error: Exception) { events.add("error $error") }
        fun ids(which: String) = tokens.filter { it.first == which }.map { it.second.id }
        fun text(which: String) = tokens.filter { it.first == which }.joinToString("") { it.second.text }
    }

    @Test fun `a comparison streams before then after, token by token, text as it comes`() {
        val s = session(newRun("cmp", 6))
        assertEquals(RunStatus.COMPLETED, s.run().status)
        val rec = Recorder()
        val tok = ByteTokenizer()
        val c = s.compare(prompt, 4, emptySet(), tok, listener = rec)
        assertEquals(listOf("start before 0") + (0..3).map { "token before $it" } + "done before max_new_tokens" +
            "start after 6" + (0..3).map { "token after $it" } + "done after max_new_tokens", rec.events)
        assertEquals(expected(null), c.before.ids, "before: the initial adapter")
        assertEquals(expected(s.loop.state), c.after.ids, "after: the trained state")
        assertEquals(Pair(0L, 6L), Pair(c.before.stateStep, c.after.stateStep))
        for (side in listOf(c.before, c.after)) {
            assertEquals(side.ids, rec.ids(side.which), "${side.which}: streamed ids = the result's, in order")
            assertEquals(Prompts.decode(tok, side.ids, emptySet()), side.text)
            assertEquals(side.text, rec.text(side.which))
            assertEquals(StopReason.MAX_NEW_TOKENS, side.stopReason)
        }
        assertEquals(Pair(c.before.ids, c.after.ids), s.generateBoth(prompt, 4, emptySet()))
        // Without a tokenizer: ids only.
        assertEquals(null, s.compare(prompt, 2, emptySet()).after.text)
        // Asked before run() or loadState(): after reads the run's checkpoint (here the last step's), not an empty state.
        val idle = session(s.runDir).compare(prompt, 4, emptySet())
        assertEquals(Pair(6L, c.after.ids), Pair(idle.after.stateStep, idle.after.ids))
        val unstarted = session(newRun("new", 6)).compare(prompt, 4, emptySet())
        assertEquals(Pair(0L, expected(null)), Pair(unstarted.after.stateStep, unstarted.after.ids))
    }

    @Test fun `cancel - before stops with the tokens so far, after makes no call, cancelled before the start nothing runs`() {
        val runtime = SessionTest.HashRuntime(program)
        val s = session(newRun("cancel", 2), runtime)
        assertEquals(RunStatus.COMPLETED, s.run().status)
        val control = GenerationControl()
        val rec = object : GenerationListener {
            val seen = ArrayList<Int>()
            override fun onToken(which: String, token: GeneratedToken) { seen.add(token.id); if (which == "before" && token.index == 1) control.cancel() }
        }
        val calls0 = runtime.calls
        val c = s.compare(prompt, 4, emptySet(), ByteTokenizer(), control, rec)
        assertEquals(StopReason.CANCELLED, c.before.stopReason)
        assertEquals(expected(null).take(2), c.before.ids)
        assertEquals(c.before.ids, rec.seen)
        assertEquals(Triple(emptyList<Int>(), StopReason.CANCELLED, null as Long?), Triple(c.after.ids, c.after.stopReason, c.after.stateStep))
        val layers = program.layers
        val chunks = (prompt.size + program.prefillChunk - 1) / program.prefillChunk
        assertEquals((chunks * (1 + layers) + 1) + (2 + layers), runtime.calls - calls0, "the prefill and one decode step of before, nothing of after")
        // Cancelled before it starts.
        val calls1 = runtime.calls
        val none = s.compare(prompt, 4, emptySet(), ByteTokenizer(), GenerationControl().also { it.cancel() })
        assertEquals(listOf(StopReason.CANCELLED, StopReason.CANCELLED), listOf(none.before.stopReason, none.after.stopReason))
        assertEquals(Pair(emptyList<Int>(), emptyList<Int>()), Pair(none.before.ids, none.after.ids))
        assertEquals(calls1, runtime.calls, "no program call")
        // Through a job on the generation thread, cancelled from its listener.
        val job = AtomicReference<GenerationJob>()
        val started = CountDownLatch(1)
        val j = s.startComparison(prompt, 4, emptySet(), ByteTokenizer(), object : GenerationListener {
            override fun onToken(which: String, token: GeneratedToken) {
                started.await(10, TimeUnit.SECONDS)
                if (which == "after" && token.index == 0) job.get().cancel()
            }
        })
        job.set(j)
        started.countDown()
        val r = j.await(60_000)
        assertEquals(StopReason.MAX_NEW_TOKENS, r.before.stopReason)
        assertEquals(Pair(StopReason.CANCELLED, 1), Pair(r.after.stopReason, r.after.ids.size))
        assertTrue(j.isDone)
        assertTrue(s.closeGeneration(drainMs = 60_000))
        // A failure reaches the caller (and the listener).
        val errors = ArrayList<String>()
        val bad = s.startComparison(List(program.seqLen) { 1 }, 4, emptySet(), null, object : GenerationListener {
            override fun onError(error: Exception) { errors.add(error.javaClass.simpleName) }
        })
        assertTrue(assertThrows<BadInput> { bad.await(60_000) }.message!!.contains("no room"))
        assertEquals(listOf("BadInput"), errors)
        assertTrue(s.closeGeneration())
    }

    @Test fun `generation on its own thread while the session trains - progress keeps coming, after reads a whole step`() {
        val steps = 20L
        val progress = AtomicInteger(0)
        val stepThreads = Collections.synchronizedSet(HashSet<String>())
        val s = session(newRun("live", steps), listener = object : SessionListener {
            override fun onStep(step: Long, steps: Long, loss: Double, anonBytes: Long?, budgetBytes: Long) {
                progress.incrementAndGet()
                stepThreads.add(Thread.currentThread().name)
            }
        })
        // The trainer waits (between steps 2 and 3, and 8 and 9) for the first token of before, then of after, so each
        // side surely overlaps training; each side's listener then holds its first token until 3 more steps are reported.
        val firstToken = mapOf("before" to CountDownLatch(1), "after" to CountDownLatch(1))
        var between = 0
        val outcome = AtomicReference<RunOutcome>()
        val failure = AtomicReference<Throwable>()
        val trainer = Thread({
            try {
                outcome.set(s.run(RunControl { false }) {
                    when (++between) {
                        2 -> firstToken.getValue("before").await(60, TimeUnit.SECONDS)
                        8 -> firstToken.getValue("after").await(60, TimeUnit.SECONDS)
                    }
                })
            } catch (e: Throwable) { failure.set(e) }
        }, "trainer")
        trainer.start()
        val deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60)
        while (progress.get() < 1 && System.nanoTime() < deadline) Thread.sleep(1)
        val stepsWhileHeld = Collections.synchronizedMap(HashMap<String, Int>())
        val genThreads = Collections.synchronizedSet(HashSet<String>())
        val job = s.startComparison(prompt, 4, emptySet(), ByteTokenizer(), object : GenerationListener {
            override fun onToken(which: String, token: GeneratedToken) {
                genThreads.add(Thread.currentThread().name)
                if (token.index == 0) {
                    val at = progress.get()
                    firstToken.getValue(which).countDown()
                    val until = System.nanoTime() + TimeUnit.SECONDS.toNanos(60)
                    while (progress.get() < at + 3 && progress.get() < steps && System.nanoTime() < until) Thread.sleep(1)
                    stepsWhileHeld[which] = progress.get() - at
                }
            }
        })
        val c = job.await(120_000)
        trainer.join(120_000)
        failure.get()?.let { throw it }
        assertEquals(RunStatus.COMPLETED, outcome.get().status, outcome.get().message)
        for (which in listOf("before", "after"))
            assertTrue((stepsWhileHeld[which] ?: 0) >= 3, "steps reported while $which held its first token: $stepsWhileHeld")
        assertEquals(setOf("trainer"), stepThreads)
        assertEquals(setOf("generate"), genThreads)
        assertEquals(expected(null), c.before.ids, "before: the initial adapter, whatever training did meanwhile")
        // after: the state of a whole step k (a run stopped after k steps holds it; a completed run may end in the
        // evaluation gate's kept state instead), not a mix of two.
        val k = c.after.stateStep!!
        assertTrue(k in 4..8, "after ran on step $k (after before's hold, before the trainer's wait at step 8)")
        val shorter = session(newRun("live", k + 1))
        assertEquals(RunStatus.PAUSED, shorter.run(RunControl { shorter.completed >= k }).status)
        assertEquals(expected(shorter.loop.state), c.after.ids, "after: the state of step $k")
        assertEquals(StopReason.MAX_NEW_TOKENS, c.after.stopReason)
        assertTrue(s.closeGeneration(drainMs = 60_000))
    }

    /** [inner] with each call taking [trainMs] (training and held-out methods) or [genMs] (generation methods) more. */
    private class TimedRuntime(val inner: ProgramRuntime, val trainMs: Long, val genMs: Long) : ProgramRuntime {
        override fun execute(method: String, inputs: List<TensorBuffer>): List<TensorBuffer> {
            val out = inner.execute(method, inputs)
            Thread.sleep(if (method in Contract.GENERATION_ROLES) genMs else trainMs)
            return out
        }
    }

    /** Token arrival times of one comparison's sides (ns). */
    private fun timedCompare(s: TrainingSession, n: Int): Map<String, List<Long>> {
        val times = Collections.synchronizedMap(HashMap<String, MutableList<Long>>())
        val c = s.compare(prompt, n, emptySet(), null, GenerationControl(), object : GenerationListener {
            override fun onStart(which: String, stateStep: Long) { times[which] = arrayListOf(System.nanoTime()) }
            override fun onToken(which: String, token: GeneratedToken) { times.getValue(which).add(System.nanoTime()) }
        })
        assertEquals(n, c.before.ids.size)
        assertEquals(n, c.after.ids.size)
        return times
    }

    /** Decode rate after the first token (tokens/s) and the time to the first token (s) of one side. */
    private fun rates(t: List<Long>): Pair<Double, Double> = Pair((t.size - 2) / ((t.last() - t[1]) / 1e9), (t[1] - t[0]) / 1e9)

    /**
     * The host's replay of generation beside training with the phone's call times in proportion (a training
     * call 30x a generation call; on a phone ~0.3 s and ~1 ms): idle, then while the session trains. With the
     * calls alternating one by one a token waited L + 2 training calls (here ~150 ms for a 5 ms token); with
     * the generation first ([RuntimeGate]) the decode rate during training is about the idle one. A measurement,
     * printed (tokens/s and the first token's time, idle and during training): wall-clock rates depend on the
     * machine's load, so what is asserted is the scheduling property, with the gate's clock in the test's hands
     * (the next test); here only that training gave way and goes on after the generation.
     */
    @Test fun `generation beside training - the decode rate idle and during training, printed`() {
        val steps = 100_000L
        val progress = AtomicInteger(0)
        val stop = AtomicBoolean(false)
        val s = session(newRun("speed", steps), TimedRuntime(SessionTest.HashRuntime(program), trainMs = 30, genMs = 1), object : SessionListener {
            override fun onStep(step: Long, steps: Long, loss: Double, anonBytes: Long?, budgetBytes: Long) { progress.incrementAndGet() }
        })
        val n = 12
        val idle = timedCompare(s, n)
        val outcome = AtomicReference<RunOutcome>()
        val trainer = Thread({ outcome.set(s.run(RunControl { stop.get() })) }, "trainer")
        trainer.start()
        val deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(120)
        while (progress.get() < 1 && System.nanoTime() < deadline) Thread.sleep(1)
        assertTrue(progress.get() >= 1, "training runs")
        val busy = timedCompare(s, n)
        val atEnd = progress.get()
        while (progress.get() < atEnd + 2 && System.nanoTime() < deadline) Thread.sleep(1)
        stop.set(true)
        trainer.join(120_000)
        assertEquals(RunStatus.PAUSED, outcome.get().status, outcome.get().message)
        assertTrue(progress.get() >= atEnd + 2, "training goes on after the generation")
        assertTrue(s.gate.trainingWaits >= 1, "training gave way to the generation")
        for (which in listOf("before", "after")) {
            val (idleRate, idleFirst) = rates(idle.getValue(which))
            val (busyRate, busyFirst) = rates(busy.getValue(which))
            println("generation beside training ($which): idle ${"%.1f".format(idleRate)} tokens/s, first token ${"%.3f".format(idleFirst)} s; " +
                "during training ${"%.1f".format(busyRate)} tokens/s (${"%.0f".format(100 * busyRate / idleRate)}%), first token ${"%.3f".format(busyFirst)} s")
        }
        assertTrue(s.closeGeneration(drainMs = 60_000))
    }

    /**
     * Issue 42's scheduling property, with the gate's clock in the test's hands ([RuntimeGate]'s `now`; nothing here
     * depends on how fast the machine is): while a generation's consumer (its token callback) holds it within the
     * grace period, no training call starts (the trainer waits at the gate); once the grace has passed on the gate's
     * clock, training goes on, call by call, while the consumer still holds it. Without the gate the trainer never
     * waits and its calls start during the hold: this test fails.
     */
    @Test fun `no training call starts while a generation's consumer is within the grace period, training goes on after it`() {
        val clock = AtomicLong(0)
        val grace = TimeUnit.MILLISECONDS.toNanos(50)
        val gate = RuntimeGate(grace) { clock.get() }
        val trainer = AtomicReference<Thread>()
        val watching = AtomicBoolean(false)  // the hold, the trainer parked, the gate's clock within the grace
        val graceOver = AtomicBoolean(false)
        val startedInGrace = AtomicInteger(0)
        val resumed = CountDownLatch(1)
        val inner = SessionTest.HashRuntime(program)
        val runtime = object : ProgramRuntime {
            override fun execute(method: String, inputs: List<TensorBuffer>): List<TensorBuffer> {
                if (Thread.currentThread() === trainer.get()) {
                    if (watching.get()) startedInGrace.incrementAndGet()
                    if (graceOver.get()) resumed.countDown()
                }
                return inner.execute(method, inputs)
            }
        }
        val progress = AtomicInteger(0)
        val stop = AtomicBoolean(false)
        val s = TrainingSession(program, weights, runtime, newRun("grace", 100_000L), ScriptedProbe(listOf(50_000_000L)), FakeClock(),
            object : SessionListener {
                override fun onStep(step: Long, steps: Long, loss: Double, anonBytes: Long?, budgetBytes: Long) { progress.incrementAndGet() }
            }, gate = gate)
        val outcome = AtomicReference<RunOutcome>()
        val t = Thread({ outcome.set(s.run(RunControl { stop.get() })) }, "trainer")
        trainer.set(t)
        t.start()
        val deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60)
        while (progress.get() < 1 && System.nanoTime() < deadline) Thread.sleep(1)
        assertTrue(progress.get() >= 1, "training runs")
        var parked = false
        var afterGrace = false
        val c = s.compare(prompt, 4, emptySet(), null, GenerationControl(), object : GenerationListener {
            override fun onToken(which: String, token: GeneratedToken) {
                if (which != "before" || token.index != 1) return
                // The consumer holds the generation (the gate's clock stands still: within the grace). The trainer,
                // wanting its next call, waits at the gate: parked, not running calls.
                val until = System.nanoTime() + TimeUnit.SECONDS.toNanos(10)
                while (System.nanoTime() < until && !parked) {
                    parked = t.state == Thread.State.WAITING || t.state == Thread.State.TIMED_WAITING
                    if (!parked) Thread.sleep(1)
                }
                watching.set(true)
                Thread.sleep(200)  // real time in which an ungated trainer would start many calls
                clock.addAndGet(grace - 1)  // the last nanosecond of the grace
                Thread.sleep(100)
                watching.set(false)
                graceOver.set(true)
                clock.addAndGet(1)  // the grace has passed: training may go on while the consumer still holds it
                afterGrace = resumed.await(60, TimeUnit.SECONDS)
            }
        })
        stop.set(true)
        t.join(120_000)
        assertEquals(RunStatus.PAUSED, outcome.get().status, outcome.get().message)
        assertEquals(0, startedInGrace.get(), "training calls started while the consumer was within the grace period")
        assertTrue(parked, "the trainer waited at the gate while the consumer held the generation within the grace")
        assertTrue(afterGrace, "training went on once the grace had passed")
        assertTrue(gate.trainingWaits >= 1, "training gave way to the generation")
        assertEquals(expected(null), c.before.ids, "before: the initial adapter, whatever training did meanwhile")
        assertTrue(s.closeGeneration(drainMs = 60_000))
    }
}
