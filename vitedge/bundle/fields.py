"""Field types of a manifest read from disk: a damaged or hand-edited manifest.json is a one-line
BundleError, never a crash (exit 3) further on."""

from __future__ import annotations

from typing import Any

from vitedge.core import limits
from vitedge.core.errors import BundleError
from vitedge.bundle.spec import ModelSpec


def check_field_types(d: dict[str, Any], sections: tuple[str, ...]) -> None:
    """Each section an object, `files` a map of path -> sha256 text, artifact roles text: a damaged or hand-edited
    manifest is a one-line BundleError, never a crash further on."""
    def bad(what: str, value: object, expected: str) -> BundleError:
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
        spec_obj = ModelSpec.from_dict(spec)
        check_spec_bounds(spec_obj)
    except BundleError:
        raise
    except Exception as err:  # noqa: BLE001 - any malformed field is the file's fault
        raise BundleError(f"manifest.json: 'model.spec' is malformed ({type(err).__name__}: {str(err)[:80]}); "
                          "the bundle is damaged or was edited by hand: rebuild it") from None


def check_spec_bounds(spec: ModelSpec, where: str = "manifest.json", error: type[Exception] = BundleError,
                      fix: str = "the bundle is damaged or was edited by hand: rebuild it") -> None:
    """The numbers of the model's input a runtime will allocate for: finite and within vitedge.core.limits. Checked where a
    spec is read: from a manifest (``where`` manifest.json) and from a model file (its path, ``ModelLoadError``)."""
    pre = spec.preprocess
    checks = [(f"model.spec.image_size[{i}]", v, 1, limits.MAX_INPUT_SIDE, True) for i, v in enumerate(spec.image_size)]
    checks += [(f"model.spec.preprocess.crop_size[{i}]", v, 1, limits.MAX_INPUT_SIDE, True) for i, v in enumerate(pre.crop_size)]
    checks += [(f"model.spec.preprocess.mean[{i}]", v, -1e6, 1e6, False) for i, v in enumerate(pre.mean)]
    checks += [(f"model.spec.preprocess.std[{i}]", v, 0.0, 1e6, False) for i, v in enumerate(pre.std)]
    checks += [("model.spec.preprocess.channels", pre.channels, 1, 4, True)]
    if spec.patch_size is not None:
        checks.append(("model.spec.patch_size", spec.patch_size, 1, limits.MAX_INPUT_SIDE, True))
    if spec.num_classes is not None:
        checks.append(("model.spec.num_classes", spec.num_classes, 1, limits.MAX_CLASSES, True))
    for name, value, lo, hi, integer in checks:
        if not limits.within(value, lo, hi, integer=integer, lo_open=name.startswith("model.spec.preprocess.std")):
            raise error(f"{where}: '{name}' is {value!r}, expected {limits.kind_text(integer)}"
                        f"{limits.bounds_text(lo, hi, name.startswith('model.spec.preprocess.std'))}; {fix}")
    if not limits.within(pre.crop_pct, limits.MIN_CROP_PCT, 1.0):
        raise error(f"{where}: 'model.spec.preprocess.crop_pct' is {pre.crop_pct!r}, expected a finite number in "
                    f"[{limits.MIN_CROP_PCT:g}, 1]; {fix}")
