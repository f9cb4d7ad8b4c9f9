import Foundation

/// The program directory contract, as `toolchain/contract` names it (docs/architecture.md maps every name
/// across Python, Kotlin and Swift): the file names (contract/files.py) the method roles
/// (contract/methods.py) and the chat markers (contract/chat.py). The typed manifest is `Manifest` (contract/manifest.py), its methods
/// `MethodSpec` with `IoSpec`s, its state layout `StateEntry`s (contract/state.py), its sections
/// `ModelSection`, `GenerateSection`, `FusedSection`, ... as in Python.
public enum Contract {
    /// files.py MANIFEST_NAME.
    public static let manifestName = "manifest.json"
    /// files.py MANIFEST_SCHEMA_VERSION: the manifest version this app runs (3: layer-generic methods,
    /// weights as inputs).
    public static let manifestSchemaVersion = 3
    /// files.py LAYER: the placeholder in the manifest's per-layer names (`weights.layer_placeholder`).
    public static let layer = "{layer}"
    /// methods.py TRAINING_ROLES: the training methods, in the order one step calls them
    /// (`block_skip_update` only when the loop moves unselected layers).
    public static let trainingRoles = ["embed", "block_forward", "head_loss", "block_backward", "block_skip_update"]
    /// methods.py GENERATION_ROLES: the roles of the methods generation calls: the chunked prefill
    /// (`embed_prefill`, then per layer `block_prefill`; `head_logits` of the prompt's last row) and each
    /// decode step (`embed_token`, per layer `block_decode`, `head_logits`). The one list of them:
    /// `LayerLoop.loadGeneration`, `Manifest.canGenerate` / `generationMethods` and the state a
    /// generation snapshot keeps read it; `LayerLoop.generate` is the one place they are called.
    public static let generationRoles = ["embed_token", "embed_prefill", "block_prefill", "block_decode", "head_logits"]
    /// chat.py IM_START / IM_END: the ChatML turn markers (`<|im_start|>{role}\n{content}<|im_end|>\n`).
    public static let imStart = "<|im_start|>"
    public static let imEnd = "<|im_end|>"
    /// chat.py ASSISTANT_HEADER: the generation prompt after the last turn; generation stops at `imEnd` (or eos).
    public static let assistantHeader = imStart + "assistant\n"
    /// The held-out rows a held-out loss reads: the first this many of the run's held-out rows (a seeded
    /// random draw already, so a random sample). A phone's forward pass of the 0.5B program is seconds a
    /// row: uncapped, 10% of a 32 MB text is hours before the first step. The Android app's
    /// Contract.HELD_OUT_EVAL_ROWS is the same number (docs/ios.md "held-out loss").
    public static let heldOutEvalRows = 32
    /// The learning rate of a run on a program whose manifest records none (`toolchain export --lr`'s default).
    public static let fallbackLr = 1e-4
    /// A run's steps when neither the user nor the manifest (`defaults.steps`) gives them (Contract.FALLBACK_STEPS on Android).
    public static let fallbackSteps = 100
}
