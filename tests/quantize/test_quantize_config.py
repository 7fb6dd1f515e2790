"""QuantConfig validation, threshold methods on known distributions, and the CLI's errors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from vitedge.core.errors import UsageError
from vitedge.quantize import QuantConfig, stats


@pytest.mark.parametrize("kwargs, message", [
    ({"method": "kl"}, "--method must be one of"),
    ({"method": ""}, "--method must be one of"),
    ({"percentile": 50.0}, "--percentile must be between 90 and 100"),
    ({"percentile": 100.5}, "--percentile must be between 90 and 100"),
    ({"percentile": float("nan")}, "--percentile must be between"),
    ({"percentile": "99"}, "--percentile must be a number"),
    ({"percentile": True}, "--percentile must be a number"),
    ({"method": "minmax", "percentile": 99.0}, "--percentile only applies to --method percentile"),
    ({"smoothquant_alpha": -0.1}, "--smoothquant-alpha must be between 0 and 1"),
    ({"smoothquant_alpha": 1.5}, "--smoothquant-alpha must be between 0 and 1"),
    ({"smoothquant_alpha": float("inf")}, "--smoothquant-alpha must be between 0 and 1"),
    ({"smoothquant_alpha": "0.5"}, "--smoothquant-alpha must be between 0 and 1"),
    ({"smoothquant_alpha": False}, "--smoothquant-alpha must be between 0 and 1"),
    ({"quantize_attention": "yes"}, "quantize_attention must be True or False"),
    ({"smoothquant_shared": 1}, "smoothquant_shared must be True or False"),
    ({"num_bins": 10}, "num_bins must be an integer between 256 and 65536"),
    ({"num_bins": 2048.0}, "num_bins must be an integer"),
])
def test_bad_settings_are_one_line_usage_errors(kwargs, message):
    with pytest.raises(UsageError, match=message) as err:
        QuantConfig(**kwargs)
    assert "\n" not in str(err.value)


def test_config_is_frozen_and_keyword_only():
    c = QuantConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.method = "minmax"  # type: ignore[misc]
    with pytest.raises(TypeError):
        QuantConfig("minmax")  # type: ignore[misc]
    assert QuantConfig(method="entropy").method_params() == {"num_bins": 2048}
    assert QuantConfig(method="minmax").method_params() == {}
    assert QuantConfig(method="percentile", percentile=99.9).method_params() == {"percentile": 99.9, "num_bins": 2048}
    with pytest.raises(UsageError, match="only applies to --method percentile"):
        QuantConfig(method="entropy", percentile=99.9)
    assert QuantConfig(smoothquant_alpha=None).smoothquant_params() is None


def test_calibrate_refuses_what_is_not_a_config(tmp_path):
    from helpers.quantize_models import fp32_model, source_for

    from vitedge.quantize import calibrate

    path, spec = fp32_model("timm")
    with pytest.raises(UsageError, match="QuantConfig"):
        calibrate(path, source_for(spec, limit=2), {"method": "minmax"}, cache_dir=tmp_path)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="does not exist"):
        calibrate(tmp_path / "missing.onnx", source_for(spec, limit=2), QuantConfig(), cache_dir=tmp_path)


def test_calibration_data_of_the_wrong_size(tmp_path):
    from helpers.quantize_models import CALIB_DIR, fp32_model

    from vitedge.datasources.sources import open_source
    from vitedge.core.errors import CalibrationError
    from vitedge.quantize import calibrate
    from vitedge.bundle.spec import Preprocess

    path, _ = fp32_model("timm")
    wrong = open_source(CALIB_DIR, Preprocess(crop_size=(48, 48)), limit=2)
    with pytest.raises(CalibrationError, match="model takes 3x32x32"):
        calibrate(path, wrong, QuantConfig(method="minmax"), cache_dir=tmp_path)


# --------------------------------------------------------------------------- thresholds


def _heavy_tailed(n=200_000, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n)
    x[:20] *= 30.0  # a few large outliers, as post-LayerNorm ViT activations have
    return x


def test_histogram_is_exact_and_clips_into_the_last_bin():
    x = np.array([0.0, 0.5, -0.5, 0.999, 1.0, -3.0])
    h = stats.histogram(x, 1.0, 4)
    assert h.tolist() == [1, 0, 2, 3]
    assert stats.histogram(np.zeros(5), 0.0, 8).tolist() == [5, 0, 0, 0, 0, 0, 0, 0]


def test_minmax_is_the_absolute_max():
    x = _heavy_tailed()
    a = stats.absmax(x)
    assert stats.threshold("minmax", a, None) == a


@pytest.mark.parametrize("p", [99.0, 99.9, 99.99])
def test_percentile_keeps_that_share_of_values(p):
    x = _heavy_tailed()
    a = stats.absmax(x)
    t = stats.threshold("percentile", a, stats.histogram(x, a, 2048), percentile=p)
    kept = np.mean(np.abs(x) <= t)
    assert kept >= p / 100 and t <= np.percentile(np.abs(x), p) + a / 2048 + 1e-12


@pytest.mark.parametrize("method, most", [("entropy", 0.5), ("percentile", 0.5), ("mse", 0.9)])
def test_outliers_are_clipped_by_the_histogram_methods(method, most):
    # mse clips least: each clipped outlier costs (x - t)^2, far more than rounding
    x = _heavy_tailed()
    a = stats.absmax(x)
    t = stats.threshold(method, a, stats.histogram(x, a, 2048))
    assert 2.5 < t < most * a


def test_mse_threshold_beats_minmax_on_measured_error():
    x = _heavy_tailed()
    a = stats.absmax(x)
    t = stats.threshold("mse", a, stats.histogram(x, a, 2048))

    def err(t):
        s = t / 127
        return np.mean((np.clip(np.rint(x / s), -127, 127) * s - x) ** 2)

    assert err(t) < err(a)


def test_uniform_data_is_not_clipped_by_mse():
    x = np.random.default_rng(1).uniform(-1, 1, 100_000)
    t = stats.threshold("mse", 1.0, stats.histogram(x, 1.0, 2048))
    assert t > 0.98


def test_all_zero_tensor_gets_a_positive_threshold():
    for method in ("minmax", "percentile", "entropy", "mse"):
        t = stats.threshold(method, 0.0, stats.histogram(np.zeros(10), 0.0, 256))
        assert t > 0 and np.isfinite(t)


# --------------------------------------------------------------------------- CLI


def test_cli_errors_are_one_line(capsys):
    from helpers.quantize_models import CALIB_DIR, DIGITS_PT

    from vitedge.cli.entry import main

    cases = [
        (["--method", "minmax", "--percentile", "99"], "--percentile only applies to --method percentile"),
        (["--smoothquant-alpha", "2"], "--smoothquant-alpha must be between 0 and 1"),
        (["--smoothquant-alpha", "0.5", "--no-smoothquant"], "contradict"),
        (["-o", "model.txt"], "should name an .onnx file"),
        (["--calib-size", "0"], "'--calib-size': 0 is not an integer in [1, 10000000]"),  # as `vitedge build` says it
        (["--seed", "-1"], "'--seed': -1 is not an integer in [0, 4294967295]"),
    ]
    for extra, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            main(["calibrate", str(DIGITS_PT), "--calib", str(CALIB_DIR), "-q", *extra])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err, err
