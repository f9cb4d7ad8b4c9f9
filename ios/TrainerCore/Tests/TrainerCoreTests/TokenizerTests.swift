import Foundation
import XCTest
@testable import TrainerCore

/// The Swift BPE against the shared corpus (`shared_schemas/tokenizer_corpus/`: 984 cases, reference
/// ids from tiktoken) on the Qwen2.5 tokenizer.json the toolchain ships. The tokenizer.json and the
/// Python decodes are produced at test time (ios/test.sh runs ios/hostcheck/tokenizer_reference.py
/// into /tmp/trainercore-qwen of the test chroot; QWEN_REFERENCE_DIR overrides).
final class TokenizerTests: XCTestCase {
    static var referenceDir: URL {
        URL(fileURLWithPath: ProcessInfo.processInfo.environment["QWEN_REFERENCE_DIR"] ?? "/tmp/trainercore-qwen")
    }

    static let tokenizer: BPETokenizer? = try? BPETokenizer(url: referenceDir.appendingPathComponent("tokenizer.json"))

    func qwen() throws -> BPETokenizer {
        guard let t = Self.tokenizer else {
            XCTFail("no Qwen2.5 tokenizer.json at \(Self.referenceDir.path): run .venv/bin/python ios/hostcheck/tokenizer_reference.py DIR (ios/test.sh does)")
            throw TrainerError.badInput("no tokenizer")
        }
        return t
    }

    /// The corpus cases: one JSON string per line, parsed here so that unpaired UTF-16 surrogates
    /// become U+FFFD (what the reference's `sanitize` does before tokenizing).
    static func cases() throws -> [String] {
        let text = try String(contentsOf: Repo.root.appendingPathComponent("shared_schemas/tokenizer_corpus/cases.jsonl"), encoding: .utf8)
        return try text.split(separator: "\n", omittingEmptySubsequences: true).map { try jsonString(Array(String($0).utf16)) }
    }

    static func jsonString(_ u: [UInt16]) throws -> String {
        guard u.first == 0x22, u.last == 0x22 else { throw TrainerError.badInput("not a JSON string") }
        var units: [UInt16] = []
        var i = 1
        while i < u.count - 1 {
            if u[i] == 0x5C {
                let e = u[i + 1]
                switch e {
                case 0x75: units.append(UInt16(String(decoding: u[i + 2..<i + 6], as: UTF16.self), radix: 16)!); i += 6; continue
                case 0x6E: units.append(0x0A)
                case 0x74: units.append(0x09)
                case 0x72: units.append(0x0D)
                case 0x62: units.append(0x08)
                case 0x66: units.append(0x0C)
                default: units.append(e)          // \" \\ \/
                }
                i += 2
            } else {
                units.append(u[i]); i += 1
            }
        }
        // String(decoding:as: UTF16) replaces each unpaired surrogate by U+FFFD
        return String(decoding: units, as: UTF16.self)
    }

    static func hex(_ s: String) -> [UInt8] {
        let c = Array(s.utf8)
        return stride(from: 0, to: c.count, by: 2).map { UInt8(String(decoding: c[$0..<$0 + 2], as: UTF8.self), radix: 16)! }
    }

    func testCorpusIdsEqualReference() throws {
        let tk = try qwen()
        let ref = try JSONSerialization.jsonObject(with: try Data(contentsOf: Repo.root.appendingPathComponent("shared_schemas/tokenizer_corpus/qwen2.5_ids.json"))) as! [String: Any]
        let ids = ref["ids"] as! [[Int]], ordinary = ref["ids_ordinary"] as! [[Int]]
        let cases = try Self.cases()
        XCTAssertEqual(cases.count, 984)
        XCTAssertEqual(ids.count, cases.count)
        var bad: [Int] = [], badOrdinary: [Int] = []
        for (i, text) in cases.enumerated() {
            if tk.encode(text) != ids[i] { bad.append(i) }
            if tk.encode(text, allowSpecial: false) != ordinary[i] { badOrdinary.append(i) }
        }
        XCTAssertEqual(bad, [], "cases whose ids differ (allow_special): \(bad.prefix(10)); first: \(bad.first.map { cases[$0].debugDescription } ?? "")")
        XCTAssertEqual(badOrdinary, [], "cases whose ids differ (ordinary): \(badOrdinary.prefix(10))")
        print("tokenizer: \(cases.count - bad.count)/\(cases.count) corpus cases equal (ids), \(cases.count - badOrdinary.count)/\(cases.count) (ordinary)")
    }

    func testDecodeEqualsReference() throws {
        let tk = try qwen()
        let doc = try JSONSerialization.jsonObject(with: try Data(contentsOf: Self.referenceDir.appendingPathComponent("decode.json"))) as! [String: Any]
        let ref = try JSONSerialization.jsonObject(with: try Data(contentsOf: Repo.root.appendingPathComponent("shared_schemas/tokenizer_corpus/qwen2.5_ids.json"))) as! [String: Any]
        let ids = ref["ids"] as! [[Int]]
        let corpus = doc["corpus"] as! [String]
        var bad: [Int] = []
        for (i, h) in corpus.enumerated() where Array(try tk.decode(ids[i]).utf8) != Self.hex(h) { bad.append(i) }
        XCTAssertEqual(bad, [], "corpus decodes that differ")
        var badRandom: [[Int]] = []
        for r in doc["random"] as! [[String: Any]] {
            let seq = r["ids"] as! [Int]
            if Array(try tk.decode(seq).utf8) != Self.hex(r["text"] as! String) { badRandom.append(seq) }
        }
        XCTAssertEqual(badRandom, [], "random id sequences whose decode differs (split UTF-8, added tokens)")
        XCTAssertThrowsError(try tk.decode([tk.vocabSize]))
    }

    func testSpecialTokensAndRoundTrip() throws {
        let tk = try qwen()
        XCTAssertEqual(tk.tokenId("<|endoftext|>"), 151643)
        XCTAssertEqual(tk.tokenId("<|im_end|>"), 151645)
        let chat = "<|im_start|>user\nHallo, wie geht's? 你好 🙂<|im_end|>\n"
        let ids = tk.encode(chat)
        XCTAssertEqual(ids.first, 151644)
        XCTAssertTrue(ids.contains(151645))
        XCTAssertEqual(Array(try tk.decode(ids).utf8), Array(chat.utf8))
        XCTAssertFalse(tk.encode(chat, allowSpecial: false).contains(151644))
        // NFC first: a decomposed é encodes as the composed one
        XCTAssertEqual(tk.encode("caf\u{65}\u{301}"), tk.encode("caf\u{e9}"))
    }

    /// `toolchain data`'s rows of a text (windows sharing one token, <|endoftext|> last) and of a chat
    /// (ChatML, labels on the assistant's content and <|im_end|>), equal to the Python ones.
    func testTextAndChatRowsEqualToolchainData() throws {
        let tk = try qwen()
        let doc = try JSONSerialization.jsonObject(with: try Data(contentsOf: Self.referenceDir.appendingPathComponent("decode.json"))) as! [String: Any]
        let text = doc["text_rows"] as! [String: Any]
        let rows = try TextRows.textRows(text["text"] as! String, tokenizer: tk, seqLen: text["seq_len"] as! Int, eosId: 151643)
        XCTAssertEqual(rows, text["rows"] as! [[Int]])
        XCTAssertEqual(rows.last?.last, 151643)
        let chat = doc["chat"] as! [String: Any]
        let messages = (chat["messages"] as! [[String: String]]).map { (role: $0["role"]!, content: $0["content"]!) }
        let row = try TextRows.chatRow(messages, tokenizer: tk, seqLen: 256)
        XCTAssertEqual(row.inputIds, chat["input_ids"] as! [Int])
        XCTAssertEqual(row.labels, (chat["labels"] as! [Int]).map(Int64.init))
        XCTAssertThrowsError(try TextRows.chatRow(messages, tokenizer: tk, seqLen: 20))
        XCTAssertThrowsError(try TextRows.chatRow([(role: "user", content: "hi")], tokenizer: tk, seqLen: 64))
        XCTAssertThrowsError(try TextRows.chatRow([(role: "tool", content: "hi")], tokenizer: tk, seqLen: 64))
        XCTAssertEqual(try TextRows.windows([1, 2, 3, 4, 5], seqLen: 3), [[1, 2, 3], [3, 4, 5]])
        XCTAssertEqual(try TextRows.windows([1], seqLen: 3), [])
    }

    func testBadTokenizerJSONRefused() {
        XCTAssertThrowsError(try BPETokenizer(json: Data("{}".utf8)))
        XCTAssertThrowsError(try BPETokenizer(json: Data(#"{"model": {"type": "WordPiece", "vocab": {}}}"#.utf8)))
        XCTAssertThrowsError(try BPETokenizer(json: Data(#"{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}"#.utf8)))
    }

    func testIcuPatternWhitespace() throws {
        let p = BPETokenizer.icuPattern("\\s+(?!\\S)|[^\\s\\p{L}]+")
        XCTAssertFalse(p.contains("\\s"))
        let re = try NSRegularExpression(pattern: "^" + BPETokenizer.icuPattern("\\s+") + "$")
        for s in ["\u{0B}", "\u{85}", " \t\n", "\u{3000}"] {
            XCTAssertEqual(re.numberOfMatches(in: s, range: NSRange(location: 0, length: (s as NSString).length)), 1, s.debugDescription)
        }
    }
}
