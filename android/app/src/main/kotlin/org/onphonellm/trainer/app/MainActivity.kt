package org.onphonellm.trainer.app

import android.app.Activity
import android.content.Intent
import android.os.Build
import android.os.Bundle
import android.os.Handler
import android.os.Looper
import android.widget.Button
import android.widget.LinearLayout
import android.widget.ProgressBar
import android.widget.TextView

/**
 * Progress, loss and memory against the budget, refreshed every second, and a Stop button.
 * `adb shell am start -n org.onphonellm.trainer/org.onphonellm.trainer.app.MainActivity -a
 * org.onphonellm.trainer.action.START --es program ... --es data ...` forwards the request to the
 * service from the foreground (the route that works on every Android version).
 */
class MainActivity : Activity() {
    private val handler = Handler(Looper.getMainLooper())
    private lateinit var status: TextView
    private lateinit var steps: ProgressBar
    private lateinit var memory: TextView
    private lateinit var memoryBar: ProgressBar

    override fun onCreate(savedInstanceState: Bundle?) {
        super.onCreate(savedInstanceState)
        val pad = (16 * resources.displayMetrics.density).toInt()
        status = TextView(this)
        steps = ProgressBar(this, null, android.R.attr.progressBarStyleHorizontal)
        memory = TextView(this)
        memoryBar = ProgressBar(this, null, android.R.attr.progressBarStyleHorizontal)
        val stop = Button(this).apply {
            text = "Stop (checkpoint and stop)"
            setOnClickListener { TrainingStatus.requestStop() }
        }
        setContentView(LinearLayout(this).apply {
            orientation = LinearLayout.VERTICAL
            setPadding(pad, pad, pad, pad)
            addView(TextView(this@MainActivity).apply { text = "On-device LoRA training"; textSize = 20f })
            addView(status)
            addView(steps)
            addView(memory)
            addView(memoryBar)
            addView(stop)
        })
        if (Build.VERSION.SDK_INT >= 33) requestPermissions(arrayOf("android.permission.POST_NOTIFICATIONS"), 1)
        if (intent?.action == RunRequest.ACTION_START) {
            startService(Intent(this, TrainingService::class.java).setAction(RunRequest.ACTION_START).putExtras(intent))
        }
    }

    override fun onResume() {
        super.onResume()
        handler.post(refresh)
    }

    override fun onPause() {
        handler.removeCallbacks(refresh)
        super.onPause()
    }

    private val refresh = object : Runnable {
        override fun run() {
            val s = TrainingStatus
            val loss = s.loss?.let { "%.4f".format(it) } ?: "-"
            status.text = "run ${s.runId ?: "-"}: ${s.message}\nstep ${s.step}/${s.steps}  loss $loss"
            steps.max = maxOf(1, s.steps.toInt())
            steps.progress = s.step.toInt()
            val anonMb = (s.anonBytes ?: 0L) shr 20
            val budgetMb = s.budgetBytes shr 20
            memory.text = "anonymous memory (RssAnon) $anonMb MB of a $budgetMb MB budget"
            memoryBar.max = maxOf(1, budgetMb.toInt())
            memoryBar.progress = anonMb.toInt()
            handler.postDelayed(this, 1000)
        }
    }
}
