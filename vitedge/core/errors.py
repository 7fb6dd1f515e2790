"""One error hierarchy. The CLI prints ``str(error)`` as one line and exits with ``exit_code``.

Exit codes (documented in the README):
  0  success, every gate held
  1  a parity gate failed (accuracy, agreement, speed)
  2  bad input or usage: the message says what was wrong and what to do
  3  an internal error (a bug in vitedge); ``--debug`` shows the traceback
130  interrupted (Ctrl-C)
143  terminated (SIGTERM: `timeout`, CI cancellation, `docker stop`); cleaned up as for Ctrl-C
"""

from __future__ import annotations

import re

# Unicode's format characters (category Cf: the bidi overrides and isolates U+202A-202E and U+2066-2069, the
# marks U+200E/U+200F/U+061C, zero-width characters, the BOM, tags) and the line/paragraph separators (Zl, Zp):
# a file or row name holding U+202E prints reversed (a "...gpj.exe" shows as "...exe.jpg"), so they are shown as
# \\uNNNN. The ranges are Unicode 14's (Python 3.11's unicodedata); tests/core/test_ui.py checks them against the
# running Python's.
FORMAT_RANGES = ((0x00AD, 0x00AD), (0x0600, 0x0605), (0x061C, 0x061C), (0x06DD, 0x06DD), (0x070F, 0x070F), (0x0890, 0x0891),
                 (0x08E2, 0x08E2), (0x180E, 0x180E), (0x200B, 0x200F), (0x2028, 0x202E), (0x2060, 0x2064), (0x2066, 0x206F),
                 (0xFEFF, 0xFEFF), (0xFFF9, 0xFFFB), (0x110BD, 0x110BD), (0x110CD, 0x110CD), (0x13430, 0x13438),
                 (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A), (0xE0001, 0xE0001), (0xE0020, 0xE007F))
_FORMAT = "".join(f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in FORMAT_RANGES)
# lone surrogates: the bytes of a file name that is not UTF-8 (os.fsdecode's surrogateescape), which a strict
# UTF-8 stdout cannot print at all
_SURROGATES = "\\ud800-\\udfff"
_CONTROL = re.compile(f"[\\x00-\\x1f\\x7f-\\x9f{_FORMAT}{_SURROGATES}]")
_CONTROL_BUT_LAYOUT = re.compile(f"[\\x00-\\x08\\x0b-\\x1f\\x7f-\\x9f{_FORMAT}{_SURROGATES}]")  # tab and line feed print as themselves


def _shown(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def shown_controls(text: str, *, keep_layout: bool = False) -> str:
    """``text`` with its control characters shown as ``\\xNN`` and its Unicode format characters (bidi overrides,
    zero-width characters) as ``\\uNNNN`` (``keep_layout``: tab and line feed kept)."""
    pattern = _CONTROL_BUT_LAYOUT if keep_layout else _CONTROL
    return pattern.sub(lambda m: _shown(m.group()), text)


def one_line(text: object) -> str:
    """``text`` as one printable line: runs of whitespace (line breaks too) become one space, and any other control
    character is shown as ``\\xNN``. Error lines name paths, class names and values that came from files and flags; a
    file name holding an escape sequence would otherwise reach the terminal that prints the error (recolour it,
    retitle it, write to its clipboard)."""
    return shown_controls(" ".join(str(text).split()))


class VitedgeError(Exception):
    """Base class for every error vitedge reports to a user."""

    exit_code = 2

    def __init__(self, message: str):
        # Keep messages to one printable line: the CLI prints exactly this.
        super().__init__(one_line(message))


class UsageError(VitedgeError):
    """A flag or argument combination that cannot work."""


class ModelLoadError(VitedgeError):
    """A model file that cannot be read or is not a ViT vitedge understands."""


class UnsafePickleError(ModelLoadError):
    """A checkpoint that needs full unpickling (arbitrary code) without --trust-pickle."""


class ExportError(VitedgeError):
    """ONNX export failed or the exported graph does not match the PyTorch model."""


class CalibrationError(VitedgeError):
    """Calibration data that is missing, unreadable or too small."""


class QuantizationError(VitedgeError):
    """The quantizer could not produce a valid Q/DQ graph."""


class ProfileError(VitedgeError):
    """A target profile that is malformed or unknown."""


class BundleError(VitedgeError):
    """A bundle that is incomplete, altered or does not match its manifest."""


class DataError(VitedgeError):
    """A validation data set that does not fit the model."""


class MissingDependencyError(VitedgeError):
    """An optional package a feature needs is not installed."""

    def __init__(self, what: str, install: str):
        super().__init__(f"{what} is not installed; install it with: {install}")
        self.install = install


class IncompatibleEngineError(BundleError):
    """A TensorRT engine built for another GPU, TensorRT version or JetPack."""


class GateFailure(VitedgeError):
    """A build or validation that ran but missed one of its parity thresholds."""

    exit_code = 1


class Interrupted(VitedgeError):
    """Ctrl-C (exit 130) or SIGTERM (exit 143) after part of a multi-target build was written: says what was kept."""

    def __init__(self, message: str, exit_code: int = 130):
        super().__init__(message)
        self.exit_code = exit_code


class EnvironmentFault(VitedgeError):
    """The machine, not the input or vitedge: a full disk, a read-only or forbidden folder."""


# errno -> what to tell the user; these are not bugs, so they exit 2 (bad input or environment)
_OS_ERRORS = {
    28: "no space left on the device",  # ENOSPC
    122: "disk quota exceeded",  # EDQUOT
    27: "file too large for this file system or the process's size limit",  # EFBIG
    30: "the file system is read-only",  # EROFS
    13: "permission denied",  # EACCES
    1: "operation not permitted",  # EPERM
}


# errno -> what the OS refused about a name (reading or writing), should one get past the checks where paths enter
_NAME_ERRORS = {
    36: "a file name longer than the file system allows",  # ENAMETOOLONG
    84: "a file name in an encoding the file system refuses",  # EILSEQ
}


def environment_error(err: BaseException) -> VitedgeError | None:
    """A one-line EnvironmentFault for an OSError the machine caused (full disk, read-only, no permission), or a
    UsageError for a name the OS refuses (too long, not UTF-8); else None (then it is a bug)."""
    if isinstance(err, OSError) and err.errno in _NAME_ERRORS:
        where = f": {str(err.filename)[:120]}" if getattr(err, "filename", None) else ""
        return UsageError(f"{_NAME_ERRORS[err.errno]}{where}; use a shorter path (at most 255 bytes per name) in UTF-8")
    if isinstance(err, UnicodeEncodeError) and "surrogate" in str(err.reason):
        return UsageError(f"a file name or value holds bytes that are not UTF-8 ({err.object[err.start:err.end]!r}); "
                          "rename it with UTF-8 characters")
    if isinstance(err, OSError) and err.errno in _OS_ERRORS:
        where = f" writing {err.filename}" if getattr(err, "filename", None) else ""
        return EnvironmentFault(f"{_OS_ERRORS[err.errno]}{where}; free space, fix the permissions or choose another -o, then run again")
    return None
