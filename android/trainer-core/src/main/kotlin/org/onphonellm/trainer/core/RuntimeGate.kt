package org.onphonellm.trainer.core

import java.util.concurrent.TimeUnit
import java.util.concurrent.locks.ReentrantLock
import kotlin.concurrent.withLock

/**
 * Who gets the one runtime next when a generation runs beside training ([TrainingSession]): the generation.
 * A training call takes ~0.3 s on a phone, a decode call ~1 ms, and a token is L + 2 calls; with the two
 * threads alternating call by call each token would wait L + 2 training calls (~8 s). So while a generation
 * is in progress ([generation]) a training-side call ([awaitTrainingTurn], before it queues for the runtime
 * lock) waits, and the generation waits at most for the one training call already running when it started.
 *
 * The exception: a generation whose consumer holds it ([consumer]: its token callback blocks, the UI is
 * slow) for [graceNanos] or more lets training go on (call by call, re-checked before each), so a stalled
 * consumer never stalls training. A token's callback on a phone returns in microseconds, well inside the
 * grace. Outside its consumer a generation keeps priority however long its thread is not scheduled.
 */
class RuntimeGate(val graceNanos: Long = TimeUnit.MILLISECONDS.toNanos(50), private val now: () -> Long = System::nanoTime) {
    private val lock = ReentrantLock()
    private val changed = lock.newCondition()
    private var generating = 0
    /** The generation's consumer (a token callback) holds it, since [consumerSince]. */
    private var inConsumer = false
    private var consumerSince = 0L
    @Volatile private var generationThread: Thread? = null

    /** Training-side calls that waited for a generation, and their total wait (for the tests and the status line). */
    var trainingWaits = 0L
        private set

    /** Run [body] (a whole generation) with priority over training's calls; one generation at a time per gate. */
    fun <T> generation(body: () -> T): T {
        lock.withLock { generating++; generationThread = Thread.currentThread() }
        try {
            return body()
        } finally {
            lock.withLock {
                generating--
                if (generating == 0) generationThread = null
                inConsumer = false
                changed.signalAll()
            }
        }
    }

    /** The calling thread is running a [generation]. */
    val isGenerationThread: Boolean get() = generationThread === Thread.currentThread()

    /** A generation's consumer ([body]: its token callback) runs: after [graceNanos] of it, training may go on. */
    fun <T> consumer(body: () -> T): T {
        lock.withLock { inConsumer = true; consumerSince = now(); changed.signalAll() }
        try {
            return body()
        } finally {
            lock.withLock { inConsumer = false }
        }
    }

    /** Before a training-side call queues for the runtime: wait while a generation is in progress (see the class comment). */
    fun awaitTrainingTurn() = lock.withLock {
        var waited = false
        while (generating > 0) {
            if (inConsumer) {
                val held = now() - consumerSince
                if (held >= graceNanos) break
                waited = true
                changed.awaitNanos(graceNanos - held)
            } else {
                waited = true
                changed.await()  // signalled when a consumer starts and when the generation ends
            }
        }
        if (waited) trainingWaits++
    }
}
