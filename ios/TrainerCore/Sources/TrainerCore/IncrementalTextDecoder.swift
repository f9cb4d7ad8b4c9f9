import Foundation

/// Text of generated ids as they come, with a tokenizer whose tokens may end inside a UTF-8
/// character (byte tokens, byte-level BPE): each `append` returns the text that became complete with
/// that id (often "", e.g. the first bytes of an emoji), never a broken character; the pieces plus
/// `finish()` concatenate to `String(decoding: tokenizer.decodeBytes(ids), as: UTF8.self)`, the
/// whole decode (`ProgramTokenizer.decode`), exactly.
///
/// How: the bytes of the ids so far, minus the ones already shown; of those, the longest prefix that
/// does not end in an incomplete but still valid start of a character (a lead byte and fewer
/// continuation bytes than it announces, each in its allowed range) is decoded and shown; the
/// incomplete tail waits for the next id. A byte sequence that can no longer become a character is
/// shown at once, as `String(decoding:as:)` shows it (U+FFFD), so the pieces equal the whole decode.
public final class IncrementalTextDecoder {
    public let tokenizer: TokenEncoding
    /// Ids that add no text (stop ids: EOS, `<|im_end|>`).
    public let hidden: Set<Int>
    private var pending: [UInt8] = []

    public init(tokenizer: TokenEncoding, hidden: Set<Int> = []) {
        (self.tokenizer, self.hidden) = (tokenizer, hidden)
    }

    /// The text completed by `id` ("" when it only starts a character, or is hidden).
    public func append(_ id: Int) throws -> String {
        if hidden.contains(id) { return "" }
        pending += try tokenizer.decodeBytes([id])
        let cut = Self.completePrefix(pending)
        guard cut > 0 else { return "" }
        let text = String(decoding: pending[0..<cut], as: UTF8.self)
        pending.removeFirst(cut)
        return text
    }

    /// What is left (an incomplete character at the end, as U+FFFD), and start over.
    public func finish() -> String {
        defer { pending = [] }
        return pending.isEmpty ? "" : String(decoding: pending, as: UTF8.self)
    }

    /// Bytes of an incomplete character's start still waiting for the next id.
    public var pendingBytes: Int { pending.count }

    /// The length of the longest prefix of `bytes` that does not end inside a character which the
    /// next bytes could still complete.
    static func completePrefix(_ bytes: [UInt8]) -> Int {
        let n = bytes.count
        // the last byte that is not a continuation byte (10xxxxxx), within a character's reach
        var i = n - 1
        while i >= 0, i > n - 4, bytes[i] & 0xC0 == 0x80 { i -= 1 }
        guard i >= 0 else { return n }
        let lead = bytes[i]
        let need: Int
        switch lead {
        case 0xC2...0xDF: need = 2
        case 0xE0...0xEF: need = 3
        case 0xF0...0xF4: need = 4
        default: return n               // ASCII, or a byte that starts no character: nothing to wait for
        }
        let have = n - i
        guard have < need else { return n }
        // the continuation bytes so far must be the ones this lead allows (Unicode Table 3-7)
        if have >= 2 {
            let second = bytes[i + 1]
            let ok: ClosedRange<UInt8>
            switch lead {
            case 0xE0: ok = 0xA0...0xBF
            case 0xED: ok = 0x80...0x9F
            case 0xF0: ok = 0x90...0xBF
            case 0xF4: ok = 0x80...0x8F
            default: ok = 0x80...0xBF
            }
            guard ok.contains(second) else { return n }
        }
        return i
    }
}
