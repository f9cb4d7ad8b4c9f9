package org.onphonellm.trainer.core

import java.io.File
import java.io.RandomAccessFile
import java.nio.ByteBuffer
import java.nio.ByteOrder
import java.nio.channels.FileChannel

/** What a message about a weights file changed under its mapping tells the user to do. */
const val WEIGHTS_CHANGED_ADVICE = "re-import the program (or put its files back as they were) and resume"

/**
 * What tells that a file changed without reading it: its size, its modification time (ms) and, where the
 * platform gives it, its (device, inode) [key] (null: not known; java.io.File has no inode, the app's
 * source reads it with android.system.Os.stat).
 */
data class FileIdentity(val size: Long, val mtimeMs: Long, val key: String? = null) {
    /** Why [now] (null: the file is gone) is not the file this identity was taken of; null: the same. */
    fun changeTo(now: FileIdentity?, file: File): String? = when {
        now == null -> "$file is gone"
        key != null && now.key != null && now.key != key -> "$file was replaced by another file"
        now.size != size -> "$file changed size from $size to ${now.size} bytes"
        now.mtimeMs != mtimeMs -> "$file was modified"
        else -> null
    }
}

/** Reads a file's [FileIdentity] (null: no such file, or it cannot be read). */
fun interface FileIdentitySource {
    fun identity(file: File): FileIdentity?

    companion object {
        /** java.io.File's size and modification time (no inode: a same-size replacement within the same millisecond is not seen). */
        val JAVA = FileIdentitySource { f -> if (f.isFile) FileIdentity(f.length(), f.lastModified()) else null }
    }
}

/**
 * weights.safetensors memory-mapped: each tensor a read-only direct buffer over the file's pages
 * (`FileChannel.map`, one mapping per tensor so files over 2 GiB work), passed to the runtime as is.
 *
 * The file must not change while it is mapped: a page read past a new, shorter end is a SIGBUS, which kills
 * the process. [identity] is the file's, read (by [identities]) just before it was mapped; [checkChanged]
 * compares it with the file's now, and the training session calls it at every step boundary. Once a change
 * is seen the mapping is [stale] for good: every [LayerLoop] over it refuses to call the program again.
 */
class MappedWeights private constructor(val file: File, val tensors: Map<String, TensorBuffer>, val identity: FileIdentity,
                                        private val identities: FileIdentitySource) {
    operator fun get(key: String): TensorBuffer = tensors[key] ?: throw BadInput("$file has no tensor '$key'; re-export the program")

    /** Why the mapping is no longer trusted (the first change [checkChanged] saw), or null. */
    @Volatile var stale: String? = null
        private set

    /**
     * Why the file is not the one mapped any more (another file in its place, another size, a newer
     * modification time, gone), or null; a change, once seen, is kept ([stale]), whatever the file does next.
     */
    fun checkChanged(): String? {
        stale?.let { return it }
        val now = try { identities.identity(file) } catch (e: Exception) { null }
        val why = identity.changeTo(now, file) ?: return null
        synchronized(this) { if (stale == null) stale = why }
        return stale
    }

    /** Rows [a, b) of [key] (a view of the mapped rows, no copy). */
    fun rows(key: String, a: Int, b: Int): TensorBuffer {
        val t = get(key)
        if (t.shape.isEmpty() || b > t.shape[0]) throw BadInput("$file: rows [$a, $b) of $key ${t.shape}")
        val rowBytes = t.nbytes / t.shape[0]
        return TensorBuffer(key, t.dtype, listOf(b - a) + t.shape.drop(1), t.data.window(a * rowBytes, (b - a) * rowBytes))
    }

    companion object {
        /** Map [file]; its identity is read by [identities] first (a change between the two is seen at the first check). */
        fun map(file: File, identities: FileIdentitySource = FileIdentitySource.JAVA): MappedWeights {
            val identity = try { identities.identity(file) } catch (e: Exception) { null }
                ?: throw BadInput("cannot read the size and time of $file; re-import the program")
            return mapFile(file, identity, identities)
        }

        private fun mapFile(file: File, identity: FileIdentity, identities: FileIdentitySource): MappedWeights = RandomAccessFile(file, "r").use { raf ->
            val size = raf.length()
            if (size < 8) throw BadInput("$file is not a safetensors file (${size} bytes)")
            val head = ByteBuffer.allocate(8).order(ByteOrder.LITTLE_ENDIAN)
            raf.channel.read(head, 0)
            val n = head.getLong(0)
            if (n <= 0 || 8 + n > size || n > 100_000_000) throw BadInput("$file: bad safetensors header length $n")
            val hb = ByteArray(n.toInt())
            raf.seek(8)
            raf.readFully(hb)
            val header = Fields.of(Json.parse(String(hb, Charsets.UTF_8)), "$file header")
            val start = 8 + n
            val out = LinkedHashMap<String, TensorBuffer>()
            for ((key, v) in header.obj.fields) {
                if (key == "__metadata__" || key.startsWith("__pad_")) continue
                val f = Fields.of(v, "$file $key")
                val dtype = ElemType.ofSafetensors(f.string("dtype"), f.where)
                val off = f.arr("data_offsets").map { (it as Json.Num).asLongOrNull ?: throw BadInput("${f.where}: bad data_offsets") }
                val begin = start + off[0]
                val len = off[1] - off[0]
                if (off[0] < 0 || len < 0 || start + off[1] > size) throw BadInput("${f.where}: data_offsets $off outside the file")
                val buf = if (len == 0L) ByteBuffer.allocateDirect(0) else raf.channel.map(FileChannel.MapMode.READ_ONLY, begin, len)
                out[key] = TensorBuffer(key, dtype, f.ints("shape"), buf)
            }
            MappedWeights(file, out, identity, identities)
        }
    }
}
