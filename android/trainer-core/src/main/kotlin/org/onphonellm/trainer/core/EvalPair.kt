package org.onphonellm.trainer.core

import java.io.File

/** Held-out loss of the initial state and of the trained one (results.json). */
class EvalPair(val before: Double?, val after: Double?, val afterStep: Long?, val gate: GateDecision? = null) {
    fun toJson(): Json = Json.of(linkedMapOf<String, Any?>("eval_before" to before, "eval_after" to after, "eval_after_step" to afterStep)
        .also { m -> gate?.let { m["gate"] = it.toJson() } })

    companion object {
        fun read(file: File): EvalPair {
            if (!file.isFile) return EvalPair(null, null, null)
            val f = Fields.of(Json.parse(file.readText()), file.name)
            return EvalPair(f.optDouble("eval_before"), f.optDouble("eval_after"), f.optLong("eval_after_step"),
                if (f.has("gate")) GateDecision.parse(f.raw("gate"), "${file.name} gate") else null)
        }
    }
}
