package org.onphonellm.trainer.core

import java.io.File

/** Paths to the repository's shared files and small builders for the tests. */
object Fixtures {
    /** The repository root: -Drepo.root (android/test.sh sets it), else found above the working directory. */
    val repo: File by lazy {
        System.getProperty("repo.root")?.let { return@lazy File(it) }
        var d: File? = File("").absoluteFile
        while (d != null && !File(d, "shared_schemas").isDirectory) d = d.parentFile
        d ?: error("run from inside the repository or pass -Drepo.root")
    }
    val schemas: File get() = File(repo, "shared_schemas")
    val examples: File get() = File(schemas, "examples")
    val invalid: File get() = File(examples, "invalid")

    /** Real Android outputs kept outside the repository (../shared/android-samples, see its README). */
    val androidSamples: File get() = File(repo, "../shared/android-samples").canonicalFile

    fun examples(prefix: String): List<File> = examples.listFiles { f -> f.name.startsWith(prefix) && f.name.endsWith(".json") }!!.sortedBy { it.name }
    fun invalid(prefix: String): List<File> = invalid.listFiles { f -> f.name.startsWith(prefix) && f.name.endsWith(".json") }!!.sortedBy { it.name }

    /**
     * An example manifest's text; an int4 one written before issue 23 (no quant.head, which the app refuses as
     * an old export) gets `"head": false` (its embedding and head are float32 inputs), until the example is
     * re-exported.
     */
    fun exampleManifest(name: String): String {
        val text = File(examples, name).readText()
        return if ("\"head\":" in text || "\"kind\": \"int4\"" !in text) text
        else text.replace("\"int4_packing\": \"interleaved\"", "\"head\": false,\n    \"int4_packing\": \"interleaved\"")
    }

    fun tempDir(): File = kotlin.io.path.createTempDirectory("trainer-core-test").toFile().also { it.deleteOnExit() }
}

/** Time that moves only when the code under test sleeps or a test advances it. */
class FakeClock(var nowMs: Long = 1_767_225_600_000L) : Clock {
    val sleeps = ArrayList<Long>()
    override fun wallSeconds(): Double = nowMs / 1000.0
    override fun monoNanos(): Long = nowMs * 1_000_000
    override fun sleepMs(ms: Long) { sleeps.add(ms); nowMs += ms }
}

/** Thrown by a test runtime to play the process being killed mid-run (an Error: nothing catches it). */
class SimulatedKill : Error("simulated kill")

/** A probe returning scripted samples: [anon] per call (the last one repeats), plus optional pressure. */
class ScriptedProbe(private val anon: List<Long>, var lowMemory: Boolean = false, var trimLevel: Int? = null) : MemoryProbe {
    var calls = 0
    override fun sample(): List<MemorySample> {
        val a = anon[minOf(calls, anon.size - 1)]
        calls++
        return listOf(MemorySample("android_proc_status", anonBytes = a, rssBytes = a + 100_000_000, peakBytes = a + 120_000_000),
            MemorySample("android_activity_manager", availableBytes = 3_000_000_000, lowMemory = lowMemory, trimLevel = trimLevel))
    }
}

/** JUnit's Kotlin `assertThrows` is not in Debian's junit5 jar: the same, on Assertions.fail. */
inline fun <reified T : Throwable> assertThrows(message: String = "", block: () -> Unit): T {
    try {
        block()
    } catch (e: Throwable) {
        if (e is T) return e
        throw AssertionError("$message: expected ${T::class.java.simpleName}, got $e", e)
    }
    throw AssertionError("$message: expected ${T::class.java.simpleName}, nothing was thrown")
}
