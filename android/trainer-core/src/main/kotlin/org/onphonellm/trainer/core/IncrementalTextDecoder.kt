package org.onphonellm.trainer.core

import java.nio.ByteBuffer
import java.nio.CharBuffer
import java.nio.charset.CodingErrorAction

/**
 * Token ids to text as they are generated: each id's bytes ([TextTokenizer.decodeBytes]) go into one UTF-8
 * decoder that keeps an incomplete character's bytes until the token holding its last byte arrives (a
 * byte-level BPE or the byte tokenizer splits a character across tokens), so no piece ever shows a
 * character half decoded (U+FFFD, a lone surrogate). Invalid bytes become U+FFFD as soon as they are known
 * to be invalid, as `String(bytes, UTF_8)` replaces them. [skip] ids (the stop ids) add no text, as
 * [Prompts.decode] drops the stop token. The pieces of [push] followed by [finish] concatenate to the
 * tokenizer's decode of the ids pushed (without [skip]).
 */
class IncrementalTextDecoder(private val tok: TextTokenizer, private val skip: Set<Int> = emptySet()) {
    private val decoder = Charsets.UTF_8.newDecoder()
        .onMalformedInput(CodingErrorAction.REPLACE).onUnmappableCharacter(CodingErrorAction.REPLACE)
    private var pending = ByteArray(0)  // bytes of a character not complete yet (at most 3)
    private val text = StringBuilder()
    private var finished = false

    /** Every complete character so far. */
    val textSoFar: String get() = text.toString()

    /** Add [id]'s bytes; returns the text they complete (empty when they only start a character). */
    fun push(id: Int): String {
        check(!finished) { "the decoder is finished" }
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
