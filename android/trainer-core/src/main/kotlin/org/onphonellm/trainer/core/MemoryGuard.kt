package org.onphonellm.trainer.core

/** What the guard tells the trainer to do next. */
sealed class GuardDecision {
    object Continue : GuardDecision()
    /** The OS signals pressure: checkpoint and wait for it to clear. */
    data class Pause(val code: String, val message: String) : GuardDecision()
    /** Going on would break the budget: checkpoint and stop the run. */
    data class Stop(val code: String, val message: String) : GuardDecision()
}

/**
 * Keeps a run inside its memory budget: the measurements (peak, growth per step) and the checks before the first
 * step. At the step boundaries the session's [PressurePolicy] decides from them (a smaller working set first; the
 * decisions below are what remains when nothing smaller fits).
 *
 * - Before the first step: resident anon after loading + the program's predicted step peak
 *   ([Manifest.predictedPeakBytes], the exporter's memory_plan estimate; conservative, since it also
 *   counts the state already resident) must fit the budget, else the run does not start.
 * - After each step: anon must be under the budget, and so must anon + the largest growth one step
 *   has shown so far (the next step may grow as much), else stop cleanly (checkpointed, resumable).
 * - OS pressure: ActivityManager.MemoryInfo.lowMemory (sampled with every step), or a recent
 *   onTrimMemory RUNNING_CRITICAL / COMPLETE: pause (checkpointed; the app resumes later). On API 34+
 *   onTrimMemory delivers only UI_HIDDEN and BACKGROUND, so the levels above never arrive there: the
 *   budget check on the sampled footprint (after every step, and the app's watchdog between steps) is
 *   what keeps the run inside its budget, lowMemory what reports system pressure.
 */
class MemoryGuard(val budgetBytes: Long, private val predictedStepBytes: Long) {
    private var lastAnon: Long? = null
    /** The largest growth of the footprint one step has shown (since [resetGrowth]). */
    var maxGrowth = 0L
        private set
    var peakAnon = 0L
        private set

    companion object {
        const val TRIM_MEMORY_RUNNING_CRITICAL = 15 // ComponentCallbacks2 levels
        const val TRIM_MEMORY_COMPLETE = 80
        val PRESSURE_TRIM_LEVELS = setOf(TRIM_MEMORY_RUNNING_CRITICAL, TRIM_MEMORY_COMPLETE)
        private fun mb(b: Long) = "%.1f MB".format(b / 1048576.0)

        fun anonOf(samples: List<MemorySample>): Long? = samples.firstOrNull { it.anonBytes != null }?.anonBytes
    }

    /** The working set changed (memory pressure): the next steps' growth is learned again. */
    fun resetGrowth() { maxGrowth = 0L }

    fun preflight(samples: List<MemorySample>): GuardDecision {
        val anon = anonOf(samples) ?: 0L
        lastAnon = anon
        peakAnon = maxOf(peakAnon, anon)
        val predicted = anon + predictedStepBytes
        return if (predicted > budgetBytes) {
            GuardDecision.Stop("budget_exceeded", "predicted peak ${mb(predicted)} (${mb(anon)} resident + ${mb(predictedStepBytes)} " +
                "for a step) exceeds the ${mb(budgetBytes)} budget; export with a shorter --seq-len, lower rank or int4")
        } else pressure(samples)
    }

    fun afterStep(samples: List<MemorySample>): GuardDecision {
        val anon = anonOf(samples)
        if (anon != null) {
            lastAnon?.let { maxGrowth = maxOf(maxGrowth, anon - it) }
            lastAnon = anon
            peakAnon = maxOf(peakAnon, anon)
            if (anon > budgetBytes) return GuardDecision.Stop("budget_exceeded", "anonymous memory ${mb(anon)} exceeds the ${mb(budgetBytes)} budget")
            if (anon + maxGrowth > budgetBytes) {
                return GuardDecision.Stop("budget_exceeded", "anonymous memory ${mb(anon)} grew by up to ${mb(maxGrowth)} a step; " +
                    "the next step would exceed the ${mb(budgetBytes)} budget")
            }
        }
        return pressure(samples)
    }

    /** Pause on the OS's signals, Continue when none is raised. */
    fun pressure(samples: List<MemorySample>): GuardDecision {
        if (samples.any { it.lowMemory == true }) return GuardDecision.Pause("memory_pressure", "the system reports low memory")
        samples.firstOrNull { it.trimLevel in PRESSURE_TRIM_LEVELS }?.let {
            return GuardDecision.Pause("memory_pressure", "onTrimMemory level ${it.trimLevel}")
        }
        return GuardDecision.Continue
    }
}
