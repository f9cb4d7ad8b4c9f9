import SwiftUI
import TrainerCore

/// Keep / Edit… / Discard under the generation (one record each in Documents/Feedback/feedback.jsonl), the counts,
/// and the file to the share sheet (AirDrop it to the computer: `toolchain data --program P --feedback feedback.jsonl`).
struct FeedbackSection: View {
    @ObservedObject var feedback: FeedbackController
    @State private var editing = false
    @State private var editedText = ""

    var body: some View {
        if let offer = feedback.pending {
            HStack {
                Button("Keep") { feedback.tap(.accept) }
                Button("Edit…") { editedText = offer.response; editing = true }
                Button("Discard", role: .destructive) { feedback.tap(.reject) }
            }
            .buttonStyle(.bordered)
            .sheet(isPresented: $editing) {
                NavigationStack {
                    TextEditor(text: $editedText)
                        .padding()
                        .navigationTitle("Edit the response")
                        .toolbar {
                            ToolbarItem(placement: .cancellationAction) { Button("Cancel") { editing = false } }
                            ToolbarItem(placement: .confirmationAction) {
                                Button("Save") { editing = false; feedback.tap(.edit, edited: editedText) }
                                    .disabled(editedText.isEmpty)
                            }
                        }
                }
            }
        }
        Text(feedback.note).font(.caption).foregroundStyle(.secondary)
        if feedback.hasRecords {
            ShareLink("Share feedback (JSONL)", item: feedback.url)
        }
    }
}
