package org.onphonellm.trainer.core

import java.io.File
import java.io.FileInputStream
import java.nio.ByteBuffer
import java.nio.ByteOrder

/**
 * The training state the app owns (contract version 2): one flat float32 array of `state.numel`
 * values; entry e is values[e.offset, e.offset + prod(e.shape)). It starts as `state.init_file`, a
 * checkpoint is this array written to disk, and every step passes each entry to the method as an
 * input and copies each returned entry back into its slice. The program keeps nothing between calls.
 */
class ProgramState(private val manifest: Manifest, val values: FloatArray) {
    init {
        if (values.size != manifest.stateNumel) throw ContractError("a state of ${values.size} values for a program of ${manifest.stateNumel}")
    }

    /** A method's inputs: input_ids, labels, lr, then every state entry (a window of [values], not a copy), in order. */
    fun inputs(inputIds: LongArray, labels: LongArray, lr: Float): List<TensorValue> {
        val t = listOf(manifest.seqLen)
        val fixed = listOf(TensorValue.Longs("input_ids", t, inputIds), TensorValue.Longs("labels", t, labels),
            TensorValue.Floats("lr", listOf(1), floatArrayOf(lr)))
        return fixed + manifest.stateEntries.map { TensorValue.Floats(it.name, it.shape, values, it.offset) }
    }

    /**
     * Check what [method] returned against the manifest (count, names, sizes, dtypes) and return the
     * loss. Touches nothing: a bad output is found before any slice is overwritten.
     */
    fun checkOutputs(method: Manifest.MethodSpec, outputs: List<TensorValue>): Float {
        fun fail(why: String): Nothing = throw ContractError("$why; the program does not match its manifest.json: push the program directory again or re-export it")
        if (outputs.size != method.outputs.size) fail("method ${method.name} returned ${outputs.size} outputs, the manifest lists ${method.outputs.size}")
        outputs.forEachIndexed { i, out ->
            val spec = method.outputs[i]
            if (out.name.isNotEmpty() && out.name != spec.name) fail("output $i of method ${method.name} is named '${out.name}', the manifest says '${spec.name}'")
            if (out.dtype != DType.FLOAT32) fail("output '${spec.name}' of method ${method.name} is ${out.dtype}, not float32")
            val want = if (i == 0) 1 else (manifest.entry(spec.name) ?: fail("output '${spec.name}' of method ${method.name} is not a state entry")).numel
            if (out.numel != want) fail("output '${spec.name}' of method ${method.name} has ${out.numel} values, ${if (i == 0) "the loss" else "its state entry"} $want")
        }
        return FloatArray(1).also { outputs[0].copyInto(it, 0) }[0]
    }

    /** Copy every output after the loss into its entry's slice (checked first: all or nothing). */
    fun copyOutputs(method: Manifest.MethodSpec, outputs: List<TensorValue>) {
        checkOutputs(method, outputs)
        for (i in 1 until outputs.size) outputs[i].copyInto(values, manifest.entry(method.outputs[i].name)!!.offset)
    }

    /** The entry's current values (a copy). */
    fun slice(name: String): FloatArray {
        val e = manifest.entry(name) ?: throw ContractError("no state entry '$name'")
        return values.copyOfRange(e.offset, e.offset + e.numel)
    }

    companion object {
        /** The initial state: `state.init_file` of the program directory, numel raw little-endian float32 values. */
        fun readInit(programDir: File, manifest: Manifest): ProgramState {
            val file = File(programDir, manifest.stateInitFile)
            if (!file.isFile) throw ContractError("$file is missing (state.init_file of manifest.json); push the whole program directory again")
            val expected = 4L * manifest.stateNumel
            if (file.length() != expected) {
                throw ContractError("$file holds ${file.length()} bytes, the manifest's ${manifest.stateNumel} float32 values need $expected; " +
                    "push the program directory again or re-export it")
            }
            val values = FloatArray(manifest.stateNumel)
            FileInputStream(file).use { input ->
                val chunk = ByteArray(1 shl 16)
                var filled = 0
                while (filled < values.size) {
                    val want = minOf(chunk.size, 4 * (values.size - filled))
                    var got = 0
                    while (got < want) {
                        val n = input.read(chunk, got, want - got)
                        if (n < 0) throw ContractError("$file ended early; push it again")
                        got += n
                    }
                    ByteBuffer.wrap(chunk, 0, want).order(ByteOrder.LITTLE_ENDIAN).asFloatBuffer().get(values, filled, want / 4)
                    filled += want / 4
                }
            }
            return ProgramState(manifest, values)
        }
    }
}
