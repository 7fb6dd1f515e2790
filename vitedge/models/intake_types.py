"""What the model intake is asked (``IntakeOptions``: the CLI's model flags) and what it returns
(``LoadedModel``: the module or ONNX file and its ``ModelSpec``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitedge.bundle.spec import INTERPOLATIONS, ModelSpec
from vitedge.core.errors import UsageError
from vitedge.core.limits import MIN_CROP_PCT


@dataclass(frozen=True)
class IntakeOptions:
    """Everything a user can tell vitedge about a model (the CLI's model flags)."""

    arch: str | None = None
    num_heads: int | None = None
    model_class: str | None = None
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    trust_pickle: bool = False
    input_size: tuple[int, int] | None = None
    output_kind: str | None = None  # logits / embedding, for models vitedge cannot tell
    mean: tuple[float, ...] | None = None  # one value per channel, or one that broadcasts
    std: tuple[float, ...] | None = None
    crop_pct: float | None = None
    interpolation: str | None = None

    def __post_init__(self) -> None:
        if self.input_size is not None and any(int(v) <= 0 for v in self.input_size):
            raise UsageError(f"--input-size must be two positive integers, got {self.input_size}")
        if self.crop_pct is not None and not MIN_CROP_PCT <= self.crop_pct <= 1.0:
            raise UsageError(f"--crop-pct must be in [{MIN_CROP_PCT:g}, 1] (the resize side is crop / crop-pct), got {self.crop_pct}")
        if self.interpolation is not None and self.interpolation not in INTERPOLATIONS:
            raise UsageError(f"--interpolation must be one of {', '.join(INTERPOLATIONS)}, got '{self.interpolation}'")
        for name in ("mean", "std"):
            values = getattr(self, name)
            if values is not None and not all(math.isfinite(v) for v in values):
                raise UsageError(f"--{name} values must be finite numbers, got {' '.join(map(str, values))}")
        if self.std is not None and any(s <= 0 for s in self.std):
            raise UsageError(f"--std values must be positive, got {self.std}")
        if self.output_kind not in (None, "logits", "embedding"):
            raise UsageError(f"--output-kind must be logits or embedding, got '{self.output_kind}'")


@dataclass
class LoadedModel:
    spec: ModelSpec
    path: Path
    module: Any = None  # torch.nn.Module (or ScriptModule / ExportedProgram); None for ONNX input
    onnx_path: Path | None = None  # set when the input already is ONNX: export is skipped
    exporter: str = "torchscript"  # which torch.onnx path exports it: torchscript or dynamo

    @property
    def is_onnx(self) -> bool:
        return self.onnx_path is not None
