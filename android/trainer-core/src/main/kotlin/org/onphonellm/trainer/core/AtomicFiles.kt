package org.onphonellm.trainer.core

import java.io.File
import java.io.FileOutputStream
import java.io.IOException
import java.io.OutputStream

/** Outputs written atomically: a temp file in the same directory, fsync, then rename over the target. */
object AtomicFiles {
    fun write(target: File, writer: (OutputStream) -> Unit) {
        val dir = target.absoluteFile.parentFile ?: throw IOException("$target has no parent directory")
        if (!dir.isDirectory && !dir.mkdirs()) throw IOException("cannot create $dir")
        val tmp = File.createTempFile(".${target.name}.", ".tmp", dir)
        try {
            FileOutputStream(tmp).use { out ->
                val buffered = out.buffered(1 shl 16)
                writer(buffered)
                buffered.flush()
                out.fd.sync()
            }
            // rename(2) replaces the target atomically on Linux/Android: readers see the old or the new file.
            if (!tmp.renameTo(target)) throw IOException("cannot rename $tmp to $target")
        } finally {
            if (tmp.exists()) tmp.delete()
        }
    }

    fun writeText(target: File, text: String) = write(target) { it.write(text.toByteArray(Charsets.UTF_8)) }

    /** Replace directory [target] by one filled by [fill]: built beside it, then swapped in. */
    fun replaceDir(target: File, fill: (File) -> Unit) {
        val parent = target.absoluteFile.parentFile
        if (!parent.isDirectory && !parent.mkdirs()) throw IOException("cannot create $parent")
        val tmp = File(parent, ".${target.name}.tmp-${java.lang.System.nanoTime()}")
        val old = File(parent, ".${target.name}.old-${java.lang.System.nanoTime()}")
        try {
            if (!tmp.mkdirs()) throw IOException("cannot create $tmp")
            fill(tmp)
            if (target.exists() && !target.renameTo(old)) throw IOException("cannot move $target aside")
            if (!tmp.renameTo(target)) {
                old.renameTo(target)
                throw IOException("cannot rename $tmp to $target")
            }
        } finally {
            tmp.deleteRecursively()
            old.deleteRecursively()
        }
    }
}
