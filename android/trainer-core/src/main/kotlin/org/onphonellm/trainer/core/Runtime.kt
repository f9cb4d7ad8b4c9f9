package org.onphonellm.trainer.core

import java.io.File
import java.io.FileOutputStream
import java.io.IOException
import java.io.OutputStream

/** Element type of a [TensorValue]: the two the contract uses. */
enum class DType(val manifestName: String) {
    INT64("int64"), FLOAT32("float32");

    companion object {
        fun of(name: String, where: String): DType =
            values().firstOrNull { it.manifestName == name } ?: throw ContractError("$where: dtype '$name' is not int64 or float32")
    }
}

/**
 * A tensor crossing the app/runtime boundary, row-major. Inputs are windows of the app's arrays
 * (a state entry is `numel` values of the one state array from its offset: nothing is copied to
 * build the inputs); outputs may be windows of the runtime's memory, valid until its next call, so
 * they are read by copying ([copyInto]).
 */
abstract class TensorValue(val name: String, val shape: List<Int>) {
    val numel: Int = shape.fold(1) { a, b -> a * b }
    abstract val dtype: DType

    /** Copy the float32 values into dst[offset, offset + numel). */
    open fun copyInto(dst: FloatArray, offset: Int): Unit = throw ContractError("tensor '$name' is $dtype, not float32")

    /** The int64 values (a copy or the backing array: do not modify). */
    open fun longs(): LongArray = throw ContractError("tensor '$name' is $dtype, not int64")

    fun floats(): FloatArray = FloatArray(numel).also { copyInto(it, 0) }

    override fun toString(): String = "$name $dtype$shape"

    class Longs(name: String, shape: List<Int>, val data: LongArray) : TensorValue(name, shape) {
        init { require(data.size == numel) { "$name: ${data.size} values for shape $shape" } }
        override val dtype get() = DType.INT64
        override fun longs(): LongArray = data
    }

    /** float32 values data[offset, offset + numel). */
    class Floats(name: String, shape: List<Int>, val data: FloatArray, val offset: Int = 0) : TensorValue(name, shape) {
        init { require(offset >= 0 && offset + numel <= data.size) { "$name: [$offset, ${offset + numel}) lies outside ${data.size} values" } }
        override val dtype get() = DType.FLOAT32
        override fun copyInto(dst: FloatArray, offset: Int) = System.arraycopy(data, this.offset, dst, offset, numel)
    }
}

/**
 * The exported program as the trainer sees it (contract version 2, functional state): a set of
 * named methods, each a function of its inputs. The app implements it with ExecuTorch
 * (`Module.load(path, LOAD_MODE_MMAP)`, `loadMethod`, `execute`); tests with a fake.
 *
 * The runtime keeps no training state between calls: the trainer owns the flat state array and
 * passes every entry in; the method returns the loss and the new values of the entries it changed.
 * The optimizer runs inside the program: the app only copies outputs into place.
 */
interface TrainingRuntime : AutoCloseable {
    /** Prepare a method (the trainer loads every method before the first call, so failures and memory show early). */
    fun loadMethod(name: String)

    /**
     * Run [method] on [inputs] (the manifest's order); returns its outputs in the manifest's order.
     * Names of the returned tensors may be empty (positional runtimes such as ExecuTorch); a
     * non-empty name must be the manifest's. Outputs may be read only until the next call.
     */
    fun execute(method: String, inputs: List<TensorValue>): List<TensorValue>
}

/** Time as the trainer needs it, injectable so tests run without waiting. */
interface Clock {
    /** Unix time in seconds (telemetry timestamps). */
    fun wallSeconds(): Double
    /** Monotonic nanoseconds (durations). */
    fun monoNanos(): Long
    fun sleepMs(ms: Long)

    object System : Clock {
        override fun wallSeconds(): Double = java.lang.System.currentTimeMillis() / 1000.0
        override fun monoNanos(): Long = java.lang.System.nanoTime()
        override fun sleepMs(ms: Long) = Thread.sleep(ms)
    }
}

/** Outputs written atomically: a temp file in the same directory, fsync, then rename over the target. */
object AtomicFiles {
    fun write(target: File, writer: (OutputStream) -> Unit) {
        val dir = target.absoluteFile.parentFile ?: throw IOException("$target has no parent directory")
        if (!dir.isDirectory && !dir.mkdirs()) throw IOException("cannot create $dir")
        val tmp = File.createTempFile(".${target.name}.", ".tmp", dir)
        try {
            FileOutputStream(tmp).use { out ->
                val buffered = out.buffered(1 shl 16)
                writer(buffered)
                buffered.flush()
                out.fd.sync()
            }
            // rename(2) replaces the target atomically on Linux/Android: readers see the old or the new file.
            if (!tmp.renameTo(target)) throw IOException("cannot rename $tmp to $target")
        } finally {
            if (tmp.exists()) tmp.delete()
        }
    }

    fun writeText(target: File, text: String) = write(target) { it.write(text.toByteArray(Charsets.UTF_8)) }

    /** Replace directory [target] by one filled by [fill]: built beside it, then swapped in. */
    fun replaceDir(target: File, fill: (File) -> Unit) {
        val parent = target.absoluteFile.parentFile
        if (!parent.isDirectory && !parent.mkdirs()) throw IOException("cannot create $parent")
        val tmp = File(parent, ".${target.name}.tmp-${java.lang.System.nanoTime()}")
        val old = File(parent, ".${target.name}.old-${java.lang.System.nanoTime()}")
        try {
            if (!tmp.mkdirs()) throw IOException("cannot create $tmp")
            fill(tmp)
            if (target.exists() && !target.renameTo(old)) throw IOException("cannot move $target aside")
            if (!tmp.renameTo(target)) {
                old.renameTo(target)
                throw IOException("cannot rename $tmp to $target")
            }
        } finally {
            tmp.deleteRecursively()
            old.deleteRecursively()
        }
    }
}
