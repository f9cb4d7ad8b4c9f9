package org.pytorch.executorch

import org.pytorch.executorch.annotations.Experimental

/**
 * Compile-only stand-in of org.pytorch.executorch.EValue (executorch-android 1.5.x, EValue.kt): the same public
 * declarations (`isTensor`, ... are Kotlin properties; `toTensor()`, ... functions). Bodies throw.
 */
@Experimental
class EValue private constructor(@JvmField val mTypeCode: Int) {
  @JvmField var mData: Any? = null

  val isNone: Boolean get() = TODO("stub")
  val isTensor: Boolean get() = TODO("stub")
  val isBool: Boolean get() = TODO("stub")
  val isInt: Boolean get() = TODO("stub")
  val isDouble: Boolean get() = TODO("stub")
  val isString: Boolean get() = TODO("stub")

  fun toTensor(): Tensor = TODO("stub")
  fun toBool(): Boolean = TODO("stub")
  fun toInt(): Long = TODO("stub")
  fun toDouble(): Double = TODO("stub")
  fun toStr(): String = TODO("stub")
  fun toByteArray(): ByteArray = TODO("stub")

  companion object {
    @JvmStatic fun optionalNone(): EValue = TODO("stub")
    @JvmStatic fun from(tensor: Tensor): EValue = TODO("stub")
    @JvmStatic fun from(value: Boolean): EValue = TODO("stub")
    @JvmStatic fun from(value: Long): EValue = TODO("stub")
    @JvmStatic fun from(value: Double): EValue = TODO("stub")
    @JvmStatic fun from(value: String): EValue = TODO("stub")
    @JvmStatic fun fromByteArray(bytes: ByteArray): EValue = TODO("stub")
  }
}
