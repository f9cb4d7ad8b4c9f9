package org.onphonellm.trainer.app

import org.onphonellm.trainer.core.MemorySignals
import org.onphonellm.trainer.core.PressurePolicy
import org.onphonellm.trainer.core.PressureSignal
import java.util.concurrent.atomic.AtomicBoolean
import java.util.concurrent.atomic.AtomicLong

/**
 * The memory signals a training session reads at each step boundary (trainer-core's [MemorySignals]; the policy is
 * [PressurePolicy]): the memory watchdog's largest RssAnon since the last boundary (it polls during the step, so it
 * sees the step's own peak), and an onTrimMemory at RUNNING_LOW or above (API < 34 delivers those levels; the budget
 * check is what works on every level). Each is read and reset once per step: one signal, one notch.
 */
object AppPressure : MemorySignals {
    private val peak = AtomicLong(-1)
    private val trimmed = AtomicBoolean(false)

    /** The watchdog's sample (its thread). */
    fun watched(anonBytes: Long) {
        while (true) {  // a CAS loop: AtomicLong.accumulateAndGet is API 24
            val p = peak.get()
            if (anonBytes <= p || peak.compareAndSet(p, anonBytes)) return
        }
    }

    /** ComponentCallbacks2.onTrimMemory (the service's main thread). */
    fun trimmed(level: Int) { if (level in PressurePolicy.TRIM_PRESSURE_LEVELS) trimmed.set(true) }

    /** A new session: nothing from an earlier one counts. */
    fun reset() { peak.set(-1); trimmed.set(false) }

    override fun sinceLastStep(): PressureSignal = PressureSignal(peak.getAndSet(-1).takeIf { it >= 0 }, trimmed.getAndSet(false))
}
