package org.onphonellm.trainer.core

import java.io.File
import java.nio.ByteBuffer
import java.nio.ByteOrder

/**
 * The Kotlin Trainer against a real exported program, replayed: android/replay_record.py ran the
 * program on the host (ExecuTorch's Python runtime, driven by ProgramDir.call_train_method) and
 * recorded every call. Here the Trainer runs the same steps on the program's own manifest.json and
 * state_init.bin, with a runtime that checks each call's inputs (method, ids, labels, lr, the whole
 * state) against the recording and answers with the recorded outputs. The run's final state must equal
 * the host's bit for bit: same inputs in the same order, each output copied into the same slice.
 *
 * Not a JUnit test (it needs an exported program): android/test.sh runs it when ANDROID_TEST_PROGRAM
 * is set. Usage: ReplayCheck PROGRAM_DIR RECORDING_DIR
 */
object ReplayCheck {
    private const val LR = 0.05 // replay_record.py's

    private fun le(f: File): FloatArray {
        val b = ByteBuffer.wrap(f.readBytes()).order(ByteOrder.LITTLE_ENDIAN).asFloatBuffer()
        return FloatArray(b.remaining()).also { b.get(it) }
    }

    private fun longs(v: List<Json>) = v.map { (it as Json.Num).asLongOrNull!! }

    @JvmStatic
    fun main(args: Array<String>) {
        val (program, rec) = args.map { File(it) }
        val m = Manifest.load(File(program, "manifest.json"))
        m.verifyFiles(program)
        val steps = (Json.parse(File(rec, "steps.json").readText()) as Json.Arr).items.map { Fields.of(it, "steps.json") }
        var k = 0
        val runtime = object : TrainingRuntime {
            override fun loadMethod(name: String) {}
            override fun execute(method: String, inputs: List<TensorValue>): List<TensorValue> {
                val s = steps[k]
                check(method == s.string("method")) { "step $k: method $method, the host called ${s.string("method")}" }
                check(inputs[0].longs().toList() == longs(s.arr("ids"))) { "step $k: input_ids differ from the host's" }
                check(inputs[1].longs().toList() == longs(s.arr("labels"))) { "step $k: labels differ from the host's" }
                check(inputs[2].floats()[0] == LR.toFloat()) { "step $k: lr ${inputs[2].floats()[0]}" }
                val flat = FloatArray(m.stateNumel)
                var at = 0
                inputs.drop(3).forEach { it.copyInto(flat, at); at += it.numel }
                check(at == m.stateNumel && flat.contentEquals(le(File(rec, "s${k}_in.bin")))) { "step $k: the state inputs differ from the host's" }
                val shapes = s.arr("shapes")
                val outs = shapes.indices.map { i ->
                    TensorValue.Floats("", (shapes[i] as Json.Arr).items.map { (it as Json.Num).asLongOrNull!!.toInt() }, le(File(rec, "s${k}_out$i.bin")))
                }
                k++
                return outs
            }
            override fun close() {}
        }
        val probe = object : MemoryProbe {
            override fun sample() = listOf(MemorySample("android_proc_status", anonBytes = 1L shl 20))
        }
        val runDir = RunDir(kotlin.io.path.createTempDirectory("replay").toFile())
        val config = RunConfig("replay", steps.size.toLong(), LR, 1L shl 40, mapOf("platform" to "android", "device_model" to "host",
            "os" to "jvm", "total_ram_bytes" to (1L shl 33)), checkpointEvery = steps.size)
        val rows = readDataset(File(rec, "data.jsonl"), m.vocab, m.seqLen)
        val out = Trainer(m, program, Schedule.fromManifest(m), rows, runtime, probe, config, runDir).run()
        check(out.status == "completed" && k == steps.size) { "replay ended $out after $k calls" }
        val final = CheckpointStore(runDir.checkpoint).load(m.stateNumel).state
        check(final.contentEquals(le(File(rec, "final.bin")))) { "the final state differs from the host's" }
        runDir.dir.deleteRecursively()
        println("replay: $k steps (${steps.joinToString(", ") { it.string("method") }}) of ${program.name}: inputs and the final state " +
            "(${m.stateNumel} values) equal the host's, bit for bit")
    }
}
