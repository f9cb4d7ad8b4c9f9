package org.onphonellm.trainer.core

/**
 * The runtime of a program: layer-generic methods, each a pure function of its inputs. The app
 * implements it with ExecuTorch (`Module.load(path, LOAD_MODE_MMAP)`, `Tensor.fromBlob` over the direct
 * buffers given here, `execute`); tests with a fake that replays a recorded trace. Inputs come in the
 * manifest's order and are views (the mapped weights, the state array, the app's activations): the
 * runtime reads them in place. Outputs, in the manifest's order, may live in the runtime's memory until
 * its next call: the loop copies what it keeps before calling again.
 *
 * Every implementation writes its outputs only after the method has run (it has read all of its inputs):
 * a destination the loop offers may be one of the same call's inputs ([executeInto]: a state entry the method
 * updates, the KV cache a block reads, and in a training step the activation buffer of head_loss's `x` or of
 * block_backward's incoming `d`, which [LayerLoop.trainStep] reuses for the new `d`). A runtime that wrote an
 * output while inputs are still to be read would hand the method a half-overwritten input.
 */
interface ProgramRuntime {
    fun execute(method: String, inputs: List<TensorBuffer>): List<TensorBuffer>

    /**
     * Whether every one of [kernels] (manifest names, e.g. `toolchain::int4_linear_a8.out`) is registered with
     * this runtime, so methods listing them in `methods[].kernels` can run. The generation driver calls the
     * fused methods (manifest generate.fused) only when this says yes ([LayerLoop.generationNames]). Default:
     * no (stock ExecuTorch has none of them).
     */
    fun hasKernels(kernels: Collection<String>): Boolean = false

    /**
     * [execute], with a destination offered for each output: [into][i] (null: none) is a buffer of exactly
     * output i's bytes (its state slice, or a pooled activation buffer of the loop's), [cacheInto][i] (null:
     * none) the rows of the layer's KV cache a cache output goes to ([CacheRows]); nothing else reads either
     * during the call. A runtime that writes output i into [into][i] returns [into][i] itself (the same object)
     * in its place; one that writes its rows with [CacheRows.write] returns [cacheInto][i]'s [CacheRows.cache]:
     * the loop then copies nothing. Any other output it returns the loop copies once, as after [execute]. A
     * destination may be an input of the same call (a state entry the method updates, the cache a block reads,
     * the activation buffer of head_loss's `x` or of block_backward's incoming `d` that a training step gives
     * the new `d`: [LayerLoop.call]'s `into`): write outputs only after the method has run, never while an
     * input may still be read. Default: [execute] (no output written in place; the loop copies after it returns).
     */
    fun executeInto(method: String, inputs: List<TensorBuffer>, into: List<TensorBuffer?>, cacheInto: List<CacheRows?>): List<TensorBuffer> =
        execute(method, inputs)
}
