package org.onphonellm.trainer.core

import com.sun.net.httpserver.HttpServer
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import java.io.File
import java.io.IOException
import java.net.InetSocketAddress
import kotlin.random.Random

class TelemetryTest {
    @Test
    fun `telemetry examples validate and every invalid example is refused`() {
        val ok = Fixtures.examples("telemetry_")
        assertTrue(ok.size >= 3)
        for (f in ok) assertEquals(emptyMap<Int, List<String>>(), EventSchema.batchProblems(Json.parse(f.readText())), f.name)
        val bad = Fixtures.invalid("telemetry_")
        assertTrue(bad.size >= 10)
        for (f in bad) {
            val problems = try {
                EventSchema.batchProblems(Json.parse(f.readText()))
            } catch (e: BadInput) {
                mapOf(0 to listOf(e.message!!)) // not JSON at all (NaN)
            }
            assertTrue(problems.isNotEmpty(), "${f.name} was accepted")
        }
    }

    @Test
    fun `event tables match telemetry_event schema field for field`() {
        val schema = Fields.of(Json.parse(java.io.File(Fixtures.schemas, "telemetry_event.schema.json").readText()), "schema")
        val defs = schema.obj("\$defs")
        assertEquals(schema.obj("properties").obj.fields.keys, EventSchema.COMMON.keys)
        assertEquals(schema.strings("required"), EventSchema.COMMON_REQUIRED)
        val typeEnum = schema.obj("properties").obj("type").strings("enum")
        assertEquals(typeEnum.toSet(), EventSchema.TYPES.keys)
        for ((name, type) in EventSchema.TYPES) {
            val d = defs.obj(name)
            assertEquals(d.obj("properties").obj.fields.keys, type.fields.keys, name)
            assertEquals(d.strings("required").toSet(), type.required.toSet(), name)
            for ((field, spec) in type.fields) {
                val p = d.obj("properties").obj(field)
                if (spec is EventSchema.Field.Enum) assertEquals(p.strings("enum"), spec.values, "$name.$field")
            }
        }
    }

    @Test
    fun `recorder numbers events, refuses invalid ones and the log survives a torn write`() {
        val dir = Fixtures.tempDir()
        val log = EventLog(File(dir, "t.jsonl"))
        val rec = TelemetryRecorder("run-1", log, FakeClock(), startSeq = 5)
        rec.emit("thermal", mapOf("state" to "light"))
        rec.emit("step", mapOf("step" to 0, "loss" to Json.Null, "step_time_s" to 0.5, "tokens_per_s" to 10.0))
        assertThrows<IllegalArgumentException> { rec.emit("memory", mapOf("probe" to "android_proc_status")) } // no measurement
        assertThrows<IllegalArgumentException> { rec.emit("step", mapOf("step" to 0, "loss" to 1.0, "step_time_s" to 0.5, "tokens_per_s" to 1.0, "probe" to "x")) }
        assertEquals(listOf(5L, 6L), log.events().map { (it["seq"] as Json.Num).asLongOrNull })
        log.events().forEach { assertEquals(emptyList<String>(), EventSchema.problems(it)) }
        log.file.appendText("""{"schema_version":1,"type":"ther""") // killed mid-append
        val reopened = EventLog(log.file)
        assertEquals(2, reopened.events().size)
        assertTrue(reopened.file.readText().endsWith("\n"))
    }

    /** A server that stores events by (run_id, seq), like `toolchain telemetry serve`, and fails on cue. */
    private class FakeServer(val script: MutableList<Any>) : HttpPoster {
        val stored = LinkedHashMap<Pair<String, Long>, String>()
        val bodies = ArrayList<String>()
        override fun post(url: String, token: String, body: ByteArray): Int {
            val text = String(body)
            bodies.add(text)
            when (val next = if (script.isEmpty()) 200 else script.removeAt(0)) {
                is IOException -> throw next
                200 -> (Json.parse(text) as Json.Arr).items.forEach { e ->
                    val f = Fields(e as Json.Obj, "event")
                    val key = f.string("run_id") to f.long("seq")
                    val prev = stored.putIfAbsent(key, JsonWriter.write(e))
                    if (prev != null && prev != JsonWriter.write(e)) return 409
                }
                else -> return next as Int
            }
            return 200
        }
    }

    private fun logWith(n: Int): EventLog {
        val log = EventLog(File(Fixtures.tempDir(), "t.jsonl"))
        val rec = TelemetryRecorder("run-2", log, FakeClock(), 0)
        repeat(n) { rec.emit("battery", mapOf("level_pct" to 50 + it, "charging" to true)) }
        return log
    }

    @Test
    fun `upload retries with backoff, resends the same batch and stores each event once`() {
        val log = logWith(5)
        val server = FakeServer(mutableListOf(503, IOException("connection refused"), 401, 200))
        val dir = log.file.parentFile
        val q = UploadQueue(log, File(dir, "cursor"), File(dir, "rejected"), server, "http://x/v1/events", "T",
            Backoff(initialMs = 1000, maxMs = 3000, jitter = 0.0, random = Random(0)), maxBatch = 3)
        val clock = FakeClock(0)
        val results = ArrayList<UploadQueue.Result>()
        while (true) {
            val r = q.pump(clock.nowMs)
            results.add(r)
            if (r == UploadQueue.Result.Idle) break
            if (r is UploadQueue.Result.RetryAt) clock.sleepMs(r.atMs - clock.nowMs)
        }
        assertEquals(listOf(1000L, 2000L, 3000L), clock.sleeps) // 1 s, 2 s, capped at 3 s
        assertEquals(setOf(server.bodies[0]), server.bodies.take(4).toSet()) // retried byte-for-byte
        assertEquals(5, server.stored.size)
        assertEquals(0L, q.pendingBytes())
        // A second queue over the same files (the app restarted) has nothing left to send.
        val again = UploadQueue(log, File(dir, "cursor"), File(dir, "rejected"), server, "http://x/v1/events", "T")
        assertEquals(UploadQueue.Result.Idle, again.pump(0))
        // Re-sending everything (cursor lost) duplicates nothing on the server.
        File(dir, "cursor").delete()
        UploadQueue(log, File(dir, "cursor"), File(dir, "rejected"), server, "u", "T").drain(clock, clock.nowMs + 10_000)
        assertEquals(5, server.stored.size)
    }

    @Test
    fun `a refused event is isolated by halving the batch and set aside, the rest is delivered`() {
        val log = logWith(4)
        val dir = log.file.parentFile
        // The server refuses any batch holding seq 2 (422), as it would a schema violation.
        val server = object : HttpPoster {
            val stored = HashSet<Long>()
            override fun post(url: String, token: String, body: ByteArray): Int {
                val seqs = (Json.parse(String(body)) as Json.Arr).items.map { Fields(it as Json.Obj, "e").long("seq") }
                if (2L in seqs) return 422
                stored.addAll(seqs)
                return 200
            }
        }
        val q = UploadQueue(log, File(dir, "cursor"), File(dir, "rejected"), server, "u", "T", Backoff(jitter = 0.0))
        assertTrue(q.drain(FakeClock(0), 60_000))
        assertEquals(setOf(0L, 1L, 3L), server.stored)
        assertEquals(1L, q.rejectedEvents)
        assertEquals(2L, Fields(Json.parse(File(dir, "rejected").readText().trim()) as Json.Obj, "r").long("seq"))
    }

    @Test
    fun `url poster sends the bearer token and JSON body to a real HTTP server`() {
        val server = HttpServer.create(InetSocketAddress("127.0.0.1", 0), 0)
        val seen = ArrayList<Triple<String?, String?, String>>()
        server.createContext("/v1/events") { ex ->
            val body = ex.requestBody.readBytes().toString(Charsets.UTF_8)
            seen.add(Triple(ex.requestHeaders.getFirst("Authorization"), ex.requestHeaders.getFirst("Content-Type"), body))
            val status = if (ex.requestHeaders.getFirst("Authorization") == "Bearer secret") 200 else 401
            val reply = """{"received":1}""".toByteArray()
            ex.sendResponseHeaders(status, reply.size.toLong())
            ex.responseBody.use { it.write(reply) }
        }
        server.start()
        try {
            val url = "http://127.0.0.1:${server.address.port}/v1/events"
            val poster = UrlConnectionPoster(connectTimeoutMs = 2000, readTimeoutMs = 5000)
            assertEquals(200, poster.post(url, "secret", "[{\"a\":1}]".toByteArray()))
            assertEquals(401, poster.post(url, "wrong", "[]".toByteArray()))
            assertEquals(Triple("Bearer secret", "application/json", "[{\"a\":1}]"), seen[0])
        } finally {
            server.stop(0)
        }
        // nothing listening: an IOException, which the queue turns into a retry
        val closedPort = HttpServer.create(InetSocketAddress("127.0.0.1", 0), 0).let { val p = it.address.port; it.stop(0); p }
        val log = logWith(1)
        val q = UploadQueue(log, File(log.file.parentFile, "c"), File(log.file.parentFile, "r"), UrlConnectionPoster(500, 500),
            "http://127.0.0.1:$closedPort/v1/events", "secret", Backoff(initialMs = 1000, jitter = 0.0))
        val r = q.pump(0)
        assertTrue(r is UploadQueue.Result.RetryAt && r.atMs == 1000L && r.reason.startsWith("network"), r.toString())
    }

    @Test
    fun `a run keeps the telemetry server it was started with, for resumes that are told none`() {
        val run = RunDir(File(Fixtures.tempDir(), "run-1").also { it.mkdirs() })
        org.junit.jupiter.api.Assertions.assertNull(TelemetryEndpoint.resolve(run, null, null), "never given one: no upload")
        val first = TelemetryEndpoint.resolve(run, "http://10.0.2.2:8088/v1/events", "secret")
        assertEquals(TelemetryEndpoint("http://10.0.2.2:8088/v1/events", "secret"), first)
        // a charging-window run (WorkManager) or a restart after a kill: no URL in the request, the run's own
        assertEquals(first, TelemetryEndpoint.resolve(run, null, null))
        // a new URL replaces the stored one; no token is an empty one
        assertEquals(TelemetryEndpoint("http://host:1/v1/events", ""), TelemetryEndpoint.resolve(run, "http://host:1/v1/events", null))
        assertEquals(TelemetryEndpoint("http://host:1/v1/events", ""), TelemetryEndpoint.load(run))
        assertTrue("secret" !in first.toString(), "the token is never printed")
        TelemetryEndpoint.file(run).writeText("[1]")
        val e = assertThrows<BadInput> { TelemetryEndpoint.load(run) }
        assertTrue(e.message!!.contains("telemetry_endpoint.json"), e.message)
    }
}
