package org.onphonellm.trainer.core

import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertNull
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import java.io.File

/**
 * A run's lr and steps when the user gives none (issue 42 item 3): the manifest's `defaults` (what `toolchain export`
 * measured and recorded, toolchain/export/app_defaults.py), else an older program's optimizer.default_lr, else the
 * fallbacks; what the user asks for wins. The same rules as the host's ProgramDir and the iOS core (RunDefaultsTests).
 */
class RunDefaultsTest {
    private val text = Fixtures.exampleManifest("manifest_tiny.json")

    private fun parse(defaults: String?, dropDefaultLr: Boolean = false): Manifest {
        assertTrue("\"defaults\"" !in text)   // the example is a library export: no defaults
        var t = if (defaults == null) text else text.replaceFirst("\"schema_version\": 3", "\"defaults\": $defaults,\n  \"schema_version\": 3")
        if (dropDefaultLr) t = t.replace(Regex("\"default_lr\": [0-9.e-]+,?"), "")
        return Manifest.parse(File("/programs/tiny"), Json.parse(t), "manifest.json")
    }

    @Test fun `the manifest's defaults are a run's lr and steps unless the user asks`() {
        val p = parse("{\"lr\": 0.1, \"steps\": 400}")
        assertEquals(Pair(0.1, 400L), Pair(p.runLr(null), p.runSteps(null)))
        assertEquals(Pair(0.003, 25L), Pair(p.runLr(0.003), p.runSteps(25L)))
        assertEquals(0.1, p.defaultLr)
    }

    @Test fun `an older program - optimizer default_lr and 100 steps, else the fallback lr`() {
        val old = parse(null)
        val lr = Fields.of(Json.parse(text), "m").obj("optimizer").double("default_lr")
        assertEquals(Pair(lr, Contract.FALLBACK_STEPS), Pair(old.runLr(null), old.runSteps(null)))
        assertNull(old.defaultSteps)
        val none = parse(null, dropDefaultLr = true)
        assertEquals(Contract.FALLBACK_LR, none.runLr(null))
        assertEquals(100L, Contract.FALLBACK_STEPS)
    }

    @Test fun `bad defaults are a manifest error`() {
        for (bad in listOf("{\"lr\": 0, \"steps\": 10}", "{\"lr\": 0.1, \"steps\": 0}", "{\"lr\": 0.1}", "{\"steps\": 3}", "{\"lr\": \"x\", \"steps\": 3}")) {
            val e = assertThrows<BadInput>(bad) { parse(bad) }
            assertTrue(e.message!!.startsWith("manifest.json") && "defaults" in e.message!! || "lr" in e.message!! || "steps" in e.message!!, e.message)
        }
    }
}
