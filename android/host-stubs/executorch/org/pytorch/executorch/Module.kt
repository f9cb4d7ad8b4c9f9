package org.pytorch.executorch

import java.io.Closeable
import org.pytorch.executorch.annotations.Experimental

/**
 * Compile-only stand-in of org.pytorch.executorch.Module (executorch-android 1.5.x, Module.kt): `load` is a
 * @JvmStatic @JvmOverloads companion function (modelPath, loadMode = LOAD_MODE_FILE, numThreads = 0), beside the
 * backend-options overload; `execute` takes a vararg. Bodies throw.
 */
@Experimental
open class Module private constructor() : Closeable {
  open fun forward(vararg inputs: EValue): Array<EValue> = TODO("stub")
  open fun execute(methodName: String, vararg inputs: EValue): Array<EValue> = TODO("stub")
  open fun loadMethod(methodName: String): Unit = TODO("stub")
  open fun getMethods(): Array<String> = TODO("stub")
  open fun getMethodMetadata(name: String): MethodMetadata = TODO("stub")
  open fun readLogBuffer(): Array<String>? = TODO("stub")
  @Experimental open fun etdump(): Boolean = TODO("stub")
  @Experimental open fun etdump(outputPath: String): Boolean = TODO("stub")
  open fun destroy(): Unit = TODO("stub")
  override fun close(): Unit = TODO("stub")

  companion object {
    const val LOAD_MODE_FILE = 0
    const val LOAD_MODE_MMAP = 1
    const val LOAD_MODE_MMAP_USE_MLOCK = 2
    const val LOAD_MODE_MMAP_USE_MLOCK_IGNORE_ERRORS = 3

    @JvmStatic @JvmOverloads
    fun load(modelPath: String?, loadMode: Int = LOAD_MODE_FILE, numThreads: Int = 0): Module = TODO("stub")

    @JvmStatic @JvmOverloads
    fun load(modelPath: String?, options: BackendOptionsMap, loadMode: Int = LOAD_MODE_FILE, numThreads: Int = 0): Module = TODO("stub")

    @JvmStatic fun readLogBufferStatic(): Array<String>? = TODO("stub")
  }
}
