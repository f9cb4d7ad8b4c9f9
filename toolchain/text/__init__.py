"""The user's-text stage: training rows from JSONL files and plain or chat text (`dataset`, `text_data`),
large texts encoded in bounded memory (`encode_stream`), generated ids decoded as they arrive
(`decode_stream`: `IncrementalTextDecoder`, `GeneratedToken`), the tokenizers (`tokenizer`) and the seeded
permutation the host and the apps share (`shuffle`)."""
