package org.onphonellm.trainer.core

import java.math.BigDecimal

/**
 * A small strict JSON model (RFC 8259): enough for manifest.json, step plans, data rows and
 * telemetry events, with no library (org.json lives in android.jar but not on the JVM where the
 * tests run). Numbers keep their source text so integers of any size and doubles round-trip.
 * NaN and Infinity are not JSON: the parser refuses them and the writer throws on them.
 */
sealed class Json {
    object Null : Json()
    data class Bool(val value: Boolean) : Json()
    data class Num(val text: String) : Json() {
        val asDouble: Double get() = text.toDouble()

        /** The value as a Long when it is integral (1 and 1.0 alike, as JSON Schema counts them), else null. */
        val asLongOrNull: Long?
            get() = try {
                BigDecimal(text).stripTrailingZeros().let { if (it.scale() <= 0) it.longValueExact() else null }
            } catch (e: ArithmeticException) {
                null
            }
    }
    data class Str(val value: String) : Json()
    data class Arr(val items: List<Json>) : Json()
    data class Obj(val fields: Map<String, Json>) : Json() {
        operator fun get(key: String): Json? = fields[key]
    }

    override fun toString(): String = JsonWriter.write(this)

    companion object {
        fun parse(text: String): Json = JsonParser(text).parseDocument()

        /** Kotlin value -> Json: null, Boolean, Int/Long, Float/Double (finite), String, List, Map, Json. */
        fun of(value: Any?): Json = when (value) {
            null -> Null
            is Json -> value
            is Boolean -> Bool(value)
            is Int, is Long, is Short -> Num(value.toString())
            is Float -> num(value.toDouble())
            is Double -> num(value)
            is String -> Str(value)
            is List<*> -> Arr(value.map { of(it) })
            is IntArray -> Arr(value.map { Num(it.toString()) })
            is Map<*, *> -> Obj(LinkedHashMap<String, Json>().also { m -> value.forEach { (k, v) -> m[k as String] = of(v) } })
            else -> throw IllegalArgumentException("no JSON form for ${value::class.java.name}")
        }

        private fun num(d: Double): Num {
            require(d.isFinite()) { "JSON has no NaN or Infinity (write a non-finite value as null)" }
            val l = d.toLong()
            return Num(if (l.toDouble() == d && kotlin.math.abs(d) < 1e15) "$l.0" else d.toString())
        }
    }
}

private class JsonParser(private val s: String) {
    private var i = 0
    private var depth = 0

    fun parseDocument(): Json {
        skipWs()
        val v = value()
        skipWs()
        if (i != s.length) fail("unexpected '${s[i]}' after the value")
        return v
    }

    private fun fail(why: String): Nothing = throw BadInput("invalid JSON at offset $i: $why")

    private fun skipWs() {
        while (i < s.length && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) i++
    }

    private fun value(): Json {
        if (i >= s.length) fail("unexpected end of input")
        return when (val c = s[i]) {
            '{' -> nested { obj() }
            '[' -> nested { arr() }
            '"' -> Json.Str(string())
            't' -> literal("true", Json.Bool(true))
            'f' -> literal("false", Json.Bool(false))
            'n' -> literal("null", Json.Null)
            else -> if (c == '-' || c in '0'..'9') number() else fail("unexpected '$c' (NaN and Infinity are not JSON)")
        }
    }

    private inline fun nested(block: () -> Json): Json {
        if (++depth > 64) fail("nested deeper than 64 levels")
        return block().also { depth-- }
    }

    private fun literal(word: String, v: Json): Json {
        if (!s.startsWith(word, i)) fail("expected '$word'")
        i += word.length
        return v
    }

    private fun obj(): Json.Obj {
        i++ // {
        val fields = LinkedHashMap<String, Json>()
        skipWs()
        if (i < s.length && s[i] == '}') { i++; return Json.Obj(fields) }
        while (true) {
            skipWs()
            if (i >= s.length || s[i] != '"') fail("expected a quoted key")
            val key = string()
            if (key in fields) fail("duplicate key \"$key\"")
            skipWs()
            if (i >= s.length || s[i] != ':') fail("expected ':' after key \"$key\"")
            i++
            skipWs()
            fields[key] = value()
            skipWs()
            if (i >= s.length) fail("unterminated object")
            when (s[i++]) {
                ',' -> continue
                '}' -> return Json.Obj(fields)
                else -> { i--; fail("expected ',' or '}'") }
            }
        }
    }

    private fun arr(): Json.Arr {
        i++ // [
        val items = ArrayList<Json>()
        skipWs()
        if (i < s.length && s[i] == ']') { i++; return Json.Arr(items) }
        while (true) {
            skipWs()
            items.add(value())
            skipWs()
            if (i >= s.length) fail("unterminated array")
            when (s[i++]) {
                ',' -> continue
                ']' -> return Json.Arr(items)
                else -> { i--; fail("expected ',' or ']'") }
            }
        }
    }

    private fun string(): String {
        i++ // opening quote
        val sb = StringBuilder()
        while (true) {
            if (i >= s.length) fail("unterminated string")
            val c = s[i++]
            when {
                c == '"' -> return sb.toString()
                c == '\\' -> {
                    if (i >= s.length) fail("unterminated escape")
                    when (val e = s[i++]) {
                        '"' -> sb.append('"'); '\\' -> sb.append('\\'); '/' -> sb.append('/')
                        'b' -> sb.append('\b'); 'f' -> sb.append('\u000C'); 'n' -> sb.append('\n')
                        'r' -> sb.append('\r'); 't' -> sb.append('\t')
                        'u' -> {
                            if (i + 4 > s.length) fail("short \\u escape")
                            val hex = s.substring(i, i + 4)
                            sb.append(hex.toIntOrNull(16)?.toChar() ?: fail("bad \\u escape '$hex'"))
                            i += 4
                        }
                        else -> fail("bad escape '\\$e'")
                    }
                }
                c < ' ' -> fail("control character in string")
                else -> sb.append(c)
            }
        }
    }

    private fun number(): Json.Num {
        val start = i
        if (s[i] == '-') i++
        if (i < s.length && s[i] == '0') i++
        else if (i < s.length && s[i] in '1'..'9') while (i < s.length && s[i] in '0'..'9') i++
        else fail("bad number")
        if (i < s.length && s[i] == '.') {
            i++
            if (i >= s.length || s[i] !in '0'..'9') fail("bad fraction")
            while (i < s.length && s[i] in '0'..'9') i++
        }
        if (i < s.length && (s[i] == 'e' || s[i] == 'E')) {
            i++
            if (i < s.length && (s[i] == '+' || s[i] == '-')) i++
            if (i >= s.length || s[i] !in '0'..'9') fail("bad exponent")
            while (i < s.length && s[i] in '0'..'9') i++
        }
        return Json.Num(s.substring(start, i))
    }
}

/** Compact JSON text (no spaces), keys in insertion order. */
object JsonWriter {
    fun write(v: Json): String = StringBuilder().also { append(it, v) }.toString()

    private fun append(sb: StringBuilder, v: Json) {
        when (v) {
            Json.Null -> sb.append("null")
            is Json.Bool -> sb.append(v.value)
            is Json.Num -> sb.append(v.text)
            is Json.Str -> quote(sb, v.value)
            is Json.Arr -> {
                sb.append('[')
                v.items.forEachIndexed { k, item -> if (k > 0) sb.append(','); append(sb, item) }
                sb.append(']')
            }
            is Json.Obj -> {
                sb.append('{')
                var first = true
                for ((k, item) in v.fields) {
                    if (!first) sb.append(',')
                    first = false
                    quote(sb, k)
                    sb.append(':')
                    append(sb, item)
                }
                sb.append('}')
            }
        }
    }

    /** A JSON string literal; [python]: as Python's json.dumps writes it (\b, \f; ensure_ascii: non-ASCII as \uXXXX). */
    internal fun quote(sb: StringBuilder, s: String, python: Boolean = false) {
        sb.append('"')
        for (c in s) {
            when {
                c == '"' -> sb.append("\\\"")
                c == '\\' -> sb.append("\\\\")
                c == '\n' -> sb.append("\\n")
                c == '\r' -> sb.append("\\r")
                c == '\t' -> sb.append("\\t")
                python && c == '\b' -> sb.append("\\b")
                python && c == '\u000c' -> sb.append("\\f")
                c < ' ' || (python && c.code > 127) -> sb.append(String.format("\\u%04x", c.code))
                else -> sb.append(c)
            }
        }
        sb.append('"')
    }
}

/**
 * JSON text as Python's `json.dumps(v, indent=2, sort_keys=True)` writes it (ensure_ascii: non-ASCII as
 * \uXXXX; empty containers as {} / []): what the host writes to adapter_config.json, so the app's
 * adapter files are byte-identical to the host's.
 */
object PythonJson {
    fun dumps(v: Json): String = StringBuilder().also { append(it, v, 0) }.toString()

    private fun indent(sb: StringBuilder, level: Int) { sb.append('\n'); repeat(level) { sb.append("  ") } }

    private fun append(sb: StringBuilder, v: Json, level: Int) {
        when (v) {
            Json.Null -> sb.append("null")
            is Json.Bool -> sb.append(if (v.value) "true" else "false")
            is Json.Num -> sb.append(v.text)
            is Json.Str -> JsonWriter.quote(sb, v.value, python = true)
            is Json.Arr -> if (v.items.isEmpty()) sb.append("[]") else {
                sb.append('[')
                v.items.forEachIndexed { k, item -> if (k > 0) sb.append(','); indent(sb, level + 1); append(sb, item, level + 1) }
                indent(sb, level); sb.append(']')
            }
            is Json.Obj -> if (v.fields.isEmpty()) sb.append("{}") else {
                sb.append('{')
                // Python sorts str keys by code point; Kotlin's String order is by UTF-16 unit (the same for the BMP).
                v.fields.keys.sorted().forEachIndexed { k, key ->
                    if (k > 0) sb.append(',')
                    indent(sb, level + 1); JsonWriter.quote(sb, key, python = true); sb.append(": "); append(sb, v.fields.getValue(key), level + 1)
                }
                indent(sb, level); sb.append('}')
            }
        }
    }
}
