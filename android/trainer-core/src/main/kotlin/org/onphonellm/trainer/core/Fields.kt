package org.onphonellm.trainer.core

/**
 * Typed, path-aware access to a JSON object: `Fields(obj, "manifest.json").int("seq_len")` either
 * returns the value or throws a [BadInput] naming the file, the field and what was found.
 */
class Fields(val obj: Json.Obj, val where: String) {
    companion object {
        fun of(v: Json, where: String): Fields =
            Fields(v as? Json.Obj ?: throw BadInput("$where must be a JSON object"), where)
    }

    fun has(key: String): Boolean = key in obj.fields && obj.fields[key] != Json.Null
    private fun bad(key: String, want: String): Nothing =
        throw BadInput("$where: '$key' must be $want, got ${obj.fields[key]?.let { short(it) } ?: "nothing"}")
    private fun short(v: Json): String = v.toString().let { if (it.length > 60) it.take(60) + "..." else it }

    fun raw(key: String): Json = obj.fields[key] ?: throw BadInput("$where: missing required field '$key'")
    fun long(key: String): Long = ((raw(key) as? Json.Num)?.asLongOrNull) ?: bad(key, "an integer")
    fun int(key: String): Int = long(key).let { if (it in Int.MIN_VALUE..Int.MAX_VALUE) it.toInt() else bad(key, "a 32-bit integer") }
    fun double(key: String): Double = (raw(key) as? Json.Num)?.asDouble ?: bad(key, "a number")
    fun string(key: String): String = (raw(key) as? Json.Str)?.value ?: bad(key, "a string")
    fun bool(key: String): Boolean = (raw(key) as? Json.Bool)?.value ?: bad(key, "true or false")
    fun obj(key: String): Fields = Fields(raw(key) as? Json.Obj ?: bad(key, "an object"), "$where.$key")
    fun arr(key: String): List<Json> = (raw(key) as? Json.Arr)?.items ?: bad(key, "an array")
    fun ints(key: String): List<Int> = arr(key).map { (it as? Json.Num)?.asLongOrNull?.toInt() ?: bad(key, "an array of integers") }
    fun strings(key: String): List<String> = arr(key).map { (it as? Json.Str)?.value ?: bad(key, "an array of strings") }

    fun optInt(key: String): Int? = if (has(key)) int(key) else null
    fun optLong(key: String): Long? = if (has(key)) long(key) else null
    fun optDouble(key: String): Double? = if (has(key)) double(key) else null
    fun optString(key: String): String? = if (has(key)) string(key) else null
}
