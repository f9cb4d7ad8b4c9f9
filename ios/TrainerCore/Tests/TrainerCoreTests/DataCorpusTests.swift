import Foundation
import XCTest
@testable import TrainerCore

/// On-device data preparation against the host's reference cases (`shared_schemas/data_corpus/cases.jsonl`,
/// written by scripts/record_data_corpus.py from toolchain/text_data.py, shuffle.py, training/order.py):
/// SplitMix64 outputs, permutations, the per-epoch row order of `train --shuffle`, the held-out split,
/// text -> rows with the byte and the Qwen2.5 tokenizers, chat -> row, LCSB plans of every policy
/// (`toolchain/lcsb/plan.py:make_plan`). Every case must match.
final class DataCorpusTests: XCTestCase {
    static func cases() throws -> [[String: Any]] {
        let url = Repo.root.appendingPathComponent("shared_schemas/data_corpus/cases.jsonl")
        let text = try String(contentsOf: url, encoding: .utf8)
        return try text.split(separator: "\n").map { try JSONSerialization.jsonObject(with: Data($0.utf8)) as! [String: Any] }
    }

    static func int64(_ v: Any) -> Int64 { (v as! NSNumber).int64Value }

    /// Seeds as the host takes them: a Python int modulo 2^64 (the corpus has -3, -1, 2^40, 2^64-1).
    static func seed(_ v: Any) -> UInt64 {
        if let s = v as? String { return UInt64(s)! }
        let n = v as! NSNumber
        return n.int64Value < 0 ? UInt64(bitPattern: n.int64Value) : n.uint64Value
    }

    func tokenizer(_ name: String) throws -> ProgramTokenizer {
        switch name {
        case "byte": return .byte()
        case "qwen2.5":
            guard let t = TokenizerTests.tokenizer else {
                XCTFail("no Qwen2.5 tokenizer.json at \(TokenizerTests.referenceDir.path): run .venv/bin/python ios/hostcheck/tokenizer_reference.py DIR (ios/test.sh does)")
                throw TrainerError.badInput("no tokenizer")
            }
            return ProgramTokenizer(kind: "qwen2.5", base: t, bosId: nil, eosId: 151643, padId: 151643)
        default: throw TrainerError.badInput("unknown tokenizer \(name)")
        }
    }

    func testEveryCaseMatchesTheHost() throws {
        let cases = try Self.cases()
        var counts: [String: Int] = [:]
        for (n, c) in cases.enumerated() {
            let kind = c["kind"] as! String
            let what = "case \(n + 1) (\(kind))"
            switch kind {
            case "splitmix":
                var rng = SplitMix64(state: Self.seed(c["seed"]!))
                let want = (c["outputs"] as! [String]).map { UInt64($0)! }
                XCTAssertEqual((0..<want.count).map { _ in rng.next() }, want, what)
            case "permutation":
                XCTAssertEqual(Shuffle.permutation(c["n"] as! Int, seed: Self.seed(c["seed"]!)), c["perm"] as! [Int], what)
            case "order":
                let order = DataOrder(rowCount: c["rows"] as! Int, seed: Self.seed(c["seed"]!))
                XCTAssertEqual((0..<(c["steps"] as! Int)).map(order.row(forStep:)), c["order"] as! [Int], what)
            case "split":
                let (train, held) = try TextRows.splitHeldOut(count: c["rows"] as! Int, fraction: c["fraction"] as! Double, seed: Self.seed(c["seed"]!))
                XCTAssertEqual(held, c["held"] as! [Int], what)
                XCTAssertEqual((train + held).sorted(), Array(0..<(c["rows"] as! Int)), what)
            case "text":
                let tok = try tokenizer(c["tokenizer"] as! String)
                let rows = try TextRows.textRows(c["text"] as! String, tokenizer: tok, seqLen: c["seq_len"] as! Int)
                XCTAssertEqual(rows, c["rows"] as! [[Int]], "\(what): \(c["tokenizer"]!) seq_len \(c["seq_len"]!) \((c["text"] as! String).prefix(40))")
            case "chat":
                let tok = try tokenizer(c["tokenizer"] as! String)
                let messages = (c["messages"] as! [[String: String]]).map { (role: $0["role"]!, content: $0["content"]!) }
                let row = try TextRows.chatRow(messages, tokenizer: tok.base, seqLen: c["seq_len"] as! Int)
                XCTAssertEqual(row.inputIds, c["input_ids"] as! [Int], what)
                XCTAssertEqual(row.labels, (c["labels"] as! [Any]).map(Self.int64), what)
                // The same conversation as a chat JSONL line gives the same row.
                let line = String(decoding: try JSONSerialization.data(withJSONObject: ["messages": c["messages"]!]), as: UTF8.self)
                let viaFile = try TextRows.chatRows("\n" + line + "\n\n", tokenizer: tok.base, seqLen: c["seq_len"] as! Int)
                XCTAssertEqual(viaFile, [DataRow(inputIds: row.inputIds.map(Int64.init), labels: row.labels)], what)
            case "lcsb_plan":
                let plan = try StepPlan.make(layers: c["layers"] as! Int, k: c["k"] as? Int, policy: c["policy"] as! String,
                                             seed: (c["seed"] as? NSNumber)?.int64Value, period: c["period"] as? Int,
                                             warmup: c["warmup"] as? Int ?? 0)  // absent: no warm-up
                XCTAssertEqual(plan.phases, c["phases"] as! [[Int]], what)
                XCTAssertEqual(plan.schedule, c["schedule"] as! [Int], what)
                XCTAssertEqual(plan.warmup, c["warmup"] as? Int ?? 0, what)
                if let at = c["layers_at"] as? [String: [Int]] {
                    for (step, layers) in at { XCTAssertEqual(plan.layers(forStep: Int(step)!), layers, "\(what) layers_at[\(step)]") }
                    counts["lcsb_plan warmup", default: 0] += 1
                }
            default:
                XCTFail("\(what): unknown kind")
            }
            counts[kind, default: 0] += 1
        }
        for kind in ["splitmix", "permutation", "order", "split", "text", "chat", "lcsb_plan", "lcsb_plan warmup"] {
            XCTAssertGreaterThan(counts[kind] ?? 0, 0, "no \(kind) case")
        }
        print("data corpus: \(cases.count) cases matched \(counts.sorted { $0.key < $1.key })")
    }

    func testSplitAndChatErrorsAsTheHost() throws {
        XCTAssertThrowsError(try TextRows.splitHeldOut(count: 1, fraction: 0.5, seed: 0)) { XCTAssertTrue("\($0)".contains("holds out"), "\($0)") }
        XCTAssertThrowsError(try TextRows.splitHeldOut(count: 10, fraction: 0.01, seed: 0))   // 0 held
        XCTAssertThrowsError(try TextRows.splitHeldOut(count: 2, fraction: 0.9, seed: 0))     // every row held
        XCTAssertThrowsError(try TextRows.splitHeldOut(count: 10, fraction: 1, seed: 0))
        // floor(0.25 * 10 + 0.5) = 3
        XCTAssertEqual(try TextRows.splitHeldOut(count: 10, fraction: 0.25, seed: 3).held.count, 3)
        let tok = try tokenizer("qwen2.5")
        let ok = #"{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}"#
        let long = #"{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "\#(String(repeating: "word ", count: 60))"}]}"#
        for (text, needle) in [(ok + "\n\n" + long, "chat.jsonl:3"), ("[1]", "chat.jsonl:1: expected"), ("{\"messages\": []}", "non-empty"),
                               (#"{"messages": [{"role": "user", "content": "x"}]}"#, "no assistant"),
                               (#"{"messages": [{"role": "tool", "content": "x"}]}"#, "role must be"),
                               (#"{"messages": [{"role": "user"}]}"#, "exactly the keys"), ("{", "not valid JSON"), ("\n \n", "no conversation")] {
            XCTAssertThrowsError(try TextRows.chatRows(text, tokenizer: tok.base, seqLen: 32)) { XCTAssertTrue("\($0)".contains(needle), "\(needle): \($0)") }
        }
        XCTAssertThrowsError(try TextRows.chatRows(ok, tokenizer: ByteTokenizer(), seqLen: 32)) { XCTAssertTrue("\($0)".contains("chat template"), "\($0)") }
        XCTAssertEqual(TextRows.pythonLines("a\r\nb\rc\u{2028}d\n\ne\n"), ["a", "b", "c", "d", "", "e"])
    }

    func testByteTokenizer() throws {
        let t = ProgramTokenizer.byte()
        XCTAssertEqual(t.encode("é<|im_end|>"), [0xC3, 0xA9] + Array("<|im_end|>".utf8).map(Int.init))
        XCTAssertEqual(try t.decode([256, 104, 105, 257, 258]), "hi")
        XCTAssertEqual(try TextRows.textRows("abc", tokenizer: t, seqLen: 3), [[256, 97, 98], [98, 99, 257]])
        XCTAssertEqual(try TextRows.textRows("ab", tokenizer: t, seqLen: 2), [[256, 97], [97, 98], [98, 257]])
        // The byte program's tokenizer.json (a BPE without merges, ByteLevel without regex) encodes the same ids.
        // (written by ios/hostcheck/tokenizer_reference.py, as the Qwen reference)
        let bpe = try BPETokenizer(url: TokenizerTests.referenceDir.appendingPathComponent("byte_tokenizer.json"))
        for s in ["hello world", "Ünïcödé 東京 😀 e\u{301}", "  tabs\tand\r\n", "<|bos|> <|endoftext|>"] {
            XCTAssertEqual(bpe.encode(s, allowSpecial: false), t.encode(s), s)
        }
        for c in try Self.cases() where c["kind"] as? String == "text" && c["tokenizer"] as? String == "byte" {
            XCTAssertEqual(bpe.encode(c["text"] as! String, allowSpecial: false), t.encode(c["text"] as! String))
        }
    }
}
