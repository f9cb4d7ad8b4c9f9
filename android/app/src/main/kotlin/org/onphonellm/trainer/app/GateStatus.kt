package org.onphonellm.trainer.app

/** The evaluation gate's line for the result screen ("rolled back: held-out 2.3100 -> 2.4000"), set when the session decides. */
object GateStatus {
    @Volatile var reason: String? = null
}
