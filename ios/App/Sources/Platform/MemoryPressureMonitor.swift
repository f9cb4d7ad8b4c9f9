import Dispatch
import Foundation
import TrainerCore
import UIKit

/// The OS's memory-pressure level (DispatchSource.makeMemoryPressureSource) and memory warnings
/// (UIApplication.didReceiveMemoryWarningNotification), readable from any thread.
final class MemoryPressureMonitor {
    private let lock = NSLock()
    private var current: MemoryPressure = .normal
    private var warned = false
    private var source: DispatchSourceMemoryPressure?
    private var observer: NSObjectProtocol?

    var level: MemoryPressure { lock.lock(); defer { lock.unlock() }; return current }
    var receivedWarning: Bool { lock.lock(); defer { lock.unlock() }; return warned }

    func start() {
        guard source == nil else { return }
        let s = DispatchSource.makeMemoryPressureSource(eventMask: [.normal, .warning, .critical], queue: .global(qos: .utility))
        s.setEventHandler { [weak self, weak s] in
            guard let self, let event = s?.data else { return }
            let level: MemoryPressure = event.contains(.critical) ? .critical : event.contains(.warning) ? .warning : .normal
            self.lock.lock()
            self.current = level
            if level == .normal { self.warned = false }
            self.lock.unlock()
        }
        s.activate()
        source = s
        observer = NotificationCenter.default.addObserver(
            forName: UIApplication.didReceiveMemoryWarningNotification, object: nil, queue: nil
        ) { [weak self] _ in
            guard let self else { return }
            self.lock.lock()
            self.warned = true
            self.lock.unlock()
        }
    }

    deinit {
        source?.cancel()
        if let observer { NotificationCenter.default.removeObserver(observer) }
    }
}
