package org.onphonellm.trainer.app

import android.app.Activity
import android.content.Intent
import android.net.Uri
import android.os.Build
import android.os.Bundle
import android.os.Handler
import android.os.Looper
import android.provider.DocumentsContract
import android.provider.OpenableColumns
import android.text.InputType
import android.view.View
import android.widget.ArrayAdapter
import android.widget.Button
import android.widget.CheckBox
import android.widget.EditText
import android.widget.LinearLayout
import android.widget.ProgressBar
import android.widget.ScrollView
import android.widget.Spinner
import android.widget.TextView
import org.onphonellm.trainer.core.EvalPair
import org.onphonellm.trainer.core.Manifest
import org.onphonellm.trainer.core.PreparedData
import org.onphonellm.trainer.core.ProgramImport
import org.onphonellm.trainer.core.RunOverview
import org.onphonellm.trainer.core.Runs
import org.onphonellm.trainer.core.ScreenState
import org.onphonellm.trainer.core.StateCheckpoints
import org.onphonellm.trainer.core.TextImport
import org.onphonellm.trainer.core.TextTokenizer
import org.onphonellm.trainer.core.VerifyCache
import java.io.File

/**
 * The app's one screen, plain android.widget Views: import a program folder (Storage Access Framework: copied
 * into files/programs/, checked as it is copied, with a progress bar) or choose one pushed there (the list is
 * refreshed on every resume), paste
 * text or pick a file (plain text, or chat JSONL), see its rows and held-out split, start / stop / resume,
 * a live loss chart, the memory footprint against the budget, the held-out loss before and after, a prompt
 * generated with the initial and the trained adapter side by side, and the adapter exported (PEFT files)
 * into a folder chosen with the Storage Access Framework, then offered to the share sheet. All the logic
 * is trainer-core's; the service runs the session.
 *
 * Rotation, config changes and process death keep the screen: every field is saved as a [ScreenState] in the
 * saved-state Bundle (a picked file's text lives in the cache dir, only its path in the Bundle), and the run's
 * progress lives in [TrainingStatus] (the process) and the run directory. File reads, the import and the
 * export run on background threads; a picked text above [TextImport.DEFAULT_CAP_BYTES] is refused with a message.
 *
 * `adb shell am start -n org.onphonellm.trainer/.app.MainActivity -a org.onphonellm.trainer.action.START
 * --es program NAME --es text FILE ...` forwards the request to the service from the foreground.
 */
class MainActivity : Activity() {
    private val handler = Handler(Looper.getMainLooper())
    /** The app's external files dir (first asked on [io]: getExternalFilesDir may create it, disk I/O). */
    private val base: File by lazy { getExternalFilesDir(null) ?: filesDir }
    /**
     * One background thread for the screen's small reads and writes (the latest run's overview every second,
     * the switch's preference, the restored screen state): the main thread touches no file.
     */
    private val io = java.util.concurrent.Executors.newSingleThreadExecutor()
    /** The latest run as last read on [io] (at most a second old): what the status shows while nothing trains. */
    @Volatile private var overview = RunOverview.EMPTY
    private val overviewPending = java.util.concurrent.atomic.AtomicBoolean(false)
    /** A saved state being restored on [io]: saved again as it was if the Activity is stopped before it is shown. */
    @Volatile private var restoring: Map<String, String?>? = null
    private lateinit var program: Spinner
    private lateinit var input: EditText
    private lateinit var steps: EditText
    private lateinit var heldOut: EditText
    private lateinit var lcsbK: EditText
    private lateinit var lcsbPolicy: Spinner
    private lateinit var lessMemory: CheckBox
    private lateinit var dataInfo: TextView
    private lateinit var status: TextView
    private lateinit var chart: LossChartView
    private lateinit var memory: TextView
    /** Which kernel path the generation runs (TrainingStatus.kernels, from the runtime's probe). */
    private lateinit var kernels: TextView
    private lateinit var memoryBar: ProgressBar
    private lateinit var evals: TextView
    private lateinit var prompt: EditText
    private lateinit var before: TextView
    private lateinit var after: TextView
    private lateinit var generationNote: TextView
    private lateinit var startButton: Button
    private lateinit var stopButton: Button
    private lateinit var resumeButton: Button
    private lateinit var generateButton: Button
    private lateinit var cancelButton: Button
    /** Keep / edit / discard under the generation, and the feedback file's export (FeedbackBar.kt). */
    private lateinit var feedback: FeedbackBar
    /** A generation update is posted to the main thread and not shown yet (coalesces a burst of tokens into one). */
    private val generationPosted = java.util.concurrent.atomic.AtomicBoolean(false)
    private lateinit var importButton: Button
    private lateinit var importBar: ProgressBar
    private lateinit var chargingOnly: CheckBox
    /** The picked file's text, kept in the cache dir (survives rotation and process death; the Bundle holds the path). */
    @Volatile private var pickedPath: String? = null
    @Volatile private var pickedName = "pasted text"
    @Volatile private var prepared: PreparedData? = null
    /** The program to select once the list is loaded (restored state). */
    private var wantProgram: String? = null

    override fun onCreate(savedInstanceState: Bundle?) {
        super.onCreate(savedInstanceState)
        val dp = resources.displayMetrics.density
        val col = LinearLayout(this).apply { orientation = LinearLayout.VERTICAL; setPadding((16 * dp).toInt(), (16 * dp).toInt(), (16 * dp).toInt(), (16 * dp).toInt()) }
        fun label(t: String, size: Float = 14f) = TextView(this).apply { text = t; textSize = size }.also { col.addView(it) }
        fun button(t: String, onClick: () -> Unit) = Button(this).apply { text = t; setOnClickListener { onClick() } }
        fun row(vararg views: View) = LinearLayout(this).apply {
            orientation = LinearLayout.HORIZONTAL
            views.forEach { addView(it, LinearLayout.LayoutParams(0, LinearLayout.LayoutParams.WRAP_CONTENT, 1f)) }
        }.also { col.addView(it) }
        fun field(hint: String, type: Int) = EditText(this).apply { this.hint = hint; inputType = type }

        label("On-device LoRA training", 20f)
        program = Spinner(this)
        col.addView(program)
        importButton = button("Import program folder ...") { importProgram() }
        col.addView(importButton)
        importBar = ProgressBar(this, null, android.R.attr.progressBarStyleHorizontal).apply { visibility = View.GONE; max = 1000 }
        col.addView(importBar)
        input = EditText(this).apply { hint = "Paste your text here (or a chat JSONL)"; minLines = 4; gravity = android.view.Gravity.TOP }
        col.addView(input)
        steps = field("steps (program's default)", InputType.TYPE_CLASS_NUMBER)
        heldOut = field("held-out (0.1)", InputType.TYPE_CLASS_NUMBER or InputType.TYPE_NUMBER_FLAG_DECIMAL)
        lcsbK = field("LCSB k (all layers)", InputType.TYPE_CLASS_NUMBER)
        row(steps, heldOut, lcsbK)
        // With k: which k layers each step trains (toolchain/lcsb/plan.py); "random" draws them with seed 0.
        lcsbPolicy = Spinner(this).apply { adapter = ArrayAdapter(this@MainActivity, android.R.layout.simple_spinner_dropdown_item, LCSB_POLICIES) }
        // Checkpoint groups: keep one layer input per round(sqrt(layers per step)) and rerun the forward for the others.
        lessMemory = CheckBox(this).apply { text = "Recompute more, use less memory" }
        row(lcsbPolicy, lessMemory)
        row(button("Pick file") { pickFile() }, button("Prepare") { prepare() })
        dataInfo = label("no data yet")
        startButton = button("Start") { start() }
        stopButton = button("Stop") { TrainingStatus.requestStop(); showButtons(); service(RunRequest.ACTION_STOP) }
        resumeButton = button("Resume") { if (TrainingStatus.start.begin()) { showButtons(); service(RunRequest.ACTION_START) } }
        row(startButton, stopButton, resumeButton)
        // Train while charging: WorkManager resumes the latest run when the phone is charging and idle (ChargingWorker).
        chargingOnly = CheckBox(this).apply { text = "Train while charging (resume overnight when plugged in and idle)" }
        col.addView(chargingOnly)
        status = label("idle")
        chart = LossChartView(this)
        col.addView(chart, LinearLayout.LayoutParams(LinearLayout.LayoutParams.MATCH_PARENT, (180 * dp).toInt()))
        memory = label("memory: -")
        kernels = label("native kernels: - (no program loaded)")
        memoryBar = ProgressBar(this, null, android.R.attr.progressBarStyleHorizontal)
        col.addView(memoryBar)
        evals = label("held-out loss: before -, after -")
        prompt = EditText(this).apply { hint = "Prompt" }
        col.addView(prompt)
        generateButton = button("Generate before / after") { generate() }
        cancelButton = button("Cancel") { cancelGeneration() }
        row(generateButton, cancelButton)
        generationNote = label("")
        before = TextView(this).apply { text = "before:" }
        after = TextView(this).apply { text = "after:" }
        row(before, after)
        feedback = FeedbackBar(this, io)
        col.addView(feedback.view)
        col.addView(button("Export adapter (PEFT) ...") { exportAdapter() })
        setContentView(ScrollView(this).apply { fitsSystemWindows = true; addView(col) })  // targetSdk 35 draws edge to edge

        // The saved screen (a long text may be in a file) and the switch's preference, read on io, shown on the main thread.
        val saved = savedInstanceState?.let { b -> b.keySet().associateWith { k -> b.getString(k) } }
        restoring = saved
        io.execute {
            base  // getExternalFilesDir, off the main thread
            val st = saved?.let { ScreenState.restore(it) }
            val charging = if (st == null) ChargingSchedule.enabled(this) else st.chargingOnly
            runOnUiThread {
                st?.let { restore(it) }
                restoring = null
                chargingOnly.isChecked = charging
                chargingOnly.setOnCheckedChangeListener { _, on -> io.execute { try { ChargingSchedule.set(this, on) } catch (e: Exception) {
                    runOnUiThread { status.text = "cannot schedule: ${e.message}" } } } }
                refreshPrograms()
            }
        }
        if (Build.VERSION.SDK_INT >= 33) requestPermissions(arrayOf("android.permission.POST_NOTIFICATIONS"), 1)
        if (intent?.action == RunRequest.ACTION_START) {
            startService(Intent(this, TrainingService::class.java).setAction(RunRequest.ACTION_START).putExtras(intent))
        }
    }

    private fun programs(): List<String> = ProgramImport.list(File(base, "programs"))

    /** The program list, read off the main thread on every resume (a program pushed or imported meanwhile appears). */
    private fun refreshPrograms(select: String? = null) = Thread {
        val names = programs()
        runOnUiThread {
            val keep = select ?: wantProgram ?: program.selectedItem as? String
            wantProgram = null
            @Suppress("UNCHECKED_CAST") val current = (program.adapter as? ArrayAdapter<String>)?.let { a -> (0 until a.count).map { a.getItem(it) } }
            if (current != names) program.adapter = ArrayAdapter(this, android.R.layout.simple_spinner_dropdown_item, names)
            names.indexOf(keep).takeIf { it >= 0 }?.let { program.setSelection(it) }
            if (names.isEmpty()) dataInfo.text = "no program yet: tap Import program folder (or push one with scripts/android/deploy.sh)"
        }
    }.start()

    private fun screenState() = ScreenState(
        program = program.selectedItem as? String, input = input.text.toString(), pickedPath = pickedPath, pickedName = pickedName,
        steps = steps.text.toString(), heldOut = heldOut.text.toString(), lcsbK = lcsbK.text.toString(),
        lcsbPolicy = lcsbPolicy.selectedItem as? String, lessMemory = lessMemory.isChecked, prompt = prompt.text.toString(),
        dataInfo = dataInfo.text.toString(), chargingOnly = chargingOnly.isChecked)

    private fun restore(st: ScreenState) {
        wantProgram = st.program
        input.setText(st.input)
        pickedPath = st.pickedPath
        pickedName = st.pickedName
        steps.setText(st.steps); heldOut.setText(st.heldOut); lcsbK.setText(st.lcsbK)
        st.lcsbPolicy?.let { p -> LCSB_POLICIES.indexOf(p).takeIf { it >= 0 }?.let { lcsbPolicy.setSelection(it) } }
        lessMemory.isChecked = st.lessMemory
        prompt.setText(st.prompt)
        dataInfo.text = st.dataInfo
        chargingOnly.isChecked = st.chargingOnly
    }

    override fun onSaveInstanceState(outState: Bundle) {
        super.onSaveInstanceState(outState)
        val pending = restoring
        // Not restored yet: the state as it came (its spilled text file is still there). Else the screen (a text over
        // 64 K characters is written to a file here: the Bundle must be filled now).
        val pairs = pending?.filterValues { it != null }?.mapValues { it.value!! } ?: screenState().save(File(cacheDir, "screen"))
        for ((k, v) in pairs) outState.putString(k, v)
    }

    override fun onDestroy() {
        io.shutdown()
        super.onDestroy()
    }

    /** Read the latest run's overview on [io] (one read at a time); [then] on the main thread with it. */
    private fun readOverview(then: ((RunOverview) -> Unit)? = null) {
        if (then == null && !overviewPending.compareAndSet(false, true)) return
        val app = applicationContext
        try {
            io.execute {
                val o = try { RunOverview.read(Runs(File(base, "runs")), AppState.paused(app)) } catch (e: Exception) { overview }
                overview = o
                if (then == null) overviewPending.set(false) else runOnUiThread { then(o) }
            }
        } catch (e: java.util.concurrent.RejectedExecutionException) {
            overviewPending.set(false)  // the Activity is being destroyed
        }
    }

    /** Pick a program folder (SAF), copy it into files/programs/NAME with a progress bar, checked as it is copied. */
    private fun importProgram() {
        if (ImportStatus.running) { ImportStatus.cancel = true; return }  // the button reads "Cancel import" meanwhile
        startActivityForResult(Intent(Intent.ACTION_OPEN_DOCUMENT_TREE), IMPORT_TREE)
    }

    /** The import runs in the process ([ImportStatus]), not in this Activity: a rotation meanwhile shows it going on. */
    private fun importFrom(tree: Uri) {
        if (ImportStatus.running) return
        ImportStatus.begin()
        showImport()
        val app = applicationContext
        Thread {
            val st = ImportStatus
            st.message = try {
                val src = SafImport(app.contentResolver, tree)
                val programs = File(base, "programs").also { it.mkdirs() }
                val name = ProgramImport.safeName(src.folderName())
                st.name = name
                val p = ProgramImport.import(src, programs, name, VerifyCache(File(base, "verified")), freeBytes = programs.usableSpace,
                    progress = { c, t -> st.copied = c; st.total = t }, cancelled = { st.cancel })
                st.imported = p.dir.name
                "imported ${p.dir.name}: ${p.layers} layers, seq_len ${p.seqLen}, ${p.quant}, compute ${p.compute} (files checked)"
            } catch (e: ProgramImport.Cancelled) {
                "import cancelled (nothing kept)"
            } catch (e: Exception) {
                "import failed: ${e.message}"
            }
            st.running = false
        }.start()
    }

    /** The import's progress on this screen (called by [refresh] every second, and when one starts). */
    private fun showImport() {
        val st = ImportStatus
        importButton.text = if (st.running) "Cancel import" else "Import program folder ..."
        importBar.visibility = if (st.running) View.VISIBLE else View.GONE
        if (st.running) {
            importBar.progress = if (st.total > 0) (1000 * st.copied / st.total).toInt() else 0
            dataInfo.text = "importing ${st.name ?: ""}: ${st.copied shr 20} / ${st.total shr 20} MB"
        } else st.message?.let { m ->
            st.message = null  // shown once
            dataInfo.text = m
            refreshPrograms(select = st.imported)
        }
    }

    /** Read a picked text off the main thread (a cloud file may download now), capped; kept in the cache dir. */
    private fun readPicked(uri: Uri) {
        dataInfo.text = "reading the file ..."
        Thread {
            try {
                val name = contentResolver.query(uri, arrayOf(OpenableColumns.DISPLAY_NAME, OpenableColumns.SIZE), null, null, null)?.use { c ->
                    if (c.moveToFirst()) Pair(c.getString(0), if (c.isNull(1)) null else c.getLong(1)) else null
                }
                val display = name?.first ?: uri.lastPathSegment?.substringAfterLast('/') ?: "picked file"
                val text = contentResolver.openInputStream(uri)?.use { TextImport.read(it, name?.second, what = display) }
                    ?: throw IllegalStateException("cannot open $display")
                val f = File(cacheDir, "picked.txt")
                org.onphonellm.trainer.core.AtomicFiles.writeText(f, text)
                runOnUiThread {
                    pickedPath = f.path
                    pickedName = display
                    input.setText(text.take(2000))
                    prepare()
                }
            } catch (e: Exception) {
                runOnUiThread { dataInfo.text = "cannot use this file: ${e.message}" }
            }
        }.start()
    }

    private fun service(action: String, extras: Bundle? = null) {
        // From the foreground (this Activity), a started service may call startForeground on every Android version.
        val i = Intent(this, TrainingService::class.java).setAction(action)
        extras?.let { i.putExtras(it) }
        startService(i)
    }

    private fun pickFile() {
        val i = Intent(Intent.ACTION_OPEN_DOCUMENT).addCategory(Intent.CATEGORY_OPENABLE).setType("*/*")
            .putExtra(Intent.EXTRA_MIME_TYPES, arrayOf("text/*", "application/json", "application/x-ndjson", "application/jsonl", "application/octet-stream"))
        startActivityForResult(i, PICK_TEXT)
    }

    /** Tokenize on a background thread: rows and held-out split of the pasted or picked text. */
    private fun prepare(then: ((PreparedData) -> Unit)? = null) {
        val name = program.selectedItem as? String ?: run { dataInfo.text = "no program yet: tap Import program folder (or push one with scripts/android/deploy.sh)"; return }
        val picked = pickedPath
        val pasted = input.text.toString()
        val fraction = heldOut.text.toString().toDoubleOrNull() ?: 0.1
        dataInfo.text = "tokenizing ..."
        Thread {
            val msg = try {
                val text = picked?.let { File(it).readText(Charsets.UTF_8) } ?: pasted
                val p = Manifest.read(File(File(base, "programs"), name))
                val d = PreparedData.prepare(text, TextTokenizer.forProgram(p), p.seqLen, p.vocab, fraction, 0, name = pickedName)
                prepared = d
                then?.let { f -> runOnUiThread { f(d) } }
                "${d.rows} rows of ${p.seqLen} tokens (${if (d.chat) "chat" else "text"}): ${d.train.size} to train on, ${d.held.size} held out"
            } catch (e: Exception) {
                "cannot use this data: ${e.message}"
            }
            runOnUiThread { dataInfo.text = msg }
        }.start()
    }

    /**
     * Start: the service creates the run (the text tokenized once, there) and trains it. Start is disabled from
     * the tap until the session ends ([RunStart]), Stop cancels the start; the run id is chosen here, so a
     * redelivered request resumes that run instead of creating another.
     */
    private fun start() {
        val name = program.selectedItem as? String ?: run { dataInfo.text = "no program yet: tap Import program folder (or push one with scripts/android/deploy.sh)"; return }
        if (!TrainingStatus.start.begin()) return  // starting or running already: a second tap does nothing
        showButtons()
        val k = lcsbK.text.toString().toIntOrNull()
        val extras = Bundle().apply {
            putString("run_id", RunRequest.newRunId())
            putString("program", name)
            steps.text.toString().toLongOrNull()?.let { putString("steps", it.toString()) }  // none: the program's (manifest defaults)
            putString("held_out", (heldOut.text.toString().toDoubleOrNull() ?: 0.1).toString())
            k?.let { putString("k", it.toString()); putString("lcsb", lcsbPolicy.selectedItem as? String ?: "cyclic") }
            putString("layers_per_checkpoint", if (lessMemory.isChecked) "auto" else "1")
        }
        val picked = pickedPath
        val pasted = input.text.toString()
        val cache = cacheDir
        status.text = "starting ..."
        io.execute {
            try {
                // The service reads the text from a file (a long text does not fit an Intent).
                val textFile = picked?.let { File(it) } ?: File(cache, "start-text.txt").also { org.onphonellm.trainer.core.AtomicFiles.writeText(it, pasted) }
                extras.putString("text", textFile.absolutePath)
                if (!TrainingStatus.start.shouldContinue()) {  // Stop tapped meanwhile: nothing is sent, nothing is created
                    TrainingStatus.start.ended()
                    runOnUiThread { status.text = "start cancelled"; showButtons() }
                } else runOnUiThread { service(RunRequest.ACTION_START, extras) }
            } catch (e: Exception) {
                TrainingStatus.start.ended()
                runOnUiThread { status.text = "cannot start: ${e.message}"; showButtons() }
            }
        }
    }

    /**
     * Generate the prompt with the initial adapter and with the live (or trained) state: the service runs it on
     * its session's generation thread (beside training, if it trains), and the tokens appear as they are decoded.
     */
    private fun generate() {
        TrainingStatus.generation.requested()
        // The chosen program: its latest run's state, else (no run of it yet) the program's own adapter (GenerateTarget).
        service(RunRequest.ACTION_GENERATE, Bundle().apply {
            putString(RunRequest.EXTRA_PROMPT, prompt.text.toString())
            (program.selectedItem as? String)?.let { putString("program", it) }
        })
        showGeneration()
    }

    private fun cancelGeneration() {
        cancelButton.isEnabled = false
        service(RunRequest.ACTION_CANCEL_GENERATION)
    }

    /** Called on the generation thread after every change: show it on the main thread (one post at a time). */
    private val onGeneration: () -> Unit = {
        if (generationPosted.compareAndSet(false, true)) handler.post { generationPosted.set(false); showGeneration() }
    }

    /** The generation so far: new text is appended to what the views show (set whole when it is not a continuation). */
    private fun showGeneration() {
        val g = TrainingStatus.generation.view()
        fun show(view: TextView, side: GenerationStatus.Side) {
            val head = "${side.header}:\n"
            val want = head + side.text
            val shown = view.text.toString()
            if (want.startsWith(shown) && shown.startsWith(head)) { if (want.length > shown.length) view.append(want.substring(shown.length)) }
            else view.text = want
        }
        show(before, g.before)
        show(after, g.after)
        generationNote.text = g.note ?: ""
        generateButton.isEnabled = !g.running
        cancelButton.isEnabled = g.running
        feedback.show(g.running)
    }

    /** Start and Resume only when idle; Stop while starting or running ([RunStart]). */
    private fun showButtons() {
        val b = TrainingStatus.start.buttons()
        startButton.isEnabled = b.start
        resumeButton.isEnabled = b.resume
        stopButton.isEnabled = b.stop
    }

    /** Whether the latest run has an adapter is read on [io]; the folder picker opens on the main thread. */
    private fun exportAdapter() = readOverview { o ->
        if (!o.hasAdapter) status.text = "no adapter yet: it is written when a run completes or is stopped"
        else startActivityForResult(Intent(Intent.ACTION_OPEN_DOCUMENT_TREE), EXPORT_TREE)
    }

    @Deprecated("Activity result API of the platform (no AndroidX here)")
    override fun onActivityResult(requestCode: Int, resultCode: Int, data: Intent?) {
        super.onActivityResult(requestCode, resultCode, data)
        val uri = data?.data ?: return
        if (resultCode != RESULT_OK) return
        when (requestCode) {
            PICK_TEXT -> readPicked(uri)
            EXPORT_TREE -> export(uri)
            IMPORT_TREE -> importFrom(uri)
            FeedbackBar.REQUEST -> feedback.exported(uri)
        }
    }

    /** Copy adapter_config.json and adapter_model.safetensors into the chosen folder, then offer them to the share sheet. */
    private fun export(tree: Uri) {
        status.text = "exporting the adapter ..."
        Thread { exportOnWorker(tree) }.start()
    }

    /** On a background thread: the copy may be to a slow or cloud-backed folder. */
    private fun exportOnWorker(tree: Uri) {
        val run = Runs(File(base, "runs")).latest() ?: return
        try {
            val parent = DocumentsContract.buildDocumentUriUsingTree(tree, DocumentsContract.getTreeDocumentId(tree))
            val out = ArrayList<Uri>()
            for ((name, mime) in listOf(StateCheckpoints.ADAPTER_CONFIG to "application/json", StateCheckpoints.ADAPTER_WEIGHTS to "application/octet-stream")) {
                val doc = DocumentsContract.createDocument(contentResolver, parent, mime, name) ?: throw IllegalStateException("cannot create $name")
                contentResolver.openOutputStream(doc)?.use { os -> File(run.adapter, name).inputStream().use { it.copyTo(os) } }
                out.add(doc)
            }
            val share = Intent(Intent.ACTION_SEND_MULTIPLE).setType("application/octet-stream")
                .putParcelableArrayListExtra(Intent.EXTRA_STREAM, out).addFlags(Intent.FLAG_GRANT_READ_URI_PERMISSION)
            runOnUiThread {
                status.text = "adapter of ${run.runId} exported"
                startActivity(Intent.createChooser(share, "Share the adapter"))
            }
        } catch (e: Exception) {
            runOnUiThread { status.text = "export failed: ${e.message}" }
        }
    }

    override fun onResume() {
        super.onResume()
        TrainingStatus.generation.listener = onGeneration
        showGeneration()
        if (restoring == null) refreshPrograms()  // else once the saved state is restored (onCreate's io read)
        handler.post(refresh)
    }

    override fun onPause() {
        TrainingStatus.generation.listener = null
        handler.removeCallbacks(refresh)
        super.onPause()
    }

    private val refresh = object : Runnable {
        override fun run() {
            val s = TrainingStatus
            val loss = s.loss?.let { "%.4f".format(it) } ?: "-"
            readOverview()  // the run directory and the preferences are read on io; this shows the last read (<= 1 s old)
            val o = overview
            val paused = if (!s.running) o.idleMessage() else null
            status.text = "run ${s.runId ?: o.runId ?: "-"}: ${paused ?: s.message}\nstep ${s.step}/${s.steps}  loss $loss"
            chart.setData(synchronized(s.losses) { s.losses.toList() })
            val anonMb = (s.anonBytes ?: 0L) shr 20
            val budgetMb = s.budgetBytes shr 20
            memory.text = "memory (RssAnon) $anonMb MB of a $budgetMb MB budget"
            memoryBar.max = maxOf(1, budgetMb.toInt())
            memoryBar.progress = anonMb.toInt()
            s.kernels?.let { kernels.text = it }
            val e = if (s.running || s.evalBefore != null) EvalPair(s.evalBefore, s.evalAfter, null) else o.evals
            fun f(x: Double?) = x?.let { "%.4f".format(it) } ?: "-"
            evals.text = "held-out loss: before ${f(e.before)}, after ${f(e.after)}" +
                ((GateStatus.reason ?: o.evals.gate?.reason)?.let { "\n$it" } ?: "")  // the evaluation gate's decision
            showButtons()
            showImport()
            showGeneration()  // also streamed by onGeneration as the tokens come; this catches up after a pause
            handler.postDelayed(this, 1000)
        }
    }

    companion object {
        private const val PICK_TEXT = 1
        private const val EXPORT_TREE = 2
        private const val IMPORT_TREE = 3
        private val LCSB_POLICIES = listOf("cyclic", "strided", "last", "anchored", "random")
    }
}
