"""Device profiles: how much memory a training run may use on a class of phone.

A profile (`shared_schemas/device_profile.schema.json`) lists the headroom the OS, the user's
foreground app and the OS's killer need, each item with its basis (documented / measured /
estimate) and sources; the budget is what remains, capped by the OS's per-app limit when it has
one. The shipped profiles (6, 8 and 12 GB; Android and iOS) live in `device_profiles/` beside
this module; `--device` takes one of their names or the path of a custom profile.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from toolchain.errors import BadInput, SchemaError
from toolchain.schemas import read_json

__all__ = ["PROFILE_DIR", "DeviceProfile", "profile_names", "load_profile"]

PROFILE_DIR = Path(__file__).resolve().parent / "device_profiles"
_TOLERANCE_MB = 0.5


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    platform: str
    total_ram_mb: float
    budget_mb: float
    per_app_limit_mb: float | None
    headroom_mb: dict[str, float]    # item name -> MB
    doc: dict                        # the whole validated JSON document

    @property
    def estimated_items(self) -> list[str]:
        return [h["name"] for h in self.doc["headroom"] if h["basis"] == "estimate"]


def profile_names() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def _check_arithmetic(doc: dict, where: str) -> None:
    rest = doc["total_ram_mb"] - sum(h["mb"] for h in doc["headroom"])
    limit = doc.get("per_app_limit_mb")
    expected = rest if limit is None else min(rest, limit)
    if abs(doc["budget_mb"] - expected) > _TOLERANCE_MB:
        raise SchemaError(f"{where}: budget_mb {doc['budget_mb']} != total_ram_mb - headroom"
                          f"{' (capped by per_app_limit_mb)' if limit is not None else ''} = {expected}; fix the profile")
    if expected <= 0:
        raise SchemaError(f"{where}: the headroom items exceed total_ram_mb; fix the profile")
    sources = {s["id"] for s in doc["sources"]}
    unknown = sorted({s for h in doc["headroom"] for s in h["sources"]} - sources)
    if unknown:
        raise SchemaError(f"{where}: headroom cites unknown source ids {', '.join(unknown)}; add them to `sources`")


def load_profile(name_or_path: str | Path) -> DeviceProfile:
    """A shipped profile by name (e.g. 'android-8gb') or a profile JSON file by path.

    Raises:
        BadInput: neither a known name nor an existing file.
        SchemaError: the file violates the schema, or its budget arithmetic or citations do not add up.
    """
    text = str(name_or_path)
    path = Path(text)
    if not (text.endswith(".json") or path.is_file()):
        if text not in profile_names():
            raise BadInput(f"unknown device profile {text!r}; choose {', '.join(profile_names())} or pass a JSON file")
        path = PROFILE_DIR / f"{text}.json"
    doc = read_json(path, "device_profile")
    _check_arithmetic(doc, str(path))
    return DeviceProfile(name=doc["name"], platform=doc["platform"], total_ram_mb=float(doc["total_ram_mb"]),
                         budget_mb=float(doc["budget_mb"]), per_app_limit_mb=doc.get("per_app_limit_mb"),
                         headroom_mb={h["name"]: float(h["mb"]) for h in doc["headroom"]}, doc=doc)
