"""VITEDGE_ORT_SPINNING (vitedge/onnxkit/session.py): "0" keeps every ONNX Runtime session's idle threads asleep,
unset or "1" leaves each session as its settings say, anything else is a one-line usage error. The test processes set
it to "0" (tests/conftest.py); the outputs do not depend on it."""

from __future__ import annotations

import numpy as np
import pytest

from vitedge.core.errors import UsageError
from vitedge.onnxkit.session import SPINNING_ENV, SessionSettings, _session_options, ort_session

KEY = "session.intra_op.allow_spinning"


def _spins(settings: SessionSettings) -> bool:
    options = _session_options(settings)
    try:
        return options.get_session_config_entry(KEY) != "0"
    except RuntimeError:  # no entry: ONNX Runtime's default, spinning
        return True


def test_the_switch_turns_spinning_off_for_every_session_and_only_then(monkeypatch):
    monkeypatch.delenv(SPINNING_ENV, raising=False)
    assert _spins(SessionSettings()) is True and _spins(SessionSettings(spinning=False)) is False
    monkeypatch.setenv(SPINNING_ENV, "1")
    assert _spins(SessionSettings()) is True and _spins(SessionSettings(spinning=False)) is False
    monkeypatch.setenv(SPINNING_ENV, "0")
    assert _spins(SessionSettings()) is False and _spins(SessionSettings(spinning=False)) is False


@pytest.mark.parametrize("value", ["no", "2", ""])
def test_a_value_other_than_0_or_1_is_a_usage_error(monkeypatch, value):
    monkeypatch.setenv(SPINNING_ENV, value)
    with pytest.raises(UsageError, match=f"{SPINNING_ENV} must be 0 .* or 1 .*, got '{value}'"):
        _session_options(SessionSettings())


def test_the_outputs_are_the_same_either_way(monkeypatch, timm_qdq):
    model, _ = timm_qdq
    x = np.random.default_rng(0).normal(size=(4, 3, 32, 32)).astype(np.float32)
    outs = []
    for value in ("1", "0"):
        monkeypatch.setenv(SPINNING_ENV, value)
        session = ort_session(model)
        outs.append(session.run(None, {session.get_inputs()[0].name: x})[0])
    np.testing.assert_array_equal(outs[0], outs[1])

