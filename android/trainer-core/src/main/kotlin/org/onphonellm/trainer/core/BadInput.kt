package org.onphonellm.trainer.core

/** An error in what the user or a file gave (bad JSON, a missing field, an inconsistent manifest, a bad option), shown as one line. */
class BadInput(message: String) : Exception(message)
