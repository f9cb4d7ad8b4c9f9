package org.onphonellm.trainer.app

import android.util.Log
import org.onphonellm.trainer.core.GeneratedToken
import org.onphonellm.trainer.core.Generation
import org.onphonellm.trainer.core.GenerationJob
import org.onphonellm.trainer.core.GenerationListener
import org.onphonellm.trainer.core.GenerationSource
import org.onphonellm.trainer.core.ProgramGeneration
import org.onphonellm.trainer.core.Prompts
import org.onphonellm.trainer.core.TextTokenizer

/**
 * The open session generation requests go to, whoever runs it (the service's worker thread, or a charging
 * window's worker): a prompt that comes before a session is open waits in [TrainingStatus.pendingPrompt].
 */
object LiveSessions {
    /** [session]: a training session, or a program without a run ([ProgramGeneration]). */
    class Live(val session: GenerationSource, val tok: TextTokenizer?, val chat: Boolean, val maxNewTokens: Int)

    private const val TAG = "Trainer"
    private val lock = Any()
    private var live: Live? = null
    private var job: GenerationJob? = null

    val isLive: Boolean get() = synchronized(lock) { live != null }

    /** A prompt to generate: to the open session's generation thread, else kept until a session is open. */
    fun offerPrompt(prompt: String) = synchronized(lock) {
        val l = live
        if (l == null) TrainingStatus.pendingPrompt = prompt else startGeneration(l, prompt)
    }

    /** A session is open: generation requests go to it from now on (and a pending one starts). */
    fun goLive(l: Live) = synchronized(lock) {
        live = l
        TrainingStatus.pendingPrompt?.let { startGeneration(l, it) }
    }

    /** The session ends: no new generation; the running one may finish within [drainMs], then it is cancelled. */
    fun close(session: GenerationSource, drainMs: Long) {
        synchronized(lock) { if (live?.session === session) live = null }
        if (!session.closeGeneration(drainMs = drainMs)) Log.w(TAG, "the generation did not end; closing the runtime anyway")
        synchronized(lock) { job = null }
    }

    /** A start failed before its session was open: a generation waiting for it is told so. */
    fun failedBeforeLive(e: Throwable) {
        if (TrainingStatus.generation.running && synchronized(lock) { job == null }) TrainingStatus.generation.failed("failed: ${e.message}")
    }

    /** Under [lock]: encode [prompt] and start the comparison on the session's generation thread (cancelling the one running). */
    private fun startGeneration(l: Live, prompt: String) {
        TrainingStatus.pendingPrompt = null
        job?.cancel()
        val status = TrainingStatus.generation
        val tok = l.tok ?: run { status.failed("the program has no tokenizer: no generation"); return }
        try {
            val (ids, stop) = Prompts.encode(tok, prompt, l.chat)
            val e = status.requested()  // this request's updates only: a superseded one's late callbacks are dropped
            AppFeedback.cleared()
            job = l.session.startComparison(ids, l.maxNewTokens, stop, tok, object : GenerationListener {
                override fun onStart(which: String, stateStep: Long) = status.started(e, which, stateStep)
                override fun onToken(which: String, token: GeneratedToken) = status.token(e, which, token.text)
                override fun onDone(which: String, result: Generation) {
                    status.done(e, which, result)
                    if (which == "after" && e == status.epoch) AppFeedback.generated(prompt, l.chat, result)  // the feedback buttons' response
                }
                override fun onSkipped(which: String, reason: String) = status.skipped(e, which, reason)
                override fun onError(error: Exception) {
                    Log.e(TAG, "generation failed", error)
                    status.failed("generation failed: ${error.message}", e)
                }
            })
        } catch (e: Exception) {
            status.failed("cannot generate: ${e.message}")
        }
    }

    fun cancelGeneration() = synchronized(lock) {
        TrainingStatus.pendingPrompt = null
        val j = job
        if (j != null && !j.isDone) j.cancel() else if (TrainingStatus.generation.running) TrainingStatus.generation.failed("cancelled")
    }
}
