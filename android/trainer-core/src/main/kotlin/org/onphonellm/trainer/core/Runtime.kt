package org.onphonellm.trainer.core

import java.io.File
import java.io.FileOutputStream
import java.io.IOException
import java.io.OutputStream

/**
 * The exported program as the trainer sees it. The app implements it with ExecuTorch
 * (`Module.load(path, LOAD_MODE_MMAP)`, `loadMethod`, `execute`); tests with a fake.
 *
 * Contract (manifest.schema.json): load every method before the first call — on ExecuTorch loading a
 * method re-initializes the shared LoRA state, so `setState` must come after all loads.
 * The optimizer runs inside the program: the app never updates weights itself.
 */
interface TrainingRuntime : AutoCloseable {
    fun loadMethod(name: String)

    /** One step: input_ids int64[T], labels int64[T], lr float32[1] -> loss float32[1]. */
    fun trainStep(method: String, inputIds: LongArray, labels: LongArray, lr: Float): Float

    /** `get_state()` -> float32[N]: LoRA params and optimizer state, manifest order. */
    fun getState(): FloatArray

    /** `set_state(float32[N])`: overwrite them (resume). */
    fun setState(state: FloatArray)
}

/**
 * Check that the runtime's methods share the program's state, as the contract assumes: set_state then
 * get_state must round-trip. They do on the host (Python `Runtime.load_program` allocates one set of
 * memory arenas per program); they do not on a runtime that gives each method its own planned memory
 * (ExecuTorch's `extension::Module` without `share_memory_arenas`, which the prebuilt Android AAR
 * uses): there each method would train, save and restore its own copy of the LoRA state.
 * Leaves the state as it found it.
 */
fun checkSharedState(runtime: TrainingRuntime, numel: Int) {
    val before = runtime.getState()
    if (before.size != numel) throw ContractError("get_state returned ${before.size} values, the manifest says $numel; re-export or re-push the program")
    val marked = before.copyOf()
    marked[0] = if (marked[0] == 1.0f) 2.0f else 1.0f
    runtime.setState(marked)
    val after = runtime.getState()
    runtime.setState(before)
    if (!after.contentEquals(marked)) {
        throw ContractError("the runtime does not share state between methods (set_state is not seen by get_state): its methods have " +
            "separate memory arenas; use an ExecuTorch build whose Module shares memory arenas (docs/android.md)")
    }
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
