package org.onphonellm.trainer.core

import java.io.File
import java.io.RandomAccessFile
import java.nio.ByteBuffer
import java.nio.ByteOrder

/**
 * The app's flat float32 state: one direct, little-endian buffer; each entry a view of it. With [only], a
 * snapshot of those entries alone, packed in manifest order (what a generation beside training reads:
 * [LayerLoop.generationStateEntries], the LoRA params without the optimizer's moments); a snapshot's
 * [buffer] is not the state array (no checkpoint or adapter is made of it), and a view of another entry is
 * an error.
 */
class StateBuffer(val program: Manifest, only: Collection<String>? = null) {
    /** The entries held: every one, or [only]'s. */
    val entries: List<StateEntry> = if (only == null) program.stateEntries else {
        val names = only.toSet()
        val unknown = names - program.stateEntries.map { it.name }.toSet()
        if (unknown.isNotEmpty()) throw BadInput("the state has no entry ${unknown.sorted().take(3).joinToString()}; re-export the program")
        program.stateEntries.filter { it.name in names }
    }
    val isSnapshot: Boolean = only != null
    /** float32 values held: the manifest's state numel, or a snapshot's entries'. */
    val numel: Int = if (only == null) program.stateNumel else entries.sumOf { it.numel }
    val buffer: ByteBuffer = ByteBuffer.allocateDirect(4 * numel).order(ByteOrder.LITTLE_ENDIAN)
    private val views: Map<String, TensorBuffer> = run {
        var at = 0
        entries.associate { e ->
            val offset = if (only == null) e.offset else at.also { at += e.numel }
            e.name to TensorBuffer(e.name, ElemType.FLOAT32, e.shape, buffer.window(4 * offset, 4 * e.numel))
        }
    }

    fun view(name: String): TensorBuffer = views[name] ?: throw BadInput(
        if (isSnapshot) "state entry '$name' is not in this snapshot of ${entries.size} entries (the generation methods read it?)"
        else "the state has no entry '$name'; re-export the program")
    fun sha256(): String = sha256Hex(buffer)

    /** A checkpoint, a restore or an adapter needs the whole state, not a snapshot. */
    fun requireWhole(what: String) {
        if (isSnapshot) throw IllegalStateException("$what needs the whole state, not a snapshot of ${entries.size} entries")
    }

    /** Read state.init_file (raw little-endian float32, exactly numel values). */
    fun loadInit() = load(File(program.dir, program.stateInitFile))

    /** [file]: a whole state (numel values); a snapshot reads only its entries' ranges of it. */
    fun load(file: File) {
        if (file.length() != 4L * program.stateNumel)
            throw BadInput("$file holds ${file.length() / 4} values, the manifest says ${program.stateNumel}; re-export the program")
        if (!isSnapshot) {
            // Straight from the file into the state buffer (no heap copy: the state is held once).
            RandomAccessFile(file, "r").use { raf ->
                val d = buffer.duplicate()
                d.position(0)
                var at = 0L
                while (d.hasRemaining()) {
                    val n = raf.channel.read(d, at)
                    if (n < 0) throw BadInput("$file ends after $at bytes of the state")
                    at += n
                }
            }
            return
        }
        RandomAccessFile(file, "r").use { raf ->
            for (e in entries) {
                val dst = views.getValue(e.name).data.duplicate()
                dst.position(0)
                var at = 4L * e.offset
                while (dst.hasRemaining()) {
                    val n = raf.channel.read(dst, at)
                    if (n < 0) throw BadInput("$file ends inside state entry ${e.name}")
                    at += n
                }
            }
        }
    }

    /** Copy each entry held here from [src] (the live state, for a snapshot; or another state). */
    fun copyFrom(src: StateBuffer) {
        for (e in entries) copyBytes(src.view(e.name).data, views.getValue(e.name).data, 0)
    }

    fun toFloatArray(): FloatArray = FloatArray(numel) { buffer.getFloat(4 * it) }
}
