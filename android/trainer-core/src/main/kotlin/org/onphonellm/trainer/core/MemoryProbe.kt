package org.onphonellm.trainer.core

/**
 * One memory sample, in the units and meaning of a telemetry `memory` event: bytes, and [probe]
 * says what the numbers are (telemetry_event.schema.json, `memory.probe`).
 */
data class MemorySample(
    val probe: String,
    val anonBytes: Long? = null,
    val rssBytes: Long? = null,
    val pssBytes: Long? = null,
    val peakBytes: Long? = null,
    val swapBytes: Long? = null,
    val availableBytes: Long? = null,
    val lowMemory: Boolean? = null,
    val trimLevel: Int? = null,
) {
    /** The telemetry event's type-specific fields (nulls left out). */
    fun eventFields(step: Long?): Map<String, Any?> = linkedMapOf<String, Any?>(
        "probe" to probe, "step" to step, "anon_bytes" to anonBytes, "rss_bytes" to rssBytes, "pss_bytes" to pssBytes,
        "peak_bytes" to peakBytes, "swap_bytes" to swapBytes, "available_bytes" to availableBytes,
        "low_memory" to lowMemory, "trim_level" to trimLevel,
    ).filterValues { it != null }
}

/** Samples memory now; the app combines /proc/self/status, Debug and ActivityManager (see the glue). */
fun interface MemoryProbe {
    /** Current samples; the first one carrying anon_bytes is the primary probe (run_end.peak_bytes). */
    fun sample(): List<MemorySample>
}

/**
 * `/proc/<pid>/status` (kernel format "Key:\t  value kB"). RssAnon is the app's dirty anonymous
 * memory, what Android's low-memory killer weighs; VmHWM is the peak of the whole RSS (file pages
 * included), so it is an upper bound, not an anon peak.
 */
object ProcStatus {
    /** kB fields by name (VmHWM, VmRSS, RssAnon, RssFile, RssShmem, VmSwap, ...). */
    fun parseKb(text: String): Map<String, Long> {
        val out = LinkedHashMap<String, Long>()
        for (line in text.lineSequence()) {
            val colon = line.indexOf(':')
            if (colon <= 0) continue
            val parts = line.substring(colon + 1).trim().split(Regex("\\s+"))
            if (parts.size == 2 && parts[1] == "kB") parts[0].toLongOrNull()?.let { out[line.substring(0, colon)] = it }
        }
        return out
    }

    fun sample(text: String): MemorySample {
        val kb = parseKb(text)
        fun bytes(key: String) = kb[key]?.let { it * 1024 }
        if (kb["RssAnon"] == null && kb["VmRSS"] == null) throw BadInput("no RssAnon or VmRSS in /proc status text")
        return MemorySample("android_proc_status", anonBytes = bytes("RssAnon"), rssBytes = bytes("VmRSS"),
            peakBytes = bytes("VmHWM"), swapBytes = bytes("VmSwap"))
    }
}
