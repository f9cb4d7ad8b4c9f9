package org.onphonellm.trainer.core

/**
 * The run-time knobs of a step's working set (telemetry `working_set`): checkpoint groups and LCSB's layers per
 * step ([lcsbK] null: every layer). A program's rows are padded to its export seq_len, so the third knob of the host's
 * ladder (the next rows' length) is not one the app has (docs/training.md "Memory pressure").
 */
data class WorkingSet(val layersPerCheckpoint: Int, val lcsbK: Int?) {
    fun selected(layers: Int): Int = lcsbK ?: layers

    fun toJson(): Map<String, Any?> = linkedMapOf("layers_per_checkpoint" to layersPerCheckpoint, "lcsb_k" to (lcsbK ?: Json.Null))

    fun describe(): String = "layers_per_checkpoint $layersPerCheckpoint, lcsb_k ${lcsbK ?: "all"}"
}

/** One notch down the ladder: [knob] changed [before] into [after]; [predictedBytes] the planner's peak for [after]. */
data class Notch(val knob: String, val before: WorkingSet, val after: WorkingSet, val predictedBytes: Long?)

/** What a memory signal at a step boundary asks of the run. */
sealed class PressureAction {
    object Continue : PressureAction()
    /** Run the next steps with [notch]'s smaller working set (a `memory_adapted` event). */
    data class Adapt(val notch: Notch, val trigger: String, val measuredBytes: Long) : PressureAction()
    /** Nothing smaller is left: checkpoint and stop ([trigger] measured / predicted) or pause (os_signal). */
    data class Exhausted(val trigger: String, val measuredBytes: Long, val message: String) : PressureAction()
}

/**
 * The memory-pressure policy of a phone run, a pure function of the signals (host-tested with simulated ones): the
 * host's ladder (toolchain/memory/fallback.py) in its order, checkpoint groups doubled up to the layers per step,
 * then LCSB k halved down to 1 (cyclic plan), a notch taken only where the planner's figure ([predict]) is lower.
 *
 * Signals, at a step boundary: the footprint the step reached ([measured], Android RssAnon) over the budget
 * ("measured"); that footprint plus the largest growth one step has shown over it ("predicted"); the OS's pressure
 * ([osSignal]: Android onTrimMemory RUNNING_LOW or above / lowMemory, iOS the memory-pressure source or
 * os_proc_available_memory below the headroom: "os_signal"). An OS signal adapts at most once per [osCooldownSteps]
 * steps (a signal is an event, the app holds it for a while: one notch per event, then the next step is measured).
 */
class PressurePolicy(
    val layers: Int,
    val budgetBytes: Long,
    /** The planner's step peak for a working set (bytes; only its order matters when the base is unknown). */
    private val predict: (WorkingSet) -> Long?,
    private val osCooldownSteps: Long = 3,
) {
    private var lastOsAdaptStep = Long.MIN_VALUE / 2

    /** [ws] with [knob] one notch lower, or null at its lowest (fallback.py `notch`). */
    fun notch(ws: WorkingSet, knob: String): WorkingSet? {
        val k = ws.selected(layers)
        return when (knob) {
            KNOB_GROUPS -> if (ws.layersPerCheckpoint >= k) null else ws.copy(layersPerCheckpoint = minOf(2 * ws.layersPerCheckpoint, k))
            KNOB_LCSB -> if (k <= 1) null else maxOf(1, k / 2).let { nk -> WorkingSet(minOf(ws.layersPerCheckpoint, nk), nk) }
            else -> throw IllegalArgumentException("unknown knob $knob")
        }
    }

    /** The first notch in [KNOBS] order the planner says lowers the peak (a knob's further notches tried when one does not); null: none. */
    fun next(ws: WorkingSet): Notch? {
        val base = predict(ws)
        for (knob in KNOBS) {
            var n = notch(ws, knob)
            while (n != null) {
                val p = predict(n)
                if (base == null || p == null || p < base) return Notch(knob, ws, n, p)
                n = notch(n, knob)
            }
        }
        return null
    }

    /**
     * Before the first step: the notches that bring [resident] + the planner's peak under the budget, walking the
     * ladder from [ws] (fallback.py `fallback_ladder`); empty when it fits as it is, null when nothing smaller does.
     */
    fun fit(ws: WorkingSet, resident: Long): List<Notch>? {
        val taken = ArrayList<Notch>()
        var cur = ws
        while (resident + (predict(cur) ?: return taken) > budgetBytes) {
            val n = next(cur) ?: return null
            taken.add(n)
            cur = n.after
        }
        return taken
    }

    /**
     * After step [done] (steps completed) with working set [ws]: [measured] the footprint now (null: no figure),
     * [growth] the largest growth one step has shown, [osSignal] the OS reports pressure.
     */
    fun decide(ws: WorkingSet, done: Long, measured: Long?, growth: Long, osSignal: Boolean): PressureAction {
        val trigger = when {
            measured != null && measured > budgetBytes -> TRIGGER_MEASURED
            measured != null && measured + growth > budgetBytes -> TRIGGER_PREDICTED
            osSignal && done - lastOsAdaptStep >= osCooldownSteps -> TRIGGER_OS
            else -> return PressureAction.Continue
        }
        val figure = when (trigger) {
            TRIGGER_PREDICTED -> measured!! + growth
            else -> measured ?: 0L
        }
        val n = next(ws)
        if (n == null) {
            val why = when (trigger) {
                TRIGGER_MEASURED -> "anonymous memory ${mb(figure)} is over the ${mb(budgetBytes)} budget"
                TRIGGER_PREDICTED -> "anonymous memory ${mb(measured!!)} grew by up to ${mb(growth)} a step: the next step would exceed the ${mb(budgetBytes)} budget"
                else -> "the system reports memory pressure"
            }
            return PressureAction.Exhausted(trigger, figure, "$why with the smallest settings (${ws.describe()})")
        }
        if (trigger == TRIGGER_OS) lastOsAdaptStep = done
        return PressureAction.Adapt(n, trigger, figure)
    }

    companion object {
        const val KNOB_GROUPS = "layers_per_checkpoint"
        const val KNOB_LCSB = "lcsb_k"
        val KNOBS = listOf(KNOB_GROUPS, KNOB_LCSB)
        const val TRIGGER_MEASURED = "measured"
        const val TRIGGER_PREDICTED = "predicted"
        const val TRIGGER_OS = "os_signal"
        /** onTrimMemory levels that count as pressure for a running app: RUNNING_LOW (10), RUNNING_CRITICAL (15), COMPLETE (80). */
        val TRIM_PRESSURE_LEVELS = setOf(10, 15, 80)

        /** At most this many layer inputs alive at once with k selected layers in groups of s: min(k, ceil(k/s) + s - 1). */
        fun maxAlive(k: Int, s: Int): Int = if (k <= 0) 0 else minOf(k, (k + maxOf(1, s) - 1) / maxOf(1, s) + maxOf(1, s) - 1)

        /**
         * The planner's step peak of a program for [ws]: the exporter's estimate [peakBytes] (memory_plan, made with every
         * layer's input kept) with the layer inputs ([T, d] float32, [checkpointBytes] each) the working set keeps
         * instead; with no estimate (0) the checkpoint term alone (it orders the notches the same).
         */
        fun plannerPeak(ws: WorkingSet, layers: Int, peakBytes: Long, checkpointBytes: Long): Long =
            maxOf(0L, peakBytes - layers * checkpointBytes) + checkpointBytes * maxAlive(ws.selected(layers), ws.layersPerCheckpoint)

        private fun mb(b: Long) = "%.1f MB".format(java.util.Locale.ROOT, b / 1048576.0)
    }
}
