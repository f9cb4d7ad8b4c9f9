package org.onphonellm.trainer.core

import java.io.File
import java.io.IOException
import java.io.InputStream
import java.security.MessageDigest

/** What a program import reads from: a folder the user picked (the app: the Storage Access Framework; tests: a directory). */
interface ImportSource {
    /** A file of the folder: its path relative to the folder ('/'-separated) and its size (-1: unknown). */
    class Entry(val path: String, val size: Long)

    /** Every file under the folder, recursively. */
    fun list(): List<Entry>
    fun open(path: String): InputStream

    /** A directory on this file system (tests, and adb-pushed folders). */
    class Directory(val root: File) : ImportSource {
        override fun list(): List<Entry> = root.walkTopDown().filter { it.isFile }
            .map { Entry(it.relativeTo(root).invariantSeparatorsPath, it.length()) }.toList()
        override fun open(path: String): InputStream = File(root, path).inputStream()
    }
}

/**
 * A program folder copied into the app's programs directory, checked as it is copied: manifest.json parsed
 * first, against the schema version this app reads (a folder that is not an exported program, or of another version, is refused before
 * anything is copied), then every file it lists copied and hashed on the way (sha256 against the manifest),
 * with progress in bytes; into a temporary directory renamed into place only when every file matched, so a
 * failed or cancelled import leaves nothing behind, and a program with the same name is replaced only then.
 * The copy is recorded in the [VerifyCache]: its first start does not hash the files again.
 */
object ProgramImport {
    /** Copied / total bytes; called after each 1 MiB and at the end. */
    fun interface Progress { fun onProgress(copied: Long, total: Long) }

    class Cancelled : IOException("import cancelled")

    private val NAME = Regex("^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")

    /** A program name from a folder name: letters, digits, '.', '_', '-' (others become '_'). */
    fun safeName(folder: String): String {
        val s = folder.trim().replace(Regex("[^A-Za-z0-9._-]"), "_").trimStart('.', '_', '-').take(100)
        return if (s.isEmpty()) "program" else s
    }

    /**
     * Import [source] as [programsDir]/[name]; returns the program read from its new place. [freeBytes]: the
     * space free on the destination (checked against the total before copying; null: not checked).
     */
    fun import(source: ImportSource, programsDir: File, name: String, cache: VerifyCache?, freeBytes: Long? = null,
               progress: Progress = Progress { _, _ -> }, cancelled: () -> Boolean = { false }): Manifest {
        if (!NAME.matches(name)) throw BadInput("'$name' is not a program name (letters, digits, '.', '_', '-')")
        val entries = source.list().associateBy { it.path }
        if (Contract.MANIFEST_NAME !in entries) {
            val hint = entries.keys.filter { it.endsWith("/manifest.json") }.minByOrNull { it.length }
            throw BadInput("the folder has no manifest.json" + (hint?.let { "; pick its folder ${it.removeSuffix("/manifest.json")} instead" }
                ?: ": pick the folder `toolchain export --out` wrote"))
        }
        if (!programsDir.isDirectory && !programsDir.mkdirs()) throw IOException("cannot create $programsDir")
        val tmp = File(programsDir, ".import-$name.tmp")
        tmp.deleteRecursively()
        if (!tmp.mkdirs()) throw IOException("cannot create $tmp")
        try {
            val manifestBytes = source.open(Contract.MANIFEST_NAME).use { it.readBytes() }
            File(tmp, Contract.MANIFEST_NAME).writeBytes(manifestBytes)
            val program = Manifest.read(tmp)  // a bad or foreign manifest is refused here, before the big files
            for (f in program.files.keys) {
                if (f.startsWith("/") || f.split('/').any { it == ".." || it.isEmpty() }) throw BadInput("manifest.json lists a file outside the program: '$f'")
                if (f !in entries) throw BadInput("the folder lacks $f (listed in manifest.json): copy the whole exported folder")
            }
            val total = program.files.keys.sumOf { maxOf(0L, entries.getValue(it).size) }
            if (freeBytes != null && total > freeBytes)
                throw IOException("the program needs ${mb(total)} MB and only ${mb(freeBytes)} MB are free on this phone")
            var copied = 0L
            var reported = 0L
            progress.onProgress(0, total)
            val buf = ByteArray(1 shl 16)
            for ((f, sha) in program.files.toSortedMap()) {
                val out = File(tmp, f)
                out.parentFile.mkdirs()
                val md = MessageDigest.getInstance("SHA-256")
                source.open(f).use { ins ->
                    out.outputStream().use { os ->
                        while (true) {
                            if (cancelled()) throw Cancelled()
                            val n = ins.read(buf)
                            if (n < 0) break
                            md.update(buf, 0, n)
                            os.write(buf, 0, n)
                            copied += n
                            if (copied - reported >= (1 shl 20)) { reported = copied; progress.onProgress(copied, maxOf(total, copied)) }
                        }
                    }
                }
                val got = md.digest().joinToString("") { "%02x".format(it) }
                if (got != sha) throw BadInput("$f does not match the manifest's sha256 (a partial or changed copy?): export or copy the program again")
            }
            progress.onProgress(copied, maxOf(total, copied))
            val dest = File(programsDir, name)
            val old = File(programsDir, ".import-$name.old")
            old.deleteRecursively()
            if (dest.exists() && !dest.renameTo(old)) throw IOException("cannot replace $dest")
            if (!tmp.renameTo(dest)) { old.renameTo(dest); throw IOException("cannot move the program into $dest") }
            old.deleteRecursively()
            val placed = Manifest.read(dest)
            cache?.record(placed)
            return placed
        } catch (e: Throwable) {
            tmp.deleteRecursively()  // a program of that name already there is untouched (and its record still holds)
            throw e
        }
    }

    private fun mb(b: Long) = b shr 20

    /** The programs under [programsDir] (directories with a manifest.json; imports in progress excluded), sorted. */
    fun list(programsDir: File): List<String> =
        programsDir.listFiles()?.filter { !it.name.startsWith(".") && File(it, Contract.MANIFEST_NAME).isFile }?.map { it.name }?.sorted() ?: emptyList()
}
