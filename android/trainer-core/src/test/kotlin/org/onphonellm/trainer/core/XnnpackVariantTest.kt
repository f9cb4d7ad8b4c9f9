package org.onphonellm.trainer.core

import java.io.File
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertThrows
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test

/**
 * The XNNPACK generation variant (manifest generate.xnnpack, `toolchain export --xnnpack-generation`) on the example
 * manifest exported with it (shared_schemas/examples/manifest_tiny_xnnpack.json): chosen when the runtime lacks the
 * fused kernels (the published AAR), per-layer names, and what the app loads.
 */
class XnnpackVariantTest {
    private val program = Manifest.parse(File("."), Json.parse(Fixtures.exampleManifest("manifest_tiny_xnnpack.json")), "example")

    private fun runtime(registered: Set<String>) = object : ProgramRuntime {
        override fun execute(method: String, inputs: List<TensorBuffer>): List<TensorBuffer> = throw AssertionError("not called")
        override fun hasKernels(kernels: Collection<String>) = registered.containsAll(kernels)
    }

    @Test fun `without the fused kernels the variant's names, with them the fused ones`() {
        val x = program.xnnpack!!
        val fused = program.fused!!
        assertTrue(x.weightBytes > 0)
        val stock = Contract.GENERATION_ROLES.associateWith { it }
        val none = LayerLoop.generationNames(program, runtime(emptySet()))
        assertEquals(stock + x.methods, none)
        assertEquals("block_decode_xnnpack_{layer}", none.getValue("block_decode"))
        assertEquals("block_decode_xnnpack_3", LayerLoop.atLayer(none.getValue("block_decode"), 3))
        assertEquals(stock + fused.methods, LayerLoop.generationNames(program, runtime(fused.kernels.toSet())))
    }

    @Test fun `the app loads every layer's variant methods and not the stock ones they replace`() {
        val called = LayerLoop.methodsCalled(program, runtime(emptySet()))
        val layers = program.layers
        for (role in listOf("block_prefill", "block_decode")) {
            assertTrue(role !in called, role)
            for (i in 0 until layers) assertTrue("${role}_xnnpack_$i" in called, "${role}_xnnpack_$i")
        }
        assertTrue("head_logits_xnnpack" in called && "head_logits" !in called, "head")
        assertTrue("embed_token" in called && "embed_prefill" in called, "embed")
        assertTrue(called.none { it.endsWith("_fused") }, "no fused method")
        val withKernels = LayerLoop.methodsCalled(program, runtime(program.fused!!.kernels.toSet()))
        assertTrue(withKernels.none { "xnnpack" in it }, "the fused methods win")
        // The variant's methods read the same LoRA entries as the stock ones (every layer's).
        val entries = LayerLoop.generationStateEntries(program)
        assertTrue(entries.isNotEmpty() && entries.all { e -> program.stateEntries.any { it.name == e } }, "state entries")
    }

    @Test fun `a variant naming a method the program lacks is refused`() {
        val text = Fixtures.exampleManifest("manifest_tiny_xnnpack.json").replace("\"block_decode_xnnpack_{layer}\"", "\"block_decode_xnnpack_x{layer}\"")
        assertThrows(BadInput::class.java) { Manifest.parse(File("."), Json.parse(text), "example") }
    }
}
