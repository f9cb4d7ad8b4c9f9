package org.pytorch.executorch

/**
 * Compile-only stand-in of org.pytorch.executorch.ExecutorchRuntimeException (executorch-android 1.5.x,
 * ExecutorchRuntimeException.kt): `errorCode` a property, `getDetailedError()` a function, the error codes
 * companion constants (runtime/core/error.h). Bodies throw.
 */
open class ExecutorchRuntimeException(val errorCode: Int, details: String?) : RuntimeException(details) {
  constructor(errorCode: Int, details: String?, cause: Throwable?) : this(errorCode, details)

  fun getDetailedError(): String = TODO("stub")

  class ExecutorchInvalidArgumentException(details: String?) : ExecutorchRuntimeException(INVALID_ARGUMENT, details)

  companion object {
    const val OK = 0x00
    const val INTERNAL = 0x01
    const val INVALID_STATE = 0x02
    const val END_OF_METHOD = 0x03
    const val ALREADY_LOADED = 0x04
    const val NOT_SUPPORTED = 0x10
    const val NOT_IMPLEMENTED = 0x11
    const val INVALID_ARGUMENT = 0x12
    const val INVALID_TYPE = 0x13
    const val OPERATOR_MISSING = 0x14
    const val REGISTRATION_EXCEEDING_MAX_KERNELS = 0x15
    const val REGISTRATION_ALREADY_REGISTERED = 0x16
    const val NOT_FOUND = 0x20
    const val MEMORY_ALLOCATION_FAILED = 0x21
    const val ACCESS_FAILED = 0x22
    const val INVALID_PROGRAM = 0x23
    const val INVALID_EXTERNAL_DATA = 0x24
    const val OUT_OF_RESOURCES = 0x25
    const val DELEGATE_INVALID_COMPATIBILITY = 0x30
    const val DELEGATE_MEMORY_ALLOCATION_FAILED = 0x31
    const val DELEGATE_INVALID_HANDLE = 0x32

    @JvmStatic fun makeExecutorchException(errorCode: Int, details: String?): RuntimeException = TODO("stub")
  }
}
