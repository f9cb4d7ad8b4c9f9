import Foundation

/// A byte-level BPE tokenizer read from a Hugging Face `tokenizer.json` (as `toolchain/text/tokenizer.py`
/// writes it for Qwen2.5, and as Qwen2 checkpoints ship it): NFC normalizer, a `Split` regex
/// pre-tokenizer (isolated) followed by `ByteLevel` (or `ByteLevel` with its own GPT-2 regex), a BPE
/// model with merges (`ignore_merges`: a pre-token that is itself in the vocabulary is one token, as in
/// tiktoken), added tokens matched leftmost-longest in the text before anything else, and the
/// `ByteLevel` decoder. Tokens are handled as bytes, never as Swift Strings (whose equality is
/// canonical equivalence).
public final class BPETokenizer {
    public let vocabSize: Int
    private let tokenBytes: [[UInt8]]              // id -> bytes (model vocabulary)
    private let byteToId: [Int]                    // byte -> id of the one-byte token
    private let idOf: [[UInt8]: Int]
    private let merges: [UInt64: (rank: Int, id: Int)]
    private let ignoreMerges: Bool
    private let nfc: Bool
    private let regex: NSRegularExpression?
    public let addedTokens: [(content: String, id: Int, special: Bool)]
    private let addedBytes: [(bytes: [UInt8], id: Int)]
    private let addedById: [Int: [UInt8]]
    private var cache: [[UInt8]: [Int]] = [:]

    /// The GPT-2 pattern `ByteLevel(use_regex=true)` applies.
    static let gpt2Pattern = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

    public convenience init(url: URL) throws {
        try self.init(json: try readFile(url, what: "tokenizer"), source: url.path)
    }

    public init(json data: Data, source: String = "tokenizer.json") throws {
        func fail(_ why: String) -> TrainerError { .badInput("\(source): \(why)") }
        guard let root = try? JSONSerialization.jsonObject(with: data) as? [String: Any] else { throw fail("not a JSON object") }
        guard let model = root["model"] as? [String: Any], model["type"] as? String == "BPE",
              let vocab = model["vocab"] as? [String: Any] else { throw fail("not a BPE tokenizer.json") }
        let (charToByte, _) = BPETokenizer.byteTable()
        func bytes(_ token: String) throws -> [UInt8] {
            try token.unicodeScalars.map { s in
                guard let b = charToByte[s] else { throw fail("token \(token) is not byte-level") }
                return b
            }
        }
        var size = 0
        var pairs: [(Int, [UInt8])] = []
        pairs.reserveCapacity(vocab.count)
        for (tok, v) in vocab {
            guard let id = (v as? NSNumber)?.intValue, id >= 0 else { throw fail("bad id of \(tok)") }
            pairs.append((id, try bytes(tok)))
            size = max(size, id + 1)
        }
        var table = [[UInt8]](repeating: [], count: size)
        var index: [[UInt8]: Int] = [:]
        index.reserveCapacity(pairs.count)
        for (id, b) in pairs { table[id] = b; index[b] = id }
        var single = [Int](repeating: -1, count: 256)
        for b in 0..<256 {
            guard let id = index[[UInt8(b)]] else { throw fail("the vocabulary lacks byte \(b)") }
            single[b] = id
        }
        var mergeTable: [UInt64: (rank: Int, id: Int)] = [:]
        let rawMerges = model["merges"] as? [Any] ?? []
        mergeTable.reserveCapacity(rawMerges.count)
        for (rank, m) in rawMerges.enumerated() {
            let parts: [String]
            if let s = m as? String { parts = s.split(separator: " ", omittingEmptySubsequences: false).map(String.init) }
            else if let a = m as? [String] { parts = a } else { throw fail("bad merge \(rank)") }
            guard parts.count == 2 else { throw fail("bad merge \(rank)") }
            let (a, b) = (try bytes(parts[0]), try bytes(parts[1]))
            guard let ia = index[a], let ib = index[b], let ij = index[a + b] else { throw fail("merge \(rank) names tokens outside the vocabulary") }
            let key = UInt64(ia) << 32 | UInt64(ib)
            if mergeTable[key] == nil { mergeTable[key] = (rank, ij) }
        }
        (tokenBytes, byteToId, idOf, merges) = (table, single, index, mergeTable)
        ignoreMerges = model["ignore_merges"] as? Bool ?? false

        // normalizer: NFC (alone or in a Sequence); anything else is refused rather than ignored
        var usesNFC = false
        if let n = root["normalizer"] as? [String: Any] {
            let list = n["type"] as? String == "Sequence" ? (n["normalizers"] as? [[String: Any]] ?? []) : [n]
            for item in list {
                guard item["type"] as? String == "NFC" else { throw fail("normalizer \(item["type"] ?? "?") is not supported (NFC only)") }
                usesNFC = true
            }
        }
        nfc = usesNFC

        // pre-tokenizer: [Split(regex, isolated)] + ByteLevel
        var pattern: String?
        if let p = root["pre_tokenizer"] as? [String: Any] {
            let list = p["type"] as? String == "Sequence" ? (p["pretokenizers"] as? [[String: Any]] ?? []) : [p]
            for item in list {
                switch item["type"] as? String {
                case "Split":
                    guard let re = (item["pattern"] as? [String: Any])?["Regex"] as? String, item["behavior"] as? String == "Isolated",
                          (item["invert"] as? Bool ?? false) == false, pattern == nil else { throw fail("only one Split(Regex, Isolated) pre-tokenizer is supported") }
                    pattern = re
                case "ByteLevel":
                    guard (item["add_prefix_space"] as? Bool ?? false) == false else { throw fail("ByteLevel add_prefix_space is not supported") }
                    if item["use_regex"] as? Bool ?? true {
                        guard pattern == nil else { throw fail("two pre-tokenizer regexes") }
                        pattern = BPETokenizer.gpt2Pattern
                    }
                default:
                    throw fail("pre-tokenizer \(item["type"] ?? "?") is not supported")
                }
            }
        }
        regex = try pattern.map { p in
            do { return try NSRegularExpression(pattern: BPETokenizer.icuPattern(p)) } catch { throw fail("the pre-tokenizer regex does not compile (\(error))") }
        }

        var added: [(String, Int, Bool)] = []
        for t in root["added_tokens"] as? [[String: Any]] ?? [] {
            guard let c = t["content"] as? String, let id = (t["id"] as? NSNumber)?.intValue, !c.isEmpty else { throw fail("bad added token") }
            added.append((c, id, t["special"] as? Bool ?? false))
        }
        addedTokens = added.map { (content: $0.0, id: $0.1, special: $0.2) }
        addedBytes = added.map { (bytes: Array($0.0.utf8), id: $0.1) }
        var byId: [Int: [UInt8]] = [:]
        for (c, id, _) in added {
            // the ByteLevel decoder maps a token's chars through the byte table when all are in it, else keeps its UTF-8
            byId[id] = (try? bytes(c)) ?? Array(c.utf8)
        }
        addedById = byId
        vocabSize = max(size, (added.map(\.1).max() ?? -1) + 1)
    }

    /// bytes_to_unicode of GPT-2: printable Latin-1 bytes map to themselves, the others to U+0100 + n.
    static func byteTable() -> ([Unicode.Scalar: UInt8], [Unicode.Scalar]) {
        var bs = Array(33...126) + Array(161...172) + Array(174...255)
        var cs = bs
        var n = 0
        for b in 0..<256 where !bs.contains(b) { bs.append(b); cs.append(256 + n); n += 1 }
        var toByte: [Unicode.Scalar: UInt8] = [:]
        var toChar = [Unicode.Scalar](repeating: " ", count: 256)
        for (b, c) in zip(bs, cs) { let s = Unicode.Scalar(UInt32(c))!; toByte[s] = UInt8(b); toChar[b] = s }
        return (toByte, toChar)
    }

    /// The pattern for ICU (NSRegularExpression): `\s` / `\S` as Unicode White_Space (what Rust's regex
    /// and Oniguruma use; ICU's `\s` is [\t\n\f\r\p{Z}], without U+000B and U+0085).
    static func icuPattern(_ p: String) -> String {
        let ws = "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
        var out = ""
        var inClass = false
        var it = Array(p)
        var i = 0
        while i < it.count {
            let c = it[i]
            if c == "\\", i + 1 < it.count {
                let n = it[i + 1]
                if n == "s" { out += inClass ? ws : "[\(ws)]" }
                else if n == "S" { out += inClass ? "\\S" : "[^\(ws)]" }
                else { out.append(c); out.append(n) }
                i += 2
                continue
            }
            if c == "[" && !inClass { inClass = true } else if c == "]" && inClass { inClass = false }
            out.append(c)
            i += 1
        }
        it.removeAll()
        return out
    }

    /// NFC: Foundation's composition, then the algorithmic Hangul composition (L+V, LV+T), which
    /// swift-corelibs-foundation on Linux leaves undone for LV+T (U+AC00 U+11A8 stays two scalars).
    static func nfc(_ text: String) -> String {
        let composed = text.precomposedStringWithCanonicalMapping
        let scalars = Array(composed.unicodeScalars)
        guard scalars.contains(where: { (0x1100...0x11FF).contains($0.value) }) else { return composed }
        var out: [Unicode.Scalar] = []
        out.reserveCapacity(scalars.count)
        for s in scalars {
            if let last = out.last {
                let (l, v) = (last.value, s.value)
                if (0x1100..<0x1100 + 19).contains(l), (0x1161..<0x1161 + 21).contains(v) {
                    out[out.count - 1] = Unicode.Scalar(0xAC00 + ((l - 0x1100) * 21 + (v - 0x1161)) * 28)!
                    continue
                }
                if (0xAC00..<0xAC00 + 11172).contains(l), (l - 0xAC00) % 28 == 0, (0x11A8..<0x11A7 + 28).contains(v) {
                    out[out.count - 1] = Unicode.Scalar(l + (v - 0x11A7))!
                    continue
                }
            }
            out.append(s)
        }
        var r = String.UnicodeScalarView()
        r.append(contentsOf: out)
        return String(r)
    }

    // MARK: encode

    /// The token ids of `text`. `allowSpecial`: added tokens in the text are their ids (as
    /// `toolchain tokenize`); false: their text is ordinary text.
    public func encode(_ text: String, allowSpecial: Bool = true) -> [Int] {
        let normalized = nfc ? BPETokenizer.nfc(text) : text
        let bytes = Array(normalized.utf8)
        var ids: [Int] = []
        guard allowSpecial, !addedBytes.isEmpty else { encodeOrdinary(bytes[...], into: &ids); return ids }
        var start = 0, i = 0
        while i < bytes.count {
            var best: (len: Int, id: Int)?
            for t in addedBytes where t.bytes.count > (best?.len ?? 0) && i + t.bytes.count <= bytes.count
                && bytes[i] == t.bytes[0] && bytes[i..<i + t.bytes.count].elementsEqual(t.bytes) {
                best = (t.bytes.count, t.id)
            }
            if let best {
                encodeOrdinary(bytes[start..<i], into: &ids)
                ids.append(best.id)
                i += best.len
                start = i
            } else {
                i += 1
            }
        }
        encodeOrdinary(bytes[start...], into: &ids)
        return ids
    }

    private func encodeOrdinary(_ bytes: ArraySlice<UInt8>, into ids: inout [Int]) {
        guard !bytes.isEmpty else { return }
        guard let regex else { bpe(Array(bytes), into: &ids); return }
        let s = String(decoding: bytes, as: UTF8.self)
        let ns = s as NSString
        var last = 0
        func piece(_ r: NSRange) {
            guard r.length > 0 else { return }
            bpe(Array(ns.substring(with: r).utf8), into: &ids)
        }
        for m in regex.matches(in: s, range: NSRange(location: 0, length: ns.length)) {
            if m.range.location > last { piece(NSRange(location: last, length: m.range.location - last)) }
            piece(m.range)
            last = m.range.location + m.range.length
        }
        if last < ns.length { piece(NSRange(location: last, length: ns.length - last)) }
    }

    private func bpe(_ word: [UInt8], into ids: inout [Int]) {
        if ignoreMerges, let id = idOf[word] { ids.append(id); return }
        if let hit = cache[word] { ids += hit; return }
        var symbols = word.map { byteToId[Int($0)] }
        while symbols.count > 1 {
            var best: (rank: Int, pos: Int, id: Int)?
            for p in 0..<(symbols.count - 1) {
                if let m = merges[UInt64(symbols[p]) << 32 | UInt64(symbols[p + 1])], m.rank < (best?.rank ?? Int.max) {
                    best = (m.rank, p, m.id)
                }
            }
            guard let best else { break }
            // merge every occurrence of the pair, left to right
            let (a, b) = (symbols[best.pos], symbols[best.pos + 1])
            var out: [Int] = []
            out.reserveCapacity(symbols.count)
            var p = 0
            while p < symbols.count {
                if p + 1 < symbols.count, symbols[p] == a, symbols[p + 1] == b { out.append(best.id); p += 2 } else { out.append(symbols[p]); p += 1 }
            }
            symbols = out
        }
        if cache.count < 100_000 { cache[word] = symbols }
        ids += symbols
    }

    // MARK: decode

    /// The text of `ids` (added tokens as their text; invalid UTF-8 replaced by U+FFFD, as HF's
    /// ByteLevel decoder does). Ids outside the vocabulary are refused.
    public func decode(_ ids: [Int]) throws -> String {
        String(decoding: try decodeBytes(ids), as: UTF8.self)
    }

    public func decodeBytes(_ ids: [Int]) throws -> [UInt8] {
        var out: [UInt8] = []
        for id in ids {
            if let a = addedById[id] { out += a }
            else if id >= 0, id < tokenBytes.count, !tokenBytes[id].isEmpty { out += tokenBytes[id] }
            else { throw TrainerError.badInput("token id \(id) is outside the vocabulary of \(vocabSize)") }
        }
        return out
    }

    /// The id of an added token (`<|endoftext|>`, `<|im_end|>`, ...) or a vocabulary token's text.
    public func tokenId(_ token: String) -> Int? {
        if let a = addedTokens.first(where: { $0.content == token }) { return a.id }
        let (charToByte, _) = BPETokenizer.byteTable()
        let b = token.unicodeScalars.compactMap { charToByte[$0] }
        return b.count == token.unicodeScalars.count ? idOf[b] : nil
    }
}

extension BPETokenizer: TokenEncoding {}
