package org.onphonellm.trainer.app

import android.content.Context
import android.content.Intent
import android.content.IntentFilter
import android.os.BatteryManager
import android.os.Build

/** The phone's charging state and battery level (the sticky ACTION_BATTERY_CHANGED broadcast: no receiver kept). */
object Battery {
    fun charging(ctx: Context): Boolean {
        if (Build.VERSION.SDK_INT >= 23) return (ctx.getSystemService(Context.BATTERY_SERVICE) as BatteryManager).isCharging
        val i: Intent = ctx.registerReceiver(null, IntentFilter(Intent.ACTION_BATTERY_CHANGED)) ?: return false
        val s = i.getIntExtra(BatteryManager.EXTRA_STATUS, -1)
        return s == BatteryManager.BATTERY_STATUS_CHARGING || s == BatteryManager.BATTERY_STATUS_FULL
    }

    fun percent(ctx: Context): Double? =
        (ctx.getSystemService(Context.BATTERY_SERVICE) as BatteryManager).getIntProperty(BatteryManager.BATTERY_PROPERTY_CAPACITY)
            .takeIf { it in 0..100 }?.toDouble()
}
