package org.onphonellm.trainer.app

import android.app.Activity
import android.app.AlertDialog
import android.content.Intent
import android.net.Uri
import android.view.View
import android.widget.Button
import android.widget.EditText
import android.widget.LinearLayout
import android.widget.TextView
import org.onphonellm.trainer.core.FeedbackAction
import org.onphonellm.trainer.core.FeedbackLog
import org.onphonellm.trainer.core.GenerationFeedback
import java.io.File
import java.util.concurrent.ExecutorService

/**
 * Keep / edit / discard under the generation (one record each in feedback.jsonl, [GenerationFeedback]) and the
 * export of the file (create a document, then the share sheet), as views the Activity adds to its column. File
 * work runs on [io]; the buttons follow [show], called with the generation's display.
 */
class FeedbackBar(private val activity: Activity, private val io: ExecutorService) {
    private val keep = Button(activity).apply { text = "Keep"; setOnClickListener { tap(FeedbackAction.ACCEPT) } }
    private val edit = Button(activity).apply { text = "Edit ..."; setOnClickListener { editor() } }
    private val discard = Button(activity).apply { text = "Discard"; setOnClickListener { tap(FeedbackAction.REJECT) } }
    private val note = TextView(activity).apply { text = "feedback: -" }
    private val export = Button(activity).apply { text = "Export feedback (JSONL) ..."; setOnClickListener { pickTarget() } }
    @Volatile private var counts = "feedback: -"

    /** The buttons' row, the count line and the export button, in a column. */
    val view: View = LinearLayout(activity).apply {
        orientation = LinearLayout.VERTICAL
        addView(LinearLayout(activity).apply {
            orientation = LinearLayout.HORIZONTAL
            listOf(keep, edit, discard).forEach { addView(it, LinearLayout.LayoutParams(0, LinearLayout.LayoutParams.WRAP_CONTENT, 1f)) }
        })
        addView(note)
        addView(export)
    }

    init {
        val base = activity.getExternalFilesDir(null) ?: activity.filesDir
        io.execute { AppFeedback.init(base); refreshCounts() }
    }

    /** On the main thread, after every generation update: the buttons only for a finished, unanswered response. */
    fun show(running: Boolean = false) {
        val pending = !running && AppFeedback.feedback?.pending != null
        listOf(keep, edit, discard).forEach { it.isEnabled = pending }
        val answered = AppFeedback.feedback?.lastAnswer
        note.text = if (answered != null && !pending) "$counts (this one: ${answered.wire})" else counts
    }

    /** On [io]: the records so far, by action. */
    private fun refreshCounts() {
        counts = try { "feedback: " + FeedbackLog.summary(AppFeedback.feedback!!.log.counts()) } catch (e: Exception) { "feedback: ${e.message}" }
        activity.runOnUiThread { show() }
    }

    private fun tap(action: FeedbackAction, edited: String? = null) {
        listOf(keep, edit, discard).forEach { it.isEnabled = false }  // one record per generation: no double tap
        io.execute {
            val fb = AppFeedback.feedback ?: return@execute
            try { fb.record(action, edited) } catch (e: Exception) { activity.runOnUiThread { note.text = "feedback not saved: ${e.message}" }; return@execute }
            refreshCounts()
        }
    }

    /** The response in an editor; Save writes an edit record (unchanged: a keep). */
    private fun editor() {
        val offer = AppFeedback.feedback?.pending ?: return
        val text = EditText(activity).apply { setText(offer.response); minLines = 3 }
        AlertDialog.Builder(activity).setTitle("Edit the response").setView(text)
            .setPositiveButton("Save") { _, _ -> tap(FeedbackAction.EDIT, text.text.toString()) }
            .setNegativeButton("Cancel", null).show()
    }

    private fun pickTarget() {
        val f = AppFeedback.file
        if (f == null || !f.isFile || f.length() == 0L) { note.text = "no feedback yet: tap Keep, Edit or Discard under a generation"; return }
        activity.startActivityForResult(Intent(Intent.ACTION_CREATE_DOCUMENT).addCategory(Intent.CATEGORY_OPENABLE)
            .setType("application/octet-stream").putExtra(Intent.EXTRA_TITLE, FeedbackLog.FILE_NAME), REQUEST)
    }

    /** The Activity's onActivityResult for [REQUEST]: copy the file into the document, then offer it to the share sheet. */
    fun exported(doc: Uri) {
        val f = AppFeedback.file ?: return
        io.execute {
            try {
                activity.contentResolver.openOutputStream(doc, "wt")?.use { os -> f.inputStream().use { it.copyTo(os) } }
                    ?: throw IllegalStateException("cannot write $doc")
                val share = Intent(Intent.ACTION_SEND).setType("application/octet-stream").putExtra(Intent.EXTRA_STREAM, doc)
                    .addFlags(Intent.FLAG_GRANT_READ_URI_PERMISSION)
                activity.runOnUiThread {
                    note.text = "$counts (exported; on the host: toolchain data --program P --feedback ${FeedbackLog.FILE_NAME} ...)"
                    activity.startActivity(Intent.createChooser(share, "Share the feedback"))
                }
            } catch (e: Exception) {
                activity.runOnUiThread { note.text = "export failed: ${e.message}" }
            }
        }
    }

    companion object {
        const val REQUEST = 43
    }
}
