package org.onphonellm.trainer.app

import android.content.ContentResolver
import android.net.Uri
import android.provider.DocumentsContract
import org.onphonellm.trainer.core.ImportSource
import java.io.FileNotFoundException
import java.io.InputStream

/**
 * A folder picked with the Storage Access Framework (ACTION_OPEN_DOCUMENT_TREE) as trainer-core's
 * [ImportSource]: its files listed recursively through DocumentsContract child queries (path, size), each
 * opened through the ContentResolver (local storage, an SD card, a cloud provider's folder alike). Used on a
 * background thread only (a cloud provider may download while the stream is read).
 */
class SafImport(private val resolver: ContentResolver, private val tree: Uri) : ImportSource {
    private val docs = HashMap<String, Uri>()

    override fun list(): List<ImportSource.Entry> {
        val out = ArrayList<ImportSource.Entry>()
        docs.clear()
        fun walk(docId: String, prefix: String, depth: Int) {
            if (depth > 8) return
            val children = DocumentsContract.buildChildDocumentsUriUsingTree(tree, docId)
            val cols = arrayOf(DocumentsContract.Document.COLUMN_DOCUMENT_ID, DocumentsContract.Document.COLUMN_DISPLAY_NAME,
                DocumentsContract.Document.COLUMN_MIME_TYPE, DocumentsContract.Document.COLUMN_SIZE)
            resolver.query(children, cols, null, null, null)?.use { c ->
                while (c.moveToNext()) {
                    val id = c.getString(0)
                    val name = c.getString(1) ?: continue
                    val path = if (prefix.isEmpty()) name else "$prefix/$name"
                    if (c.getString(2) == DocumentsContract.Document.MIME_TYPE_DIR) walk(id, path, depth + 1)
                    else {
                        docs[path] = DocumentsContract.buildDocumentUriUsingTree(tree, id)
                        out.add(ImportSource.Entry(path, if (c.isNull(3)) -1L else c.getLong(3)))
                    }
                }
            }
        }
        walk(DocumentsContract.getTreeDocumentId(tree), "", 0)
        return out
    }

    override fun open(path: String): InputStream {
        val uri = docs[path] ?: throw FileNotFoundException("$path is not in the picked folder")
        return resolver.openInputStream(uri) ?: throw FileNotFoundException("cannot open $path")
    }

    /** The picked folder's name (the program's default name). */
    fun folderName(): String = DocumentsContract.getTreeDocumentId(tree).substringAfterLast(':').substringAfterLast('/')
}
