package org.onphonellm.trainer.core

import java.io.File
import java.util.concurrent.Callable
import java.util.concurrent.ExecutorService
import java.util.concurrent.Executors
import java.util.concurrent.TimeUnit
import java.util.concurrent.locks.ReentrantLock
import kotlin.concurrent.withLock

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

/**
 * Which source a Generate request runs on ([resolve]). The screen names its chosen program ([requested]); the latest
 * run is used when it is of that program (its trained or live state is the "after" side), else the program alone
 * generates with its own adapter: Generate works before any run exists, as on iOS.
 */
sealed class GenerateTarget {
    class Run(val dir: RunDir) : GenerateTarget()
    class Program(val name: String) : GenerateTarget()

    companion object {
        /**
         * [latest]: the latest run (null: none); [latestProgram]: that run's program (run.json `program`); [requested]: the
         * program the request names (null: an adb request without one, which takes the latest run).
         */
        fun resolve(latest: RunDir?, latestProgram: String?, requested: String?): GenerateTarget = when {
            requested == null && latest != null -> Run(latest)
            requested == null -> throw ContractError("no run and no program to generate with: import a program first")
            latest != null && latestProgram != null && File(latestProgram).name == requested -> Run(latest)
            else -> Program(requested)
        }
    }
}

/**
 * Generation with a program's own adapter (state_init.bin), when there is no run of it yet: the "before" side of a
 * comparison, streamed token by token as [TrainingSession.compare] streams it (the same loop, state and prompt give
 * the same ids); the "after" side is not generated (nothing is trained: [GenerationListener.onSkipped] with
 * [NO_RUN], and [Comparison.afterSkipped] says so). One comparison at a time, on a "generate" thread of its own
 * ([startComparison]); [closeGeneration] as the session's.
 */
class ProgramGeneration(val program: Manifest, weights: MappedWeights, runtime: ProgramRuntime) : GenerationSource {
    private val loop = LayerLoop(program, weights, runtime,
        StateBuffer(program, LayerLoop.generationStateEntries(program)).also { it.loadInit() })
    private val genLock = ReentrantLock()
    private var executor: ExecutorService? = null
    private val jobs = ArrayList<GenerationControl>()

    /** The comparison on the calling thread: "before" on the program's adapter, "after" skipped. */
    fun compare(promptIds: List<Int>, maxNewTokens: Int, stopIds: Set<Int>, tok: TextTokenizer? = null,
                control: GenerationControl = GenerationControl(), listener: GenerationListener = object : GenerationListener {}): Comparison {
        try {
            val n = minOf(maxNewTokens, program.seqLen - promptIds.size)
            if (promptIds.isEmpty() || n < 1) throw ContractError("the prompt (${promptIds.size} tokens) leaves no room in seq_len ${program.seqLen}")
            if (!program.hasGeneration) throw ContractError("the program was exported without the generation methods; re-export it")
            return genLock.withLock {
                val before = if (control.isCancelled) GeneratedText("before", emptyList(), tok?.let { "" }, StopReason.CANCELLED, null) else {
                    listener.onStart("before", 0L)
                    val stream = tok?.let { TextStream(it, stopIds) }
                    var index = 0
                    val g = loop.generateStream(promptIds, n, stopIds, control) { id ->
                        val piece = stream?.push(id) ?: ""
                        listener.onToken("before", StreamedToken(index++, id, piece, stream?.textSoFar ?: ""))
                    }
                    stream?.finish()
                    GeneratedText("before", g.ids, stream?.textSoFar, g.stopReason, 0L)
                }
                listener.onDone("before", before)
                listener.onSkipped("after", NO_RUN)
                Comparison(before, GeneratedText("after", emptyList(), tok?.let { "" }, StopReason.CANCELLED, null), afterSkipped = NO_RUN)
            }
        } catch (e: Exception) {
            listener.onError(e)
            throw e
        }
    }

    override fun startComparison(promptIds: List<Int>, maxNewTokens: Int, stopIds: Set<Int>, tok: TextTokenizer?,
                                 listener: GenerationListener): GenerationJob {
        val control = GenerationControl()
        val future = synchronized(jobs) {
            val e = executor ?: Executors.newSingleThreadExecutor { r -> Thread(r, "generate").also { it.isDaemon = true } }.also { executor = it }
            jobs.add(control)
            e.submit(Callable {
                try { compare(promptIds, maxNewTokens, stopIds, tok, control, listener) } finally { synchronized(jobs) { jobs.remove(control) } }
            })
        }
        return GenerationJob(control, future)
    }

    override fun closeGeneration(drainMs: Long, cancelMs: Long): Boolean {
        val e = synchronized(jobs) { executor.also { executor = null } } ?: return true
        e.shutdown()
        if (drainMs > 0 && e.awaitTermination(drainMs, TimeUnit.MILLISECONDS)) return true
        synchronized(jobs) { jobs.forEach { it.cancel() } }
        return e.awaitTermination(cancelMs, TimeUnit.MILLISECONDS)
    }

    companion object {
        /** Why "after" is not generated: no run of this program has trained anything yet. */
        const val NO_RUN = "no run of this program yet: \"before\" is its own adapter (state_init.bin); train to see an \"after\""
    }
}
