package org.onphonellm.trainer.core

import java.io.File

/** What the person did with a generation (shared_schemas/feedback.schema.json, `action`). */
enum class FeedbackAction(val wire: String) {
    /** Keep: the response as it is is a training example. */
    ACCEPT("accept"),
    /** Edit: the edited text is a training example, and preferred over the response. */
    EDIT("edit"),
    /** Discard: the response is a rejected one (a pair when the same prompt has a kept or edited response). */
    REJECT("reject");

    companion object {
        val WIRE: List<String> = values().map { it.wire }
        fun of(wire: String): FeedbackAction? = values().firstOrNull { it.wire == wire }
    }
}

/**
 * One feedback record, one JSONL line of the app's feedback file (shared_schemas/feedback.schema.json): the
 * context ([prompt] for a plain generation, else the chat [messages] before the response), the [response] the
 * program generated, the [action], the [edited] text (iff EDIT: non-empty and not the response) and the
 * RFC 3339 [time]. The host reads the file with `toolchain data --program P --feedback F.jsonl`.
 */
data class FeedbackRecord(
    val prompt: String?,
    val messages: List<ChatMessage>?,
    val response: String,
    val action: FeedbackAction,
    val edited: String?,
    val time: String,
) {
    init {
        val p = FeedbackSchema.problems(toJson())
        if (p.isNotEmpty()) throw BadInput("feedback record: ${p.joinToString("; ")}")
    }

    fun toJson(): Json = Json.of(linkedMapOf<String, Any?>().apply {
        put("schema_version", FeedbackSchema.VERSION)
        prompt?.let { put("prompt", it) }
        messages?.let { m -> put("messages", m.map { linkedMapOf("role" to it.role, "content" to it.content) }) }
        put("response", response)
        put("action", action.wire)
        edited?.let { put("edited", it) }
        put("time", time)
    })

    companion object {
        /** One line of a feedback file; [where] names it in the error (file and line). */
        fun parse(line: String, where: String): FeedbackRecord {
            val doc = try { Json.parse(line) } catch (e: BadInput) { throw BadInput("$where: ${e.message}") }
            val p = FeedbackSchema.problems(doc)
            if (p.isNotEmpty()) throw BadInput("$where: ${p.joinToString("; ")}")
            val f = Fields.of(doc, where)
            val messages = if (f.has("messages")) f.arr("messages").map { m ->
                val mf = Fields.of(m, "$where.messages")
                ChatMessage(mf.string("role"), mf.string("content"))
            } else null
            return FeedbackRecord(f.optString("prompt"), messages, f.string("response"), FeedbackAction.of(f.string("action"))!!,
                f.optString("edited"), f.string("time"))
        }
    }
}

/**
 * shared_schemas/feedback.schema.json as code, so the app never writes a record the host refuses (FeedbackTest
 * compares these tables with the schema file and runs the schema's valid and invalid examples through [problems];
 * android/test.sh validates the records the tests wrote with the schema itself).
 */
object FeedbackSchema {
    const val VERSION = 1
    val REQUIRED = listOf("response", "action", "time")
    val FIELDS = listOf("schema_version", "prompt", "messages", "response", "action", "edited", "time")
    val ROLES = listOf("system", "user", "assistant")
    /** RFC 3339 date-time (section 5.6): full-date "T" full-time, seconds fraction optional, "Z" or a numeric offset. */
    val RFC3339 = Regex("^\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])[Tt]([01]\\d|2[0-3]):[0-5]\\d:([0-5]\\d|60)(\\.\\d+)?([Zz]|[+-]([01]\\d|2[0-3]):[0-5]\\d)$")

    /** Violations of the schema (empty: valid). */
    fun problems(doc: Json): List<String> {
        val o = doc as? Json.Obj ?: return listOf("a feedback record must be a JSON object")
        val out = ArrayList<String>()
        REQUIRED.filter { it !in o.fields }.forEach { out.add("missing '$it'") }
        o.fields.keys.filter { it !in FIELDS }.forEach { out.add("unknown field '$it'") }
        o["schema_version"]?.let { if ((it as? Json.Num)?.asLongOrNull != VERSION.toLong()) out.add("'schema_version' must be $VERSION") }
        val hasPrompt = "prompt" in o.fields
        val hasMessages = "messages" in o.fields
        if (hasPrompt == hasMessages) out.add("exactly one of 'prompt' and 'messages' is needed")
        if (hasPrompt && ((o["prompt"] as? Json.Str)?.value ?: "").isEmpty()) out.add("'prompt' must be a non-empty string")
        if (hasMessages) {
            val items = (o["messages"] as? Json.Arr)?.items
            if (items == null || items.isEmpty()) out.add("'messages' must be a non-empty array")
            items?.forEachIndexed { i, m -> messageProblem(m)?.let { out.add("messages[$i]: $it") } }
            // The host's rule beyond JSON Schema (toolchain data --feedback): the response answers a user turn.
            val last = ((items?.lastOrNull() as? Json.Obj)?.get("role") as? Json.Str)?.value
            if (!items.isNullOrEmpty() && last != "user") out.add("'messages' must end with a user turn")
        }
        val response = o["response"]
        if (response != null && ((response as? Json.Str)?.value ?: "").isEmpty()) out.add("'response' must be a non-empty string")
        val action = (o["action"] as? Json.Str)?.value
        if ("action" in o.fields && action !in FeedbackAction.WIRE) out.add("'action' must be one of ${FeedbackAction.WIRE}, got ${o["action"]}")
        val edited = o["edited"]
        if (action == "edit") {
            val e = (edited as? Json.Str)?.value
            when {
                edited == null -> out.add("an edit needs 'edited'")
                e.isNullOrEmpty() -> out.add("'edited' must be a non-empty string")
                e == (response as? Json.Str)?.value -> out.add("'edited' must differ from 'response'")
            }
        } else if (edited != null) out.add("'edited' is only for action 'edit'")
        o["time"]?.let { t -> if (!RFC3339.matches((t as? Json.Str)?.value ?: "")) out.add("'time' must be an RFC 3339 date-time, got $t") }
        return out
    }

    private fun messageProblem(m: Json): String? {
        val o = m as? Json.Obj ?: return "must be an object"
        if (o.fields.keys != setOf("role", "content")) return "needs exactly 'role' and 'content'"
        if ((o["role"] as? Json.Str)?.value !in ROLES) return "'role' must be one of $ROLES"
        if (o["content"] !is Json.Str) return "'content' must be a string"
        return null
    }
}

/** RFC 3339 UTC times from epoch milliseconds, without java.time (Android API 26; trainer-core keeps to API 23). */
object Rfc3339 {
    /** "2026-12-07T09:30:00.250Z" for [epochMs]. */
    fun utc(epochMs: Long): String {
        val days = epochMs.floorDiv(86_400_000L)  // kotlin's: Math.floorDiv is API 24
        val msOfDay = epochMs.mod(86_400_000L)
        // Days since 1970-01-01 to a proleptic Gregorian date (H. Hinnant's civil_from_days).
        val z = days + 719_468
        val era = z.floorDiv(146_097L)
        val doe = z - era * 146_097
        val yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365
        val doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        val mp = (5 * doy + 2) / 153
        val d = doy - (153 * mp + 2) / 5 + 1
        val m = if (mp < 10) mp + 3 else mp - 9
        val y = yoe + era * 400 + (if (m <= 2) 1 else 0)
        val h = msOfDay / 3_600_000
        val min = msOfDay / 60_000 % 60
        val s = msOfDay / 1000 % 60
        val ms = msOfDay % 1000
        return "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ".format(y, m, d, h, min, s, ms)
    }
}

/**
 * The app's feedback file (JSONL, one [FeedbackRecord] a line), appended to by the keep / edit / discard buttons and
 * exported as it is. Each append is one fsynced write of a whole line; a line torn by a kill is cut off on open.
 */
class FeedbackLog(val file: File) {
    init {
        file.absoluteFile.parentFile?.mkdirs()
        JsonlFiles.cutTornLine(file)
    }

    @Synchronized
    fun append(r: FeedbackRecord) {
        JsonlFiles.appendSynced(file, JsonWriter.write(r.toJson()) + "\n")
    }

    /** Every record (an invalid line: BadInput naming the line). */
    fun records(): List<FeedbackRecord> = if (!file.isFile) emptyList() else
        file.readLines(Charsets.UTF_8).withIndex().filter { it.value.isNotBlank() }
            .map { (i, line) -> FeedbackRecord.parse(line, "${file.name} line ${i + 1}") }

    /** Records per action, for the screen ("3 kept, 1 edited, 2 discarded"). */
    fun counts(): Map<FeedbackAction, Int> = records().groupingBy { it.action }.eachCount()

    companion object {
        const val FILE_NAME = "feedback.jsonl"

        fun summary(counts: Map<FeedbackAction, Int>): String =
            "${counts[FeedbackAction.ACCEPT] ?: 0} kept, ${counts[FeedbackAction.EDIT] ?: 0} edited, ${counts[FeedbackAction.REJECT] ?: 0} discarded"
    }
}

/**
 * The feedback buttons' state for the generation on screen: [generated] offers a finished generation (its prompt as
 * typed, whether the program's chat template framed it, the response text); the first tap ([record]) writes its one
 * record and answers it, later taps are refused until the next generation. A cancelled or empty generation, or one
 * from an empty prompt, offers nothing (the schema wants both non-empty). An edit saved unchanged is a keep (the schema's `edited` differs
 * from the response). Thread-safe: the generation thread offers, the UI thread taps.
 */
class GenerationFeedback(val log: FeedbackLog, private val nowMs: () -> Long = { System.currentTimeMillis() }) {
    class Offer(val prompt: String, val chat: Boolean, val response: String)

    private var offer: Offer? = null
    private var answered: FeedbackAction? = null

    /** A generation finished: [response] without its stop token; [complete] false for a cancelled one. */
    @Synchronized
    fun generated(prompt: String, chat: Boolean, response: String, complete: Boolean) {
        offer = if (complete && prompt.isNotEmpty() && response.isNotEmpty()) Offer(prompt, chat, response) else null
        answered = null
    }

    /** A new generation started (the buttons go away until it finishes). */
    @Synchronized
    fun cleared() { offer = null; answered = null }

    /** The response the buttons are for (null: none, or answered already); the editor starts from it. */
    @get:Synchronized val pending: Offer? get() = if (answered == null) offer else null

    @get:Synchronized val lastAnswer: FeedbackAction? get() = answered

    /**
     * The person tapped [action] ([edited]: the editor's text, for EDIT). Appends one record and returns it; refuses
     * (BadInput) with nothing written when there is no generation to answer, it was answered already, or the
     * edited text is empty.
     */
    @Synchronized
    fun record(action: FeedbackAction, edited: String? = null): FeedbackRecord {
        val o = offer ?: throw BadInput("no finished generation to give feedback on")
        answered?.let { throw BadInput("this generation has its feedback already (${it.wire})") }
        if (action == FeedbackAction.EDIT && edited.isNullOrEmpty()) throw BadInput("the edited text is empty; discard the response instead")
        val a = if (action == FeedbackAction.EDIT && edited == o.response) FeedbackAction.ACCEPT else action
        val r = FeedbackRecord(
            prompt = if (o.chat) null else o.prompt,
            messages = if (o.chat) listOf(ChatMessage("user", o.prompt)) else null,
            response = o.response, action = a, edited = if (a == FeedbackAction.EDIT) edited else null, time = Rfc3339.utc(nowMs()))
        log.append(r)
        answered = a
        return r
    }
}
