import Foundation

/// Keeps the app's large files out of iCloud / Finder backups: `isExcludedFromBackup` on each
/// directory of `AppPaths.excludedFromBackup` (programs, checkpoints, adapters), which covers every
/// file inside, set at every launch (`AppPaths.prepareDirectories(exclude:)`).
enum BackupExclusion {
    static func exclude(_ url: URL) throws {
        var values = URLResourceValues()
        values.isExcludedFromBackup = true
        var u = url
        try u.setResourceValues(values)
    }
}
