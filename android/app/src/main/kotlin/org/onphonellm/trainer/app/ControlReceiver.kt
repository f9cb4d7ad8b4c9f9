package org.onphonellm.trainer.app

import android.content.BroadcastReceiver
import android.content.Context
import android.content.Intent

/**
 * `adb shell am broadcast -a org.onphonellm.trainer.action.STOP -p org.onphonellm.trainer`: asks the
 * running trainer to checkpoint and stop after the current step. The manifest guards it with
 * android.permission.DUMP, which the adb shell holds and ordinary apps cannot.
 */
class ControlReceiver : BroadcastReceiver() {
    override fun onReceive(context: Context, intent: Intent) {
        if (intent.action == RunRequest.ACTION_STOP) TrainingStatus.requestStop()
    }
}
