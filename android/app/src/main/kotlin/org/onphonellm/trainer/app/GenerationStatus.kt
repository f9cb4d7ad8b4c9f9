package org.onphonellm.trainer.app

import org.onphonellm.trainer.core.Generation
import org.onphonellm.trainer.core.StopReason

/**
 * The before / after generation as it streams: text appended by the generation thread token by token, read by
 * the Activity on its main thread. [listener] (the Activity's, set while it is resumed) is called after every
 * change on the writing thread: it posts to the main thread, never touches views itself.
 */
class GenerationStatus {
    /** What the screen shows of one side: header ("after (step 37)"), text so far. */
    class Side(val header: String, val text: String)
    class View(val before: Side, val after: Side, val note: String?, val running: Boolean)

    private val text = arrayOf(StringBuilder(), StringBuilder())
    private val header = arrayOf("before", "after")
    /** The request shown: updates of an older one (cancelled, superseded) are dropped. */
    @Volatile var epoch = 0L
        private set
    @Volatile var running = false
        private set
    @Volatile private var note: String? = null
    @Volatile var listener: (() -> Unit)? = null

    private fun at(which: String) = if (which == "before") 0 else 1

    /** A new request (the Activity's button, the service taking a prompt): clears both sides; its epoch. */
    fun requested(): Long {
        val e = synchronized(this) {
            text.forEach { it.setLength(0) }
            header[0] = "before"; header[1] = "after"
            running = true
            note = "starting ..."
            ++epoch
        }
        changed()
        return e
    }

    private inline fun update(e: Long, f: () -> Unit) {
        val applied = synchronized(this) { if (e == epoch) { f(); true } else false }
        if (applied) changed()
    }

    fun started(e: Long, which: String, stateStep: Long) = update(e) {
        header[at(which)] = if (which == "before") "before (initial adapter)" else "after (state of step $stateStep)"
        note = "generating $which ..."
    }

    /** The text a token completed (empty: the first bytes of a character, or a stop token). */
    fun token(e: Long, which: String, piece: String) {
        if (piece.isNotEmpty()) update(e) { text[at(which)].append(piece) }
    }

    fun done(e: Long, which: String, r: Generation) = update(e) {
        val i = at(which)
        r.text?.let { text[i].setLength(0); text[i].append(it) }  // the whole decode (the pieces add up to it)
        val how = when (r.stopReason) { StopReason.EOS -> "end of text"; StopReason.MAX_NEW_TOKENS -> "${r.ids.size} tokens"; StopReason.CANCELLED -> "cancelled" }
        header[i] = "${header[i]} - $how"
        if (which == "after") { running = false; note = if (r.stopReason == StopReason.CANCELLED) "cancelled" else null }
    }

    /** [which] is not generated (no run of the program yet): its header says why; the comparison has ended. */
    fun skipped(e: Long, which: String, reason: String) = update(e) {
        header[at(which)] = "$which: $reason"
        if (which == "after") { running = false; note = null }
    }

    fun failed(message: String, e: Long = epoch) = update(e) { running = false; note = message }

    fun view(): View = synchronized(this) {
        View(Side(header[0], text[0].toString()), Side(header[1], text[1].toString()), note, running)
    }

    private fun changed() { listener?.invoke() }
}
