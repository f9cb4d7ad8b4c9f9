package org.onphonellm.trainer.core

/**
 * The manifest's `compute` (shared_schemas/manifest.schema.json, `toolchain export --compute`): the precision of
 * the training methods' frozen-weight matmuls. "fp32" (the exact default; the field is absent), "fp16" (float16
 * weight chunks, operands and products, exported for ExecuTorch + XNNPACK only) or "int8" (int8 activations x int4
 * weights on the toolchain's native kernels, [INT8]). An fp16 program needs XNNPACK's
 * float16 GEMMs, which XNNPACK has only on hardware with float16 arithmetic (on arm64: ARMv8.2 FP16, `asimdhp`;
 * XNNPACK's `use_arm_neon_fp16_arith`); without them the method's XNNPACK delegate fails to build and the
 * method does not load. The app refuses such a program before loading when it can tell ([Fp16Support.NO]),
 * and turns the method's load error into the same message when it cannot ([loadFailure]); the host does the
 * same (toolchain/runtime/program_runtime.py).
 */
object Compute {
    const val FP32 = "fp32"
    const val FP16 = "fp16"
    /**
     * int8 activations x int4 weights in the training methods' frozen matmuls (`toolchain export --compute int8`): those
     * methods call the toolchain's native kernels (their `kernels` in the manifest, e.g. `toolchain::int4_linear_a8.out`
     * and `toolchain::int4_dyw_a8.out`), which only a runtime with toolchain/native/kernels.cpp linked in has
     * ([requiredKernels], [kernelRefusal], [kernelLoadFailure]).
     */
    const val INT8 = "int8"
    val CHOICES = listOf(FP32, FP16, INT8)

    /** executorch::runtime::Error::OperatorMissing: a method calling an operator the runtime has not registered fails to load with it. */
    const val ERROR_OPERATOR_MISSING = 0x14

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
        if (c !in CHOICES) throw BadInput("$where: compute '$c' is not one of $CHOICES; re-export the program with this toolchain")
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
    fun refusal(program: Manifest, runtime: String, support: Fp16Support): BadInput? {
        if (program.compute != FP16) return null
        return when {
            runtime != "executorch" -> BadInput("${advice(program)}, which only the ExecuTorch runtime runs, not $runtime; " +
                "re-export the program with --compute fp32")
            support == Fp16Support.NO -> BadInput("${advice(program)} and this phone's CPU has no float16 arithmetic " +
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
    fun loadFailure(program: Manifest, method: String, errorCode: Int?, detail: String): BadInput? {
        if (program.compute != FP16) return null
        if (errorCode != null && errorCode !in DELEGATE_LOAD_ERRORS) return null
        return BadInput("${advice(program)} and this ExecuTorch runtime has no float16 kernels for them (method $method " +
            "did not load: $detail); re-export the program with --compute fp32")
    }

    /** What the screen says of the program's compute (beside the native kernels line). */
    fun screenLine(program: Manifest): String = when (program.compute) {
        FP16 -> "compute: fp16 (float16 frozen-weight matmuls on XNNPACK)"
        INT8 -> "compute: int8 (int8 x int4 frozen-weight matmuls on the native kernels)"
        else -> "compute: fp32"
    }

    /**
     * The native kernels the program's training and held-out methods call (the union of their manifest `kernels`): what
     * the runtime must have before the first step. The generation methods' kernels are not among them: the fused
     * methods are optional (the stock ones, or the XNNPACK variant, run without them). Empty: stock operators only.
     */
    fun requiredKernels(program: Manifest): Set<String> {
        val optional = LayerLoop.generationMethodNames(program).toSet()
        return program.methods.values.filter { it.name !in optional }.flatMap { it.kernels }.toSortedSet()
    }

    private fun needs(program: Manifest, missing: Collection<String>): String {
        val what = if (program.compute == INT8) "${program.dir.name} computes its training matmuls in int8 (exported with --compute int8)"
            else "${program.dir.name}'s training methods call native kernels"
        return "$what and needs the toolchain's native kernels ${missing.sorted()}"
    }

    /**
     * Refuse, before any method loads and any step runs, a program whose training methods call native kernels
     * ([requiredKernels]) on a runtime without them: [runtime] other than "executorch" never has them; [registered]: what
     * the app's kernel probe found registered (null: the probe cannot tell, the methods' load then decides,
     * [kernelLoadFailure]). [advice]: how this platform gets a runtime with the kernels. Null: go on.
     */
    fun kernelRefusal(program: Manifest, runtime: String, registered: Set<String>?, advice: String): BadInput? {
        val needed = requiredKernels(program)
        if (needed.isEmpty()) return null
        if (runtime != "executorch") return BadInput("${needs(program, needed)}, which only the ExecuTorch runtime has, not $runtime; " +
            "re-export the program with --compute fp32")
        val missing = needed - (registered ?: return null)
        if (missing.isEmpty()) return null
        return BadInput("${needs(program, missing)}, which this app's ExecuTorch runtime does not have; $advice, " +
            "or re-export the program with --compute fp32")
    }

    /**
     * A method's load failure as [kernelRefusal]'s message when the method calls native kernels ([MethodSpec.kernels]) and
     * the runtime says an operator is missing ([errorCode] [ERROR_OPERATOR_MISSING]); null: keep the original error.
     */
    fun kernelLoadFailure(program: Manifest, method: String, errorCode: Int?, detail: String, advice: String): BadInput? {
        val kernels = program.methods[method]?.kernels ?: return null
        if (kernels.isEmpty() || errorCode != ERROR_OPERATOR_MISSING) return null
        return BadInput("${needs(program, kernels)}, which this app's ExecuTorch runtime does not have (method $method did not load: " +
            "$detail); $advice, or re-export the program with --compute fp32")
    }

    /**
     * The kernel check before the first step, in the order a runtime with a kernel probe runs it: [kernelRefusal] on what the
     * probe found ([registered]), then the methods that need kernels loaded first ([load]; [errorCodeOf] gives a load
     * failure's executorch::runtime::Error code, null when it is not a runtime error), a missing operator turned into
     * [kernelLoadFailure]. Returns the methods loaded (the caller loads the rest). Throws the refusal, else the load's error.
     */
    fun loadKernelMethods(program: Manifest, registered: Set<String>?, advice: String, load: (String) -> Unit,
                          errorCodeOf: (Throwable) -> Int?): List<String> {
        kernelRefusal(program, "executorch", registered, advice)?.let { throw it }
        val needed = requiredKernels(program)
        if (needed.isEmpty()) return emptyList()
        val optional = LayerLoop.generationMethodNames(program).toSet()
        val loaded = ArrayList<String>()
        for (m in program.methods.values) {
            if (m.name in optional || m.kernels.isEmpty()) continue
            try {
                load(m.name)
            } catch (e: Throwable) {
                kernelLoadFailure(program, m.name, errorCodeOf(e), e.message ?: e.javaClass.simpleName, advice)?.let { throw it }
                throw e
            }
            loaded.add(m.name)
        }
        return loaded
    }
}
