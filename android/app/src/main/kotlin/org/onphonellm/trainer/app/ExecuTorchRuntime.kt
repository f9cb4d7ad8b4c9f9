package org.onphonellm.trainer.app

import android.util.Log
import org.onphonellm.trainer.core.CacheRows
import org.onphonellm.trainer.core.Compute
import org.onphonellm.trainer.core.ElemType
import org.onphonellm.trainer.core.KernelPath
import org.onphonellm.trainer.core.LayerLoop
import org.onphonellm.trainer.core.Manifest
import org.onphonellm.trainer.core.OutputBuffers
import org.onphonellm.trainer.core.ProgramRuntime
import org.onphonellm.trainer.core.TensorBuffer
import org.pytorch.executorch.EValue
import org.pytorch.executorch.ExecutorchRuntimeException
import org.pytorch.executorch.Module
import org.pytorch.executorch.Tensor
import java.io.File
import java.nio.ByteOrder
import java.nio.FloatBuffer
import org.pytorch.executorch.DType as EtDType

/**
 * A program on the stock ExecuTorch Android runtime (`org.pytorch:executorch-android`), for
 * trainer-core's [org.onphonellm.trainer.core.LayerLoop] (driven by [org.onphonellm.trainer.core.TrainingSession]
 * in [TrainingService]); compiled against the API stubs in android/host-stubs, not run here.
 *
 * - `Module.load(model.pte, LOAD_MODE_MMAP)`: the program file stays clean file-backed pages. The frozen
 *   weights are not in the .pte: they are weights.safetensors, memory-mapped by trainer-core.
 * - The generation kernel (manifest generate.fused: `toolchain::int4_linear_a8.out`, toolchain/native/kernels.cpp):
 *   reported by [hasKernels] only if this app's libexecutorch.so has it registered, which only an AAR built
 *   from source with android/native/build_executorch_aar.sh does (Maven Central's AAR has no custom kernels
 *   and exports no kernel registry to add one from another .so; docs/android.md, "The generation kernel").
 *   Detected by loading the fused methods first: a method calling an operator the runtime lacks fails in
 *   `loadMethod` with Error::OperatorMissing (0x14, ExecutorchRuntimeException.getErrorCode()), and then
 *   the stock generation methods are loaded instead. With them, [kernelPath] is the path the kernels chose for this CPU
 *   (`toolchain_kernel_path()` through the JNI shim, [NativeKernels]); [kernelLine] is what the screen shows.
 *   [requireKernels]: fail instead of falling back (an app
 *   built with the kernel that must not run without it). The methods the driver will not call (the stock
 *   ones a fused one replaces, or the fused ones without the kernel) are not loaded: no arena for them.
 * - Inputs are the loop's views, wrapped without copying: `Tensor.fromBlob` over the mapped weights'
 *   direct buffers, the state buffer's entry windows, the app's activations (the JNI reads a direct
 *   buffer's address; each window is its own slice, so `capacity()` is exactly the tensor's size).
 *   Little-endian = the native order of every Android ABI.
 * - Outputs live in the method's arena until the next call (the JNI hands each out as a direct buffer over the
 *   arena, `Tensor.getRawDataBuffer()`); each is copied once, straight into where the loop keeps it
 *   ([executeInto]): `copyDataInto` into the state slice or the loop's pooled activation buffer, and a KV-cache
 *   output's rows from the arena view into the layer's cache ([CacheRows.write], one bulk put per kv head).
 *   Only a call without destinations ([execute]) copies into this runtime's own buffer of each output, allocated
 *   once per method ([OutputBuffers]). No direct buffer is allocated per call.
 * - Threads: training and a generation beside it call this one Module from two threads, never at once: each
 *   call, from wrapping the inputs to the loop's copy of the outputs, holds the session's fair runtime lock
 *   (`LayerLoop.runtimeLock`). The Module's own lock (`Module.execute`) covers the native call only, not the
 *   outputs, which alias the method's arena.
 */
class ExecuTorchRuntime(pte: File, private val program: Manifest, requireKernels: Boolean = false,
                        fp16: Compute.Fp16Support = fp16Support()) : ProgramRuntime, AutoCloseable {
    init {
        // An fp16 program (manifest compute) on a CPU without float16 arithmetic: refused before anything loads.
        Compute.refusal(program, "executorch", fp16)?.let { throw it }
    }
    private val module: Module = Module.load(pte.absolutePath, Module.LOAD_MODE_MMAP)
    private val specs = program.methods
    /** The kernels this runtime has registered, as far as the program's methods tell (empty: stock ExecuTorch). */
    val kernels: Set<String>
    /** The methods loaded (every arena allocated up front: failures and memory show early). */
    val loaded: List<String>
    /** The native kernels' run-time path (`toolchain_kernel_path()`, [NativeKernels]); null: stock methods, or unknown. */
    val kernelPath: String?
    /**
     * The screen's line: "native kernels: yes (path dotprod)" / "... yes (path unknown)" / "... no (XNNPACK variant)" / "... no
     * (stock methods)", then the program's compute on a line of its own ([Compute.screenLine]: fp16 and int8 said on screen).
     */
    val kernelLine: String get() = KernelPath.describe(kernels.isNotEmpty() || kernelMethods.isNotEmpty(), kernelPath, program.xnnpack != null) +
        "\n" + Compute.screenLine(program)

    /**
     * The training methods that call native kernels (an int8 program's, [Compute.requiredKernels]), loaded first: a runtime
     * without the kernels refuses the program here, before any step, with one message ([Compute.loadKernelMethods]). The
     * probe: without this app's JNI kernel shim (Maven Central's AAR) the runtime has no native kernel at all; with it, a
     * method's load says (Error::OperatorMissing for a kernel an older kernels.cpp lacks).
     */
    private val kernelMethods: List<String> = try {
        Compute.loadKernelMethods(program, if (NativeKernels.linked()) null else emptySet(), KERNELS_ADVICE, { load(it) },
            { (it as? ExecutorchRuntimeException)?.errorCode })
    } catch (e: Throwable) {
        close()
        throw e
    }

    init {
        val fused = program.fused
        var missing: String? = null
        val fusedLoaded = ArrayList<String>(kernelMethods)
        if (fused != null) {
            for (name in fused.methods.values) {
                try {
                    load(name)
                    fusedLoaded.add(name)
                } catch (e: ExecutorchRuntimeException) {
                    if (e.errorCode != OPERATOR_MISSING) throw e
                    missing = "$name: ${e.message}"
                    break
                }
            }
        }
        kernels = if (fused != null && missing == null) fused.kernels.toSet() else emptySet()
        kernelPath = if (kernels.isNotEmpty() || kernelMethods.isNotEmpty()) NativeKernels.path() else null
        if (missing != null) {
            if (requireKernels) throw IllegalStateException("this app's ExecuTorch runtime lacks ${fused!!.kernels} ($missing); build the AAR with android/native/build_executorch_aar.sh")
            Log.i(TAG, "no ${fused!!.kernels} in this ExecuTorch runtime ($missing): generation runs " +
                if (program.xnnpack != null) "the XNNPACK variant" else "the stock methods")
        } else if (fused != null) {
            Log.i(TAG, "${fused.kernels} registered: generation runs ${fused.methods.values} (kernel path ${kernelPath ?: "unknown"})")
        }
        // The methods the loop can call: training's, and generation's under the names it will use.
        val want = LayerLoop.methodsCalled(program, this)
        for (m in want) if (m !in fusedLoaded) load(m)
        loaded = want
    }

    /**
     * `loadMethod`, its failure turned into the fp16 message when it is what a runtime without float16 kernels does
     * to an fp16 program (XNNPACK cannot build the float16 GEMM: Error::Internal from the delegate's init), since the
     * ExecuTorch Android API has no query for XNNPACK's float16 support ([Compute.loadFailure]).
     */
    private fun load(name: String) {
        try {
            module.loadMethod(name)
        } catch (e: ExecutorchRuntimeException) {
            Compute.loadFailure(program, name, e.errorCode, e.message ?: "error ${e.errorCode}")?.let { close(); throw it }
            throw e
        }
    }

    override fun hasKernels(kernels: Collection<String>): Boolean = this.kernels.containsAll(kernels)

    /** The input EValues of the weight and state views, by identity (the loop passes the same view objects every call). */
    private val stable = java.util.IdentityHashMap<TensorBuffer, EValue>()

    /** One output buffer per output of each method, allocated by its first call (the KV cache rows land here). */
    private val own = OutputBuffers(program)

    override fun execute(method: String, inputs: List<TensorBuffer>): List<TensorBuffer> = executeInto(method, inputs, emptyList(), emptyList())

    /**
     * Each output copied once, out of the method's arena: into the loop's destination (its state slice, its pooled
     * activation buffer; the KV cache rows of a cache output) when it offers one, else into this runtime's buffer of
     * that output ([own], reused by every call). No direct buffer is allocated after a method's first call.
     * Every copy is made after `module.execute` has returned (the method has read all of its inputs): a destination
     * may be one of the call's inputs, wrapped without copying (a state entry block_backward updates, the KV cache,
     * the activation buffer of head_loss's x or block_backward's incoming d that a training step gives the new d).
     */
    override fun executeInto(method: String, inputs: List<TensorBuffer>, into: List<TensorBuffer?>, cacheInto: List<CacheRows?>): List<TensorBuffer> {
        val spec = specs[method] ?: throw IllegalStateException("no method $method")
        // Weights and state entries are the same views call after call: their tensors are made once (the JNI reads
        // the buffer's address at each call); activations are wrapped per call.
        val args = Array(inputs.size) { i ->
            val x = inputs[i]
            val bind = spec.inputs.getOrNull(i)?.bind
            if (bind == "weight" || bind == "state") stable.getOrPut(x) { EValue.from(wrap(x)) } else EValue.from(wrap(x))
        }
        val outs = module.execute(method, *args)
        if (outs.size != spec.outputs.size) throw IllegalStateException("$method returned ${outs.size} outputs, the manifest lists ${spec.outputs.size}")
        return outs.mapIndexed { i, v ->
            if (!v.isTensor) throw IllegalStateException("output $i of $method is not a tensor")
            val t = v.toTensor()
            val io = spec.outputs[i]
            if (t.numel() != io.numel.toLong()) throw IllegalStateException("output ${io.name} of $method has ${t.numel()} elements, the manifest says ${io.numel}")
            val rows = cacheInto.getOrNull(i)
            if (rows != null) {
                // The arena's float view, its rows straight into the cache (the one copy).
                if (t.dtype() != EtDType.FLOAT) throw IllegalStateException("output ${io.name} of $method is ${t.dtype()}, the KV cache is float32")
                rows.write(t.getRawDataBuffer() as FloatBuffer)
                return@mapIndexed rows.cache
            }
            val dst = into.getOrNull(i) ?: own.of(method)[i]
            val b = dst.data.duplicate().order(ByteOrder.nativeOrder())
            when (t.dtype()) {
                EtDType.FLOAT -> t.copyDataInto(b.asFloatBuffer())
                EtDType.INT64 -> t.copyDataInto(b.asLongBuffer())
                else -> throw IllegalStateException("output ${io.name} of $method is ${t.dtype()}")
            }
            dst
        }
    }

    private fun wrap(x: TensorBuffer): Tensor {
        val shape = LongArray(x.shape.size) { x.shape[it].toLong() }
        val b = x.data.duplicate().order(ByteOrder.nativeOrder())
        return when (x.dtype) {
            ElemType.FLOAT32 -> Tensor.fromBlob(b.asFloatBuffer(), shape)
            ElemType.INT64 -> Tensor.fromBlob(b.asLongBuffer(), shape)
            ElemType.INT32 -> Tensor.fromBlob(b.asIntBuffer(), shape)
            ElemType.UINT8 -> Tensor.fromBlobUnsigned(b, shape)
            ElemType.INT8 -> Tensor.fromBlob(b, shape)
        }
    }

    /**
     * Destroys the module. ExecuTorch refuses (IllegalStateException: a method is executing) while a generation that
     * outlived the session's drain is still inside a call: the module is then left to that call and the garbage
     * collector instead of failing a run that completed (the session's outcome stands; logged).
     */
    override fun close() {
        try {
            module.close()
        } catch (e: IllegalStateException) {
            Log.w("Trainer", "the module is still executing (a generation past the drain); not destroyed now: ${e.message}")
        }
    }

    companion object {
        /**
         * ExecuTorch's own log lines (its ring buffer of ET_LOG messages, `Module.readLogBufferStatic()`), oldest
         * first; empty when the runtime cannot say (no native library loaded yet). What an error shows and sends.
         */
        fun readLog(): List<String> = try { Module.readLogBufferStatic()?.toList() ?: emptyList() } catch (e: Throwable) { emptyList() }

        /**
         * Whether XNNPACK has float16 GEMMs on this phone, from what the kernel reports of the CPU (/proc/cpuinfo
         * Features, read as XNNPACK's cpuinfo reads HWCAP_ASIMDHP); [Compute.Fp16Support.UNKNOWN] when it cannot be read.
         */
        fun fp16Support(): Compute.Fp16Support {
            val cpuinfo = try { File("/proc/cpuinfo").readText(Charsets.US_ASCII) } catch (e: Exception) { null }
            return Compute.fp16FromCpuinfo(cpuinfo, android.os.Build.SUPPORTED_ABIS.firstOrNull() ?: "")
        }

        private const val TAG = "ExecuTorchRuntime"
        /** How an Android app gets a runtime with the native kernels (docs/android.md, "The generation kernel"). */
        const val KERNELS_ADVICE = "build the app with the ExecuTorch AAR of android/native/build_executorch_aar.sh " +
            "(Maven Central's AAR runs only stock kernels)"
        /** executorch::runtime::Error::OperatorMissing (ExecutorchRuntimeException.OPERATOR_MISSING in executorch-android). */
        const val OPERATOR_MISSING = 0x14
    }
}
