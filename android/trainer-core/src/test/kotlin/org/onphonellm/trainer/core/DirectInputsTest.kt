package org.onphonellm.trainer.core

import org.junit.jupiter.api.Assertions.assertArrayEquals
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertSame
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import java.nio.ByteOrder
import java.nio.FloatBuffer
import java.nio.LongBuffer

/**
 * The buffers the ExecuTorch glue hands to `Tensor.fromBlob(FloatBuffer|LongBuffer, shape)`: that
 * call requires a direct buffer in native order with capacity == numel(shape) (Tensor.kt,
 * executorch-android 1.5), and the JNI reads the buffer's memory from its address, so each window must
 * hold exactly its input's values.
 */
class DirectInputsTest {
    @Test
    fun `inputs are staged in direct native-order windows of exactly numel values, reused across steps`() {
        val m = Fixtures.manifest(layers = 2, optimizer = "adamw")
        val state = ProgramState(m, FloatArray(m.stateNumel) { it * 0.5f - 7f })
        val ids = LongArray(m.seqLen) { 60L + it }
        val labels = LongArray(m.seqLen) { if (it == 0) -100L else 61L + it }
        val staging = DirectInputs()
        val inputs = state.inputs(ids, labels, 0.125f)
        val windows = staging.stage(inputs)
        assertEquals(inputs.size, windows.size)
        inputs.zip(windows).forEach { (t, w) ->
            assertTrue(w.isDirect, t.name)
            assertEquals(t.numel, w.capacity(), t.name)
            assertEquals(0, w.position(), t.name)
            when (t.dtype) {
                DType.INT64 -> {
                    w as LongBuffer
                    assertEquals(ByteOrder.nativeOrder(), w.order())
                    assertArrayEquals(t.longs(), LongArray(w.capacity()).also { w.duplicate().get(it) }, t.name)
                }
                DType.FLOAT32 -> {
                    w as FloatBuffer
                    assertEquals(ByteOrder.nativeOrder(), w.order())
                    assertArrayEquals(t.floats(), FloatArray(w.capacity()).also { w.duplicate().get(it) }, t.name)
                }
            }
        }
        assertEquals(8L * 2 * m.seqLen + 4L * (1 + m.stateNumel), staging.bytes)
        // the next step: same buffers, new values (nothing allocated per step)
        state.values.fill(3f)
        val again = staging.stage(state.inputs(ids, labels, 0.25f))
        windows.zip(again).forEach { (a, b) -> assertSame(a, b) }
        assertEquals(1, staging.allocations)
        assertEquals(0.25f, (again[2] as FloatBuffer).get(0))
        assertTrue(again.drop(3).all { w -> (w as FloatBuffer).let { f -> (0 until f.capacity()).all { f.get(it) == 3f } } })
        // other shapes (another program): new blocks
        val small = Fixtures.manifest(layers = 2, lcsb = false)
        staging.stage(ProgramState(small, FloatArray(small.stateNumel)).inputs(ids, labels, 1f))
        assertEquals(2, staging.allocations)
    }
}
