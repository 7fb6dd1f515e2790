"""Field types of a manifest read from disk: a damaged or hand-edited manifest.json is a one-line
BundleError, never a crash (exit 3) further on."""

from __future__ import annotations

from typing import Any

from vitedge.errors import BundleError
from vitedge.spec import ModelSpec


def check_field_types(d: dict[str, Any], sections: tuple[str, ...]) -> None:
    """Each section an object, `files` a map of path -> sha256 text, artifact roles text: a damaged or hand-edited
    manifest is a one-line BundleError, never a crash further on."""
    def bad(what: str, value: Any, expected: str) -> BundleError:
        return BundleError(f"manifest.json: '{what}' is {type(value).__name__} {str(value)[:40]!r}, expected {expected}; "
                           "the bundle is damaged or was edited by hand: rebuild it")

    for key in sections + ("backend_info", "files"):
        if key in d and d[key] is not None and not isinstance(d[key], dict):
            raise bad(key, d[key], "an object")
    if d.get("validation") is not None and not isinstance(d["validation"], dict):
        raise bad("validation", d["validation"], "an object")
    for rel, digest in (d.get("files") or {}).items():
        if not isinstance(digest, str):
            raise bad(f"files.{rel}", digest, "a sha256 string")
    for role in ("model", "reference", "qdq", "fp32_onnx"):
        value = d["artifacts"].get(role)
        if value is not None and not isinstance(value, str):
            raise bad(f"artifacts.{role}", value, "a file name")
    spec = d["model"].get("spec")
    if not isinstance(spec, dict):
        raise bad("model.spec", spec, "an object")
    try:
        ModelSpec.from_dict(spec)
    except Exception as err:  # noqa: BLE001 - any malformed field is the file's fault
        raise BundleError(f"manifest.json: 'model.spec' is malformed ({type(err).__name__}: {str(err)[:80]}); "
                          "the bundle is damaged or was edited by hand: rebuild it") from None
