package org.onphonellm.trainer.core

import java.io.File

/**
 * What the screen holds that a rotation, a config change or the process's death must not lose, as string
 * pairs (the Activity puts them into its saved-state Bundle, which Android keeps across all three). A text
 * longer than [SPILL_CHARS] (a Bundle over ~500 KB makes Android throw TransactionTooLargeException) is kept
 * in a file under the spill directory instead, and only its path is saved.
 */
data class ScreenState(
    val program: String? = null,
    val input: String = "",
    /** The picked file's text, kept as a file in the app's cache (null: the pasted text is used). */
    val pickedPath: String? = null,
    val pickedName: String = "pasted text",
    val steps: String = "",
    val heldOut: String = "",
    val lcsbK: String = "",
    val lcsbPolicy: String? = null,
    val lessMemory: Boolean = false,
    val prompt: String = "",
    val dataInfo: String = "no data yet",
    val chargingOnly: Boolean = false,
) {
    /** The pairs to save; [spillDir]: where a long pasted text goes. */
    fun save(spillDir: File): Map<String, String> {
        val out = LinkedHashMap<String, String>()
        program?.let { out["program"] = it }
        if (input.length > SPILL_CHARS) {
            spillDir.mkdirs()
            val f = File(spillDir, "screen-input.txt")
            AtomicFiles.write(f) { it.write(input.toByteArray(Charsets.UTF_8)) }
            out["input_file"] = f.path
        } else out["input"] = input
        pickedPath?.let { out["picked_path"] = it }
        out["picked_name"] = pickedName
        out["steps"] = steps
        out["held_out"] = heldOut
        out["lcsb_k"] = lcsbK
        lcsbPolicy?.let { out["lcsb_policy"] = it }
        out["less_memory"] = lessMemory.toString()
        out["prompt"] = prompt
        out["data_info"] = dataInfo
        out["charging_only"] = chargingOnly.toString()
        return out
    }

    /** The picked text, read back from its file (null: none, or the file is gone). */
    fun pickedText(): String? = pickedPath?.let { File(it) }?.takeIf { it.isFile }?.readText(Charsets.UTF_8)

    companion object {
        const val SPILL_CHARS = 64 * 1024

        /** What [save] wrote (missing keys: defaults; a spilled input whose file is gone: empty). */
        fun restore(m: Map<String, String?>): ScreenState = ScreenState(
            program = m["program"],
            input = m["input"] ?: m["input_file"]?.let { File(it) }?.takeIf { it.isFile }?.readText(Charsets.UTF_8) ?: "",
            pickedPath = m["picked_path"]?.takeIf { File(it).isFile },
            pickedName = m["picked_name"] ?: "pasted text",
            steps = m["steps"] ?: "", heldOut = m["held_out"] ?: "", lcsbK = m["lcsb_k"] ?: "",
            lcsbPolicy = m["lcsb_policy"], lessMemory = m["less_memory"] == "true", prompt = m["prompt"] ?: "",
            dataInfo = m["data_info"] ?: "no data yet", chargingOnly = m["charging_only"] == "true",
        )
    }
}
