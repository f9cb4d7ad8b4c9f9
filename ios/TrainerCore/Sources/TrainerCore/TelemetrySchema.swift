import Foundation

/// The telemetry event schema (`shared_schemas/telemetry_event.schema.json`) as code: the app checks
/// every event before it queues it, so the server never has to refuse one (422 is permanent).
/// Tested against every valid and invalid example in `shared_schemas/examples/`.
public enum TelemetrySchema {
    enum Kind {
        case string(minLength: Int, maxLength: Int?)
        case choice([String])
        case pattern(String)            // only the two patterns the schema uses, see `matches`
        case integer(min: Int64?)
        case integerOrNull(min: Int64?)
        /// A `working_set` object: layers_per_checkpoint (>= 1), lcsb_k (>= 1 or null), seq_len (>= 1), no other keys.
        case workingSet
        case number(min: Double?, max: Double?)
        case numberOrNull
        case bool
        case bytes
        case object
        case strings
        /// A list of at most `maxItems` strings of at most `maxLength` characters (error `log`).
        case lines(maxItems: Int, maxLength: Int)
    }

    static let maxSafeInt: Int64 = 9_007_199_254_740_991

    static let common: [String: Kind] = [
        "schema_version": .integer(min: 1), "type": .choice(Array(typeFields.keys)),
        "run_id": .pattern("run_id"), "seq": .integer(min: 0), "timestamp": .number(min: 0, max: nil),
        "elapsed_s": .number(min: 0, max: nil),
    ]
    static let commonRequired = ["schema_version", "type", "run_id", "seq", "timestamp"]

    /// Per type: (required fields, all fields with their kinds).
    static let typeFields: [String: (required: [String], fields: [String: Kind])] = [
        "run_start": (["model", "method", "backend", "seq_len", "rank", "platform", "device_model", "os",
                       "total_ram_bytes", "budget_bytes"], [
            "model": .string(minLength: 1, maxLength: nil), "method": .choice(["mesp", "mebp", "autograd", "mezo"]),
            "backend": .choice(["executorch", "coreml", "onnx", "eager"]), "seq_len": .integer(min: 1),
            "rank": .integer(min: 1), "lcsb_k": .integer(min: 1), "targets": .strings,
            "optimizer": .choice(["sgd", "adamw"]), "lr": .number(min: 0, max: nil),
            "quant": .choice(["none", "int8", "int4"]), "compute": .choice(Compute.choices), "steps_planned": .integer(min: 0),
            "platform": .choice(["android", "ios", "linux", "macos"]), "device_model": .string(minLength: 1, maxLength: nil),
            "os": .string(minLength: 1, maxLength: nil), "total_ram_bytes": .bytes, "budget_bytes": .bytes,
            "device_profile": .string(minLength: 0, maxLength: nil), "app_version": .string(minLength: 0, maxLength: nil),
            "program": .string(minLength: 0, maxLength: nil), "config": .object,
            "planner_estimate_bytes": .bytes, "planner_basis": .string(minLength: 0, maxLength: 512),
        ]),
        "run_end": (["status", "steps_completed"], [
            "status": .choice(["completed", "failed", "cancelled", "paused"]), "steps_completed": .integer(min: 0),
            "duration_s": .number(min: 0, max: nil), "peak_bytes": .bytes, "final_loss": .numberOrNull,
            "message": .string(minLength: 0, maxLength: 4096),
        ]),
        "step": (["step", "loss", "step_time_s", "tokens_per_s"], [
            "step": .integer(min: 0), "loss": .numberOrNull, "step_time_s": .number(min: 0, max: nil),
            "tokens_per_s": .number(min: 0, max: nil), "tokens": .integer(min: 0), "lcsb_phase": .integer(min: 0),
            "lr": .number(min: 0, max: nil),
        ]),
        "memory": (["probe"], [
            "probe": .choice(["android_proc_status", "android_debug_meminfo", "android_dumpsys", "android_activity_manager",
                              "ios_phys_footprint", "ios_os_proc_available", "linux_proc_status"]),
            "step": .integer(min: 0), "anon_bytes": .bytes, "rss_bytes": .bytes, "pss_bytes": .bytes,
            "swap_bytes": .bytes, "peak_bytes": .bytes, "available_bytes": .bytes, "low_memory": .bool,
            "trim_level": .integer(min: nil), "pressure": .choice(["normal", "warning", "critical"]), "baseline": .bool,
        ]),
        "thermal": (["state"], [
            "state": .choice(["none", "light", "moderate", "severe", "critical", "emergency", "shutdown", "nominal",
                              "fair", "serious"]),
            "headroom": .number(min: nil, max: nil), "temperature_c": .number(min: nil, max: nil),
        ]),
        "battery": (["level_pct", "charging"], [
            "level_pct": .number(min: 0, max: 100), "charging": .bool, "low_power_mode": .bool,
            "temperature_c": .number(min: nil, max: nil),
        ]),
        "error": (["message", "fatal"], [
            "message": .string(minLength: 1, maxLength: 4096), "fatal": .bool, "code": .pattern("code"),
            "step": .integer(min: 0), "log": .lines(maxItems: ErrorReport.maxLogLines, maxLength: ErrorReport.maxLogLineLength),
        ]),
        "gate": (["decision", "start_loss", "end_loss", "best_loss", "best_step", "reason"], [
            "decision": .choice(["kept", "kept_best", "rolled_back"]), "start_loss": .numberOrNull, "end_loss": .numberOrNull,
            "best_loss": .numberOrNull, "best_step": .integerOrNull(min: 0), "kept_step": .integer(min: 0),
            "reason": .string(minLength: 1, maxLength: 512), "probe": .choice(["measured", "no_probe"]),
            "probe_start_loss": .numberOrNull, "probe_end_loss": .numberOrNull, "probe_rise": .numberOrNull,
            "probe_threshold": .number(min: 0, max: nil), "forgetting": .bool,
        ]),
        "memory_adapted": (["step", "knob", "from", "to", "measured_bytes", "budget_bytes", "trigger"], [
            "step": .integer(min: 0), "knob": .choice(["layers_per_checkpoint", "lcsb_k", "seq_len"]), "from": .workingSet,
            "to": .workingSet, "measured_bytes": .bytes, "budget_bytes": .bytes, "predicted_bytes": .bytes,
            "trigger": .choice(["measured", "predicted", "os_signal"]),
        ]),
        "eval": (["step", "loss", "rows", "tokens"], [
            "step": .integer(min: 0), "loss": .numberOrNull, "rows": .integer(min: 1), "tokens": .integer(min: 1),
            "eval_time_s": .number(min: 0, max: nil),
        ]),
    ]

    /// Problems with one event (empty: valid).
    public static func errors(in event: [String: JSONValue]) -> [String] {
        var errs: [String] = []
        for key in commonRequired where event[key] == nil { errs.append("missing '\(key)'") }
        if let v = event["schema_version"], v.intValue != 1 { errs.append("schema_version must be 1") }
        guard let type = event["type"]?.stringValue, let spec = typeFields[type] else {
            errs.append("unknown type \(event["type"].map { "\($0)" } ?? "(none)")")
            return errs
        }
        for key in spec.required where event[key] == nil { errs.append("\(type): missing '\(key)'") }
        for (key, value) in event.sorted(by: { $0.key < $1.key }) {
            guard let kind = common[key] ?? spec.fields[key] else {
                errs.append("\(type): unknown field '\(key)'")
                continue
            }
            if let why = check(value, kind) { errs.append("\(key): \(why)") }
        }
        if type == "memory", !["anon_bytes", "rss_bytes", "pss_bytes", "peak_bytes", "available_bytes"].contains(where: { event[$0] != nil }) {
            errs.append("memory: needs at least one of anon_bytes, rss_bytes, pss_bytes, peak_bytes, available_bytes")
        }
        return errs
    }

    /// Problems with a POST body or example file: one event, or a non-empty array of events.
    public static func errors(inDocument data: Data) -> [String] {
        guard let doc = try? JSONValue.parse(data) else { return ["not valid JSON (NaN and Infinity are not JSON)"] }
        if let obj = doc.objectValue { return errors(in: obj) }
        guard let arr = doc.arrayValue else { return ["must be an event or an array of events"] }
        guard !arr.isEmpty else { return ["empty batch"] }
        return arr.enumerated().flatMap { i, v in
            (v.objectValue.map { errors(in: $0) } ?? ["not an object"]).map { "[\(i)] \($0)" }
        }
    }

    static func check(_ v: JSONValue, _ kind: Kind) -> String? {
        switch kind {
        case .string(let minLen, let maxLen):
            guard let s = v.stringValue else { return "must be a string" }
            if s.count < minLen { return "must not be empty" }
            if let maxLen, s.count > maxLen { return "longer than \(maxLen) characters" }
        case .choice(let options):
            guard let s = v.stringValue, options.contains(s) else { return "must be one of \(options.sorted().joined(separator: ", "))" }
        case .pattern(let name):
            guard let s = v.stringValue, matches(s, pattern: name) else { return "does not match the \(name) pattern" }
        case .integer(let minimum):
            guard let i = v.intValue, i <= maxSafeInt else { return "must be an integer" }
            if let minimum, i < minimum { return "must be >= \(minimum)" }
        case .number(let minimum, let maximum):
            guard let d = v.doubleValue else { return "must be a number" }
            if let minimum, d < minimum { return "must be >= \(minimum)" }
            if let maximum, d > maximum { return "must be <= \(maximum)" }
        case .integerOrNull(let minimum):
            if v == .null { return nil }
            guard let i = v.intValue, i <= maxSafeInt else { return "must be an integer or null" }
            if let minimum, i < minimum { return "must be >= \(minimum)" }
        case .workingSet:
            guard let o = v.objectValue else { return "must be an object" }
            if o.keys.contains(where: { !["layers_per_checkpoint", "lcsb_k", "seq_len"].contains($0) }) { return "has an unknown key" }
            for (k, x) in o {
                if k == "lcsb_k", x == .null { continue }
                guard let i = x.intValue, i >= 1 else { return "\(k) must be an integer >= 1" }
            }
        case .numberOrNull:
            if v != .null && v.doubleValue == nil { return "must be a number or null" }
        case .bool:
            if v.boolValue == nil { return "must be true or false" }
        case .bytes:
            guard let i = v.intValue, i >= 0, i <= maxSafeInt else { return "must be a byte count (integer >= 0)" }
        case .object:
            if v.objectValue == nil { return "must be an object" }
        case .strings:
            guard let a = v.arrayValue, a.allSatisfy({ $0.stringValue != nil }) else { return "must be a list of strings" }
        case .lines(let maxItems, let maxLength):
            guard let a = v.arrayValue, a.allSatisfy({ $0.stringValue != nil }) else { return "must be a list of strings" }
            if a.count > maxItems { return "more than \(maxItems) lines" }
            if a.contains(where: { $0.stringValue!.count > maxLength }) { return "a line longer than \(maxLength) characters" }
        }
        return nil
    }

    /// run_id: ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$ ; code: ^[a-z][a-z0-9_]*$
    static func matches(_ s: String, pattern: String) -> Bool {
        let u = Array(s.unicodeScalars)
        func alnum(_ c: Unicode.Scalar) -> Bool { c.isASCII && (CharacterSet.alphanumerics.contains(c)) }
        func lower(_ c: Unicode.Scalar) -> Bool { c >= "a" && c <= "z" }
        func digit(_ c: Unicode.Scalar) -> Bool { c >= "0" && c <= "9" }
        switch pattern {
        case "run_id":
            guard let first = u.first, alnum(first), u.count <= 128 else { return false }
            return u.dropFirst().allSatisfy { alnum($0) || $0 == "." || $0 == "_" || $0 == "-" }
        case "code":
            guard let first = u.first, lower(first) else { return false }
            return u.dropFirst().allSatisfy { lower($0) || digit($0) || $0 == "_" }
        default:
            return false
        }
    }
}
