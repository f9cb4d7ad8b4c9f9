package org.pytorch.executorch

import java.nio.Buffer
import java.nio.ByteBuffer
import java.nio.DoubleBuffer
import java.nio.FloatBuffer
import java.nio.IntBuffer
import java.nio.LongBuffer
import java.nio.ShortBuffer
import org.pytorch.executorch.annotations.Experimental

/**
 * Compile-only stand-in of org.pytorch.executorch.Tensor (executorch-android 1.5.x, Tensor.kt): a Kotlin class, so
 * `getRawDataBuffer()` is a function (no `rawDataBuffer` property syntax from Kotlin) while `dataAsFloatArray`, ...
 * are properties; the factories are @JvmStatic companion functions. The Buffer overloads of `fromBlob` require a
 * direct buffer in native byte order whose capacity equals numel(shape); the JNI then reads its memory by address.
 * Bodies throw.
 */
@Experimental
abstract class Tensor internal constructor(shape: LongArray) {
  @JvmField protected val shape: LongArray = shape

  fun numel(): Long = TODO("stub")
  fun shape(): LongArray = TODO("stub")
  abstract fun dtype(): DType
  fun dtypeJniCode(): Int = TODO("stub")

  open val dataAsByteArray: ByteArray get() = TODO("stub")
  open val dataAsShortArray: ShortArray get() = TODO("stub")
  open val dataAsUnsignedByteArray: ByteArray get() = TODO("stub")
  open val dataAsIntArray: IntArray get() = TODO("stub")
  open val dataAsFloatArray: FloatArray get() = TODO("stub")
  open val dataAsLongArray: LongArray get() = TODO("stub")
  open val dataAsDoubleArray: DoubleArray get() = TODO("stub")

  /** Copies the tensor's data into dst at dst's position (dst.put(data)): no intermediate array. */
  open fun copyDataInto(dst: FloatBuffer): Unit = TODO("stub")
  open fun copyDataInto(dst: ByteBuffer): Unit = TODO("stub")
  open fun copyDataIntoUnsigned(dst: ByteBuffer): Unit = TODO("stub")
  open fun copyDataInto(dst: IntBuffer): Unit = TODO("stub")
  open fun copyDataInto(dst: LongBuffer): Unit = TODO("stub")
  open fun copyDataInto(dst: DoubleBuffer): Unit = TODO("stub")
  open fun copyDataInto(dst: ShortBuffer): Unit = TODO("stub")

  /** The tensor's own data (for an output: a direct buffer over the method's arena), as its typed Buffer. */
  open fun getRawDataBuffer(): Buffer = TODO("stub")

  fun toByteArray(): ByteArray = TODO("stub")

  companion object {
    @JvmStatic fun allocateByteBuffer(numElements: Int): ByteBuffer = TODO("stub")
    @JvmStatic fun allocateIntBuffer(numElements: Int): IntBuffer = TODO("stub")
    @JvmStatic fun allocateFloatBuffer(numElements: Int): FloatBuffer = TODO("stub")
    @JvmStatic fun allocateLongBuffer(numElements: Int): LongBuffer = TODO("stub")
    @JvmStatic fun allocateHalfBuffer(numElements: Int): ShortBuffer = TODO("stub")
    @JvmStatic fun allocateDoubleBuffer(numElements: Int): DoubleBuffer = TODO("stub")

    @JvmStatic fun fromBlobUnsigned(data: ByteArray, shape: LongArray): Tensor = TODO("stub")
    @JvmStatic fun fromBlob(data: ByteArray, shape: LongArray): Tensor = TODO("stub")
    @JvmStatic fun fromBlob(data: IntArray, shape: LongArray): Tensor = TODO("stub")
    @JvmStatic fun fromBlob(data: FloatArray, shape: LongArray): Tensor = TODO("stub")
    @JvmStatic fun fromBlob(data: ShortArray, shape: LongArray): Tensor = TODO("stub")
    @JvmStatic fun fromBlob(data: LongArray, shape: LongArray): Tensor = TODO("stub")
    @JvmStatic fun fromBlob(data: DoubleArray, shape: LongArray): Tensor = TODO("stub")
    @JvmStatic fun fromBlobUnsigned(data: ByteBuffer, shape: LongArray): Tensor = TODO("stub")
    @JvmStatic fun fromBlob(data: ByteBuffer, shape: LongArray): Tensor = TODO("stub")
    @JvmStatic fun fromBlob(data: IntBuffer, shape: LongArray): Tensor = TODO("stub")
    @JvmStatic fun fromBlob(data: FloatBuffer, shape: LongArray): Tensor = TODO("stub")
    @JvmStatic fun fromBlob(data: ShortBuffer, shape: LongArray): Tensor = TODO("stub")
    @JvmStatic fun fromBlob(data: LongBuffer, shape: LongArray): Tensor = TODO("stub")
    @JvmStatic fun fromBlob(data: DoubleBuffer, shape: LongArray): Tensor = TODO("stub")
    @JvmStatic fun ones(shape: LongArray, dtype: DType): Tensor = TODO("stub")
    @JvmStatic fun zeros(shape: LongArray, dtype: DType): Tensor = TODO("stub")
    @JvmStatic fun numel(shape: LongArray): Long = TODO("stub")
    @JvmStatic fun fromByteArray(bytes: ByteArray): Tensor = TODO("stub")
  }
}
