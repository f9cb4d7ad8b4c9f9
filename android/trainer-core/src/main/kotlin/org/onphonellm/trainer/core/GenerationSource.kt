package org.onphonellm.trainer.core

import java.util.concurrent.Callable
import java.util.concurrent.ExecutionException
import java.util.concurrent.ExecutorService
import java.util.concurrent.Executors
import java.util.concurrent.Future
import java.util.concurrent.TimeUnit

/**
 * What a Generate request runs on: a training session ([TrainingSession]: the initial adapter, then the run's live or
 * trained state), or a program with no run yet ([ProgramGeneration]: its own adapter, state_init.bin). The app's
 * generation glue (LiveSessions) holds either.
 */
interface GenerationSource {
    /** The comparison on this source's generation thread; returns at once ([GenerationJob]: cancel, await). */
    fun startComparison(promptIds: List<Int>, maxNewTokens: Int, stopIds: Set<Int>, tok: TextTokenizer? = null,
                        listener: GenerationListener = object : GenerationListener {}): GenerationJob

    /** End the generation thread before the runtime closes: wait up to [drainMs], then cancel ([TrainingSession.closeGeneration]). */
    fun closeGeneration(drainMs: Long = 0, cancelMs: Long = 60_000): Boolean
}


/** A comparison running on a generation source's thread ([GenerationSource.startComparison]). */
class GenerationJob internal constructor(val control: GenerationControl, private val future: Future<Comparison>) {
    /** Stop it within one decode step (the result says [StopReason.CANCELLED]); safe from any thread. */
    fun cancel() = control.cancel()

    val isDone: Boolean get() = future.isDone

    /** Wait for the result; the comparison's own exception if it failed. */
    fun await(timeoutMs: Long = Long.MAX_VALUE): Comparison = try {
        future.get(timeoutMs, TimeUnit.MILLISECONDS)
    } catch (e: ExecutionException) {
        throw e.cause ?: e
    }
}

/**
 * A generation source's "generate" thread: its comparisons one at a time, in order ([GenerationSource.startComparison]),
 * made when first needed and ended by [close] ([GenerationSource.closeGeneration]). [TrainingSession] and
 * [ProgramGeneration] each hold one.
 */
internal class GenerationThread {
    private var executor: ExecutorService? = null
    /** The controls of the comparisons started and not ended (guards [executor] too). */
    private val jobs = ArrayList<GenerationControl>()

    /** Queue [compare] (given its job's control) on the thread; returns at once with the job. */
    fun start(compare: (GenerationControl) -> Comparison): GenerationJob {
        val control = GenerationControl()
        val future = synchronized(jobs) {
            val e = executor ?: Executors.newSingleThreadExecutor { r -> Thread(r, "generate").also { it.isDaemon = true } }.also { executor = it }
            jobs.add(control)
            e.submit(Callable {
                try { compare(control) } finally { synchronized(jobs) { jobs.remove(control) } }
            })
        }
        return GenerationJob(control, future)
    }

    /**
     * End the thread: wait up to [drainMs] for the comparisons started to end by themselves, then cancel those left
     * (the running one stops within a decode step, queued ones end without a program call) and wait up to [cancelMs].
     * True if the thread ended (or there was none). A comparison started after this makes a new thread.
     */
    fun close(drainMs: Long, cancelMs: Long): Boolean {
        val e = synchronized(jobs) { executor.also { executor = null } } ?: return true
        e.shutdown()
        if (drainMs > 0 && e.awaitTermination(drainMs, TimeUnit.MILLISECONDS)) return true
        synchronized(jobs) { jobs.forEach { it.cancel() } }
        return e.awaitTermination(cancelMs, TimeUnit.MILLISECONDS)
    }
}
