package org.onphonellm.trainer.core

import java.io.File
import java.io.FileOutputStream
import java.io.RandomAccessFile

/** The app's append-only JSONL files ([EventLog], [FeedbackLog]): whole lines, fsynced, a torn last line cut on open. */
internal object JsonlFiles {
    /** Cut [file] after its last newline: a line torn by a kill mid-write is dropped, the whole lines before it kept. */
    fun cutTornLine(file: File) {
        if (!file.isFile) return
        RandomAccessFile(file, "rw").use { raf ->
            var end = raf.length()
            while (end > 0) {
                raf.seek(end - 1)
                if (raf.read() == '\n'.code) break
                end--
            }
            if (end != raf.length()) raf.setLength(end)
        }
    }

    /** Append [text] (whole lines, each ending in a newline) to [file] in one write, then fsync it. */
    fun appendSynced(file: File, text: String) {
        FileOutputStream(file, true).use { out ->
            out.write(text.toByteArray(Charsets.UTF_8))
            out.fd.sync()
        }
    }
}
