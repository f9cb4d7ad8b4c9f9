package org.onphonellm.trainer.core

import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertFalse
import org.junit.jupiter.api.Assertions.assertNull
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import java.io.File
import java.util.concurrent.CountDownLatch
import java.util.concurrent.atomic.AtomicInteger

/**
 * The decisions of "train while charging" that the app's ChargingWorker and TrainingService act on: the
 * worker's window plan (the session runs inside the worker, foreground or not), the persisted per-run flag and
 * what a service (re)start does with it, the one-session-per-process slot, and the run overview the Activity
 * reads off its main thread.
 */
class ChargingTest {
    private val T = ChargingRuns.ServiceStart.Train::class

    @Test fun `the window plan - a foreground worker trains until the window ends, a refused one stops before the job limit`() {
        val fg = ChargingRuns.windowPlan(foregroundGranted = true, startMs = 1_000)
        assertTrue(fg.foreground)
        assertEquals(1_000 + 12 * 3_600_000L, fg.deadlineMs)
        val bg = ChargingRuns.windowPlan(foregroundGranted = false, startMs = 1_000)
        assertFalse(bg.foreground)
        assertEquals(1_000 + 9 * 60_000L, bg.deadlineMs)
        assertTrue(bg.deadlineMs - 1_000 < 10 * 60_000L, "before JobScheduler's 10-minute limit")
        assertTrue("9 min" in bg.note, bg.note)
        // The control: the deadline, the window's end, the user's stop.
        var now = 1_000L
        var ended = false
        var user = false
        val c = ChargingRuns.control({ ended }, { user }, bg.deadlineMs, { now })
        assertFalse(c.stopRequested())
        now = bg.deadlineMs - 1
        assertFalse(c.stopRequested())
        now = bg.deadlineMs
        assertTrue(c.stopRequested(), "the deadline")
        now = 0; ended = true
        assertTrue(c.stopRequested(), "the window's end")
        ended = false; user = true
        assertTrue(c.stopRequested(), "the user's stop")
        // Without a deadline, time alone never stops it.
        assertFalse(ChargingRuns.control({ false }, { false }, null, { Long.MAX_VALUE }).stopRequested())
        // A window may end without warning: every step is checkpointed (SessionTest: what a kill then keeps).
        assertTrue(c.checkpointEachStep())
        assertFalse(RunControl { false }.checkpointEachStep(), "the foreground default: every checkpoint_every steps")
    }

    @Test fun `the charging flag is kept in the run directory, read back by a new process, cleared, and unreadable counts as set`() {
        val base = Fixtures.tempDir()
        val run = Runs(base).create(RunSpec("run-c", "tiny", 10, 1e-3, 1L shl 30), PreparedData(emptyList(), emptyList(), false))
        assertFalse(ChargingRuns.isMarked(run))
        ChargingRuns.mark(run, true, nowMs = 42)
        // A process restart: nothing in memory, a new RunDir over the same directory.
        val again = Runs(base).latest()!!
        assertTrue(ChargingRuns.isMarked(again))
        val f = Fields.of(Json.parse(ChargingRuns.markFile(again).readText()), "mark")
        assertEquals(42L, f.long("since_ms"))
        ChargingRuns.mark(again, false)
        assertFalse(ChargingRuns.isMarked(run))
        assertFalse(ChargingRuns.markFile(run).exists())
        ChargingRuns.mark(run, false)  // clearing twice is fine
        ChargingRuns.markFile(run).writeText("{torn")
        assertTrue(ChargingRuns.isMarked(run), "a torn flag: the safe side (charging only)")
    }

    @Test fun `a service start - the user's trains now and clears the flag, a restart of a flagged run trains only on the charger`() {
        fun start(restart: Boolean, requested: Boolean, marked: Boolean, enabled: Boolean = true, charging: Boolean = true, pct: Double? = 80.0) =
            ChargingRuns.onServiceStart(restart, requested, marked, enabled, charging, pct)
        val trainNow = ChargingRuns.ServiceStart.Train(chargingOnly = false, setMark = false)
        // The user's Start / Resume (or adb without charging_window): now, whatever the flag or the charger.
        assertEquals(trainNow, start(restart = false, requested = false, marked = true, charging = false))
        assertEquals(trainNow, start(restart = false, requested = false, marked = false, enabled = false))
        // A restart of an unflagged run: as before (resumes), the flag left alone.
        assertEquals(ChargingRuns.ServiceStart.Train(false, null), start(restart = true, requested = false, marked = false, charging = false))
        // A restart of a flagged run: only on the charger, with the switch on, the battery not low; then until unplugged.
        val whileCharging = ChargingRuns.ServiceStart.Train(chargingOnly = true, setMark = true)
        assertEquals(whileCharging, start(restart = true, requested = false, marked = true))
        assertEquals(ChargingRuns.ServiceStart.Defer("waiting for the next charging window (not charging)"),
            start(restart = true, requested = false, marked = true, charging = false))
        assertEquals(ChargingRuns.ServiceStart.Defer("train while charging is off: tap Resume to train now"),
            start(restart = true, requested = false, marked = true, enabled = false))
        assertEquals(ChargingRuns.ServiceStart.Defer("waiting for the next charging window (battery at 12%, below 20%)"),
            start(restart = true, requested = false, marked = true, pct = 12.0))
        assertEquals(whileCharging, start(restart = true, requested = false, marked = true, pct = null), "level unknown: charging decides")
        // A request for charging only (extra charging_window), fresh or redelivered: the same, and it sets the flag.
        for (restart in listOf(false, true)) {
            assertEquals(whileCharging, start(restart = restart, requested = true, marked = false, enabled = false))
            assertTrue(start(restart = restart, requested = true, marked = false, charging = false) is ChargingRuns.ServiceStart.Defer)
        }
        assertTrue(T.isInstance(start(false, false, false)))
    }

    @Test fun `one session per process - the slot is exclusive, even under a race, and the service routes requests while a worker trains`() {
        val slot = RunSlot()
        assertNull(slot.holder)
        assertTrue(slot.tryAcquire(RunSlot.Owner.WORKER))
        assertFalse(slot.tryAcquire(RunSlot.Owner.SERVICE))
        assertFalse(slot.tryAcquire(RunSlot.Owner.WORKER), "not reentrant: one session")
        slot.release(RunSlot.Owner.SERVICE)  // not the holder: no effect
        assertEquals(RunSlot.Owner.WORKER, slot.holder)
        slot.release(RunSlot.Owner.WORKER)
        assertNull(slot.holder)
        // 200 races between the service's thread and WorkManager's: exactly one wins each time.
        repeat(200) {
            val s = RunSlot()
            val go = CountDownLatch(1)
            val wins = AtomicInteger()
            val threads = RunSlot.Owner.values().map { o -> Thread { go.await(); if (s.tryAcquire(o)) wins.incrementAndGet() }.also { it.start() } }
            go.countDown()
            threads.forEach { it.join() }
            assertEquals(1, wins.get())
        }
        val start = "org.onphonellm.trainer.action.START"
        val generate = "org.onphonellm.trainer.action.GENERATE"
        assertEquals(RunSlot.WhileWorkerTrains.REFUSE_START, RunSlot.whileWorkerTrains(start, start, generate))
        assertEquals(RunSlot.WhileWorkerTrains.REFUSE_START, RunSlot.whileWorkerTrains(null, start, generate), "a restart")
        assertEquals(RunSlot.WhileWorkerTrains.TO_WORKER_SESSION, RunSlot.whileWorkerTrains(generate, start, generate))
        assertEquals(RunSlot.WhileWorkerTrains.AS_USUAL, RunSlot.whileWorkerTrains("org.onphonellm.trainer.action.STOP", start, generate))
    }

    @Test fun `the run overview the screen reads off its main thread - evals, adapter, charging wait, finished, paused`() {
        val base = Fixtures.tempDir()
        val runs = Runs(base)
        assertEquals(RunOverview.EMPTY, RunOverview.read(runs))
        assertEquals("paused by Android", RunOverview.read(runs, "paused by Android").idleMessage())
        val run = runs.create(RunSpec("run-o", "tiny", 10, 1e-3, 1L shl 30), PreparedData(emptyList(), emptyList(), false))
        val o0 = RunOverview.read(runs)
        assertEquals("run-o", o0.runId)
        assertFalse(o0.hasAdapter)
        assertNull(o0.evals.before)
        assertNull(o0.idleMessage())
        AtomicFiles.writeText(run.results, JsonWriter.write(EvalPair(2.5, 1.25, 10).toJson()))
        File(run.adapter, StateCheckpoints.ADAPTER_WEIGHTS).also { it.parentFile.mkdirs() }.writeBytes(byteArrayOf(1))
        ChargingRuns.mark(run, true)
        val o1 = RunOverview.read(runs)
        assertEquals(2.5, o1.evals.before)
        assertEquals(1.25, o1.evals.after)
        assertTrue(o1.hasAdapter)
        assertTrue(o1.chargingOnly)
        assertEquals("waiting for the next charging window (plugged in and idle)", o1.idleMessage())
        assertEquals("tap Resume", RunOverview.read(runs, "tap Resume").idleMessage(), "the system's pause is said first")
        TelemetryRecorder("run-o", EventLog(run.telemetry), FakeClock(), 0).emit("run_end", mapOf("status" to "completed", "steps_completed" to 10))
        val o2 = RunOverview.read(runs)
        assertTrue(o2.finished)
        assertNull(o2.idleMessage(), "a finished run waits for nothing")
        run.results.writeText("{torn")
        assertNull(RunOverview.read(runs).evals.before, "a torn results.json: no evals, no exception")
    }
}
