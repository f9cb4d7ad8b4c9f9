package org.onphonellm.trainer.app

import org.onphonellm.trainer.core.FileIdentity
import org.onphonellm.trainer.core.FileIdentitySource
import java.io.File

/**
 * A file's identity with its inode ([FileIdentity.key] = "device:inode", android.system.Os.stat, API 21) and
 * its modification time in ms (java.io.File: Os.stat's st_mtime has whole seconds below API 27): a file
 * replaced by another (a re-import, a push) is seen even with the same size and time. Null when it is gone.
 */
object OsFileIdentity : FileIdentitySource {
    override fun identity(file: File): FileIdentity? = try {
        val st = android.system.Os.stat(file.path)
        FileIdentity(st.st_size, file.lastModified(), "${st.st_dev}:${st.st_ino}")
    } catch (e: android.system.ErrnoException) {
        null
    }
}
