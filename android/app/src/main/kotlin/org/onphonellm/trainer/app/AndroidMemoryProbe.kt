package org.onphonellm.trainer.app

import android.app.ActivityManager
import android.content.Context
import android.os.Debug
import android.os.SystemClock
import org.onphonellm.trainer.core.MemoryProbe
import org.onphonellm.trainer.core.MemorySample
import org.onphonellm.trainer.core.ProcStatus
import java.io.File

/**
 * Memory as Android sees the app: /proc/self/status (RssAnon, the primary probe; VmHWM; VmSwap) every
 * sample, ActivityManager.getMemoryInfo (availMem, lowMemory) with the last onTrimMemory level, and
 * Debug.getMemoryInfo (total private dirty, PSS) every [debugEvery]-th sample, since it walks smaps.
 */
class AndroidMemoryProbe(context: Context, private val debugEvery: Int = 10) : MemoryProbe {
    private val am = context.getSystemService(Context.ACTIVITY_SERVICE) as ActivityManager
    private var calls = 0

    override fun sample(): List<MemorySample> {
        val out = ArrayList<MemorySample>(3)
        out.add(ProcStatus.sample(File("/proc/self/status").readText()))
        val mi = ActivityManager.MemoryInfo()
        am.getMemoryInfo(mi)
        out.add(MemorySample("android_activity_manager", availableBytes = mi.availMem, lowMemory = mi.lowMemory,
            trimLevel = TrainingStatus.recentTrimLevel(SystemClock.elapsedRealtime())))
        if (calls++ % debugEvery == 0) {
            val d = Debug.MemoryInfo()
            Debug.getMemoryInfo(d)
            out.add(MemorySample("android_debug_meminfo", anonBytes = d.totalPrivateDirty * 1024L, pssBytes = d.totalPss * 1024L))
        }
        return out
    }

    /** RssAnon of /proc/self/status (cheap: the watchdog polls it). */
    fun anonBytes(): Long = ProcStatus.sample(File("/proc/self/status").readText()).anonBytes ?: 0L

    /** ActivityManager.MemoryInfo.lowMemory: the system's own pressure flag (delivered on every API level). */
    fun lowMemory(): Boolean = ActivityManager.MemoryInfo().also { am.getMemoryInfo(it) }.lowMemory

    fun totalRamBytes(): Long = ActivityManager.MemoryInfo().also { am.getMemoryInfo(it) }.totalMem
}
