package org.pytorch.executorch

/**
 * Compile-only stand-in of org.pytorch.executorch.ExecuTorchRuntime (executorch-android 1.5.x, ExecuTorchRuntime.kt):
 * the process's runtime (loads libexecutorch.so), its registered operators and backends.
 */
class ExecuTorchRuntime private constructor() {
  companion object {
    @JvmStatic fun getRuntime(): ExecuTorchRuntime = TODO("stub")
    @JvmStatic fun validateFilePath(path: String?, description: String): Unit = TODO("stub")
    @JvmStatic fun getRegisteredOps(): Array<String> = TODO("stub")
    @JvmStatic fun getRegisteredBackends(): Array<String> = TODO("stub")
  }
}
