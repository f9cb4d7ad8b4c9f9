package org.onphonellm.trainer.app

import android.content.Context
import android.graphics.Canvas
import android.graphics.Color
import android.graphics.Paint
import android.graphics.Path
import android.view.View

/** The training loss so far as a line on a Canvas (min..max of the values on the y axis); [setData] from the UI thread. */
class LossChartView(context: Context) : View(context) {
    private var values: List<Double> = emptyList()
    private val line = Paint(Paint.ANTI_ALIAS_FLAG).apply { color = Color.rgb(33, 110, 200); strokeWidth = 4f; style = Paint.Style.STROKE }
    private val axis = Paint(Paint.ANTI_ALIAS_FLAG).apply { color = Color.GRAY; strokeWidth = 2f }
    private val label = Paint(Paint.ANTI_ALIAS_FLAG).apply { color = Color.DKGRAY; textSize = 28f }

    fun setData(v: List<Double>) {
        if (v.size == values.size && v.lastOrNull() == values.lastOrNull()) return
        values = v
        invalidate()
    }

    override fun onDraw(canvas: Canvas) {
        super.onDraw(canvas)
        val w = width.toFloat()
        val h = height.toFloat()
        val pad = 40f
        canvas.drawLine(pad, h - pad, w - 8f, h - pad, axis)
        canvas.drawLine(pad, 8f, pad, h - pad, axis)
        if (values.isEmpty()) { canvas.drawText("loss: no step yet", pad + 8f, h / 2, label); return }
        val lo = values.minOrNull()!!
        val hi = values.maxOrNull()!!
        val span = if (hi > lo) hi - lo else 1.0
        val path = Path()
        for ((i, v) in values.withIndex()) {
            val x = pad + (w - pad - 8f) * (if (values.size == 1) 0f else i / (values.size - 1f))
            val y = 8f + (h - pad - 8f) * (1f - ((v - lo) / span).toFloat())
            if (i == 0) path.moveTo(x, y) else path.lineTo(x, y)
        }
        canvas.drawPath(path, line)
        canvas.drawText("%.3f".format(hi), pad + 4f, 34f, label)
        canvas.drawText("%.3f  (step %d)".format(lo, values.size), pad + 4f, h - pad - 8f, label)
    }
}
