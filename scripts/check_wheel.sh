#!/usr/bin/env bash
# The package as users install it, not the source tree: build the wheel from a copy of the tree,
# install it non-editable (no deps: they come from .venv) into a throwaway directory, and run the
# installed package, asserting it is the one imported. Checks: the schemas ship as package data (a
# schema-checked bad data row gives the one-line `Error:` and exit 2; a valid manifest validates) and
# the bundled assets load. Called by .ci/run after `make test`; takes well under a minute.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
py="$root/.venv/bin/python"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/src" "$tmp/dist" "$tmp/run"
# A copy, so the build leaves nothing (build/, *.egg-info) in the working tree.
tar -C "$root" --exclude=./.venv --exclude=./.git --exclude=./build --exclude='./*.egg-info' --exclude=./out \
    --exclude='__pycache__' -cf - . | tar -C "$tmp/src" -xf -
"$py" -m pip wheel -q --no-deps --no-build-isolation -w "$tmp/dist" "$tmp/src"
"$py" -m pip install -q --no-deps --no-index --target "$tmp/site" "$tmp/dist"/toolchain-*.whl
rm -rf "$tmp/src"  # nothing of the tree is left to import from

export PYTHONPATH="$tmp/site"
cd "$tmp/run"
"$py" - "$tmp/site" <<'PY'
import sys
import toolchain
from importlib import resources
assert toolchain.__file__.startswith(sys.argv[1]), f"imported {toolchain.__file__}, not the installed wheel"
schemas = resources.files("toolchain").joinpath("schemas_data")
assert schemas.is_dir() and not __import__("os").path.islink(str(schemas)), "schemas_data is not a real directory"
print(f"wheel: toolchain imported from {toolchain.__file__}")
PY

printf '{"input_ids": "not a list"}\n' > bad.jsonl
set +e
"$py" -m toolchain grads --model tiny --init random --data bad.jsonl --mode mesp --out grads.safetensors \
    >stdout.txt 2>stderr.txt
rc=$?
set -e
if [ "$rc" -ne 2 ] || [ "$(wc -l < stderr.txt)" -ne 1 ] || ! grep -q '^Error: .*not of type' stderr.txt \
    || [ -s stdout.txt ] || [ -e grads.safetensors ]; then
  echo "wheel: bad-input grads should exit 2 with one Error: line and write nothing; got exit $rc:" >&2
  cat stderr.txt >&2
  exit 1
fi
echo "wheel: bad input -> $(cat stderr.txt) (exit 2)"

"$py" - "$root/shared_schemas/examples" <<'PY'
import json
import sys
from pathlib import Path

from toolchain.text.dataset import bundled_corpus
from toolchain.errors import SchemaError
from toolchain.schemas import validate

examples = Path(sys.argv[1])
validate("manifest", json.loads((examples / "manifest_tiny.json").read_text()))
validate("telemetry_event", json.loads((examples / "telemetry_memory_host.json").read_text()))
try:
    validate("step_plan", {"schema_version": 1})
except SchemaError as e:
    print(f"wheel: packaged schemas validate (an invalid plan: {str(e)[:60]}...)")
else:
    raise SystemExit("wheel: an invalid step plan passed validation")
assert bundled_corpus(), "bundled corpus missing from the wheel"
PY
