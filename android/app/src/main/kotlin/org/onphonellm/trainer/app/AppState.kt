package org.onphonellm.trainer.app

import android.content.Context

/** What must survive the process: a run paused by the system (the Activity offers Resume). */
object AppState {
    private const val PREFS = "trainer"

    fun setPaused(context: Context, message: String?) {
        context.getSharedPreferences(PREFS, Context.MODE_PRIVATE).edit().putString("paused", message).apply()
    }

    fun paused(context: Context): String? = context.getSharedPreferences(PREFS, Context.MODE_PRIVATE).getString("paused", null)
}
