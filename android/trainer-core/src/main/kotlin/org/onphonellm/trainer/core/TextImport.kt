package org.onphonellm.trainer.core

import java.io.ByteArrayOutputStream
import java.io.InputStream
import java.nio.ByteBuffer
import java.nio.charset.CharacterCodingException
import java.nio.charset.CodingErrorAction

/**
 * A picked text file read off the main thread, with a size cap: above [capBytes] (from the size the picker
 * reports, or by counting while reading, for a cloud file of unknown size) it is refused with a message
 * saying so, before the whole file is read; a file that is not UTF-8 is refused too.
 */
object TextImport {
    /** 16 MiB: some 4 M tokens, far more than a personalization run trains on. */
    const val DEFAULT_CAP_BYTES = 16L shl 20

    class TooLarge(message: String) : Exception(message)

    fun tooLargeMessage(what: String, size: Long?, capBytes: Long): String =
        "$what is ${size?.let { "%.1f MB".format(it / 1048576.0) } ?: "over %.0f MB".format(capBytes / 1048576.0)}; the app reads texts " +
            "up to %.0f MB: pick a shorter part, or make rows with `toolchain data` on a computer".format(capBytes / 1048576.0)

    fun read(ins: InputStream, declaredSize: Long?, capBytes: Long = DEFAULT_CAP_BYTES, what: String = "the file"): String {
        if (declaredSize != null && declaredSize > capBytes) throw TooLarge(tooLargeMessage(what, declaredSize, capBytes))
        val out = ByteArrayOutputStream()
        val buf = ByteArray(1 shl 16)
        while (true) {
            val n = ins.read(buf)
            if (n < 0) break
            out.write(buf, 0, n)
            if (out.size() > capBytes) throw TooLarge(tooLargeMessage(what, null, capBytes))
        }
        val dec = Charsets.UTF_8.newDecoder().onMalformedInput(CodingErrorAction.REPORT).onUnmappableCharacter(CodingErrorAction.REPORT)
        return try {
            dec.decode(ByteBuffer.wrap(out.toByteArray())).toString()
        } catch (e: CharacterCodingException) {
            throw IllegalArgumentException("$what is not UTF-8 text (a binary file, or another encoding): save it as UTF-8 and pick it again")
        }
    }
}
