package org.onphonellm.trainer.core

import java.io.File
import java.io.RandomAccessFile

/**
 * The run's telemetry as an append-only JSONL file: the offline record (pulled with adb), and the
 * upload queue's source. Each append is fsynced; a line torn by a kill is cut off on open.
 */
class EventLog(val file: File) {
    init {
        file.absoluteFile.parentFile?.mkdirs()
        JsonlFiles.cutTornLine(file)
    }

    fun append(lines: List<String>) {
        if (lines.isEmpty()) return
        JsonlFiles.appendSynced(file, lines.joinToString("") { it + "\n" })
    }

    fun length(): Long = if (file.isFile) file.length() else 0L

    /** Complete lines from byte [offset], at most [maxLines], with the offset after the last one. */
    fun readFrom(offset: Long, maxLines: Int): Pair<List<String>, Long> {
        if (!file.isFile) return emptyList<String>() to offset
        RandomAccessFile(file, "r").use { raf ->
            val len = raf.length()
            if (offset >= len) return emptyList<String>() to offset
            val bytes = ByteArray(minOf(len - offset, 4L shl 20).toInt())
            raf.seek(offset)
            raf.readFully(bytes)
            val lines = ArrayList<String>()
            var start = 0
            for (k in bytes.indices) {
                if (bytes[k] == '\n'.code.toByte()) {
                    lines.add(String(bytes, start, k - start, Charsets.UTF_8))
                    start = k + 1
                    if (lines.size == maxLines) break
                }
            }
            return lines to offset + start
        }
    }

    /** Every event, parsed (small logs: tests, resume). */
    fun events(): List<Json.Obj> = if (!file.isFile) emptyList() else
        file.readLines().filter { it.isNotBlank() }.map { Json.parse(it) as Json.Obj }

    fun lastEvent(): Json.Obj? = events().lastOrNull()
}
