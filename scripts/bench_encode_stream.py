"""Throughput and peak memory of `toolchain data --text` and `toolchain tokenize` on large plain text
(issue 27's "time bound as a benchmark"; the figures are in docs/data.md).

    .venv/bin/python scripts/bench_encode_stream.py --mb 50 [--source prose|corpus] [--work DIR]

Writes two texts of MB megabytes (`make_text`: one with a newline between lines, one without any
newline), then runs each command under `/usr/bin/time -v` and prints
MB/s over CPU time (user + sys: one core, whatever else the machine runs), MB/s over wall time, and the
maximum RSS. Commands: `data` on an exported `tiny` program (byte tokenizer; exported here once),
`tokenize --tokenizer qwen2.5 --json` (which builds the tokenizer from the ranks: 2.4 s of start-up), and
what `data --text --program QWEN_PROGRAM` runs (`text_data.write_text_rows` with the program's tokenizer.json
loaded, seq_len 256; run as a library call, so no exported Qwen-vocabulary program is needed).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOLCHAIN = [sys.executable, "-m", "toolchain"]
# What `data --text --program P` runs for a Qwen program P (its tokenizer.json loaded, rows of seq_len 256).
QWEN_ROWS = ("import sys; from pathlib import Path; from toolchain.text.text_data import ProgramText, write_text_rows; "
             "from toolchain.text.tokenizer import HFTokenizer; t = HFTokenizer.from_file(Path(sys.argv[3]), "
             "kind='qwen2.5', pad_id=151643, eos_id=151643); "
             "print(write_text_rows(ProgramText(t, 256, 151936), Path(sys.argv[1]), Path(sys.argv[2])))")


def make_text(path: Path, mb: int, sep: str, source: str, seed: int = 0) -> None:
    """`prose`: lines of 12 words drawn from the repository's documentation; `corpus`: the tokenizer corpus's
    cases (CJK, emoji, odd Unicode: the hard end). `sep` between lines (a space: no newline at all)."""
    if source == "corpus":
        lines = [json.loads(line) for line in (ROOT / "shared_schemas/tokenizer_corpus/cases.jsonl").read_text(
            encoding="utf-8").splitlines()]
    else:
        words = " ".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md"))).split()
        lines = [" ".join(random.Random(i).choices(words, k=12)) for i in range(5000)]
    lines = [c.replace("\r", " ").replace("\n", " ") if sep == " " else c for c in lines]
    rng, size = random.Random(seed), 0
    with open(path, "w", encoding="utf-8") as f:
        while size < mb * 10**6:
            chunk = sep.join(rng.sample(lines, len(lines))) + sep
            f.write(chunk)
            size += len(chunk.encode())


def timed(argv: list[str], cwd: Path) -> dict:
    proc = subprocess.run(["/usr/bin/time", "-v", *argv], cwd=cwd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv)} failed:\n{proc.stderr[-2000:]}")
    get = lambda key: re.search(rf"{key}: (.*)", proc.stderr).group(1)  # noqa: E731
    wall = get(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\)").split(":")
    return {"cpu_s": float(get("User time \\(seconds\\)")) + float(get("System time \\(seconds\\)")),
            "wall_s": sum(float(x) * 60 ** i for i, x in enumerate(reversed(wall))),
            "max_rss_mb": int(get("Maximum resident set size \\(kbytes\\)")) / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=50)
    ap.add_argument("--source", choices=["prose", "corpus"], default="prose")
    ap.add_argument("--work", type=Path, default=None)
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-text-"))
    work.mkdir(parents=True, exist_ok=True)
    tiny = work / "tiny"
    if not tiny.exists():
        subprocess.run([*TOOLCHAIN, "export", "--model", "tiny", "--init", "random", "--seq-len", "256",
                        "--target", "onnx", "--quant", "none", "--out", str(tiny)], check=True, capture_output=True)
    if not (work / "tokenizer.json").exists():
        from toolchain.text.qwen_vocab import qwen_tokenizer

        (work / "tokenizer.json").write_text(qwen_tokenizer().to_json(), encoding="utf-8")
    for name, sep in (("newlines", "\n"), ("no-newline", " ")):
        text = work / f"{args.source}-{args.mb}-{name}.txt"
        if not text.exists():
            make_text(text, args.mb, sep, args.source)
        mb = text.stat().st_size / 10**6
        runs = {"data --text (byte, tiny)": [*TOOLCHAIN, "data", "--program", str(tiny), "--text", str(text),
                                             "--out", str(work / "rows.jsonl"), "--force"],
                "tokenize --tokenizer qwen2.5": [*TOOLCHAIN, "tokenize", "--tokenizer", "qwen2.5", "--json",
                                                 str(work / f"ids-{name}.json"), str(text)],
                "data --text (qwen2.5 program)": [sys.executable, "-c", QWEN_ROWS, str(text), str(work / "q.jsonl"),
                                                  str(work / "tokenizer.json")]}
        for what, argv in runs.items():
            (work / f"ids-{name}.json").unlink(missing_ok=True)
            t = timed(argv, work)
            print(f"{name:10s} {mb:6.1f} MB  {what:30s} {mb / t['cpu_s']:5.1f} MB/s cpu  {mb / t['wall_s']:5.1f} MB/s "
                  f"wall  max RSS {t['max_rss_mb']:6.0f} MB", flush=True)


if __name__ == "__main__":
    main()
