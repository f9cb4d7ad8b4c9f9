import Foundation

/// What the data preparation needs from a tokenizer (`BPETokenizer`, `ByteTokenizer`).
public protocol TokenEncoding: AnyObject {
    /// Ids of `text`, never with BOS/EOS. `allowSpecial` false: added-token text is ordinary text.
    func encode(_ text: String, allowSpecial: Bool) -> [Int]
    func decode(_ ids: [Int]) throws -> String
    /// The bytes `decode` turns into text (UTF-8, possibly cut inside a character: what
    /// `IncrementalTextDecoder` streams from). The default re-encodes `decode`'s text.
    func decodeBytes(_ ids: [Int]) throws -> [UInt8]
    /// The id of an added token's text (`<|im_start|>`), nil when it has none.
    func tokenId(_ token: String) -> Int?
}

extension TokenEncoding {
    public func decodeBytes(_ ids: [Int]) throws -> [UInt8] { Array(try decode(ids).utf8) }
}

/// The demo model's tokenizer (`toolchain/text/tokenizer.py` `ByteTokenizer`, manifest kind "byte"): the
/// UTF-8 bytes of the text are the ids 0..255; BOS 256, EOS 257, PAD 258 are control ids no text
/// reaches, and `decode` drops them. (Its tokenizer.json, a BPE without merges over the 256 byte
/// symbols with a ByteLevel pre-tokenizer without regex, encodes to the same ids.)
public final class ByteTokenizer: TokenEncoding {
    public static let bos = 256, eos = 257, pad = 258
    public init() {}
    public func encode(_ text: String, allowSpecial: Bool = true) -> [Int] { text.utf8.map { Int($0) } }
    public func decode(_ ids: [Int]) throws -> String {
        String(decoding: try decodeBytes(ids), as: UTF8.self)
    }
    public func decodeBytes(_ ids: [Int]) throws -> [UInt8] {
        for id in ids where id < 0 || id > 263 { throw TrainerError.badInput("token id \(id) is outside the byte vocabulary") }
        return ids.filter { $0 < 256 }.map { UInt8($0) }
    }
    public func tokenId(_ token: String) -> Int? { nil }
}

/// A program's tokenizer as its manifest names it (`tokenizer.kind`): "byte" -> `ByteTokenizer` with
/// BOS 256 / EOS 257; "qwen2.5" and "huggingface" -> `BPETokenizer` from the program's `tokenizer.json`,
/// no BOS, EOS = `eos_token_id` (else `<|endoftext|>`); PAD = `pad_token_id` ("toolchain/text/tokenizer.py").
public final class ProgramTokenizer {
    public let kind: String
    public let base: TokenEncoding
    public let bosId: Int?
    public let eosId: Int
    public let padId: Int

    public init(kind: String, base: TokenEncoding, bosId: Int?, eosId: Int, padId: Int) {
        (self.kind, self.base, self.bosId, self.eosId, self.padId) = (kind, base, bosId, eosId, padId)
    }

    public static func byte() -> ProgramTokenizer {
        ProgramTokenizer(kind: "byte", base: ByteTokenizer(), bosId: ByteTokenizer.bos, eosId: ByteTokenizer.eos, padId: ByteTokenizer.pad)
    }

    /// The tokenizer of a program directory (the manifest's `tokenizer` section).
    public static func load(manifest: Manifest, directory: URL) throws -> ProgramTokenizer {
        guard let t = manifest.tokenizer else { throw TrainerError.badInput("the manifest has no tokenizer section; re-export the program") }
        switch t.kind {
        case "byte":
            return byte()
        case "qwen2.5", "huggingface":
            guard let file = t.file else { throw TrainerError.badInput("the manifest names no tokenizer file; re-export the program") }
            let bpe = try BPETokenizer(url: directory.appendingPathComponent(file))
            guard let eos = t.eosTokenId ?? bpe.tokenId("<|endoftext|>") else {
                throw TrainerError.badInput("the manifest has no eos_token_id and the tokenizer no <|endoftext|>; re-export the program")
            }
            return ProgramTokenizer(kind: t.kind, base: bpe, bosId: nil, eosId: eos, padId: t.padTokenId)
        default:
            throw TrainerError.badInput("this program was exported without a tokenizer (kind \(t.kind)); re-export it with one " +
                                        "to train on text")
        }
    }

    public func encode(_ text: String) -> [Int] { base.encode(text, allowSpecial: false) }
    public func decode(_ ids: [Int]) throws -> String { try base.decode(ids) }
}

/// Seeded permutations equal to the host's (`toolchain/shuffle.py`): SplitMix64 seeded with
/// `seed mod 2^64`, Fisher-Yates from the top with `j = next() % (i + 1)`.
public enum Shuffle {
    public static func permutation(_ n: Int, seed: UInt64) -> [Int] {
        var p = Array(0..<max(n, 0))
        var rng = SplitMix64(state: seed)
        var i = n - 1
        while i >= 1 {
            let j = Int(rng.next() % UInt64(i + 1))
            p.swapAt(i, j)
            i -= 1
        }
        return p
    }

    /// A signed seed (the host's `--seed -3`) taken modulo 2^64.
    public static func permutation(_ n: Int, seed: Int64) -> [Int] { permutation(n, seed: UInt64(bitPattern: seed)) }
}

/// The user's own text as training rows, as `toolchain data` makes them (`toolchain/text_data.py`,
/// `tokenizer.py:apply_chat_template`), and the seeded held-out split.
public enum TextRows {
    public static let ignore: Int64 = -100

    /// `ids` in windows of at most `seqLen` tokens, stride `seqLen - 1` (consecutive windows share one
    /// token, so every token but the first is a target once; a remainder of one token is dropped).
    public static func windows(_ ids: [Int], seqLen: Int) throws -> [[Int]] {
        guard seqLen >= 2 else { throw TrainerError.badInput("seq_len must be at least 2, got \(seqLen)") }
        return stride(from: 0, to: max(ids.count - 1, 0), by: seqLen - 1).map { Array(ids[$0..<min($0 + seqLen, ids.count)]) }
    }

    /// Rows of plain text (labels = input_ids): `[BOS if any] + ids (added-token text kept as text) + [EOS]`, in windows.
    public static func textRows(_ text: String, tokenizer: TokenEncoding, seqLen: Int, eosId: Int, bosId: Int? = nil) throws -> [[Int]] {
        let stream = (bosId.map { [$0] } ?? []) + tokenizer.encode(dropBOM(text), allowSpecial: false) + [eosId]
        let rows = try windows(stream, seqLen: seqLen)
        guard !rows.isEmpty else { throw TrainerError.badInput("the text has no token to train on") }
        return rows
    }

    public static func textRows(_ text: String, tokenizer: ProgramTokenizer, seqLen: Int) throws -> [[Int]] {
        try textRows(text, tokenizer: tokenizer.base, seqLen: seqLen, eosId: tokenizer.eosId, bosId: tokenizer.bosId)
    }

    /// Qwen's ChatML, each turn `<|im_start|>{role}\n{content}<|im_end|>\n`, the pieces encoded one by
    /// one (content's special-token text kept as text); labels = the ids on each assistant content and
    /// its `<|im_end|>`, -100 elsewhere. A conversation longer than `seqLen` or without an assistant
    /// token is refused.
    public static func chatRow(_ messages: [(role: String, content: String)], tokenizer: TokenEncoding, seqLen: Int) throws -> (inputIds: [Int], labels: [Int64]) {
        guard let start = tokenizer.tokenId(Contract.imStart), let end = tokenizer.tokenId(Contract.imEnd) else {
            throw TrainerError.badInput("the tokenizer has no <|im_start|>/<|im_end|> token, so no chat template; use plain text")
        }
        guard !messages.isEmpty else { throw TrainerError.badInput("messages must be a non-empty list of {\"role\", \"content\"} objects") }
        let newline = tokenizer.encode("\n", allowSpecial: false)
        var ids: [Int] = [], labels: [Int64] = []
        for (i, m) in messages.enumerated() {
            guard ["system", "user", "assistant"].contains(m.role) else {
                throw TrainerError.badInput("message \(i + 1): role must be one of system, user, assistant and content a string, got role \(m.role)")
            }
            let header = [start] + tokenizer.encode("\(m.role)\n", allowSpecial: false)
            let body = tokenizer.encode(m.content, allowSpecial: false) + [end]
            ids += header + body + newline
            labels += Array(repeating: ignore, count: header.count)
                + (m.role == "assistant" ? body.map(Int64.init) : Array(repeating: ignore, count: body.count))
                + Array(repeating: ignore, count: newline.count)
        }
        guard labels.contains(where: { $0 != ignore }) else {
            throw TrainerError.badInput("the conversation has no assistant message with a token to learn")
        }
        guard ids.count <= seqLen else {
            throw TrainerError.badInput("the conversation is \(ids.count) tokens, longer than the program's seq_len \(seqLen); " +
                                        "shorten or split it, or export with a larger --seq-len")
        }
        return (ids, labels)
    }

    /// Rows of a chat JSONL file: one `{"messages": [{"role", "content"}, ...]}` per non-blank line
    /// (lines as Python's `str.splitlines`); every error names `source:line`.
    public static func chatRows(_ text: String, tokenizer: TokenEncoding, seqLen: Int, source: String = "chat.jsonl") throws -> [DataRow] {
        var rows: [DataRow] = []
        for (n, line) in pythonLines(dropBOM(text)).enumerated() {
            if line.unicodeScalars.allSatisfy({ pythonWhitespace.contains($0.value) }) { continue }
            let place = "\(source):\(n + 1)"
            func fail(_ why: String) -> TrainerError { .badInput("\(place): \(why)") }
            guard let doc = try? JSONSerialization.jsonObject(with: Data(line.utf8), options: [.fragmentsAllowed]) else {
                throw fail("not valid JSON")
            }
            guard let obj = doc as? [String: Any], obj.count == 1, let list = obj["messages"] else {
                throw fail("expected {\"messages\": [{\"role\": ..., \"content\": ...}, ...]}")
            }
            guard let items = list as? [Any], !items.isEmpty else {
                throw fail("messages must be a non-empty list of {\"role\", \"content\"} objects")
            }
            var messages: [(role: String, content: String)] = []
            for (i, item) in items.enumerated() {
                guard let m = item as? [String: Any], m.count == 2, let role = m["role"], let content = m["content"] else {
                    throw fail("message \(i + 1) must be an object with exactly the keys role and content")
                }
                guard let r = role as? String, let c = content as? String else {
                    throw fail("message \(i + 1): role must be one of system, user, assistant and content a string, got role \(role)")
                }
                messages.append((r, c))
            }
            do {
                let row = try chatRow(messages, tokenizer: tokenizer, seqLen: seqLen)
                rows.append(DataRow(inputIds: row.inputIds.map(Int64.init), labels: row.labels))
            } catch TrainerError.badInput(let why) {
                throw fail(why)
            }
        }
        guard !rows.isEmpty else { throw TrainerError.badInput("\(source) has no conversation") }
        return rows
    }

    /// n_held = floor(fraction * count + 0.5) indices held out: the first n_held of
    /// `Shuffle.permutation(count, seed)`; both parts in file order (`text_data.py:split_held_out`).
    public static func splitHeldOut(count: Int, fraction: Double, seed: UInt64) throws -> (train: [Int], held: [Int]) {
        guard fraction > 0, fraction < 1 else {
            throw TrainerError.badInput("the held-out fraction must be strictly between 0 and 1, got \(fraction)")
        }
        let nHeld = Int((fraction * Double(count) + 0.5).rounded(.down))
        guard nHeld >= 1, nHeld < count else {
            throw TrainerError.badInput("a held-out fraction of \(fraction) of \(count) rows holds out \(nHeld); need at least one row on " +
                                        "each side (more text, or another fraction)")
        }
        let held = Set(Shuffle.permutation(count, seed: seed).prefix(nHeld))
        let all = Array(0..<count)
        return (all.filter { !held.contains($0) }, all.filter { held.contains($0) })
    }

    public static func splitHeldOut<T>(_ rows: [T], fraction: Double, seed: UInt64) throws -> (train: [T], held: [T]) {
        let (t, h) = try splitHeldOut(count: rows.count, fraction: fraction, seed: seed)
        return (t.map { rows[$0] }, h.map { rows[$0] })
    }

    /// Rows of plain text as `DataRow`s (labels = input ids).
    public static func dataRows(text: String, tokenizer: ProgramTokenizer, seqLen: Int) throws -> [DataRow] {
        try textRows(text, tokenizer: tokenizer, seqLen: seqLen).map { DataRow(inputIds: $0.map(Int64.init)) }
    }

    static func dropBOM(_ text: String) -> String {
        text.unicodeScalars.first == "\u{FEFF}" ? String(text.unicodeScalars.dropFirst()) : text
    }

    /// Python's whitespace (`str.strip`, `str.isspace`).
    static let pythonWhitespace: Set<UInt32> = [0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x1C, 0x1D, 0x1E, 0x1F, 0x20, 0x85, 0xA0, 0x1680,
                                                0x2000, 0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009,
                                                0x200A, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000]

    /// `str.splitlines()`: \n, \r, \r\n, \v, \f, \x1c-\x1e, \x85, U+2028, U+2029 end a line; no trailing empty line.
    static func pythonLines(_ text: String) -> [String] {
        let breaks: Set<UInt32> = [0x0A, 0x0B, 0x0C, 0x0D, 0x1C, 0x1D, 0x1E, 0x85, 0x2028, 0x2029]
        var lines: [String] = []
        var cur = String.UnicodeScalarView()
        let scalars = Array(text.unicodeScalars)
        var i = 0
        while i < scalars.count {
            let s = scalars[i]
            if breaks.contains(s.value) {
                lines.append(String(cur))
                cur = String.UnicodeScalarView()
                if s.value == 0x0D, i + 1 < scalars.count, scalars[i + 1].value == 0x0A { i += 1 }
            } else {
                cur.append(s)
            }
            i += 1
        }
        if !cur.isEmpty { lines.append(String(cur)) }
        return lines
    }
}
