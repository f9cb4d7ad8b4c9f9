package org.onphonellm.trainer.core

/**
 * The manifest's `compute` (shared_schemas/manifest.schema.json, `toolchain export --compute`): the precision of
 * the training methods' frozen-weight matmuls. "fp32" (the exact default; the field is absent) or "fp16" (float16
 * weight chunks, operands and products, exported for ExecuTorch + XNNPACK only). An fp16 program needs XNNPACK's
 * float16 GEMMs, which XNNPACK has only on hardware with float16 arithmetic (on arm64: ARMv8.2 FP16, `asimdhp`;
 * XNNPACK's `use_arm_neon_fp16_arith`); without them the method's XNNPACK delegate fails to build and the
 * method does not load. The app refuses such a program before loading when it can tell ([Fp16Support.NO]),
 * and turns the method's load error into the same message when it cannot ([loadFailure]); the host does the
 * same (toolchain/runtime/runners.py).
 */
object Compute {
    const val FP32 = "fp32"
    const val FP16 = "fp16"
    val CHOICES = listOf(FP32, FP16)

    /** What the platform tells of XNNPACK's float16 GEMMs before a program loads. */
    enum class Fp16Support { YES, NO, UNKNOWN }

    /** executorch::runtime::Error codes a method load fails with when its XNNPACK delegate cannot be built
     * (XNNCompiler returns Internal for a node or runtime XNNPACK refuses), or the delegate cannot read it. */
    const val ERROR_INTERNAL = 0x01
    const val ERROR_NOT_SUPPORTED = 0x10
    const val ERROR_NOT_IMPLEMENTED = 0x11
    const val ERROR_DELEGATE_INVALID_COMPATIBILITY = 0x30
    private val DELEGATE_LOAD_ERRORS = setOf(ERROR_INTERNAL, ERROR_NOT_SUPPORTED, ERROR_NOT_IMPLEMENTED, ERROR_DELEGATE_INVALID_COMPATIBILITY)

    /** The manifest's `compute` ([raw]: the field's value, null when absent) checked: absent is fp32. */
    fun parse(raw: String?, where: String): String {
        val c = raw ?: FP32
        if (c !in CHOICES) throw ContractError("$where: compute '$c' is not one of $CHOICES; re-export the program with this toolchain")
        return c
    }

    /**
     * From the kernel's /proc/cpuinfo text and the process's ABI (Build.SUPPORTED_ABIS[0]): on arm64-v8a, the
     * `Features` flag `asimdhp` (HWCAP_ASIMDHP, which cpuinfo, XNNPACK's hardware detection, reads) says whether
     * XNNPACK has float16 GEMMs; on other ABIs (an x86_64 emulator, a 32-bit ARM build) the app cannot tell.
     */
    fun fp16FromCpuinfo(cpuinfo: String?, abi: String): Fp16Support {
        if (abi != "arm64-v8a" || cpuinfo == null) return Fp16Support.UNKNOWN
        val features = cpuinfo.lineSequence().filter { it.substringBefore(':').trim().equals("Features", ignoreCase = true) }
            .map { it.substringAfter(':').trim().split(Regex("\\s+")).toSet() }.toList()
        if (features.isEmpty()) return Fp16Support.UNKNOWN
        // Every core must have it (a big.LITTLE mix without it on some cores would fail there).
        return if (features.all { "asimdhp" in it }) Fp16Support.YES else Fp16Support.NO
    }

    private fun advice(program: Manifest) = "${program.dir.name} computes its frozen-weight matmuls in float16 (exported with --compute fp16)"

    /**
     * Refuse an fp16 program before loading it on a runtime that has no float16 GEMMs: [runtime] "coreml" never has
     * them (fp16 programs are ExecuTorch-only), "executorch" when [support] is [Fp16Support.NO]. Null: go on.
     */
    fun refusal(program: Manifest, runtime: String, support: Fp16Support): ContractError? {
        if (program.compute != FP16) return null
        return when {
            runtime != "executorch" -> ContractError("${advice(program)}, which only the ExecuTorch runtime runs, not $runtime; " +
                "re-export the program with --compute fp32")
            support == Fp16Support.NO -> ContractError("${advice(program)} and this phone's CPU has no float16 arithmetic " +
                "(ARMv8.2 FP16), so ExecuTorch's XNNPACK has no float16 kernels for them; re-export the program with --compute fp32")
            else -> null
        }
    }

    /**
     * A method's load failure ([errorCode]: the executorch::runtime::Error code, null when unknown; [detail]: its
     * message) turned into the fp16 message when the program is fp16 and the failure is its XNNPACK delegate's
     * (what a runtime without float16 kernels does); null: keep the original error (an fp32 program, a missing
     * operator, an allocation failure, ...).
     */
    fun loadFailure(program: Manifest, method: String, errorCode: Int?, detail: String): ContractError? {
        if (program.compute != FP16) return null
        if (errorCode != null && errorCode !in DELEGATE_LOAD_ERRORS) return null
        return ContractError("${advice(program)} and this ExecuTorch runtime has no float16 kernels for them (method $method " +
            "did not load: $detail); re-export the program with --compute fp32")
    }
}
