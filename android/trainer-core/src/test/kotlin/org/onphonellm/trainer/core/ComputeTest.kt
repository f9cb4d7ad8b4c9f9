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
            val e = assertThrows<ContractError>(bad) { parse(bad) }
            assertTrue(e.message!!.startsWith("manifest.json") && "compute" in e.message!!, e.message)
        }
        val e = assertThrows<ContractError> { parse("\"bf16\"") }
        assertEquals("manifest.json: compute 'bf16' is not one of [fp32, fp16]; re-export the program with this toolchain", e.message)
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
}
