package org.onphonellm.trainer.core

import org.junit.jupiter.api.Assertions.assertArrayEquals
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import java.io.File
import java.io.RandomAccessFile
import java.nio.ByteBuffer
import java.nio.ByteOrder

class CheckpointTest {
    @Test
    fun `checkpoint round-trips in the host runner's format and a damaged file is an error`() {
        val f = File(Fixtures.tempDir(), "ckpt.safetensors")
        val store = CheckpointStore(f)
        val state = FloatArray(37) { it * 0.25f - 3f }
        store.save(Checkpoint(state, 12, "run-7", 40, listOf(2.5, null, 1.25)))
        val c = store.load(37)
        assertArrayEquals(state, c.state)
        assertEquals(Triple(12L, "run-7", 40L), Triple(c.step, c.runId, c.seq))
        assertEquals(listOf(2.5, null, 1.25), c.losses)
        // Header as toolchain/training/checkpoint.py reads it: {"state": F32 [N]} + __metadata__.meta JSON.
        val n = ByteBuffer.wrap(f.readBytes(), 0, 8).order(ByteOrder.LITTLE_ENDIAN).long
        val header = Fields.of(Json.parse(String(f.readBytes(), 8, n.toInt()).trim()), "h")
        assertEquals(0L, (8 + n) % 8)
        assertEquals(listOf(37), header.obj("state").ints("shape"))
        assertEquals(12L, Fields.of(Json.parse(header.obj("__metadata__").string("meta")), "m").long("step"))
        assertEquals(listOf<File>(), f.parentFile.listFiles()!!.filter { it.name.endsWith(".tmp") }) // no temp file left
        assertThrows<BadInput> { store.load(36) }
        RandomAccessFile(f, "rw").use { it.setLength(it.length() - 4) } // torn copy
        val e = assertThrows<BadInput> { store.load(37) }
        assertTrue(e.message!!.contains("delete it"), e.message)
    }

    @Test
    fun `safetensors writer matches the format byte for byte on a hand-computed file`() {
        val out = java.io.ByteArrayOutputStream()
        Safetensors.write(out, listOf(Safetensors.Slice("w", listOf(1, 2), floatArrayOf(9f, 1f, -2f), 1)))
        val bytes = out.toByteArray()
        val header = """{"w":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]}}"""
        val padded = header + " ".repeat((8 - header.length % 8) % 8)
        val expected = ByteBuffer.allocate(8 + padded.length + 8).order(ByteOrder.LITTLE_ENDIAN)
            .putLong(padded.length.toLong()).put(padded.toByteArray()).putFloat(1f).putFloat(-2f).array()
        assertArrayEquals(expected, bytes)
    }

    @Test
    fun `the state is written from and read into its direct buffer - the same file as the array path, no heap copy`() {
        val dir = Fixtures.tempDir()
        val values = FloatArray(1001) { (it * 37 % 101) * 0.125f - 6f }
        val direct = ByteBuffer.allocateDirect(4 * values.size).order(ByteOrder.LITTLE_ENDIAN)
        values.forEachIndexed { i, v -> direct.putFloat(4 * i, v) }
        val a = CheckpointStore(File(dir, "array.safetensors"))
        val b = CheckpointStore(File(dir, "buffer.safetensors"))
        a.save(Checkpoint(values, 5, "run-9", 11, listOf(1.5, null)))
        b.saveBuffer(direct, values.size, 5, "run-9", 11, listOf(1.5, null))
        assertArrayEquals(a.file.readBytes(), b.file.readBytes())
        val into = ByteBuffer.allocateDirect(4 * values.size).order(ByteOrder.LITTLE_ENDIAN)
        val c = a.loadInto(into, values.size)
        assertEquals(Triple(5L, "run-9", 11L), Triple(c.step, c.runId, c.seq))
        assertEquals(listOf(1.5, null), c.losses)
        assertArrayEquals(values, FloatArray(values.size) { into.getFloat(4 * it) })
        // A checkpoint of another size is refused and the buffer is not written.
        val other = ByteBuffer.allocateDirect(4 * 1000).order(ByteOrder.LITTLE_ENDIAN)
        assertThrows<BadInput> { a.loadInto(other, 1000) }
        assertEquals(0f, other.getFloat(0))
    }
}
