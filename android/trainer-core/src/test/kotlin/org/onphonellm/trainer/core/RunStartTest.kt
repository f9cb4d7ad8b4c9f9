package org.onphonellm.trainer.core

import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertFalse
import org.junit.jupiter.api.Assertions.assertNotNull
import org.junit.jupiter.api.Assertions.assertNull
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import java.io.File

/** The screen's Start / Stop states while a run starts (issue 42) and the guard against replaying a crash. */
class RunStartTest {
    @Test fun `start disables Start and enables Stop, a second tap is ignored, the run ends idle`() {
        val s = RunStart()
        assertEquals(RunStart.Buttons(start = true, stop = false, resume = true), s.buttons())
        assertTrue(s.begin())
        assertEquals(RunStart.Phase.STARTING, s.phase)
        assertEquals(RunStart.Buttons(start = false, stop = true, resume = false), s.buttons())
        assertFalse(s.begin(), "a second tap while starting creates nothing")
        assertTrue(s.shouldContinue())
        assertTrue(s.running())
        assertEquals(RunStart.Buttons(start = false, stop = true, resume = false), s.buttons())
        assertFalse(s.begin(), "nor while running")
        s.ended()
        assertEquals(RunStart.Buttons(start = true, stop = false, resume = true), s.buttons())
        assertTrue(s.begin())
    }

    @Test fun `Stop during the start cancels it - no session trains, the stop is not lost`() {
        val s = RunStart()
        assertTrue(s.begin())
        s.requestStop()
        assertEquals(RunStart.Phase.STOPPING, s.phase)
        assertEquals(RunStart.Buttons(start = false, stop = false, resume = false), s.buttons())
        assertFalse(s.shouldContinue())
        assertFalse(s.running(), "a session reaching its run after the stop does not train")
        assertTrue(s.stopRequested)
        s.ended()
        assertFalse(s.stopRequested, "the next start starts clean")
        assertEquals(RunStart.Phase.IDLE, s.phase)
    }

    @Test fun `Stop while running stops at the step boundary`() {
        val s = RunStart()
        s.beginExternal()
        assertTrue(s.running())
        s.requestStop()
        assertTrue(s.stopRequested)
        assertEquals(RunStart.Phase.STOPPING, s.phase)
        s.ended()
        assertEquals(RunStart.Phase.IDLE, s.phase)
    }

    @Test fun `a crash is not replayed - redelivered starts are refused after two unended sessions, a user start always goes`() {
        val f = File(Fixtures.tempDir(), "guard/unended")
        val g = RestartGuard(f)
        assertNull(g.beforeStart(restart = false))
        g.ended()
        assertNull(g.beforeStart(restart = true), "a restart after a clean end: the OS killed us, resume")
        // The process dies twice without ending the session (a native crash), each time redelivered.
        assertNull(RestartGuard(f).beforeStart(restart = true))
        val refused = RestartGuard(f).beforeStart(restart = true)
        assertNotNull(refused)
        assertTrue(refused!!.contains("Resume"), refused)
        assertNotNull(RestartGuard(f).beforeStart(restart = true), "still refused: nothing ran")
        assertNull(RestartGuard(f).beforeStart(restart = false), "the user's Resume goes")
        assertNull(RestartGuard(f).beforeStart(restart = true), "and counts again from one")
    }
}
