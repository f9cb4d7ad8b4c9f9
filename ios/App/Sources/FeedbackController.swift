import Foundation
import SwiftUI
import TrainerCore

/// The keep / edit / discard buttons under a generation and the feedback file they append to
/// (`AppPaths.feedbackLog`, TrainerCore's `GenerationFeedback`: one schema-valid record per generation). The
/// generation queue offers each finished generation (`generated`, the trained adapter's side, else the initial
/// one's when there is no trained adapter yet); a tap writes on `io` and the screen follows `pending` / `note`.
@MainActor
final class FeedbackController: ObservableObject {
    /// The response the buttons answer (nil: none finished, or answered already).
    @Published private(set) var pending: GenerationFeedback.Offer?
    @Published private(set) var note = "Feedback: none yet"
    /// The file has records (the share button shows).
    @Published private(set) var hasRecords = false

    nonisolated let url: URL
    private nonisolated let feedback: GenerationFeedback?
    private let io = DispatchQueue(label: "org.onphonellm.trainer.feedback", qos: .userInitiated)

    init(paths: AppPaths) {
        url = paths.feedbackLog
        do {
            feedback = try GenerationFeedback(log: FeedbackLog(url: url))
        } catch {
            feedback = nil
            note = "Feedback cannot be saved: \(error)"
        }
        refresh()
    }

    /// A generation was requested: no buttons until it finishes.
    nonisolated func cleared() {
        feedback?.cleared()
        DispatchQueue.main.async { self.show() }
    }

    /// A generation ended (on the generation queue): the response the buttons are for, unless it was cancelled.
    nonisolated func generated(prompt: String, chat: Bool, _ g: Generation) {
        feedback?.generated(prompt: prompt, chat: chat, response: g.text, complete: g.stop != .cancelled)
        DispatchQueue.main.async { self.show() }
    }

    /// Keep (`.accept`), Discard (`.reject`) or the editor's Save (`.edit` with its text; unchanged: a keep).
    func tap(_ action: FeedbackAction, edited: String? = nil) {
        guard let feedback else { return }
        pending = nil  // one record per generation: no double tap
        io.async { [weak self] in
            let failure: String?
            do { try feedback.record(action, edited: edited); failure = nil } catch { failure = "Feedback not saved: \(error)" }
            DispatchQueue.main.async { self?.refresh(failure) }
        }
    }

    private func show() { pending = feedback?.pending }

    /// The counts by action (read on `io`), then the buttons.
    func refresh(_ failure: String? = nil) {
        show()
        guard let feedback else { return }
        let answered = feedback.lastAnswer
        io.async { [weak self] in
            let counts = try? feedback.log.counts()
            DispatchQueue.main.async {
                guard let self else { return }
                let total = counts?.values.reduce(0, +) ?? 0
                self.hasRecords = total > 0
                var text = counts.map { "Feedback: " + FeedbackLog.summary($0) } ?? "Feedback: the file cannot be read"
                if let answered, self.pending == nil { text += " (this one: \(answered.rawValue))" }
                self.note = failure ?? text
            }
        }
    }
}
