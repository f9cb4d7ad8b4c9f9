package org.onphonellm.trainer.app

import android.app.Activity

/** The program import in progress (process-wide: it outlives a rotation of the Activity that started it). */
object ImportStatus {
    @Volatile var running = false
    @Volatile var cancel = false
    @Volatile var name: String? = null
    @Volatile var copied = 0L
    @Volatile var total = 0L
    /** The outcome, until a screen has shown it. */
    @Volatile var message: String? = null
    @Volatile var imported: String? = null

    fun begin() { running = true; cancel = false; name = null; copied = 0; total = 0; message = null; imported = null }
}
