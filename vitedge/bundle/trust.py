"""How far a bundle's manifest.json is trusted (see docs/reliability.md, "What the manifest protects").

* Paths: every artifact and file the manifest names must be a relative path that stays inside the
  bundle, symlinks resolved; a manifest naming ``../other/model.int8.onnx`` is refused.
* Gate thresholds: `validate` gates with the thresholds the build gated with (its validation record),
  not with a profile edited afterwards, and says so when the two differ.
* Signature hook: with ``VITEDGE_SIGNING_KEY`` set, every manifest written is signed
  (``manifest.sig``, HMAC-SHA256 of manifest.json) and every bundle read must carry a valid signature.
  Without a key the sha256 hashes catch corruption and edits of artifact files, not an editor who
  also rewrites manifest.json.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import os
import posixpath
from pathlib import Path
from typing import Any

from vitedge.core.errors import BundleError, UsageError
from vitedge.files.atomic import atomic_write_path
from vitedge.core.json_sections import ABSENT
from vitedge.files.safefile import MAX_DOCUMENT_BYTES, read_bounded

SIGNATURE = "manifest.sig"
SIGNATURE_BYTES = 4096  # 64 hex digits and a newline
KEY_ENV = "VITEDGE_SIGNING_KEY"
# every gate field the build recorded: validate gates with the build's own (the near-tie gate's two included)
_GATE_KEYS = ("max_top1_drop", "min_agreement", "min_speedup", "max_p99_ms", "near_tie_margin", "drop_confidence",
              "min_decisive_agreement")


def named_paths(manifest) -> list[tuple[str, Any]]:
    """(what, path) for every path manifest.json names."""
    arts = manifest.artifacts  # vitedge.bundle.sections.ArtifactsSection
    roles = [(role, getattr(arts, role)) for role in ("model", "reference", "qdq", "fp32_onnx")]
    named = [(f"artifacts.{role}", rel) for role, rel in roles if rel is not None and rel is not ABSENT]
    extra = arts.extra or []
    named += [("artifacts.extra", p) for p in (extra if isinstance(extra, list) else [extra])]
    files = manifest.files if isinstance(manifest.files, dict) else {}
    named += [("files", p) for p in files]
    return named


def check_contained(bundle: Path, manifest) -> None:
    """A one-line BundleError when manifest.json names a path outside the bundle."""
    root = Path(bundle).resolve()
    for what, rel in named_paths(manifest):
        if not isinstance(rel, str) or not rel or "\\" in rel or "\x00" in rel:
            raise BundleError(f"{bundle}: manifest.json {what} names {rel!r}, not a relative file path; rebuild the bundle")
        norm = posixpath.normpath(rel)
        if posixpath.isabs(rel) or norm == ".." or norm.startswith("../"):
            raise BundleError(f"{bundle}: manifest.json {what} names '{rel}', outside the bundle; vitedge loads only files inside "
                              "the bundle folder: rebuild the bundle")
        resolved = (root / rel).resolve()
        if resolved != root and root not in resolved.parents:
            raise BundleError(f"{bundle}: '{rel}' (manifest.json {what}) leads outside the bundle (a symlink?); vitedge loads only "
                              "files inside the bundle folder: rebuild the bundle")


def _key() -> bytes | None:
    """$VITEDGE_SIGNING_KEY as bytes (as the environment holds them, so a key that is not UTF-8 works), None when unset.
    Set but empty (or only spaces), it is refused: an empty key silently turned every signature check off."""
    key = os.environb.get(KEY_ENV.encode()) if os.supports_bytes_environ else os.environ.get(KEY_ENV, "").encode()
    if key is None or (not os.supports_bytes_environ and KEY_ENV not in os.environ):
        return None
    if not key.strip():
        raise UsageError(f"{KEY_ENV} is set but empty, which would turn signature checks off: set it to your key, "
                         f"or unset it (unset {KEY_ENV}) to build and load unsigned bundles")
    return key


def signing_key() -> bytes | None:
    """$VITEDGE_SIGNING_KEY (None when unset); a blank one is refused: a build checks it before its work."""
    return _key()


def signature_of(manifest_bytes: bytes, key: bytes) -> str:
    return "hmac-sha256:" + hmac.new(key, manifest_bytes, hashlib.sha256).hexdigest()


def sign(bundle: Path) -> Path | None:
    """Sign manifest.json with $VITEDGE_SIGNING_KEY (no key: nothing, and any stale signature goes)."""

    sig = Path(bundle) / SIGNATURE
    key = _key()
    if key is None:
        sig.unlink(missing_ok=True)
        return None
    with atomic_write_path(sig) as tmp:
        tmp.write_text(signature_of((Path(bundle) / "manifest.json").read_bytes(), key) + "\n")
    return sig


def check_signature(bundle: Path) -> None:
    """With $VITEDGE_SIGNING_KEY set, refuse a bundle whose manifest.json is unsigned or signed otherwise."""
    key = _key()
    if key is None:
        return
    sig = Path(bundle) / SIGNATURE
    if not os.path.lexists(sig):
        raise BundleError(f"{bundle} has no {SIGNATURE} and {KEY_ENV} is set: a bundle built without the key, or its signature "
                          "was removed; rebuild it with the key")
    try:  # a FIFO, /dev/zero or a huge file where the signature belongs: refused, never read (a hang, memory)
        given = read_bounded(sig, SIGNATURE_BYTES)
        manifest = read_bounded(Path(bundle) / "manifest.json", MAX_DOCUMENT_BYTES)
    except OSError as err:
        raise BundleError(f"{err}: not a signature vitedge wrote; rebuild the bundle with the key") from None
    expected = signature_of(manifest, key)
    if not hmac.compare_digest(given.decode("ascii", "replace").strip(), expected):
        raise BundleError(f"{bundle}: manifest.json does not match {SIGNATURE} (edited after the build, or signed with another "
                          f"key); rebuild the bundle")


def locked_thresholds(manifest, profile_thresholds):
    """The gate's thresholds: those the build gated with, when it recorded them. Returns (thresholds, notes),
    a note for every threshold of manifest.json's profile that differs from the build's."""

    recorded = ((manifest.validation or {}).get("thresholds") or {}) if isinstance(manifest.validation, dict) else {}
    if not isinstance(recorded, dict) or not recorded:
        return profile_thresholds, []
    overridden = set(recorded.get("overridden") or ())
    changes, notes = {}, []
    for key in _GATE_KEYS:
        if key not in recorded:
            continue
        built, now = recorded[key], getattr(profile_thresholds, key)
        if built != now:
            changes[key] = built
            how = " (a build flag)" if key in overridden else ""
            notes.append(f"manifest.json's profile sets {key} = {now}, but the build gated with {built}{how}: "
                         f"gating with the build's {built} (pass --{key.replace('_', '-')} to choose another)")
    try:
        return (dataclasses.replace(profile_thresholds, **changes) if changes else profile_thresholds), notes
    except (TypeError, ValueError) as err:
        raise BundleError(f"manifest.json's recorded build thresholds are malformed ({err}); rebuild the bundle") from None
