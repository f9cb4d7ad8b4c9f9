package org.onphonellm.trainer.core

import java.util.concurrent.locks.ReentrantLock
import kotlin.concurrent.withLock

/**
 * Generation with a program's own adapter (state_init.bin), when there is no run of it yet: the "before" side of a
 * comparison, streamed token by token as [TrainingSession.compare] streams it (the same setup, [Comparisons]: the same
 * loop, state and prompt give the same ids); the "after" side is not generated (nothing is trained:
 * [GenerationListener.onSkipped] with [NO_RUN], and [Comparison.afterSkipped] says so). One comparison at a time, on a
 * "generate" thread of its own ([startComparison], [GenerationThread]); [closeGeneration] as the session's.
 */
class ProgramGeneration(val program: Manifest, weights: MappedWeights, runtime: ProgramRuntime) : GenerationSource {
    private val loop = LayerLoop(program, weights, runtime,
        StateBuffer(program, LayerLoop.generationStateEntries(program)).also { it.loadInit() })
    private val genLock = ReentrantLock()
    private val genThread = GenerationThread()

    /** The comparison on the calling thread: "before" on the program's adapter, "after" skipped. */
    fun compare(promptIds: List<Int>, maxNewTokens: Int, stopIds: Set<Int>, tok: TextTokenizer? = null,
                control: GenerationControl = GenerationControl(), listener: GenerationListener = object : GenerationListener {}): Comparison {
        try {
            val n = Comparisons.newTokens(program, promptIds, maxNewTokens)
            return genLock.withLock {
                val before = Comparisons.side(loop, "before", promptIds, n, stopIds, tok, control, listener) { 0L }
                listener.onSkipped("after", NO_RUN)
                Comparison(before, Comparisons.notRun("after", tok), afterSkipped = NO_RUN)
            }
        } catch (e: Exception) {
            listener.onError(e)
            throw e
        }
    }

    override fun startComparison(promptIds: List<Int>, maxNewTokens: Int, stopIds: Set<Int>, tok: TextTokenizer?,
                                 listener: GenerationListener): GenerationJob =
        genThread.start { control -> compare(promptIds, maxNewTokens, stopIds, tok, control, listener) }

    override fun closeGeneration(drainMs: Long, cancelMs: Long): Boolean = genThread.close(drainMs, cancelMs)

    companion object {
        /** Why "after" is not generated: no run of this program has trained anything yet. */
        const val NO_RUN = "no run of this program yet: \"before\" is its own adapter (state_init.bin); train to see an \"after\""
    }
}
