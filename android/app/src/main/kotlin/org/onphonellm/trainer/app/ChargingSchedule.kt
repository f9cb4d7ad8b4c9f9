package org.onphonellm.trainer.app

import android.content.Context
import androidx.work.Constraints
import androidx.work.ExistingPeriodicWorkPolicy
import androidx.work.PeriodicWorkRequest
import androidx.work.WorkManager
import org.onphonellm.trainer.core.ChargingRuns
import java.util.concurrent.TimeUnit

/** The switch: stored in preferences, and the periodic work enqueued (KEEP) or cancelled with it. */
object ChargingSchedule {
    private const val PREFS = "trainer"
    private const val KEY = "train_while_charging"

    fun enabled(context: Context): Boolean = context.getSharedPreferences(PREFS, Context.MODE_PRIVATE).getBoolean(KEY, false)

    fun set(context: Context, on: Boolean) {
        context.getSharedPreferences(PREFS, Context.MODE_PRIVATE).edit().putBoolean(KEY, on).apply()
        val wm = WorkManager.getInstance(context)
        if (!on) { wm.cancelUniqueWork(ChargingRuns.WORK_NAME); return }
        val constraints = Constraints.Builder()
            .setRequiresCharging(ChargingRuns.REQUIRES_CHARGING)
            .setRequiresDeviceIdle(ChargingRuns.REQUIRES_IDLE)
            .build()
        val work = PeriodicWorkRequest.Builder(ChargingWorker::class.java, 15, TimeUnit.MINUTES).setConstraints(constraints).build()
        wm.enqueueUniquePeriodicWork(ChargingRuns.WORK_NAME, ExistingPeriodicWorkPolicy.KEEP, work)
    }
}
