"""The build's inputs travel as typed records (issue 27 item 2): one cache-settings object from the
flags to every consumer, the quantizer and gate flags as override records, the budget's inputs as
one job, and no ``Any`` in a signature between the layers of the build and the budget."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from vitedge.app.build_flags import BuildFlags
from vitedge.app.overrides import QuantOverrides, ThresholdOverrides
from vitedge.budget import BudgetSettings
from vitedge.app.matrix.config import load_matrix
from vitedge.core.errors import UsageError
from vitedge.models.intake import IntakeOptions
from vitedge.targets.profiles import Thresholds, load_profile
from vitedge.quantize.config import QuantConfig
from vitedge.validation.reference_cache import ReferenceCacheSettings

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "vitedge"
# the modules whose signatures must say what they take (issue 27: the build, the budget and the build matrix)
TYPED = [PACKAGE / "app" / "build.py", PACKAGE / "app" / "build_flags.py", PACKAGE / "app" / "overrides.py", PACKAGE / "app" / "summary.py",
         *sorted((PACKAGE / "budget").glob("*.py")), *sorted((PACKAGE / "cli" / "commands").glob("build*.py")),
         *sorted((PACKAGE / "distributed").glob("matrix*.py"))]
# a JSON document (a manifest section, an accuracy record) is the one place Any is honest: the value of a str-keyed mapping
JSON_DOCUMENT = {"dict[str, Any]", "Mapping[str, Any]"}


def _loose(annotation: ast.expr) -> list[str]:
    """The parts of an annotation that are ``Any`` outside a JSON document's mapping."""
    text = ast.unparse(annotation)
    for doc in JSON_DOCUMENT:
        text = text.replace(doc, "")
    return ["Any"] if "Any" in text.replace("[", " ").replace("]", " ").replace(",", " ").replace("|", " ").split() else []


def _public_annotations(path: Path) -> list[tuple[str, ast.expr]]:
    """(where, annotation) of every parameter and return of a public function or method, and every
    field of a public class, in ``path``."""
    out: list[tuple[str, ast.expr]] = []

    def function(node: ast.FunctionDef | ast.AsyncFunctionDef, owner: str) -> None:
        if node.name.startswith("_") and node.name != "__init__":
            return
        args = node.args
        for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
            if a is not None and a.annotation is not None:
                out.append((f"{owner}{node.name}({a.arg})", a.annotation))
        if node.returns is not None:
            out.append((f"{owner}{node.name} -> ", node.returns))

    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function(node, "")
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for member in node.body:
                if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    function(member, node.name + ".")
                elif isinstance(member, ast.AnnAssign):
                    out.append((f"{node.name}.{ast.unparse(member.target)}", member.annotation))
    return out


def test_the_build_and_budget_signatures_name_their_types():
    checked = [(p, where, ann) for p in TYPED for where, ann in _public_annotations(p)]
    assert len(checked) > 100  # the walk found the signatures (a broken walk must not pass)
    loose = [f"{p.relative_to(REPO)}: {where} {ast.unparse(ann)}" for p, where, ann in checked if _loose(ann)]
    assert not loose, "typed records instead of Any between layers:\n" + "\n".join(loose)


def test_the_walk_refuses_any():
    """The check above can fail: a bare Any, or Any inside a container other than a JSON document, is refused."""
    tree = ast.parse("def f(a: Any, b: dict[str, Any], c: list[Any], d: Mapping[str, Any] | None, e: tuple[Any, Any]): pass")
    verdict = {a.arg: bool(_loose(a.annotation)) for a in tree.body[0].args.args}
    assert verdict == {"a": True, "b": False, "c": True, "d": False, "e": True}


def _flags(**changes: object) -> BuildFlags:
    base = dict(model=Path("m.pt"), targets=("onnx",), calib=Path("c"), intake=IntakeOptions(), fallback_max_evals=12)
    return BuildFlags.from_click({**base, **changes})


def test_flags_become_one_request_with_one_cache_settings_object(tmp_path):
    req = _flags(cache_dir=tmp_path, reference_cache=True, int8_cache=False, no_latency=True, no_fallback=True,
                 fallback_max_evals=5, max_top1_drop=0.5, min_nn_agreement=0.9).request(config_record={"path": "vitedge.toml"})
    assert req.cache == ReferenceCacheSettings(enabled=True, root=tmp_path, int8_outputs=False)
    assert not {"cache_dir", "reference_cache", "int8_cache"} & {f.name for f in dataclasses.fields(req)}
    assert req.budget == BudgetSettings(enabled=False, max_evals=5, measure_cost=False) and req.measure_speed is False
    assert req.threshold_overrides.set_values() == {"max_top1_drop": 0.5, "min_nn_agreement": 0.9}
    assert req.config_record == {"path": "vitedge.toml"}
    off = _flags(reference_cache=False).request()
    assert off.cache.enabled is False and off.cache.root is None and not off.cache.for_int8().enabled


def test_quant_overrides_over_the_profile():
    profile = dataclasses.replace(load_profile("onnx"), quantization={"method": "minmax", "smoothquant_alpha": 0.3})
    assert QuantOverrides().config_for(profile) == QuantConfig(method="minmax", smoothquant_alpha=0.3)
    assert QuantOverrides(smoothquant_off=True).config_for(profile).smoothquant_alpha is None
    assert QuantOverrides(smoothquant_alpha=0.7, weight_range="7bit").config_for(profile) == QuantConfig(
        method="minmax", smoothquant_alpha=0.7, weight_range="7bit")
    # --percentile alone means the percentile method, as `vitedge calibrate` reads it
    flags = dict(method=None, smoothquant_alpha=None, no_smoothquant=False, quantize_attention=None, weight_range=None)
    assert QuantOverrides.from_flags(percentile=99.9, **flags).changes() == {"method": "percentile", "percentile": 99.9}
    with pytest.raises(UsageError, match="--no-smoothquant and --smoothquant-alpha contradict"):
        _flags(no_smoothquant=True, smoothquant_alpha=0.5).request()


def test_threshold_overrides_name_the_flag_and_keep_the_profile_where_unset():
    base = Thresholds(max_top1_drop=1.0, min_agreement=0.98, min_speedup=1.2, min_speedup_without_vnni=0.6)
    assert ThresholdOverrides().apply(base) == base
    got = ThresholdOverrides(min_agreement=0.9, min_speedup=1.0).apply(base)
    assert (got.min_agreement, got.max_top1_drop, got.min_speedup, got.min_speedup_without_vnni) == (0.9, 1.0, 1.0, None)
    with pytest.raises(UsageError, match="^--min-agreement: "):
        ThresholdOverrides(min_agreement=1.5).apply(base)


def test_a_matrix_row_carries_the_same_records(tmp_path):
    (tmp_path / "m.pt").write_bytes(b"x")
    (tmp_path / "calib").mkdir()
    path = tmp_path / "matrix.toml"
    path.write_text('targets = ["onnx"]\n[build]\nmin_agreement = 0.97\ncache_dir = "cache"\n'
                    '[[models]]\npath = "m.pt"\ncalib = "calib"\n')
    [row] = load_matrix(path).rows
    assert row.settings.cache == ReferenceCacheSettings(root=tmp_path.resolve() / "cache")
    assert row.settings.thresholds == ThresholdOverrides(min_agreement=0.97)
