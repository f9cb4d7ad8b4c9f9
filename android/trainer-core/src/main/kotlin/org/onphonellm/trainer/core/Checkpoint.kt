package org.onphonellm.trainer.core

import java.io.File

/**
 * Where a run stands: the app's flat state array ([StateBuffer]) plus the position in the run.
 * Same file as the host runner's (toolchain/training/checkpoint.py): safetensors with one F32 tensor
 * "state" [N] and `__metadata__.meta` = JSON {"step", "run_id", "seq", "losses"}, so either side can
 * resume the other's run.
 */
data class Checkpoint(val state: FloatArray, val step: Long, val runId: String, val seq: Long, val losses: List<Double?>)

class CheckpointStore(val file: File) {
    fun exists(): Boolean = file.isFile

    /** Written atomically: after a kill the file is the previous checkpoint or this one, never a mix. */
    fun save(c: Checkpoint) {
        val meta = Json.of(mapOf("step" to c.step, "run_id" to c.runId, "seq" to c.seq, "losses" to c.losses.map { l -> l?.takeIf { it.isFinite() } }))
        AtomicFiles.write(file) { out ->
            Safetensors.write(out, listOf(Safetensors.Slice("state", listOf(c.state.size), c.state, 0)), mapOf("meta" to JsonWriter.write(meta)))
        }
    }

    /**
     * [save] of the state in [buffer] (4 x numel little-endian bytes, the [StateBuffer]'s direct buffer): the same
     * file, written straight from the buffer (no whole-state FloatArray on the Java heap).
     */
    fun saveBuffer(buffer: java.nio.ByteBuffer, numel: Int, step: Long, runId: String, seq: Long, losses: List<Double?>) {
        val meta = Json.of(mapOf("step" to step, "run_id" to runId, "seq" to seq, "losses" to losses.map { l -> l?.takeIf { it.isFinite() } }))
        AtomicFiles.write(file) { out -> Safetensors.writeBuffer(out, "state", listOf(numel), buffer, mapOf("meta" to JsonWriter.write(meta))) }
    }

    /**
     * [load] straight into [buffer] (4 x [expectedNumel] bytes): the position is returned with an empty state array
     * (the values are in the buffer). Checked as [load]; on an error [buffer] is not written.
     */
    fun loadInto(buffer: java.nio.ByteBuffer, expectedNumel: Int): Checkpoint {
        val parsed = try {
            Safetensors.readHeader(file)
        } catch (e: BadInput) {
            throw BadInput("checkpoint ${file.path} is unreadable (${e.message}); delete it to start the run over")
        }
        val e = parsed.entries["state"] ?: throw BadInput("checkpoint ${file.path} has no tensor 'state'")
        val numel = (e.end - e.begin) / 4
        if (numel != expectedNumel.toLong()) {
            throw BadInput("checkpoint ${file.path} has $numel state values, the program $expectedNumel; it belongs to another program")
        }
        val meta = Fields.of(Json.parse(parsed.metadata["meta"] ?: throw BadInput("checkpoint ${file.path} has no run metadata")), "checkpoint meta")
        val losses = meta.arr("losses").map { (it as? Json.Num)?.asDouble }
        val c = Checkpoint(FloatArray(0), meta.long("step"), meta.string("run_id"), meta.long("seq"), losses)
        Safetensors.readInto(file, parsed, "state", buffer)
        return c
    }

    /** The checkpoint, checked against the program's state size; a damaged file is an error, not a fresh start. */
    fun load(expectedNumel: Int): Checkpoint {
        val parsed = try {
            Safetensors.readHeader(file)
        } catch (e: BadInput) {
            throw BadInput("checkpoint ${file.path} is unreadable (${e.message}); delete it to start the run over")
        }
        val state = Safetensors.readFloats(file, parsed, "state")
        if (state.size != expectedNumel) {
            throw BadInput("checkpoint ${file.path} has ${state.size} state values, the program $expectedNumel; it belongs to another program")
        }
        val meta = Fields.of(Json.parse(parsed.metadata["meta"] ?: throw BadInput("checkpoint ${file.path} has no run metadata")), "checkpoint meta")
        val losses = meta.arr("losses").map { (it as? Json.Num)?.asDouble }
        return Checkpoint(state, meta.long("step"), meta.string("run_id"), meta.long("seq"), losses)
    }
}
