package org.onphonellm.trainer.app

import org.onphonellm.trainer.core.ElemType
import org.onphonellm.trainer.core.NdBuffer
import org.onphonellm.trainer.core.ProgramRuntime
import org.onphonellm.trainer.core.ProgramV3
import org.pytorch.executorch.EValue
import org.pytorch.executorch.Module
import org.pytorch.executorch.Tensor
import java.io.File
import java.nio.ByteBuffer
import java.nio.ByteOrder
import org.pytorch.executorch.DType as EtDType

/**
 * A contract-v3 program on the stock ExecuTorch Android runtime (`org.pytorch:executorch-android`), for
 * trainer-core's [org.onphonellm.trainer.core.LayerLoop] (driven by [org.onphonellm.trainer.core.TrainingSession]
 * in [TrainingService]); compiled against the API stubs in android/host-stubs, not run here.
 *
 * - `Module.load(model.pte, LOAD_MODE_MMAP)`: the program file stays clean file-backed pages. The frozen
 *   weights are not in the .pte: they are weights.safetensors, memory-mapped by trainer-core.
 * - Inputs are the loop's views, wrapped without copying: `Tensor.fromBlob` over the mapped weights'
 *   direct buffers, the state buffer's entry windows, the app's activations (the JNI reads a direct
 *   buffer's address; each window is its own slice, so `capacity()` is exactly the tensor's size).
 *   Little-endian = the native order of every Android ABI.
 * - Outputs live in the method's arena until the next call; each is copied once into a direct buffer
 *   (`copyDataInto`) that the loop copies again into what it keeps (state slice, cache row, activation).
 * - Threads: training and a generation beside it call this one Module from two threads, never at once: each
 *   call, from wrapping the inputs to the loop's copy of the outputs, holds the session's fair runtime lock
 *   (`LayerLoop.runtimeLock`). The Module's own lock (`Module.execute`) covers the native call only, not the
 *   outputs, which alias the method's arena.
 */
class ExecuTorchRuntime(pte: File, program: ProgramV3, methods: Collection<String> = program.methods.keys) :
    ProgramRuntime, AutoCloseable {
    private val module: Module = Module.load(pte.absolutePath, Module.LOAD_MODE_MMAP)
    private val specs = program.methods

    init {
        for (m in methods) module.loadMethod(m)  // every arena allocated up front: failures and memory show early
    }

    override fun execute(method: String, inputs: List<NdBuffer>): List<NdBuffer> {
        val spec = specs[method] ?: throw IllegalStateException("no method $method")
        val args = Array(inputs.size) { i -> EValue.from(wrap(inputs[i])) }
        val outs = module.execute(method, *args)
        if (outs.size != spec.outputs.size) throw IllegalStateException("$method returned ${outs.size} outputs, the manifest lists ${spec.outputs.size}")
        return outs.mapIndexed { i, v ->
            if (!v.isTensor) throw IllegalStateException("output $i of $method is not a tensor")
            val t = v.toTensor()
            val io = spec.outputs[i]
            val buf = ByteBuffer.allocateDirect(io.numel * io.dtype.size).order(ByteOrder.nativeOrder())
            when (t.dtype()) {
                EtDType.FLOAT -> t.copyDataInto(buf.asFloatBuffer())
                EtDType.INT64 -> t.copyDataInto(buf.asLongBuffer())
                else -> throw IllegalStateException("output ${io.name} of $method is ${t.dtype()}")
            }
            NdBuffer(io.name, io.dtype, t.shape().map { it.toInt() }, buf)
        }
    }

    private fun wrap(x: NdBuffer): Tensor {
        val shape = LongArray(x.shape.size) { x.shape[it].toLong() }
        val b = x.data.duplicate().order(ByteOrder.nativeOrder())
        return when (x.dtype) {
            ElemType.FLOAT32 -> Tensor.fromBlob(b.asFloatBuffer(), shape)
            ElemType.INT64 -> Tensor.fromBlob(b.asLongBuffer(), shape)
            ElemType.INT32 -> Tensor.fromBlob(b.asIntBuffer(), shape)
            ElemType.UINT8 -> Tensor.fromBlobUnsigned(b, shape)
            ElemType.INT8 -> Tensor.fromBlob(b, shape)
        }
    }

    override fun close() = module.close()
}
