"""The project config (vitedge.toml / [tool.vitedge]): discovery, strict parsing, flags over it,
`build --dry-run` provenance, the missing-calibration error and `vitedge init`. Nothing here builds."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import CALIB_DIR, EXAMPLES

from vitedge.core.errors import UsageError
from vitedge.cli.project_config import find_config, load_config, parse_config

MODEL = EXAMPLES / "digits_vit.pt"


def run_cli(capsys, *args) -> tuple[int, str, str]:
    from vitedge.cli.entry import main

    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    cap = capsys.readouterr()
    return int(exc.value.code or 0), cap.out, " ".join(cap.err.split())


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """A project folder with the example model and data linked in, and a vitedge.toml; cwd is a subfolder."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "vit.pt").symlink_to(MODEL)
    (tmp_path / "data").symlink_to(CALIB_DIR.parent, target_is_directory=True)
    (tmp_path / "vitedge.toml").write_text(
        'model = "models/vit.pt"\ncalib = "data"\ntargets = ["onnx", "intel-cpu"]\noutput = "build"\n'
        "calib-size = 32\nno_latency = true\nkeep-float = [\"head\"]\nmean = [0.5, 0.5, 0.5]\n"
        "[thresholds]\nmax_top1_drop = 1.5\nmin_agreement = 0.9\n")
    (tmp_path / "src" / "deep").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "src" / "deep")
    return tmp_path


def test_found_from_a_subfolder_with_paths_relative_to_the_file(project):
    found = find_config()
    assert found == project / "vitedge.toml"
    cfg = load_config(found)
    v = cfg.values
    assert v["model"] == project / "models" / "vit.pt" and v["calib"] == project / "data" and v["out"] == project / "build"
    assert v["targets"] == ("onnx", "intel-cpu") and v["calib_size"] == 32 and v["no_latency"] is True
    assert v["keep_float"] == ("head",) and v["mean"] == (0.5, 0.5, 0.5)
    assert v["max_top1_drop"] == 1.5 and v["min_agreement"] == 0.9
    assert cfg.where("calib_size") == "vitedge.toml:calib-size" and cfg.where("max_top1_drop") == "vitedge.toml:thresholds.max_top1_drop"


def test_pyproject_tool_table_and_a_vitedge_toml_nearer_wins(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n[tool.vitedge]\ntargets = "onnx"\nseed = 7\n')
    (tmp_path / "a").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    cfg = load_config(find_config())
    assert cfg.table == "tool.vitedge" and cfg.values == {"targets": ("onnx",), "seed": 7}
    (tmp_path / "a" / "vitedge.toml").write_text("seed = 1\n")
    assert find_config() == tmp_path / "a" / "vitedge.toml"
    (tmp_path / "a" / "vitedge.toml").unlink()
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')  # no [tool.vitedge]: not a config
    assert find_config(tmp_path / "a") is None


@pytest.mark.parametrize("text, needle", [
    ('colour = "red"\n', "unknown key 'colour'"),
    ("max_top1_drop = 1\n", "unknown key 'max_top1_drop'; thresholds go in a [thresholds] table"),
    ('calib-size = "32"\n', "'calib-size' must be an integer, got '32'"),
    ("no_latency = 1\n", "'no_latency' must be true or false"),
    ('targets = [1]\n', "'targets' must be a list of target names"),
    ('calib = "nowhere"\n', "'calib' names"),
    ("mean = [0.5, 0.5]\n", "'mean' must be a list of 3 numbers"),
    ("seed = 1\nseed-x = 2\n", "unknown key 'seed-x'"),
    ('target = "onnx"\ntargets = ["onnx"]\n', "set the same thing"),
    ("[thresholds]\nmax_top1_drop = -1\n", "[thresholds] max_top1_drop must be >= 0"),
    ("[thresholds]\nmin_agreemnt = 0.9\n", "unknown key 'thresholds.min_agreemnt'"),
    ('[thresholds]\nmin_agreement = "high"\n', "'thresholds.min_agreement' must be a number"),
    ("seed = \n", "not valid TOML"),
])
def test_bad_configs_are_one_line_errors_naming_key_and_file(tmp_path, text, needle):
    path = tmp_path / "vitedge.toml"
    path.write_text(text)
    with pytest.raises(UsageError) as err:
        load_config(path)
    msg = str(err.value)
    assert needle in msg and str(path) in msg and "\n" not in msg


def test_dry_run_prints_each_setting_and_where_it_came_from_flags_win(project, capsys):
    code, out, err = run_cli(capsys, "build", "--dry-run", "-t", "onnx", "--calib-size", 20, "--max-top1-drop", 2)
    assert code == 0, err
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert out.splitlines()[0] == f"config: {project / 'vitedge.toml'}"
    assert rows["MODEL"][1:] == [str(project / "models" / "vit.pt"), "vitedge.toml:model"]
    assert rows["--target"][1:] == ["onnx", "flag"]  # the flag replaces the config's two targets
    assert rows["--calib-size"][1:] == ["20", "flag"] and rows["--max-top1-drop"][1:] == ["2.0", "flag"]
    assert rows["--min-agreement"][1:] == ["0.9", "vitedge.toml:thresholds.min_agreement"]
    assert rows["--calib"][-1] == "vitedge.toml:calib" and rows["--out"][-1] == "vitedge.toml:output"
    assert rows["--seed"][1:] == ["0", "default"] and rows["--mean"][-1] == "vitedge.toml:mean"
    assert not (project / "build").exists()  # nothing built
    code, out, _ = run_cli(capsys, "config")
    shown = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:]}
    assert code == 0 and shown["calib-size"] == ["32"] and shown["targets"] == ["onnx,", "intel-cpu"]


def test_the_cache_switches_come_from_the_config(project, capsys):
    """A CI job can turn the reuse of validation outputs off in vitedge.toml (docs/reports.md)."""
    with open(project / "vitedge.toml", "r+") as f:
        text = f.read()
        f.seek(0)
        f.write(text.replace("[thresholds]", "int8-cache = false\nreference_cache = true\n[thresholds]"))
    code, out, err = run_cli(capsys, "build", "--dry-run")
    assert code == 0, err
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert rows["--int8-cache"][1:] == ["False", "vitedge.toml:int8-cache"]
    assert rows["--reference-cache"][1:] == ["True", "vitedge.toml:reference_cache"]
    (project / "vitedge.toml").write_text('int8_cache = "no"\n')
    code, _, err = run_cli(capsys, "build", "--dry-run")
    assert code == 2 and "int8_cache" in err


def test_config_values_are_checked_against_the_flag_types(project, capsys):
    (project / "vitedge.toml").write_text('method = "best"\n')
    code, _, err = run_cli(capsys, "build", "--dry-run")
    assert code == 2 and "vitedge.toml: 'method'" in err and "'best' is not one of" in err


def test_dry_run_refuses_an_unknown_target_in_one_line(project, capsys):
    """--dry-run said yes to any target name (exit 0); a typo must be caught before a CI job trusts the plan."""
    code, _, err = run_cli(capsys, "build", "--dry-run", "-t", "onxx")
    assert code == 2 and "unknown target 'onxx'" in err and err.strip().count("\n") == 0, err
    code, _, err = run_cli(capsys, "build", "--dry-run", "-t", "jetson")  # a family names several profiles: known
    assert code == 0, err


def test_without_config_or_calib_the_error_names_both(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "build", "-t", "onnx", MODEL)
    assert code == 2 and "--calib" in err and "vitedge.toml" in err and "vitedge init" in err
    (tmp_path / "vitedge.toml").write_text('targets = ["onnx"]\n')
    code, _, err = run_cli(capsys, "build", MODEL)
    assert code == 2 and "--calib" in err and str(tmp_path / "vitedge.toml") in err
    code, _, err = run_cli(capsys, "validate")
    assert code == 2 and "pass BUNDLE" in err and "model and targets" in err


def test_headline_command_takes_calib_from_the_config(project, capsys):
    code, out, err = run_cli(capsys, "build", "--dry-run", "--target", "jetson-orin", project / "models" / "vit.pt")
    assert code == 0, err
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert rows["MODEL"][-1] == "flag" and rows["--calib"][1:] == [str(project / "data"), "vitedge.toml:calib"]


def test_init_writes_a_commented_config_that_build_reads(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, "init", MODEL, "--calib", CALIB_DIR.parent, "-t", "onnx", "-t", "intel-cpu", "--num-heads", 3)
    assert code == 0, err
    text = (tmp_path / "vitedge.toml").read_text()
    assert "# digits_vit.pt: timm" in text and "10 classes" in text and "# mean = [" in text and "[thresholds]" in text
    cfg = load_config(tmp_path / "vitedge.toml")
    assert cfg.values["model"] == MODEL and cfg.values["calib"] == CALIB_DIR.parent and cfg.values["num_heads"] == 3
    assert cfg.values["targets"] == ("onnx", "intel-cpu")
    code, _, err = run_cli(capsys, "init", MODEL)
    assert code == 2 and "exists; pass --force" in err
    code, out, err = run_cli(capsys, "build", "--dry-run")
    assert code == 0, err


def test_parse_is_strict_about_tables(tmp_path):
    with pytest.raises(UsageError, match="'thresholds' must be a table"):
        parse_config({"thresholds": 3}, tmp_path / "vitedge.toml")
    with pytest.raises(UsageError, match="'model_kwargs' must be a table"):
        parse_config({"model_kwargs": "dim=3"}, tmp_path / "vitedge.toml")
    cfg = parse_config({"model-kwargs": {"dim": 8}, "input-size": [48, 48]}, tmp_path / "vitedge.toml")
    assert cfg.values["model_kwargs"] == '{"dim": 8}' and cfg.values["input_size"] == (48, 48)
