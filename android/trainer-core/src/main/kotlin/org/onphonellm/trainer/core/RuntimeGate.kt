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
 * The exception: a generation whose consumer holds it between two calls (its token callback blocks, the UI
 * is slow) for [graceNanos] or more, with no call of its own in flight or waited for, lets training go on
 * (call by call, re-checked before each), so a stalled generation never stalls training. A token's callback
 * on a phone returns in microseconds, well inside the grace.
 */
class RuntimeGate(val graceNanos: Long = TimeUnit.MILLISECONDS.toNanos(50), private val now: () -> Long = System::nanoTime) {
    private val lock = ReentrantLock()
    private val changed = lock.newCondition()
    private var generating = 0
    /** A generation is waiting for the runtime lock or inside a call. */
    private var generationBusy = false
    private var lastGenerationActivity = 0L
    @Volatile private var generationThread: Thread? = null

    /** Training-side calls that waited for a generation, and their total wait (for the tests and the status line). */
    var trainingWaits = 0L
        private set

    /** Run [body] (a whole generation) with priority over training's calls; one generation at a time per gate. */
    fun <T> generation(body: () -> T): T {
        lock.withLock { generating++; lastGenerationActivity = now(); generationThread = Thread.currentThread() }
        try {
            return body()
        } finally {
            lock.withLock {
                generating--
                if (generating == 0) generationThread = null
                lastGenerationActivity = now()
                changed.signalAll()
            }
        }
    }

    /** The calling thread is running a [generation]. */
    val isGenerationThread: Boolean get() = generationThread === Thread.currentThread()

    /** A generation's call: [body] holds the runtime; training waits meanwhile. */
    fun <T> generationCall(body: () -> T): T {
        lock.withLock { generationBusy = true; lastGenerationActivity = now() }
        try {
            return body()
        } finally {
            lock.withLock { generationBusy = false; lastGenerationActivity = now(); changed.signalAll() }
        }
    }

    /** Before a training-side call queues for the runtime: wait while a generation is in progress (see the class comment). */
    fun awaitTrainingTurn() = lock.withLock {
        var waited = false
        while (generating > 0) {
            val idle = now() - lastGenerationActivity
            if (!generationBusy && idle >= graceNanos) break
            waited = true
            changed.awaitNanos(if (generationBusy) graceNanos else graceNanos - idle)
        }
        if (waited) trainingWaits++
    }
}
