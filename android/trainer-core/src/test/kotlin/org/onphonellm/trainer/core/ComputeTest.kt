package org.onphonellm.trainer.core

import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertNull
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.Test
import java.io.File

/** The manifest's `compute` (`toolchain export --compute`): parsed, shown, and an fp16 program refused where it cannot run. */
class ComputeTest {
    private val text = Fixtures.exampleManifest("manifest_tiny.json")

    private fun withCompute(value: String?): String {
        assertTrue("\"compute\"" !in text)   // the example is an fp32 export: no compute field
        return if (value == null) text else text.replaceFirst("\"schema_version\": 3", "\"compute\": $value,\n  \"schema_version\": 3")
    }

    private fun parse(value: String?) = Manifest.parse(File("/programs/tiny16"), Json.parse(withCompute(value)), "manifest.json")

    @Test fun `compute absent is fp32, fp32 and fp16 are accepted, anything else is a manifest error`() {
        assertEquals("fp32", parse(null).compute)
        assertEquals("fp32", parse("null").compute)   // JSON null reads as absent (Fields.has), as in the Swift core
        assertEquals("fp32", parse("\"fp32\"").compute)
        assertEquals("fp16", parse("\"fp16\"").compute)
        for (bad in listOf("\"bf16\"", "\"FP16\"", "\"\"", "16", "[\"fp16\"]")) {
            val e = assertThrows<BadInput>(bad) { parse(bad) }
            assertTrue(e.message!!.startsWith("manifest.json") && "compute" in e.message!!, e.message)
        }
        assertEquals("int8", parse("\"int8\"").compute)
        val e = assertThrows<BadInput> { parse("\"bf16\"") }
        assertEquals("manifest.json: compute 'bf16' is not one of [fp32, fp16, int8]; re-export the program with this toolchain", e.message)
    }

    @Test fun `the cpu's float16 arithmetic is read from proc cpuinfo on arm64 only`() {
        val withHp = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm\n\n" +
            "processor\t: 1\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm\n"
        val without = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 cpuid\n"   // Cortex-A53 (ARMv8.0)
        assertEquals(Compute.Fp16Support.YES, Compute.fp16FromCpuinfo(withHp, "arm64-v8a"))
        assertEquals(Compute.Fp16Support.NO, Compute.fp16FromCpuinfo(without, "arm64-v8a"))
        // one core without it: not every core can run the float16 GEMMs
        assertEquals(Compute.Fp16Support.NO, Compute.fp16FromCpuinfo(withHp + "\nprocessor\t: 2\n" + without.substringAfter('\n'), "arm64-v8a"))
        // "asimdhp" must be a flag of its own, not part of another
        assertEquals(Compute.Fp16Support.NO, Compute.fp16FromCpuinfo("Features\t: fp asimd asimdhpx\n", "arm64-v8a"))
        assertEquals(Compute.Fp16Support.UNKNOWN, Compute.fp16FromCpuinfo("processor\t: 0\nBogoMIPS\t: 38.40\n", "arm64-v8a"))
        assertEquals(Compute.Fp16Support.UNKNOWN, Compute.fp16FromCpuinfo(null, "arm64-v8a"))
        assertEquals(Compute.Fp16Support.UNKNOWN, Compute.fp16FromCpuinfo("flags\t: fpu avx2 f16c avx512fp16\n", "x86_64"))
        assertEquals(Compute.Fp16Support.UNKNOWN, Compute.fp16FromCpuinfo(withHp, "armeabi-v7a"))
    }

    @Test fun `an fp16 program is refused before loading where the cpu has no float16 arithmetic, an fp32 one never`() {
        val fp16 = parse("\"fp16\"")
        val e = Compute.refusal(fp16, "executorch", Compute.Fp16Support.NO)!!
        assertEquals("tiny16 computes its frozen-weight matmuls in float16 (exported with --compute fp16) and this phone's CPU " +
            "has no float16 arithmetic (ARMv8.2 FP16), so ExecuTorch's XNNPACK has no float16 kernels for them; re-export the " +
            "program with --compute fp32", e.message)
        assertNull(Compute.refusal(fp16, "executorch", Compute.Fp16Support.YES))
        assertNull(Compute.refusal(fp16, "executorch", Compute.Fp16Support.UNKNOWN))   // the load error decides (loadFailure)
        assertTrue("--compute fp32" in Compute.refusal(fp16, "coreml", Compute.Fp16Support.YES)!!.message!!)
        for (support in Compute.Fp16Support.values()) for (rt in listOf("executorch", "coreml"))
            assertNull(Compute.refusal(parse(null), rt, support))
    }

    @Test fun `a method load failure of an fp16 program is the fp16 message, other failures keep theirs`() {
        val fp16 = parse("\"fp16\"")
        // What executorch-android throws when XNNPACK cannot build a float16 GEMM: Error::Internal from the delegate's init.
        val e = Compute.loadFailure(fp16, "block_step", 0x01, "Failed to load method: block_step")!!
        assertEquals("tiny16 computes its frozen-weight matmuls in float16 (exported with --compute fp16) and this ExecuTorch " +
            "runtime has no float16 kernels for them (method block_step did not load: Failed to load method: block_step); " +
            "re-export the program with --compute fp32", e.message)
        for (code in listOf(0x10, 0x11, 0x30, null)) assertTrue("--compute fp32" in Compute.loadFailure(fp16, "m", code, "x")!!.message!!, "$code")
        // a missing operator (the fused generation kernels' fallback), an allocation failure: not a float16 matter
        for (code in listOf(0x14, 0x21, 0x23)) assertNull(Compute.loadFailure(fp16, "m", code, "x"), "$code")
        // an fp32 program's load failure is never turned into the fp16 message
        for (code in listOf(0x01, 0x10, null)) assertNull(Compute.loadFailure(parse(null), "m", code, "x"))
    }

    @Test fun `the run_start event carries compute and the schema refuses other values`() {
        val base = linkedMapOf<String, Any?>("schema_version" to 1, "type" to "run_start", "run_id" to "r1", "seq" to 0,
            "timestamp" to 1.0, "model" to "m", "method" to "mesp", "backend" to "executorch", "seq_len" to 8, "rank" to 2,
            "platform" to "android", "device_model" to "Pixel 8", "os" to "Android 14", "total_ram_bytes" to 1, "budget_bytes" to 1)
        fun problems(extra: Map<String, Any?>) = EventSchema.problems(Json.of(base + extra) as Json.Obj)
        assertEquals(emptyList<String>(), problems(emptyMap()))   // absent: older telemetry stays valid
        assertEquals(emptyList<String>(), problems(mapOf("compute" to "fp16")))
        assertEquals(emptyList<String>(), problems(mapOf("compute" to "fp32")))
        assertTrue(problems(mapOf("compute" to "bf16")).isNotEmpty())
    }

    // --- int8 programs (issue 41 item 4): the training methods call native kernels ----------------------------------

    private val int8Kernels = listOf("toolchain::int4_dyw_a8.out", "toolchain::int4_linear_a8.out")

    /**
     * The generation example (fused methods with their kernels) as an int8 export writes it: compute "int8", and each
     * training / held-out method listing the W4A8 kernels it calls (the stock generation methods list none).
     */
    private fun int8Program(name: String = "tiny8", compute: String = "int8"): Manifest {
        val doc = Json.parse(Fixtures.exampleManifest("manifest_tiny_generate.json")) as Json.Obj
        val generation = Contract.GENERATION_ROLES.toSet()
        val methods = (doc.fields.getValue("methods") as Json.Arr).items.map { m ->
            val f = (m as Json.Obj).fields
            val n = (f.getValue("name") as Json.Str).value
            if (n in generation || "kernels" in f) m else Json.Obj(f + ("kernels" to Json.Arr(int8Kernels.map { Json.Str(it) })))
        }
        val out = Json.Obj(doc.fields + mapOf("compute" to Json.Str(compute), "methods" to Json.Arr(methods)))
        return Manifest.parse(File("/programs/$name"), out, "manifest.json")
    }

    @Test fun `the kernels an int8 program needs are its training methods', not the optional fused generation ones`() {
        val p = int8Program()
        assertEquals(int8Kernels.toSet(), Compute.requiredKernels(p))
        val fp32 = Manifest.parse(File("/programs/tiny"), Json.parse(Fixtures.exampleManifest("manifest_tiny_generate.json")), "manifest.json")
        assertTrue(fp32.fused!!.kernels.isNotEmpty(), "the example has fused generation methods with kernels")
        assertEquals(emptySet<String>(), Compute.requiredKernels(fp32), "fused generation methods are optional (stock fallback)")
        assertEquals("compute: int8 (int8 x int4 frozen-weight matmuls on the native kernels)", Compute.screenLine(p))
        assertEquals("compute: fp16 (float16 frozen-weight matmuls on XNNPACK)", Compute.screenLine(parse("\"fp16\"")))
        assertEquals("compute: fp32", Compute.screenLine(fp32))
    }

    @Test fun `an int8 program on a runtime without the kernels is refused with one message before any method loads or step runs`() {
        val p = int8Program()
        val advice = "build the app with the kernels"
        // The probe says no kernel at all (Maven Central's AAR): refused before a single method loads.
        val loads = ArrayList<String>()
        val e = assertThrows<BadInput> { Compute.loadKernelMethods(p, emptySet(), advice, { loads.add(it) }, { null }) }
        assertEquals("tiny8 computes its training matmuls in int8 (exported with --compute int8) and needs the toolchain's native " +
            "kernels [toolchain::int4_dyw_a8.out, toolchain::int4_linear_a8.out], which this app's ExecuTorch runtime does not have; " +
            "build the app with the kernels, or re-export the program with --compute fp32", e.message)
        assertEquals(emptyList<String>(), loads, "nothing loaded")
        // One kernel registered, the other not: only the missing one is named.
        val one = Compute.kernelRefusal(p, "executorch", setOf("toolchain::int4_linear_a8.out"), advice)!!
        assertTrue("[toolchain::int4_dyw_a8.out]" in one.message!! && "int4_linear_a8" !in one.message!!, one.message)
        assertNull(Compute.kernelRefusal(p, "executorch", int8Kernels.toSet() + "toolchain::other.out", advice))
        assertTrue("only the ExecuTorch runtime" in Compute.kernelRefusal(p, "coreml", int8Kernels.toSet(), advice)!!.message!!)
        // The probe cannot tell: the kernel methods load first, and a missing operator is the same message.
        class Missing(val code: Int) : RuntimeException("Operator missing")
        val tried = ArrayList<String>()
        val e2 = assertThrows<BadInput> {
            Compute.loadKernelMethods(p, null, advice, { tried.add(it); throw Missing(Compute.ERROR_OPERATOR_MISSING) }, { (it as? Missing)?.code })
        }
        assertEquals(1, tried.size, "refused at the first kernel method")
        assertTrue(p.method(tried[0]).kernels.isNotEmpty() && tried[0] !in Contract.GENERATION_ROLES, tried[0])
        assertEquals("tiny8 computes its training matmuls in int8 (exported with --compute int8) and needs the toolchain's native " +
            "kernels [toolchain::int4_dyw_a8.out, toolchain::int4_linear_a8.out], which this app's ExecuTorch runtime does not have " +
            "(method ${tried[0]} did not load: Operator missing); build the app with the kernels, or re-export the program with " +
            "--compute fp32", e2.message)
        // Another load error stays itself.
        val other = assertThrows<Missing> { Compute.loadKernelMethods(p, null, advice, { throw Missing(0x21) }, { (it as? Missing)?.code }) }
        assertEquals(0x21, other.code)
        // With the kernels: the training methods that call them are loaded first, and only they.
        val first = Compute.loadKernelMethods(p, int8Kernels.toSet(), advice, {}, { null })
        assertEquals(p.methods.values.filter { it.kernels.isNotEmpty() && it.name !in LayerLoop.generationMethodNames(p) }.map { it.name }, first)
        assertTrue(first.isNotEmpty() && first.none { it in LayerLoop.generationMethodNames(p) })
        // An fp32 program: nothing to check, nothing loaded here.
        assertEquals(emptyList<String>(), Compute.loadKernelMethods(parse(null), emptySet(), advice, { error("no load") }, { null }))
    }
}
