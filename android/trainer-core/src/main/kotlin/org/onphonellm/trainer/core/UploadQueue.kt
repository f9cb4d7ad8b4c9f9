package org.onphonellm.trainer.core

import java.io.File
import java.io.IOException
import java.net.HttpURLConnection
import java.net.URL
import kotlin.random.Random

/** POSTs a body and returns the HTTP status; network failures throw IOException. */
fun interface HttpPoster {
    fun post(url: String, token: String, body: ByteArray): Int
}

/** java.net.HttpURLConnection (on Android and the JVM alike), short timeouts: a step is never held up long. */
class UrlConnectionPoster(private val connectTimeoutMs: Int = 3000, private val readTimeoutMs: Int = 10000) : HttpPoster {
    override fun post(url: String, token: String, body: ByteArray): Int {
        val conn = URL(url).openConnection() as HttpURLConnection
        try {
            conn.requestMethod = "POST"
            conn.connectTimeout = connectTimeoutMs
            conn.readTimeout = readTimeoutMs
            conn.doOutput = true
            conn.setFixedLengthStreamingMode(body.size)
            conn.setRequestProperty("Content-Type", "application/json")
            conn.setRequestProperty("Authorization", "Bearer $token")
            conn.outputStream.use { it.write(body) }
            val status = conn.responseCode
            (if (status >= 400) conn.errorStream else conn.inputStream)?.use { it.readBytes() }
            return status
        } finally {
            conn.disconnect()
        }
    }
}

/** Exponential backoff with jitter: initial * factor^(failures-1), capped, times 1 +- jitter. */
class Backoff(
    val initialMs: Long = 1000,
    val maxMs: Long = 60_000,
    val factor: Double = 2.0,
    val jitter: Double = 0.2,
    private val random: Random = Random.Default,
) {
    fun delayMs(failures: Int): Long {
        val base = minOf(maxMs.toDouble(), initialMs * Math.pow(factor, (failures - 1).toDouble()))
        return (base * (1 + jitter * (2 * random.nextDouble() - 1))).toLong().coerceAtLeast(0)
    }
}

/**
 * Uploads the event log to `toolchain telemetry serve` (POST /v1/events, Bearer token) in batches.
 *
 * Idempotent by (run_id, seq): a batch is retried byte-for-byte unchanged, so the server stores each
 * event once however often it arrives. The position of the first unacknowledged byte of the log is
 * kept in [cursorFile] (written atomically), so a killed app resumes the upload where it stopped.
 * Status handling follows the server: 2xx acknowledged; 401, 408, 429, 5xx and network errors
 * retried with [Backoff]; any other 4xx is permanent for that batch, which is halved until the
 * refused event is alone, then set aside in [rejectedFile] (so one bad event never blocks the rest).
 */
class UploadQueue(
    private val log: EventLog,
    private val cursorFile: File,
    private val rejectedFile: File,
    private val poster: HttpPoster,
    private val url: String,
    private val token: String,
    private val backoff: Backoff = Backoff(),
    private val maxBatch: Int = 200,
) {
    sealed class Result {
        object Idle : Result()
        data class Sent(val events: Int) : Result()
        data class RetryAt(val atMs: Long, val reason: String) : Result()
        data class Rejected(val events: Int, val status: Int) : Result()
    }

    private var cursor: Long = if (cursorFile.isFile) cursorFile.readText().trim().toLongOrNull() ?: 0L else 0L
    private var batchLimit = maxBatch
    private var failures = 0
    private var nextAttemptMs = 0L
    var sentEvents = 0L
        private set
    var rejectedEvents = 0L
        private set

    /** Bytes of the log not yet acknowledged. */
    fun pendingBytes(): Long = maxOf(0L, log.length() - cursor)

    /** Send at most one batch if one is due at [nowMs]. Never throws for network trouble. */
    fun pump(nowMs: Long): Result {
        if (nowMs < nextAttemptMs) return Result.RetryAt(nextAttemptMs, "backing off")
        val (lines, end) = log.readFrom(cursor, batchLimit)
        if (lines.isEmpty()) return Result.Idle
        val body = ("[" + lines.joinToString(",") + "]").toByteArray(Charsets.UTF_8)
        val status = try {
            poster.post(url, token, body)
        } catch (e: IOException) {
            return retry(nowMs, "network: ${e.message}")
        }
        return when {
            status in 200..299 -> {
                advance(end)
                sentEvents += lines.size
                failures = 0
                batchLimit = maxBatch
                Result.Sent(lines.size)
            }
            status == 401 || status == 408 || status == 429 || status >= 500 -> retry(nowMs, "HTTP $status")
            lines.size > 1 -> {
                batchLimit = (lines.size + 1) / 2 // find the refused event: bisect, no waiting
                Result.RetryAt(nowMs, "HTTP $status, splitting the batch")
            }
            else -> {
                rejectedFile.appendText(lines[0] + "\n")
                advance(end)
                rejectedEvents++
                batchLimit = maxBatch
                Result.Rejected(1, status)
            }
        }
    }

    private fun retry(nowMs: Long, reason: String): Result {
        failures++
        nextAttemptMs = nowMs + backoff.delayMs(failures)
        return Result.RetryAt(nextAttemptMs, reason)
    }

    private fun advance(end: Long) {
        cursor = end
        AtomicFiles.writeText(cursorFile, "$cursor\n")
    }

    /** Pump until the log is sent or [deadlineMs] passes (end of a run), sleeping through backoffs. */
    fun drain(clock: Clock, deadlineMs: Long): Boolean {
        while (true) {
            val now = (clock.wallSeconds() * 1000).toLong()
            if (now >= deadlineMs) return pendingBytes() == 0L
            when (val r = pump(now)) {
                Result.Idle -> return true
                is Result.RetryAt -> clock.sleepMs(minOf(r.atMs, deadlineMs) - now)
                else -> Unit
            }
        }
    }
}

/**
 * Where a run's telemetry goes, kept in its run directory (`telemetry_endpoint.json`, written atomically) when
 * the run is started with a URL, so a resume that is not told one (a charging-window run from WorkManager, a
 * restart after a kill) uploads to the same server. [resolve]: the request's URL wins and replaces the stored
 * one; without one, the stored one; null: the run uploads nothing. The token is app-private data (the run
 * directory is the app's own storage) and never logged.
 */
data class TelemetryEndpoint(val url: String, val token: String) {
    fun save(run: RunDir) = AtomicFiles.writeText(file(run), JsonWriter.write(Json.of(linkedMapOf("url" to url, "token" to token))))

    override fun toString(): String = "TelemetryEndpoint(url=$url, token=${if (token.isEmpty()) "none" else "<set>"})"

    companion object {
        fun file(run: RunDir) = File(run.dir, "telemetry_endpoint.json")

        /** The stored endpoint, or null when there is none. A file that is not one is a [BadInput] naming it. */
        fun load(run: RunDir): TelemetryEndpoint? {
            val f = file(run)
            if (!f.isFile) return null
            val fields = Fields.of(Json.parse(f.readText(Charsets.UTF_8)), f.name)
            return TelemetryEndpoint(fields.string("url"), fields.optString("token") ?: "")
        }

        fun resolve(run: RunDir, url: String?, token: String?): TelemetryEndpoint? =
            if (url != null) TelemetryEndpoint(url, token ?: "").also { it.save(run) } else load(run)
    }
}
