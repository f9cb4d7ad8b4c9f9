import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Checks of a program directory's files against its manifest's `files` (path -> sha256), made
/// **once per import** and remembered in `.verified.json` beside the manifest, keyed on the
/// manifest's checksums and each file's size and modification time: a start finds the stamp and
/// hashes nothing; a re-export (new checksums) or a file replaced by hand (new size or time) is
/// hashed again.
public enum ProgramVerification {
    public static let stampName = ".verified.json"

    struct Stamp: Codable, Equatable {
        var key: String
        var files: [String: FileFacts]
    }

    struct FileFacts: Codable, Equatable {
        var size: Int
        var modified: Double
    }

    /// The sha256 of the manifest's sorted `files` entries: a new export, a new key.
    public static func key(_ manifest: Manifest) -> String {
        SHA256.hex(Data(manifest.files.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)\n" }.joined().utf8))
    }

    static func facts(_ url: URL) -> FileFacts? {
        guard let a = try? FileManager.default.attributesOfItem(atPath: url.path),
              let size = (a[.size] as? NSNumber)?.intValue else { return nil }
        return FileFacts(size: size, modified: (a[.modificationDate] as? Date)?.timeIntervalSince1970 ?? 0)
    }

    /// Whether the directory holds a stamp for this manifest whose files are unchanged since.
    public static func isVerified(directory: URL, manifest: Manifest) -> Bool {
        guard let data = try? Data(contentsOf: directory.appendingPathComponent(stampName)),
              let stamp = try? JSONDecoder().decode(Stamp.self, from: data), stamp.key == key(manifest),
              Set(stamp.files.keys) == Set(manifest.files.keys) else { return false }
        return manifest.files.keys.allSatisfy { facts(directory.appendingPathComponent($0)) == stamp.files[$0] }
    }

    /// Hash every file the manifest lists (`progress(bytesDone, bytesTotal)`), refuse a missing or
    /// changed one, and write the stamp.
    public static func verify(directory: URL, manifest: Manifest, progress: ((Int, Int) -> Void)? = nil) throws {
        let names = manifest.files.keys.sorted()
        var sizes: [String: FileFacts] = [:]
        for name in names {
            guard let f = facts(directory.appendingPathComponent(name)) else {
                throw TrainerError.io("\(name) is missing from the program \(directory.lastPathComponent); import or copy the whole program directory")
            }
            sizes[name] = f
        }
        let total = sizes.values.reduce(0) { $0 + $1.size }
        var done = 0
        for name in names {
            let url = directory.appendingPathComponent(name)
            let before = done
            let sha = try hashFile(url) { progress?(before + $0, total) }
            done += sizes[name]!.size
            progress?(done, total)
            guard sha == manifest.files[name] else {
                throw TrainerError.badInput("\(name) of \(directory.lastPathComponent) does not match its checksum in manifest.json " +
                                            "(a partial copy, or a file of another export); copy the program again")
            }
        }
        let stamp = try JSONEncoder().encode(Stamp(key: key(manifest), files: sizes))
        try stamp.write(to: directory.appendingPathComponent(stampName), options: .atomic)
    }

    /// Verify unless already verified; returns true when it hashed.
    @discardableResult
    public static func ensureVerified(directory: URL, manifest: Manifest, progress: ((Int, Int) -> Void)? = nil) throws -> Bool {
        if isVerified(directory: directory, manifest: manifest) { return false }
        try verify(directory: directory, manifest: manifest, progress: progress)
        return true
    }

    /// sha256 of a file, memory-mapped (clean file pages, not app memory); `progress(bytes)`.
    public static func hashFile(_ url: URL, progress: ((Int) -> Void)? = nil) throws -> String {
        let fd = open(url.path, O_RDONLY)
        guard fd >= 0 else { throw TrainerError.io("cannot open \(url.path)") }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0 else { throw TrainerError.io("cannot stat \(url.path)") }
        let size = Int(st.st_size)
        if size == 0 { return SHA256.hex(Data()) }
        guard let p = mmap(nil, size, PROT_READ, MAP_PRIVATE, fd, 0), p != MAP_FAILED else { throw TrainerError.io("cannot map \(url.path)") }
        defer { munmap(p, size) }
        return SHA256.digest(UnsafeRawBufferPointer(start: p, count: size), progress: progress).map { String(format: "%02x", $0) }.joined()
    }
}

/// A program directory brought in from outside the app (a folder picked with `fileImporter`: Files,
/// iCloud Drive, a USB drive): checked, copied into Documents/Programs/<name> file by file with
/// progress, verified once (`ProgramVerification`) and only then moved into place, so a failed or
/// cancelled import leaves nothing behind and the program list never shows half a program.
public enum ProgramImport {
    public struct Progress: Equatable {
        public enum Phase: String, Equatable { case checking, copying, verifying, done }
        public var phase: Phase
        public var bytesDone: Int
        public var bytesTotal: Int
        public var file: String
        public var fraction: Double { bytesTotal > 0 ? min(1, Double(bytesDone) / Double(bytesTotal)) : 0 }
        public init(phase: Phase, bytesDone: Int, bytesTotal: Int, file: String) {
            (self.phase, self.bytesDone, self.bytesTotal, self.file) = (phase, bytesDone, bytesTotal, file)
        }
    }

    /// A program name from a folder name: letters, digits, '.', '_', '-' (others become '_').
    public static func programName(_ folder: String) -> String {
        let cleaned = String(folder.unicodeScalars.map { c -> Character in
            c.isASCII && (CharacterSet.alphanumerics.contains(c) || "._-".unicodeScalars.contains(c)) ? Character(c) : "_"
        })
        let trimmed = cleaned.trimmingCharacters(in: CharacterSet(charactersIn: "."))
        return trimmed.isEmpty ? "program" : String(trimmed.prefix(100))
    }

    /// What would be copied: manifest.json and every file the manifest lists, with their sizes;
    /// refuses a folder that is not a program of this contract (manifest schema_version 3) or lacks a listed file.
    public static func check(source: URL) throws -> (manifest: Manifest, files: [(name: String, size: Int)]) {
        guard FileManager.default.fileExists(atPath: source.appendingPathComponent(Contract.manifestName).path) else {
            throw TrainerError.badInput("\(source.lastPathComponent) has no manifest.json: pick the folder `toolchain export --out` wrote")
        }
        let manifest = try Manifest.load(directory: source)
        guard !manifest.files.isEmpty else {
            throw TrainerError.badInput("the manifest of \(source.lastPathComponent) lists no files; re-export it with this toolchain")
        }
        var files: [(String, Int)] = []
        for name in [Contract.manifestName] + manifest.files.keys.sorted() {
            guard !name.hasPrefix("/"), !name.split(separator: "/").contains("..") else {
                throw TrainerError.badInput("the manifest lists \(name), outside the program folder")
            }
            guard let f = ProgramVerification.facts(source.appendingPathComponent(name)) else {
                throw TrainerError.io("\(name) is missing from \(source.lastPathComponent) (a partial copy? wait for iCloud to download it)")
            }
            files.append((name, f.size))
        }
        return (manifest, files)
    }

    /// Import `source` into `programs` as `name` (default: `programName(source.lastPathComponent)`).
    /// `replace`: an existing program of that name is replaced (its checkpoint stays; the export's
    /// sha256 in it refuses a different export). `cancel`: checked between chunks; throws. Returns
    /// the name.
    @discardableResult
    public static func run(source: URL, into programs: URL, name: String? = nil, replace: Bool = false,
                           chunkBytes: Int = 8 << 20, progress: ((Progress) -> Void)? = nil,
                           cancel: (() -> Bool)? = nil) throws -> String {
        let name = programName(name ?? source.lastPathComponent)
        let fm = FileManager.default
        let final = programs.appendingPathComponent(name)
        if fm.fileExists(atPath: final.path) && !replace {
            throw TrainerError.badInput("a program named \(name) is already there; delete it or import with another name")
        }
        progress?(Progress(phase: .checking, bytesDone: 0, bytesTotal: 0, file: Contract.manifestName))
        let (manifest, files) = try check(source: source)
        let total = files.reduce(0) { $0 + $1.size }
        if let free = freeBytes(at: programs), free < Int64(total) + (64 << 20) {
            throw TrainerError.io("the program needs \(total >> 20) MB and the phone has \(free >> 20) MB free; free some space and import again")
        }
        try fm.createDirectory(at: programs, withIntermediateDirectories: true)
        let staging = programs.appendingPathComponent(".import-\(UUID().uuidString)")
        try fm.createDirectory(at: staging, withIntermediateDirectories: true)
        var moved = false
        defer { if !moved { try? fm.removeItem(at: staging) } }
        var done = 0
        for (file, size) in files {
            let to = staging.appendingPathComponent(file)
            try fm.createDirectory(at: to.deletingLastPathComponent(), withIntermediateDirectories: true)
            try copy(source.appendingPathComponent(file), to: to, chunkBytes: chunkBytes, cancel: cancel) { n in
                progress?(Progress(phase: .copying, bytesDone: done + n, bytesTotal: total, file: file))
            }
            done += size
        }
        try ProgramVerification.verify(directory: staging, manifest: manifest) { d, t in
            progress?(Progress(phase: .verifying, bytesDone: d, bytesTotal: t, file: ""))
        }
        if fm.fileExists(atPath: final.path) { try fm.removeItem(at: final) }
        try fm.moveItem(at: staging, to: final)
        moved = true
        progress?(Progress(phase: .done, bytesDone: total, bytesTotal: total, file: ""))
        return name
    }

    static func copy(_ from: URL, to: URL, chunkBytes: Int, cancel: (() -> Bool)?, progress: (Int) -> Void) throws {
        guard let input = FileHandle(forReadingAtPath: from.path) else { throw TrainerError.io("cannot read \(from.path)") }
        defer { try? input.close() }
        guard FileManager.default.createFile(atPath: to.path, contents: nil), let output = FileHandle(forWritingAtPath: to.path) else {
            throw TrainerError.io("cannot write \(to.path)")
        }
        defer { try? output.close() }
        var n = 0
        while true {
            if cancel?() == true { throw TrainerError.io("import cancelled") }
            let chunk = try input.read(upToCount: max(1, chunkBytes)) ?? Data()
            if chunk.isEmpty { break }
            try output.write(contentsOf: chunk)
            n += chunk.count
            progress(n)
        }
    }

    static func freeBytes(at url: URL) -> Int64? {
        var dir = url
        while !FileManager.default.fileExists(atPath: dir.path) && dir.path != "/" { dir = dir.deletingLastPathComponent() }
        guard let a = try? FileManager.default.attributesOfFileSystem(forPath: dir.path) else { return nil }
        return (a[.systemFreeSize] as? NSNumber)?.int64Value
    }
}

/// A text or chat file the user picked, read off the main thread with a size cap: above
/// `maxBytes` it is refused with a message that says how big it is and what to do, instead of a
/// frozen screen (a cloud file is downloaded by the read; the app calls this on its work queue).
public enum UserTextFile {
    /// 32 MiB: far more text than a run trains on (Qwen2.5-0.5B at seq 256: ~400 k rows).
    public static let defaultMaxBytes = 32 << 20

    public static func read(_ url: URL, maxBytes: Int = defaultMaxBytes) throws -> String {
        let size = ProgramVerification.facts(url)?.size
        if let size, size > maxBytes {
            throw TrainerError.badInput("\(url.lastPathComponent) is \(megabytes(size)); the app takes text files up to \(megabytes(maxBytes)). " +
                                        "Pick a part of it, or turn it into rows on your computer (toolchain data) and push them")
        }
        let data: Data
        do { data = try Data(contentsOf: url) } catch {
            throw TrainerError.io("cannot read \(url.lastPathComponent): \(error.localizedDescription)")
        }
        guard data.count <= maxBytes else {
            throw TrainerError.badInput("\(url.lastPathComponent) is more than \(megabytes(maxBytes)); the app takes text files up to \(megabytes(maxBytes))")
        }
        guard let text = String(data: data, encoding: .utf8) else {
            throw TrainerError.badInput("\(url.lastPathComponent) is not UTF-8 text")
        }
        return text
    }

    static func megabytes(_ n: Int) -> String { String(format: "%.1f MB", Double(n) / 1_048_576) }
}

/// The exported adapter folder before it is handed to the share sheet / Files (`ShareLink`,
/// `fileExporter`): its size, measured off the main thread; above `maxBytes` the screen offers no
/// share and says how to get it instead (a large-rank adapter of a 3B model can reach GBs).
public enum AdapterExport {
    /// 1 GiB: what the share sheet and AirDrop handle without trouble.
    public static let defaultMaxBytes = 1 << 30

    /// Bytes of every file in the folder.
    public static func size(of directory: URL) throws -> Int {
        var isDir: ObjCBool = false
        guard FileManager.default.fileExists(atPath: directory.path, isDirectory: &isDir), isDir.boolValue,
              let names = FileManager.default.enumerator(atPath: directory.path)?.allObjects.compactMap({ $0 as? String }) else {
            throw TrainerError.io("cannot list the adapter folder \(directory.path)")
        }
        return names.compactMap { ProgramVerification.facts(directory.appendingPathComponent($0)) }
            .filter { $0.size > 0 }.reduce(0) { $0 + $1.size }
    }

    /// nil when the folder can be shared, else the message the screen shows.
    public static func refusal(bytes: Int, maxBytes: Int = defaultMaxBytes) -> String? {
        guard bytes > maxBytes else { return nil }
        return "The adapter is \(UserTextFile.megabytes(bytes)), more than the \(UserTextFile.megabytes(maxBytes)) the share sheet takes; " +
            "pull it to your computer with scripts/ios/pull_telemetry.sh --adapters (or Files > On My iPhone > LoRA Trainer > Adapters)"
    }
}
