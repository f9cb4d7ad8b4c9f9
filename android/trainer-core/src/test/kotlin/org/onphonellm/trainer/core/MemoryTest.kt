package org.onphonellm.trainer.core

import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Assumptions.assumeTrue
import org.junit.jupiter.api.Test
import java.io.File

class MemoryTest {
    private fun sample(name: String): MemorySample {
        val dir = Fixtures.androidSamples
        assumeTrue(dir.isDirectory, "$dir is absent: the real /proc status samples live outside the repository")
        return ProcStatus.sample(File(dir, name).readText())
    }

    @Test
    fun `proc status parser reads real Android samples (AOSP youtube, Pixel 7a)`() {
        // Key values from ../shared/android-samples/README.md (kB as printed).
        val yt = sample("proc-pid-status-aosp-procfsmemoryutiltest-youtube.txt")
        assertEquals(MemorySample("android_proc_status", anonBytes = 37860L * 1024, rssBytes = 126776L * 1024,
            peakBytes = 137668L * 1024, swapBytes = 22L * 1024), yt)
        val px = sample("proc-pid-status-android14plus-pixel7a-footos.txt")
        assertEquals(114120L * 1024, px.anonBytes)
        assertEquals(505536L * 1024, px.rssBytes)
        assertEquals(524884L * 1024, px.peakBytes)
        assertEquals(16060L * 1024, px.swapBytes)
        val kb = ProcStatus.parseKb(File(Fixtures.androidSamples, "proc-pid-status-android14plus-pixel7a-footos.txt").readText())
        assertEquals(kb["VmRSS"], kb["RssAnon"]!! + kb["RssFile"]!! + kb["RssShmem"]!!)
        assertThrows<BadInput> { ProcStatus.sample("Name:\tfoo\nThreads:\t4\n") }
    }

    @Test
    fun `budget guard refuses to start when resident plus the predicted step exceeds the budget`() {
        val program = Manifest.read(File(Fixtures.schemas, "traces/tiny/program"))
        val predicted = program.predictedPeakBytes  // memory_plan.peak_estimate_bytes.executorch
        assertEquals(175556L, predicted)
        val s = listOf(MemorySample("android_proc_status", anonBytes = 100_000L))
        assertEquals(GuardDecision.Continue, MemoryGuard(300_000L, predicted).preflight(s))
        val stop = MemoryGuard(200_000L, predicted).preflight(s)
        assertTrue(stop is GuardDecision.Stop && stop.code == "budget_exceeded", stop.toString())
    }

    @Test
    fun `budget guard stops before a step would overrun and pauses on OS pressure`() {
        val g = MemoryGuard(budgetBytes = 1000, predictedStepBytes = 100)
        fun anon(a: Long, low: Boolean? = null, trim: Int? = null) = listOf(MemorySample("android_proc_status", anonBytes = a),
            MemorySample("android_activity_manager", availableBytes = 1, lowMemory = low, trimLevel = trim))
        assertEquals(GuardDecision.Continue, g.preflight(anon(500)))
        assertEquals(GuardDecision.Continue, g.afterStep(anon(700)))        // grew 200
        val d = g.afterStep(anon(850))                                       // 850 + 200 > 1000
        assertTrue(d is GuardDecision.Stop && d.message.contains("next step"), d.toString())
        assertTrue(g.afterStep(anon(1001)) is GuardDecision.Stop)
        assertEquals(1001L, g.peakAnon)
        val h = MemoryGuard(10_000, 0)
        assertTrue(h.afterStep(anon(10, low = true)) is GuardDecision.Pause)
        assertTrue(h.afterStep(anon(10, trim = MemoryGuard.TRIM_MEMORY_RUNNING_CRITICAL)) is GuardDecision.Pause)
        assertEquals(GuardDecision.Continue, h.afterStep(anon(10, trim = 20))) // UI_HIDDEN: the screen went off, not pressure
        assertEquals(GuardDecision.Continue, h.afterStep(anon(10, low = false)))
    }

    @Test
    fun `memory samples become valid telemetry events`() {
        val dir = Fixtures.tempDir()
        val rec = TelemetryRecorder("r", EventLog(File(dir, "t.jsonl")), FakeClock(), 0)
        val e = rec.emit("memory", MemorySample("android_activity_manager", availableBytes = 5, lowMemory = true, trimLevel = 15).eventFields(3))
        assertEquals(setOf("schema_version", "type", "run_id", "seq", "timestamp", "elapsed_s", "probe", "step", "available_bytes", "low_memory", "trim_level"),
            e.fields.keys)
    }
}
