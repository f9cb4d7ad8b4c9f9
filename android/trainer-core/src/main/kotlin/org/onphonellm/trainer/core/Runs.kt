package org.onphonellm.trainer.core

import java.io.File

/** One run's files: what it trains on, where it stands, what it reports and produces. */
class RunDir(val dir: File) {
    val spec = File(dir, "run.json")
    val train = File(dir, "train.jsonl")
    val held = File(dir, "held_out.jsonl")
    val results = File(dir, "results.json")
    val checkpoint = File(dir, "checkpoint.safetensors")
    val telemetry = File(dir, "telemetry.jsonl")
    val uploadCursor = File(dir, "upload.cursor")
    val rejected = File(dir, "rejected.jsonl")
    val adapter = File(dir, "adapter")
    val runId: String get() = dir.name
}

/** Rows as JSONL (data_row.schema.json), one object per line. */
object RowFiles {
    fun write(file: File, rows: List<DataRow>) = AtomicFiles.writeText(file, rows.joinToString("") {
        JsonWriter.write(Json.of(linkedMapOf("schema_version" to 1, "input_ids" to it.inputIds.toList(), "labels" to it.labels.toList()))) + "\n"
    })

    fun read(file: File, vocab: Int, seqLen: Int): List<DataRow> = if (!file.isFile || file.length() == 0L) emptyList() else
        file.readLines(Charsets.UTF_8).withIndex().filter { it.value.isNotBlank() }.map { (i, line) -> DataRow.parse(line, "${file.name} line ${i + 1}", vocab, seqLen) }
}

/**
 * The runs of an app, one directory each under [base]; `latest` names the most recent one, so the app
 * resumes "the run" without being told a run id (after a process kill, from the notification, from adb).
 */
class Runs(val base: File) {
    private val latestFile = File(base, "latest")

    /** Create [spec]'s run directory with its rows, and make it the latest run. */
    fun create(spec: RunSpec, data: PreparedData): RunDir {
        val d = RunDir(File(base, spec.runId))
        if (d.spec.exists()) throw BadInput("run ${spec.runId} exists already; resume it or choose another id")
        d.dir.mkdirs()
        RowFiles.write(d.train, data.train)
        RowFiles.write(d.held, data.held)
        AtomicFiles.writeText(d.spec, JsonWriter.write(spec.toJson()) + "\n")  // last: a run exists once its spec does
        AtomicFiles.writeText(latestFile, spec.runId + "\n")
        return d
    }

    fun get(runId: String): RunDir? = RunDir(File(base, runId)).takeIf { it.spec.isFile }

    /** The latest run (the `latest` pointer, else the newest run.json), or null. */
    fun latest(): RunDir? {
        if (latestFile.isFile) get(latestFile.readText().trim())?.let { return it }
        return base.listFiles()?.mapNotNull { f -> RunDir(f).takeIf { it.spec.isFile } }?.maxByOrNull { it.spec.lastModified() }
    }
}
