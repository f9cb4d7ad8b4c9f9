package org.onphonellm.trainer.core

import org.junit.jupiter.api.Assertions.assertArrayEquals
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Test
import java.io.File

/**
 * Files for the host to read: a checkpoint and an adapter for the example manifest, state[i] = i / 1024
 * (exact in float32). android/test.sh passes -Dinterop.dir and then reads them with the host's own
 * code (android/interop_check.py: toolchain.runtime.trainer's checkpoint reader, PEFT adapter loader).
 */
class InteropTest {
    @Test
    fun `checkpoint and adapter files for the host runner`() {
        val dir = System.getProperty("interop.dir")?.let { File(it) } ?: Fixtures.tempDir()
        val m = if (Fixtures.manifestExample.isFile) Manifest.load(Fixtures.manifestExample) else Fixtures.manifest()
        val state = FloatArray(m.stateNumel) { it / 1024f }
        CheckpointStore(File(dir, "checkpoint.safetensors")).save(Checkpoint(state, 3, "interop", 9, listOf(1.5, null)))
        writeAdapter(File(dir, "adapter"), m, state)
        val back = CheckpointStore(File(dir, "checkpoint.safetensors")).load(m.stateNumel)
        assertArrayEquals(state, back.state)
        assertEquals(listOf(1.5, null), back.losses)
    }
}
