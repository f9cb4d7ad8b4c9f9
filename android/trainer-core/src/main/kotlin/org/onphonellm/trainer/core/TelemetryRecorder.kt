package org.onphonellm.trainer.core

/**
 * Telemetry events (shared_schemas/telemetry_event.schema.json): flat objects, common fields
 * schema_version/type/run_id/seq/timestamp[/elapsed_s] plus the fields of their type, no others.
 * [EventSchema] is that schema as tables, so the app never writes an event the server refuses;
 * a test compares the tables with the schema file.
 */
object EventSchema {
    sealed class Field {
        data class Int(val min: Long? = null, val max: Long? = null, val nullable: Boolean = false) : Field()
        data class Num(val min: Double? = null, val max: Double? = null, val nullable: Boolean = false) : Field()
        data class Str(val minLength: kotlin.Int = 0, val maxLength: kotlin.Int = kotlin.Int.MAX_VALUE, val pattern: Regex? = null) : Field()
        data class Enum(val values: List<String>) : Field()
        object Bool : Field()
        object StrArray : Field()
        /** An array of at most [maxItems] strings of at most [maxLength] characters each. */
        data class StrList(val maxItems: kotlin.Int, val maxLength: kotlin.Int) : Field()
        object Obj : Field()
        /** A `working_set` object: layers_per_checkpoint (>= 1), lcsb_k (>= 1 or null), seq_len (>= 1), no other keys. */
        object WorkingSet : Field()
    }

    class Type(val required: List<String>, val fields: Map<String, Field>)

    private const val MAX_SAFE = 9007199254740991L
    /** error.log: the runtime's log lines sent with an error, at most this many, each at most [MAX_LOG_LINE] characters. */
    const val MAX_LOG_LINES = 64
    const val MAX_LOG_LINE = 1024
    private val BYTES = Field.Int(0, MAX_SAFE)
    private val COUNT = Field.Int(0)
    private val NONNEG = Field.Num(0.0)
    val RUN_ID = Regex("^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
    val COMMON: Map<String, Field> = mapOf(
        "schema_version" to Field.Int(1, 1), "type" to Field.Str(), "run_id" to Field.Str(pattern = RUN_ID),
        "seq" to Field.Int(0, MAX_SAFE), "timestamp" to NONNEG, "elapsed_s" to NONNEG,
    )
    val COMMON_REQUIRED = listOf("schema_version", "type", "run_id", "seq", "timestamp")
    val MEASUREMENTS = listOf("anon_bytes", "rss_bytes", "pss_bytes", "peak_bytes", "available_bytes")

    val TYPES: Map<String, Type> = mapOf(
        "run_start" to Type(
            listOf("model", "method", "backend", "seq_len", "rank", "platform", "device_model", "os", "total_ram_bytes", "budget_bytes"),
            mapOf("model" to Field.Str(1), "method" to Field.Enum(listOf("mesp", "mebp", "autograd", "mezo")),
                "backend" to Field.Enum(listOf("executorch", "coreml", "onnx", "eager")), "seq_len" to Field.Int(1),
                "rank" to Field.Int(1), "lcsb_k" to Field.Int(1), "targets" to Field.StrArray,
                "optimizer" to Field.Enum(listOf("sgd", "adamw")), "lr" to NONNEG, "quant" to Field.Enum(listOf("none", "int8", "int4")),
                "compute" to Field.Enum(Compute.CHOICES),
                "steps_planned" to COUNT, "platform" to Field.Enum(listOf("android", "ios", "linux", "macos")),
                "device_model" to Field.Str(1), "os" to Field.Str(1), "total_ram_bytes" to BYTES, "budget_bytes" to BYTES,
                "device_profile" to Field.Str(), "app_version" to Field.Str(), "program" to Field.Str(), "config" to Field.Obj,
                "planner_estimate_bytes" to BYTES, "planner_basis" to Field.Str(0, 512)),
        ),
        "run_end" to Type(
            listOf("status", "steps_completed"),
            mapOf("status" to Field.Enum(listOf("completed", "failed", "cancelled", "paused")), "steps_completed" to COUNT,
                "duration_s" to NONNEG, "peak_bytes" to BYTES, "final_loss" to Field.Num(nullable = true), "message" to Field.Str(0, 4096)),
        ),
        "step" to Type(
            listOf("step", "loss", "step_time_s", "tokens_per_s"),
            mapOf("step" to COUNT, "loss" to Field.Num(nullable = true), "step_time_s" to NONNEG, "tokens_per_s" to NONNEG,
                "tokens" to COUNT, "lcsb_phase" to COUNT, "lr" to NONNEG),
        ),
        "memory" to Type(
            listOf("probe"),
            mapOf("probe" to Field.Enum(listOf("android_proc_status", "android_debug_meminfo", "android_dumpsys", "android_activity_manager",
                "ios_phys_footprint", "ios_os_proc_available", "linux_proc_status")),
                "step" to COUNT, "anon_bytes" to BYTES, "rss_bytes" to BYTES, "pss_bytes" to BYTES, "swap_bytes" to BYTES,
                "peak_bytes" to BYTES, "available_bytes" to BYTES, "low_memory" to Field.Bool, "trim_level" to Field.Int(),
                "pressure" to Field.Enum(listOf("normal", "warning", "critical")), "baseline" to Field.Bool),
        ),
        "thermal" to Type(
            listOf("state"),
            mapOf("state" to Field.Enum(listOf("none", "light", "moderate", "severe", "critical", "emergency", "shutdown", "nominal", "fair", "serious")),
                "headroom" to Field.Num(), "temperature_c" to Field.Num()),
        ),
        "battery" to Type(
            listOf("level_pct", "charging"),
            mapOf("level_pct" to Field.Num(0.0, 100.0), "charging" to Field.Bool, "low_power_mode" to Field.Bool, "temperature_c" to Field.Num()),
        ),
        "error" to Type(
            listOf("message", "fatal"),
            mapOf("message" to Field.Str(1, 4096), "fatal" to Field.Bool, "code" to Field.Str(pattern = Regex("^[a-z][a-z0-9_]*$")), "step" to COUNT,
                "log" to Field.StrList(MAX_LOG_LINES, MAX_LOG_LINE)),
        ),
        "gate" to Type(
            listOf("decision", "start_loss", "end_loss", "best_loss", "best_step", "reason"),
            mapOf("decision" to Field.Enum(listOf("kept", "kept_best", "rolled_back")), "start_loss" to Field.Num(nullable = true),
                "end_loss" to Field.Num(nullable = true), "best_loss" to Field.Num(nullable = true), "best_step" to Field.Int(0, nullable = true),
                "kept_step" to COUNT, "reason" to Field.Str(1, 512), "probe" to Field.Enum(listOf("measured", "no_probe")),
                "probe_start_loss" to Field.Num(nullable = true), "probe_end_loss" to Field.Num(nullable = true), "probe_rise" to Field.Num(nullable = true),
                "probe_threshold" to NONNEG, "forgetting" to Field.Bool),
        ),
        "memory_adapted" to Type(
            listOf("step", "knob", "from", "to", "measured_bytes", "budget_bytes", "trigger"),
            mapOf("step" to COUNT, "knob" to Field.Enum(listOf("layers_per_checkpoint", "lcsb_k", "seq_len")), "from" to Field.WorkingSet,
                "to" to Field.WorkingSet, "measured_bytes" to BYTES, "budget_bytes" to BYTES, "predicted_bytes" to BYTES,
                "trigger" to Field.Enum(listOf("measured", "predicted", "os_signal"))),
        ),
        "eval" to Type(
            listOf("step", "loss", "rows", "tokens"),
            mapOf("step" to COUNT, "loss" to Field.Num(nullable = true), "rows" to Field.Int(1), "tokens" to Field.Int(1),
                "eval_time_s" to NONNEG),
        ),
    )

    /** Violations of the schema (empty: valid). */
    fun problems(event: Json): List<String> {
        val obj = event as? Json.Obj ?: return listOf("an event must be a JSON object")
        val out = ArrayList<String>()
        COMMON_REQUIRED.filter { it !in obj.fields }.forEach { out.add("missing '$it'") }
        val typeName = (obj["type"] as? Json.Str)?.value
        val type = TYPES[typeName]
        if (type == null) return out + "unknown type ${obj["type"]}; one of ${TYPES.keys}"
        type.required.filter { it !in obj.fields }.forEach { out.add("$typeName: missing '$it'") }
        if (typeName == "memory" && MEASUREMENTS.none { it in obj.fields }) out.add("memory: needs one of $MEASUREMENTS")
        for ((key, value) in obj.fields) {
            val field = COMMON[key] ?: type.fields[key]
            if (field == null) { out.add("$typeName: unknown field '$key'"); continue }
            check(field, value)?.let { out.add("'$key' $it") }
        }
        return out
    }

    private fun check(f: Field, v: Json): String? = when (f) {
        is Field.Int -> {
            val n = (v as? Json.Num)?.asLongOrNull
            when {
                v == Json.Null && f.nullable -> null
                n == null -> "must be an integer${if (f.nullable) " or null" else ""}, got $v"
                f.min != null && n < f.min -> "must be >= ${f.min}"
                f.max != null && n > f.max -> "must be <= ${f.max}"
                else -> null
            }
        }
        is Field.Num -> {
            val d = (v as? Json.Num)?.asDouble
            when {
                v == Json.Null && f.nullable -> null
                d == null -> "must be a number${if (f.nullable) " or null" else ""}, got $v"
                f.min != null && d < f.min -> "must be >= ${f.min}"
                f.max != null && d > f.max -> "must be <= ${f.max}"
                else -> null
            }
        }
        is Field.Str -> {
            val s = (v as? Json.Str)?.value
            when {
                s == null -> "must be a string, got $v"
                s.codePointCount(0, s.length) !in f.minLength..f.maxLength -> "must have ${f.minLength}..${f.maxLength} characters"
                f.pattern != null && !f.pattern.matches(s) -> "must match ${f.pattern}"
                else -> null
            }
        }
        is Field.Enum -> if ((v as? Json.Str)?.value in f.values) null else "must be one of ${f.values}, got $v"
        Field.Bool -> if (v is Json.Bool) null else "must be true or false, got $v"
        Field.StrArray -> if (v is Json.Arr && v.items.all { it is Json.Str }) null else "must be an array of strings"
        Field.Obj -> if (v is Json.Obj) null else "must be an object"
        Field.WorkingSet -> {
            val o = v as? Json.Obj
            fun positive(key: String, nullable: Boolean): Boolean = o!![key].let { x ->
                x == null || (nullable && x == Json.Null) || ((x as? Json.Num)?.asLongOrNull ?: 0L) >= 1 }
            when {
                o == null -> "must be an object"
                o.fields.keys.any { it !in setOf("layers_per_checkpoint", "lcsb_k", "seq_len") } -> "has an unknown key (layers_per_checkpoint, lcsb_k, seq_len)"
                !positive("layers_per_checkpoint", false) || !positive("lcsb_k", true) || !positive("seq_len", false) -> "values must be integers >= 1 (lcsb_k may be null)"
                else -> null
            }
        }
        is Field.StrList -> when {
            v !is Json.Arr || !v.items.all { it is Json.Str } -> "must be an array of strings"
            v.items.size > f.maxItems -> "must have at most ${f.maxItems} items"
            v.items.any { (it as Json.Str).value.let { s -> s.codePointCount(0, s.length) > f.maxLength } } -> "items must have at most ${f.maxLength} characters"
            else -> null
        }
    }

    /** A batch as the server takes it: one event or a non-empty array; problems by event index. */
    fun batchProblems(batch: Json): Map<Int, List<String>> {
        val events = if (batch is Json.Arr) batch.items else listOf(batch)
        if (events.isEmpty()) return mapOf(-1 to listOf("empty batch"))
        return events.mapIndexed { i, e -> i to problems(e) }.filter { it.second.isNotEmpty() }.toMap()
    }
}

/** Numbers, stamps, validates and logs a run's events. */
class TelemetryRecorder(val runId: String, private val log: EventLog, private val clock: Clock, startSeq: Long) {
    var nextSeq: Long = startSeq
        private set
    private val sessionStart = clock.monoNanos()

    init {
        require(EventSchema.RUN_ID.matches(runId)) { "run id '$runId' must match ${EventSchema.RUN_ID}" }
    }

    /**
     * Log one event of [type] with [fields] (a Kotlin null leaves the field out; [Json.Null] writes null).
     * An event the schema refuses is a bug in the caller: IllegalArgumentException.
     */
    fun emit(type: String, fields: Map<String, Any?>): Json.Obj {
        val m = LinkedHashMap<String, Json>()
        m["schema_version"] = Json.of(1)
        m["type"] = Json.of(type)
        m["run_id"] = Json.of(runId)
        m["seq"] = Json.of(nextSeq)
        m["timestamp"] = Json.of(Math.round(clock.wallSeconds() * 1000) / 1000.0)
        m["elapsed_s"] = Json.of(Math.round((clock.monoNanos() - sessionStart) / 1e6) / 1000.0)
        for ((k, v) in fields) if (v != null) m[k] = Json.of(v)
        val event = Json.Obj(m)
        val problems = EventSchema.problems(event)
        require(problems.isEmpty()) { "invalid $type event: $problems" }
        log.append(listOf(JsonWriter.write(event)))
        nextSeq++
        return event
    }
}
