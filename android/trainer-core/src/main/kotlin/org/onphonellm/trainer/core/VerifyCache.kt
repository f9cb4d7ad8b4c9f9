package org.onphonellm.trainer.core

import java.io.File
import java.security.MessageDigest

/**
 * Verify a program once, not once per start: a record per program (in the app's own files, [dir]) of the
 * key of its manifest's checksums ([key]: the sha256 of the sorted `name sha256` lines of manifest `files`)
 * and each file's size and modification time when it was last found to match. [verifyOnce] hashes the
 * files only when there is no record, the manifest's checksums changed (a re-export pushed over it), or a
 * file's size or time changed (a partial or new `adb push`); a failed check leaves no record.
 */
class VerifyCache(val dir: File) {
    /** The record of the program in [programDir] (by its directory name). */
    fun recordFile(programDir: File): File = File(dir, programDir.name + ".verified.json")

    /** Whether [program]'s files are known to match its manifest (a record with this key, every file unchanged). */
    fun isVerified(program: Manifest, skip: (String) -> Boolean = { false }): Boolean {
        val f = recordFile(program.dir)
        if (!f.isFile) return false
        val doc = try { Fields.of(Json.parse(f.readText(Charsets.UTF_8)), f.path) } catch (e: BadInput) { return false }
        if (doc.optString("key") != key(program)) return false
        val files = if (doc.has("files")) doc.obj("files") else return false
        for (name in program.files.keys) {
            if (skip(name)) continue
            val got = File(program.dir, name)
            if (!files.has(name)) return false
            val e = files.obj(name)
            if (!got.isFile || e.optLong("size") != got.length() || e.optLong("mtime_ms") != got.lastModified()) return false
        }
        return true
    }

    /**
     * Check [program]'s files against its manifest unless [isVerified]; true: they were hashed now (and a
     * record written), false: the record said they match. Throws [BadInput] on a mismatch.
     */
    fun verifyOnce(program: Manifest, skip: (String) -> Boolean = { false }): Boolean {
        if (isVerified(program, skip)) return false
        recordFile(program.dir).delete()
        program.verifyFiles(skip)
        record(program)
        return true
    }

    /** Record that [program]'s files match (after [Manifest.verifyFiles], or an import that hashed them as it copied). */
    fun record(program: Manifest) {
        val files = LinkedHashMap<String, Any?>()
        for (name in program.files.keys.sorted()) {
            val f = File(program.dir, name)
            if (f.isFile) files[name] = linkedMapOf("size" to f.length(), "mtime_ms" to f.lastModified())
        }
        val doc = Json.of(linkedMapOf("key" to key(program), "files" to files))
        AtomicFiles.writeText(recordFile(program.dir), JsonWriter.write(doc) + "\n")
    }

    fun forget(programDir: File) { recordFile(programDir).delete() }

    companion object {
        /** The key of a program's checksums: sha256 of its `files` as sorted `name sha256\n` lines. */
        fun key(program: Manifest): String {
            val md = MessageDigest.getInstance("SHA-256")
            for ((name, sha) in program.files.toSortedMap()) md.update("$name $sha\n".toByteArray(Charsets.UTF_8))
            return md.digest().joinToString("") { "%02x".format(it) }
        }
    }
}
