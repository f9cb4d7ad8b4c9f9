package org.onphonellm.trainer.core


/** One side of a before / after comparison: [which] "before" or "after", [stateStep] the step of the state it ran on (0: the initial adapter). */
class Generation(val which: String, val ids: List<Int>, val text: String?, val stopReason: StopReason, val stateStep: Long?) {
    override fun toString(): String = "Generation($which, $ids, ${text?.let { Json.of(it) }}, $stopReason, step $stateStep)"
}

/**
 * The same prompt generated with the initial adapter and with the live (or trained) state. [afterSkipped]: why "after"
 * was not generated (a program without a run: [ProgramGeneration]); null when it was.
 */
class Comparison(val before: Generation, val after: Generation, val afterSkipped: String? = null)

/**
 * What a streaming comparison reports, on the generating thread (post to the UI thread from here). Called
 * outside every lock of the session, so a slow listener delays only the generation, never training.
 */
interface GenerationListener {
    /** [which] starts, on a state of step [stateStep] (0: the initial adapter). */
    fun onStart(which: String, stateStep: Long) {}
    /** A token of [which] was chosen (before the next decode step runs). */
    fun onToken(which: String, token: GeneratedToken) {}
    /** [which] ended (its [Generation.stopReason]; "after" is [StopReason.CANCELLED] without a program call when "before" was cancelled). */
    fun onDone(which: String, result: Generation) {}
    /** [which] is not generated, for [reason] (no run yet: [ProgramGeneration]); the comparison has ended. */
    fun onSkipped(which: String, reason: String) {}
    /** The comparison failed (the exception is also thrown to the caller). */
    fun onError(error: Exception) {}
}

/**
 * The generation setup every comparison shares ([TrainingSession.compare], [ProgramGeneration.compare]): the prompt
 * checked against the program, and one side generated on a loop, streamed to the listener token by token.
 */
internal object Comparisons {
    /** The new tokens of a comparison: [maxNewTokens] cut to what seq_len leaves after the prompt ([BadInput] when none fit, or without the generation methods). */
    fun newTokens(program: Manifest, promptIds: List<Int>, maxNewTokens: Int): Int {
        val n = minOf(maxNewTokens, program.seqLen - promptIds.size)
        if (promptIds.isEmpty() || n < 1) throw BadInput("the prompt (${promptIds.size} tokens) leaves no room in seq_len ${program.seqLen}")
        if (!program.hasGeneration) throw BadInput("the program was exported without the generation methods; re-export it")
        return n
    }

    /** A side that made no program call: no ids, [StopReason.CANCELLED] (text "" with a tokenizer, null without). */
    fun notRun(which: String, tok: TextTokenizer?): Generation = Generation(which, emptyList(), tok?.let { "" }, StopReason.CANCELLED, null)

    /**
     * Side [which] of a comparison, generated greedily on [loop] from [promptIds] ([n] new tokens at most), text decoded
     * incrementally with [tok] when given ([IncrementalTextDecoder]; a stop id adds no text). Cancelled before it starts:
     * [notRun], no program call. Else [snapshot] loads [loop]'s state and returns its step; [GenerationListener.onStart],
     * a [GenerationListener.onToken] per token, then [GenerationListener.onDone] with the result.
     */
    fun side(loop: LayerLoop, which: String, promptIds: List<Int>, n: Int, stopIds: Set<Int>, tok: TextTokenizer?,
             control: GenerationControl, listener: GenerationListener, snapshot: () -> Long): Generation {
        if (control.isCancelled) return notRun(which, tok).also { listener.onDone(which, it) }
        val step = snapshot()
        listener.onStart(which, step)
        val decoder = tok?.let { IncrementalTextDecoder(it, stopIds) }
        var index = 0
        val g = loop.generateStream(promptIds, n, stopIds, control) { id ->
            val piece = decoder?.push(id) ?: ""
            listener.onToken(which, GeneratedToken(index++, id, piece, decoder?.textSoFar ?: ""))
        }
        decoder?.finish()
        return Generation(which, g.ids, decoder?.textSoFar, g.stopReason, step).also { listener.onDone(which, it) }
    }
}
