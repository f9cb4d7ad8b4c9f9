package org.onphonellm.trainer.core

import java.util.concurrent.atomic.AtomicBoolean


/**
 * Cancels one generation from any thread (the UI's Cancel button, a service shutting down). The generation
 * driver ([LayerLoop.generateStream]) checks it before the prefill, before each prefill chunk and each of its
 * layers, after the prefill and before each decode step, so a cancel takes effect within one program call
 * during the prefill and within one decode step (one token) after it; a generation cancelled before it
 * starts makes no program call.
 */
class GenerationControl {
    private val cancelled = AtomicBoolean(false)

    fun cancel() = cancelled.set(true)

    val isCancelled: Boolean get() = cancelled.get()
}
