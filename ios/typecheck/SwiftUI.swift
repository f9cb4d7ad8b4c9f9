// Stand-in for the part of SwiftUI (and Combine) that ios/App/Sources/TrainingController.swift uses:
// `ObservableObject`, `@Published`, `ScenePhase`. Declarations as Apple documents them (the real
// ObservableObject has an `objectWillChange` publisher with a default implementation; @Published is a
// property wrapper). Only for type-checking the controller on Linux (ios/test.sh); bodies are placeholders.

public protocol ObservableObject: AnyObject {}

@propertyWrapper
public struct Published<Value> {
    public var wrappedValue: Value
    public init(wrappedValue: Value) { self.wrappedValue = wrappedValue }
}

public enum ScenePhase: Comparable, Hashable {
    case background, inactive, active
}
