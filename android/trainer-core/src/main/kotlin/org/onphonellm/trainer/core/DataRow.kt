package org.onphonellm.trainer.core

import java.io.BufferedReader
import java.io.File

/**
 * Tokenized training rows (shared_schemas/data_row.schema.json, one JSON object per JSONL line).
 * Labels follow Hugging Face: aligned with input_ids (the step shifts them), -100 = no target;
 * without `labels` the row trains on every token.
 */
class DataRow(val inputIds: IntArray, val labels: IntArray) {
    /** Positions that carry a target (labels != -100): the tokens a step trains on. */
    val tokens: Int get() = labels.count { it != IGNORE }

    companion object {
        const val IGNORE = -100
        private val KEYS = setOf("schema_version", "input_ids", "labels", "text")

        /** One row, checked against its schema and against the program (token ids < vocab, length <= seqLen). */
        fun parse(line: String, where: String, vocab: Int, seqLen: Int): DataRow {
            val f = Fields.of(Json.parse(line), where)
            (f.obj.fields.keys - KEYS).firstOrNull()?.let { throw BadInput("$where: unknown field '$it'") }
            if (f.has("schema_version") && f.int("schema_version") != 1) throw BadInput("$where: schema_version must be 1")
            val ids = f.ints("input_ids").toIntArray()
            if (ids.size < 2) throw BadInput("$where: input_ids needs at least 2 tokens")
            ids.forEach { if (it !in 0 until vocab) throw BadInput("$where: token id $it is outside the vocabulary of $vocab") }
            if (ids.size > seqLen) {
                throw BadInput("$where has ${ids.size} tokens; this program was exported for seq_len $seqLen " +
                    "(re-export with a longer --seq-len or shorten the rows)")
            }
            val labels = if (f.has("labels")) f.ints("labels").toIntArray() else ids.copyOf()
            if (labels.size != ids.size) throw BadInput("$where: labels has ${labels.size} entries, input_ids ${ids.size}")
            labels.forEach { if (it != IGNORE && it !in 0 until vocab) throw BadInput("$where: label $it is neither -100 nor a token id < $vocab") }
            return DataRow(ids, labels)
        }
    }

    /** input_ids padded with [padId] and labels with -100 to [seqLen], as the program's int64[T] inputs. */
    fun padded(seqLen: Int, padId: Int): PaddedRow {
        require(inputIds.size <= seqLen) { "row of ${inputIds.size} tokens does not fit seq_len $seqLen" }
        val ids = LongArray(seqLen) { if (it < inputIds.size) inputIds[it].toLong() else padId.toLong() }
        val lab = LongArray(seqLen) { if (it < labels.size) labels[it].toLong() else IGNORE.toLong() }
        return PaddedRow(ids, lab)
    }
}

/** A [DataRow] padded to seq_len ([DataRow.padded]): input_ids with the pad id, labels with -100, the program's int64[T] inputs. */
class PaddedRow(val inputIds: LongArray, val labels: LongArray) {
    operator fun component1(): LongArray = inputIds
    operator fun component2(): LongArray = labels
}

/** All rows of a JSONL file, every line checked before training starts (blank lines are skipped). */
fun readDataset(file: File, vocab: Int, seqLen: Int): List<DataRow> = file.bufferedReader().use { readDataset(it, file.name, vocab, seqLen) }

fun readDataset(reader: BufferedReader, name: String, vocab: Int, seqLen: Int): List<DataRow> {
    val rows = ArrayList<DataRow>()
    reader.lineSequence().forEachIndexed { i, line ->
        if (line.isNotBlank()) rows.add(DataRow.parse(line, "$name line ${i + 1}", vocab, seqLen))
    }
    if (rows.isEmpty()) throw BadInput("$name has no rows")
    return rows
}
