package org.onphonellm.trainer.core

import java.nio.ByteBuffer
import java.nio.ByteOrder
import java.security.MessageDigest

/** Element types of a program's tensors (manifest names; safetensors names). */
enum class ElemType(val manifestName: String, val safetensorsName: String, val size: Int) {
    FLOAT32("float32", "F32", 4), INT64("int64", "I64", 8), INT32("int32", "I32", 4),
    UINT8("uint8", "U8", 1), INT8("int8", "I8", 1);

    companion object {
        fun of(name: String, where: String): ElemType =
            values().firstOrNull { it.manifestName == name } ?: throw BadInput("$where: dtype '$name' is not one of ${values().map { it.manifestName }}")
        fun ofSafetensors(name: String, where: String): ElemType =
            values().firstOrNull { it.safetensorsName == name } ?: throw BadInput("$where: safetensors dtype '$name' is not supported")
    }
}

/**
 * A tensor of a program: a window of a little-endian buffer (the mapped weights file, the state array,
 * an activation the app keeps, or the runtime's output memory), never copied to be passed on. [data] has
 * position 0 and exactly [nbytes] remaining. A runtime's output may be valid only until its next call.
 */
class TensorBuffer(val name: String, val dtype: ElemType, val shape: List<Int>, data: ByteBuffer) {
    val numel: Int = shape.fold(1) { a, b -> a * b }
    val nbytes: Int = numel * dtype.size
    val data: ByteBuffer = data.order(ByteOrder.LITTLE_ENDIAN)

    init {
        if (data.position() != 0 || data.remaining() != nbytes)
            throw BadInput("$name: ${data.remaining()} bytes from position ${data.position()} for $dtype$shape ($nbytes bytes)")
    }

    fun float(i: Int): Float = data.getFloat(4 * i)
    fun long(i: Int): Long = data.getLong(8 * i)
    fun floats(): FloatArray = FloatArray(numel) { data.getFloat(4 * it) }

    /** sha256 of exactly the tensor's bytes (row-major, little-endian). */
    fun sha256(): String = sha256Hex(data)

    /** A new direct buffer holding a copy (what the app keeps of a runtime output). */
    fun copy(name: String = this.name): TensorBuffer = TensorBuffer(name, dtype, shape, ByteBuffer.allocateDirect(nbytes).also { copyBytes(data, it, 0) })

    override fun toString(): String = "$name $dtype$shape"

    companion object {
        fun floats(name: String, shape: List<Int>, values: FloatArray): TensorBuffer {
            val b = ByteBuffer.allocateDirect(4 * values.size).order(ByteOrder.LITTLE_ENDIAN)
            for ((i, v) in values.withIndex()) b.putFloat(4 * i, v)
            return TensorBuffer(name, ElemType.FLOAT32, shape, b)
        }
        fun longs(name: String, shape: List<Int>, values: LongArray): TensorBuffer {
            val b = ByteBuffer.allocateDirect(8 * values.size).order(ByteOrder.LITTLE_ENDIAN)
            for ((i, v) in values.withIndex()) b.putLong(8 * i, v)
            return TensorBuffer(name, ElemType.INT64, shape, b)
        }
    }
}

/** Bytes [from, from + len) of [b] as a little-endian buffer of its own (shares the memory). */
fun ByteBuffer.window(from: Int, len: Int): ByteBuffer {
    val d = duplicate()
    d.limit(from + len)
    d.position(from)
    return d.slice().order(ByteOrder.LITTLE_ENDIAN)
}

/** Copy all of [src] (from its position 0) into [dst] at byte [at]; neither buffer's position changes. */
fun copyBytes(src: ByteBuffer, dst: ByteBuffer, at: Int) {
    val s = src.duplicate()
    s.position(0)
    val d = dst.duplicate()
    d.position(at)
    d.put(s)
}

fun sha256Hex(b: ByteBuffer): String {
    val md = MessageDigest.getInstance("SHA-256")
    val d = b.duplicate()
    d.position(0)
    md.update(d)
    return md.digest().joinToString("") { "%02x".format(it) }
}
