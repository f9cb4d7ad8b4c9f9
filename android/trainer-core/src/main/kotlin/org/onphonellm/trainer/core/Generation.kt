package org.onphonellm.trainer.core

import java.nio.ByteBuffer
import java.nio.CharBuffer
import java.nio.charset.CodingErrorAction
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

/** Why a generation stopped; [wire]: the name the host's driver uses (toolchain/runtime/generate.py `stopped`), plus "cancelled". */
enum class StopReason(val wire: String) {
    /** A stop id was chosen (EOS, a chat's `<|im_end|>`); it is the last id. */
    EOS("eos"),
    /** max_new_tokens ids were generated. */
    MAX_NEW_TOKENS("max_new_tokens"),
    /** [GenerationControl.cancel]: the ids chosen before the cancel was seen, nothing after. */
    CANCELLED("cancelled");

    override fun toString(): String = wire
}

/** The new ids (a stop id included, as the host's generate returns them) and why generation stopped. */
class Generation(val ids: List<Int>, val stopReason: StopReason) {
    override fun toString(): String = "Generation($ids, $stopReason)"
}

/**
 * Token ids to text as they are generated: each id's bytes ([TextTokenizer.decodeBytes]) go into one UTF-8
 * decoder that keeps an incomplete character's bytes until the token holding its last byte arrives (a
 * byte-level BPE or the byte tokenizer splits a character across tokens), so no piece ever shows a
 * character half decoded (U+FFFD, a lone surrogate). Invalid bytes become U+FFFD as soon as they are known
 * to be invalid, as `String(bytes, UTF_8)` replaces them. [skip] ids (the stop ids) add no text, as
 * [Prompts.decode] drops the stop token. The pieces of [push] followed by [finish] concatenate to the
 * tokenizer's decode of the ids pushed (without [skip]).
 */
class TextStream(private val tok: TextTokenizer, private val skip: Set<Int> = emptySet()) {
    private val decoder = Charsets.UTF_8.newDecoder()
        .onMalformedInput(CodingErrorAction.REPLACE).onUnmappableCharacter(CodingErrorAction.REPLACE)
    private var pending = ByteArray(0)  // bytes of a character not complete yet (at most 3)
    private val text = StringBuilder()
    private var finished = false

    /** Every complete character so far. */
    val textSoFar: String get() = text.toString()

    /** Add [id]'s bytes; returns the text they complete (empty when they only start a character). */
    fun push(id: Int): String {
        check(!finished) { "the text stream is finished" }
        if (id in skip) return ""
        return decode(pending + tok.decodeBytes(listOf(id)), endOfInput = false)
    }

    /** The end: bytes of an incomplete last character become U+FFFD (as a whole decode does); returns that text. */
    fun finish(): String {
        if (finished) return ""
        val piece = decode(pending, endOfInput = true)
        finished = true
        return piece
    }

    private fun decode(bytes: ByteArray, endOfInput: Boolean): String {
        val input = ByteBuffer.wrap(bytes)
        val out = CharBuffer.allocate(bytes.size + 2)  // at most one char per byte (a 4-byte character is 2 chars)
        val r = decoder.decode(input, out, endOfInput)
        check(!r.isOverflow) { "UTF-8 decoder overflow" }
        if (endOfInput) {
            decoder.flush(out)
            decoder.reset()
        }
        pending = ByteArray(input.remaining()).also { input.get(it) }  // an incomplete character: kept for the next token
        out.flip()
        val piece = out.toString()
        text.append(piece)
        return piece
    }
}

/** One generated token as it streams: [index] in the output, [id], [text] the characters it completed (may be empty), [textSoFar]. */
class StreamedToken(val index: Int, val id: Int, val text: String, val textSoFar: String)

/** One side of a before / after comparison: [which] "before" or "after", [stateStep] the step of the state it ran on (0: the initial adapter). */
class GeneratedText(val which: String, val ids: List<Int>, val text: String?, val stopReason: StopReason, val stateStep: Long?) {
    override fun toString(): String = "GeneratedText($which, $ids, ${text?.let { Json.of(it) }}, $stopReason, step $stateStep)"
}

/**
 * The same prompt generated with the initial adapter and with the live (or trained) state. [afterSkipped]: why "after"
 * was not generated (a program without a run: [ProgramGeneration]); null when it was.
 */
class Comparison(val before: GeneratedText, val after: GeneratedText, val afterSkipped: String? = null)

/**
 * What a streaming comparison reports, on the generating thread (post to the UI thread from here). Called
 * outside every lock of the session, so a slow listener delays only the generation, never training.
 */
interface GenerationListener {
    /** [which] starts, on a state of step [stateStep] (0: the initial adapter). */
    fun onStart(which: String, stateStep: Long) {}
    /** A token of [which] was chosen (before the next decode step runs). */
    fun onToken(which: String, token: StreamedToken) {}
    /** [which] ended (its [GeneratedText.stopReason]; "after" is [StopReason.CANCELLED] without a program call when "before" was cancelled). */
    fun onDone(which: String, result: GeneratedText) {}
    /** [which] is not generated, for [reason] (no run yet: [ProgramGeneration]); the comparison has ended. */
    fun onSkipped(which: String, reason: String) {}
    /** The comparison failed (the exception is also thrown to the caller). */
    fun onError(error: Exception) {}
}
