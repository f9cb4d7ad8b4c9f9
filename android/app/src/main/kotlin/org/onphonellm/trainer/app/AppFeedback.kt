package org.onphonellm.trainer.app

import org.onphonellm.trainer.core.FeedbackLog
import org.onphonellm.trainer.core.Generation
import org.onphonellm.trainer.core.GenerationFeedback
import org.onphonellm.trainer.core.StopReason
import java.io.File

/**
 * The process's feedback file (<external files>/feedback.jsonl) and the state of the buttons under the generation on
 * screen (trainer-core's [GenerationFeedback]). [init] is called with the app's files directory by whoever runs first
 * (the session runner, the screen); the generation thread offers each finished "after" generation ([generated]).
 */
object AppFeedback {
    @Volatile var feedback: GenerationFeedback? = null
        private set
    @Volatile var file: File? = null
        private set

    /** Off the main thread (opening the log repairs a torn last line). */
    @Synchronized
    fun init(base: File): GenerationFeedback = feedback ?: GenerationFeedback(FeedbackLog(File(base, FeedbackLog.FILE_NAME).also { file = it }))
        .also { feedback = it }

    /** A generation was requested: no buttons until it finishes. */
    fun cleared() = feedback?.cleared()

    /** The "after" side (the live or trained adapter's) of a comparison ended: the response the buttons answer. */
    fun generated(prompt: String, chat: Boolean, r: Generation) =
        feedback?.generated(prompt, chat, r.text ?: "", complete = r.stopReason != StopReason.CANCELLED)
}
