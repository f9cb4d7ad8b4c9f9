package org.onphonellm.trainer.core

import java.nio.Buffer
import java.nio.ByteBuffer
import java.nio.ByteOrder
import java.nio.FloatBuffer
import java.nio.LongBuffer

/**
 * Method inputs staged in direct, native-order buffers, for a runtime whose native side reads inputs
 * by address: ExecuTorch's JNI (`Tensor.fromBlob(FloatBuffer|LongBuffer, shape)`) takes a direct
 * buffer in native byte order whose capacity is exactly the tensor's numel, and hands its address to
 * the method (the exporter plans no memory for graph inputs, so the method reads them in place).
 *
 * One block per dtype, allocated on the first call and reused while the inputs keep their shapes (all
 * train methods of a program take the same inputs), so a step allocates nothing: each call copies the
 * state into the float block (4 * state.numel bytes, the "one copy of the state" of
 * [Manifest.predictedStepBytes]) and returns one window per input.
 */
class DirectInputs {
    private var layout: List<Pair<DType, Int>> = emptyList()
    private var windows: List<Buffer> = emptyList()

    /** Bytes held (float32 and int64 blocks). */
    var bytes: Long = 0
        private set

    /** Allocations so far (1 after the first call while shapes stay the same). */
    var allocations: Int = 0
        private set

    /** Copy [inputs] into the blocks; element i of the result is input i's window (FloatBuffer or LongBuffer). */
    fun stage(inputs: List<TensorValue>): List<Buffer> {
        val want = inputs.map { it.dtype to it.numel }
        if (want != layout) allocate(want)
        inputs.forEachIndexed { i, t ->
            when (val w = windows[i]) {
                is FloatBuffer -> {
                    w.clear()
                    if (t is TensorValue.Floats) w.put(t.data, t.offset, t.numel) else w.put(t.floats())
                    w.rewind()
                }
                is LongBuffer -> {
                    w.clear()
                    w.put(t.longs(), 0, t.numel)
                    w.rewind()
                }
                else -> error("unexpected window $w")
            }
        }
        return windows
    }

    private fun allocate(want: List<Pair<DType, Int>>) {
        val floats = want.filter { it.first == DType.FLOAT32 }.sumOf { it.second.toLong() }
        val longs = want.filter { it.first == DType.INT64 }.sumOf { it.second.toLong() }
        if (4 * floats > Int.MAX_VALUE || 8 * longs > Int.MAX_VALUE) throw ContractError("inputs of ${4 * floats + 8 * longs} bytes exceed a direct buffer (2 GB)")
        val fBlock = ByteBuffer.allocateDirect(4 * floats.toInt()).order(ByteOrder.nativeOrder()).asFloatBuffer()
        val lBlock = ByteBuffer.allocateDirect(8 * longs.toInt()).order(ByteOrder.nativeOrder()).asLongBuffer()
        var fAt = 0
        var lAt = 0
        windows = want.map { (dtype, n) ->
            if (dtype == DType.FLOAT32) {
                val d = fBlock.duplicate()
                d.position(fAt)
                d.limit(fAt + n)
                fAt += n
                d.slice()
            } else {
                val d = lBlock.duplicate()
                d.position(lAt)
                d.limit(lAt + n)
                lAt += n
                d.slice()
            }
        }
        layout = want
        bytes = 4 * floats + 8 * longs
        allocations++
    }
}
