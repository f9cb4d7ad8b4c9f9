package org.onphonellm.trainer.app

import org.onphonellm.trainer.core.DirectInputs
import org.onphonellm.trainer.core.TensorValue
import org.onphonellm.trainer.core.TrainingRuntime
import org.pytorch.executorch.EValue
import org.pytorch.executorch.Module
import org.pytorch.executorch.Tensor
import java.io.File
import java.nio.FloatBuffer
import java.nio.LongBuffer
import org.onphonellm.trainer.core.DType as CoreDType
import org.pytorch.executorch.DType as EtDType

/**
 * The exported program on the stock ExecuTorch Android runtime (`org.pytorch:executorch-android`),
 * contract version 2: every method is a function of its inputs, so the prebuilt AAR's per-method
 * memory arenas are fine (nothing is shared between methods).
 *
 * - The program file is memory-mapped (LOAD_MODE_MMAP): frozen weights stay clean file-backed pages,
 *   which Android's accounting (RssAnon, Private Dirty) does not charge to the app.
 * - Inputs: the JNI passes a tensor's direct-buffer address to the method, so ids, labels, lr and every
 *   state slice are copied into persistent direct buffers ([DirectInputs]) and wrapped with
 *   `Tensor.fromBlob(buffer, shape)` (no allocation per step).
 * - Outputs: the JNI wraps the method's own output memory (its planned arena), valid until the next
 *   call; each is copied straight into the caller's array (`Tensor.copyDataInto(FloatBuffer)` on a
 *   window of the state), with no intermediate array.
 */
class ExecuTorchRuntime(program: File) : TrainingRuntime {
    private val module: Module = Module.load(program.absolutePath, Module.LOAD_MODE_MMAP)
    private val staged = DirectInputs()

    override fun loadMethod(name: String) = module.loadMethod(name)

    override fun execute(method: String, inputs: List<TensorValue>): List<TensorValue> {
        val buffers = staged.stage(inputs)
        val args = Array(inputs.size) { i ->
            val shape = LongArray(inputs[i].shape.size) { inputs[i].shape[it].toLong() }
            when (val b = buffers[i]) {
                is FloatBuffer -> EValue.from(Tensor.fromBlob(b, shape))
                is LongBuffer -> EValue.from(Tensor.fromBlob(b, shape))
                else -> error("unexpected buffer $b")
            }
        }
        return module.execute(method, *args).mapIndexed { i, v ->
            if (!v.isTensor) throw IllegalStateException("output $i of $method is not a tensor")
            Output(v.toTensor())
        }
    }

    override fun close() = module.close()

    /** An output tensor, read by copying; unnamed (ExecuTorch outputs are positional). */
    private class Output(private val t: Tensor) : TensorValue("", t.shape().map { it.toInt() }) {
        override val dtype: CoreDType = when (t.dtype()) {
            EtDType.FLOAT -> CoreDType.FLOAT32
            EtDType.INT64 -> CoreDType.INT64
            else -> throw IllegalStateException("output of dtype ${t.dtype()}: the contract has only float32 and int64")
        }

        override fun copyInto(dst: FloatArray, offset: Int) {
            if (dtype != CoreDType.FLOAT32) super.copyInto(dst, offset)
            t.copyDataInto(FloatBuffer.wrap(dst, offset, numel))
        }

        override fun longs(): LongArray = if (dtype == CoreDType.INT64) t.dataAsLongArray else super.longs()
    }
}
