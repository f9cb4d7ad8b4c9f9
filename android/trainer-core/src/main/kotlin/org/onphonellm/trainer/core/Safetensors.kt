package org.onphonellm.trainer.core

import java.io.File
import java.io.OutputStream
import java.io.RandomAccessFile
import java.nio.ByteBuffer
import java.nio.ByteOrder

/**
 * safetensors (https://github.com/huggingface/safetensors): u64 little-endian header length N, N bytes
 * of JSON header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}},
 * then raw little-endian data, offsets relative to the end of the header. Only F32 is written here.
 */
object Safetensors {
    /** A float32 tensor whose data is [numel] values of [source] starting at [offset]. */
    class Slice(val name: String, val shape: List<Int>, val source: FloatArray, val offset: Int) {
        val numel: Int get() = shape.fold(1) { a, b -> a * b }
    }

    fun header(tensors: List<Slice>, metadata: Map<String, String>?): ByteArray {
        val fields = LinkedHashMap<String, Json>()
        if (metadata != null) fields["__metadata__"] = Json.of(metadata)
        var begin = 0L
        for (t in tensors) {
            val end = begin + 4L * t.numel
            fields[t.name] = Json.of(mapOf("dtype" to "F32", "shape" to t.shape, "data_offsets" to listOf(begin, end)))
            begin = end
        }
        val text = JsonWriter.write(Json.Obj(fields))
        // Pad with spaces so the data starts 8-byte aligned, as the reference writer does.
        val raw = text.toByteArray(Charsets.UTF_8)
        val padded = (raw.size + 7) / 8 * 8
        return raw + ByteArray(padded - raw.size) { ' '.code.toByte() }
    }

    fun write(out: OutputStream, tensors: List<Slice>, metadata: Map<String, String>? = null) {
        val names = tensors.map { it.name }
        require(names.toSet().size == names.size) { "tensor names repeat" }
        tensors.forEach { require(it.offset >= 0 && it.offset + it.numel <= it.source.size) { "${it.name} lies outside its source" } }
        val head = header(tensors, metadata)
        out.write(ByteBuffer.allocate(8).order(ByteOrder.LITTLE_ENDIAN).putLong(head.size.toLong()).array())
        out.write(head)
        val buf = ByteBuffer.allocate(1 shl 16).order(ByteOrder.LITTLE_ENDIAN)
        for (t in tensors) {
            for (k in t.offset until t.offset + t.numel) {
                if (buf.remaining() < 4) { out.write(buf.array(), 0, buf.position()); buf.clear() }
                buf.putFloat(t.source[k])
            }
        }
        out.write(buf.array(), 0, buf.position())
    }

    /**
     * One float32 tensor [name] whose little-endian data is [data]'s bytes 0 until 4 x numel (a direct buffer:
     * written through a channel, never copied whole onto the Java heap); the same bytes as [write] of its values.
     */
    fun writeBuffer(out: OutputStream, name: String, shape: List<Int>, data: ByteBuffer, metadata: Map<String, String>? = null) {
        val numel = shape.fold(1) { a, b -> a * b }
        require(data.capacity() >= 4 * numel) { "$name: the buffer holds ${data.capacity()} bytes, not ${4L * numel}" }
        val head = header(listOf(Slice(name, shape, FloatArray(0), 0)), metadata)
        out.write(ByteBuffer.allocate(8).order(ByteOrder.LITTLE_ENDIAN).putLong(head.size.toLong()).array())
        out.write(head)
        val src = data.duplicate()
        src.position(0)
        src.limit(4 * numel)
        val ch = java.nio.channels.Channels.newChannel(out)
        while (src.hasRemaining()) ch.write(src)
    }

    /** Tensor [name]'s bytes read straight into [dest] (from byte 0; a direct buffer: no heap copy of the whole tensor). */
    fun readInto(file: File, parsed: Parsed, name: String, dest: ByteBuffer) {
        val e = parsed.entries[name] ?: throw BadInput("${file.name} has no tensor '$name'")
        val n = e.end - e.begin
        if (n > dest.capacity()) throw BadInput("${file.name}: $name is $n bytes, the buffer ${dest.capacity()}")
        val d = dest.duplicate()
        d.position(0)
        d.limit(n.toInt())
        RandomAccessFile(file, "r").use { raf ->
            val ch = raf.channel
            var at = parsed.dataStart + e.begin
            while (d.hasRemaining()) {
                val r = ch.read(d, at)
                if (r < 0) throw BadInput("${file.name}: $name is truncated")
                at += r
            }
        }
    }

    class Entry(val dtype: String, val shape: List<Int>, val begin: Long, val end: Long)
    class Parsed(val entries: Map<String, Entry>, val metadata: Map<String, String>, val dataStart: Long)

    /** Header of a safetensors file, checked: every tensor F32, offsets contiguous and inside the file. */
    fun readHeader(file: File): Parsed = RandomAccessFile(file, "r").use { raf ->
        val where = file.name
        if (raf.length() < 8) throw BadInput("$where is not a safetensors file (shorter than 8 bytes)")
        val lenBytes = ByteArray(8).also { raf.readFully(it) }
        val n = ByteBuffer.wrap(lenBytes).order(ByteOrder.LITTLE_ENDIAN).long
        if (n <= 0 || n > 100_000_000 || 8 + n > raf.length()) throw BadInput("$where: bad header length $n (truncated file?)")
        val head = ByteArray(n.toInt()).also { raf.readFully(it) }
        val f = Fields.of(Json.parse(String(head, Charsets.UTF_8).trimEnd()), where)
        val meta = if (f.has("__metadata__")) f.obj("__metadata__").let { m -> m.obj.fields.keys.associateWith { m.string(it) } } else emptyMap()
        val entries = LinkedHashMap<String, Entry>()
        for (key in f.obj.fields.keys - "__metadata__") {
            val e = f.obj(key)
            val offs = e.arr("data_offsets").map { (it as? Json.Num)?.asLongOrNull ?: throw BadInput("$where: $key has bad data_offsets") }
            entries[key] = Entry(e.string("dtype"), e.ints("shape"), offs[0], offs[1])
        }
        val dataLen = raf.length() - 8 - n
        var expect = 0L
        for ((key, e) in entries.entries.sortedBy { it.value.begin }) {
            if (e.dtype != "F32") throw BadInput("$where: $key is ${e.dtype}, only F32 is read here")
            val numel = e.shape.fold(1L) { a, b -> a * b }
            if (e.begin != expect || e.end - e.begin != 4 * numel) throw BadInput("$where: $key has inconsistent data_offsets")
            expect = e.end
        }
        if (expect != dataLen) throw BadInput("$where: data is $dataLen bytes, the header describes $expect (truncated file?)")
        Parsed(entries, meta, 8 + n)
    }

    fun readFloats(file: File, parsed: Parsed, name: String): FloatArray {
        val e = parsed.entries[name] ?: throw BadInput("${file.name} has no tensor '$name'")
        val bytes = ByteArray((e.end - e.begin).toInt())
        RandomAccessFile(file, "r").use { it.seek(parsed.dataStart + e.begin); it.readFully(bytes) }
        val fb = ByteBuffer.wrap(bytes).order(ByteOrder.LITTLE_ENDIAN).asFloatBuffer()
        return FloatArray(fb.remaining()).also { fb.get(it) }
    }
}
