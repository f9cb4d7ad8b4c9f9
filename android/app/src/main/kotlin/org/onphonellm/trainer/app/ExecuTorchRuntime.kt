package org.onphonellm.trainer.app

import org.onphonellm.trainer.core.TrainingRuntime
import org.pytorch.executorch.EValue
import org.pytorch.executorch.Module
import org.pytorch.executorch.Tensor
import java.io.File

/**
 * The exported program on ExecuTorch's Android runtime. The program file is memory-mapped
 * (LOAD_MODE_MMAP): frozen weights stay clean file-backed pages, which Android's memory accounting
 * (RssAnon, Private Dirty) does not count against the app.
 *
 * The contract needs the methods to share one set of memory arenas (the LoRA state lives in the
 * shared mutable-buffer arena). The Trainer checks that with a set_state/get_state round trip before
 * the first step and refuses to train otherwise; see docs/android.md for the prebuilt AAR.
 */
class ExecuTorchRuntime(program: File) : TrainingRuntime {
    private val module: Module = Module.load(program.absolutePath, Module.LOAD_MODE_MMAP)

    override fun loadMethod(name: String) = module.loadMethod(name)

    override fun trainStep(method: String, inputIds: LongArray, labels: LongArray, lr: Float): Float {
        val t = longArrayOf(inputIds.size.toLong())
        val out = module.execute(method, EValue.from(Tensor.fromBlob(inputIds, t)), EValue.from(Tensor.fromBlob(labels, t)),
            EValue.from(Tensor.fromBlob(floatArrayOf(lr), longArrayOf(1))))
        return out[0].toTensor().dataAsFloatArray[0]
    }

    override fun getState(): FloatArray = module.execute("get_state")[0].toTensor().dataAsFloatArray

    override fun setState(state: FloatArray) {
        module.execute("set_state", EValue.from(Tensor.fromBlob(state, longArrayOf(state.size.toLong()))))
    }

    override fun close() = module.close()
}
