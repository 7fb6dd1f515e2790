"""Importing a user's --model-class file so that its script side cannot pass for vitedge: a
`sys.exit()` or an argparse call at import is reported as that file's doing, and it sees only its
own name in sys.argv, never vitedge's arguments."""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

from vitedge.core.errors import UsageError

_GUARD = "put the script part of the file under `if __name__ == \"__main__\":`"


def import_user_file(loader, module_obj, path: Path) -> None:
    captured = io.StringIO()
    argv = sys.argv
    sys.argv = [str(path)]
    try:
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
            loader.exec_module(module_obj)
    except SystemExit as err:
        said = " ".join(captured.getvalue().split())[-160:]
        raise UsageError(
            f"--model-class: importing {path} called sys.exit({err.code!r})" + (f" after printing: {said}" if said else "")
            + f"; the file runs as a script when imported: {_GUARD}"
        ) from None
    except Exception as err:
        raise UsageError(f"--model-class: importing {path} failed: {type(err).__name__}: {err}") from err
    finally:
        sys.argv = argv
    # what the file printed while importing is the user's own output: pass it on
    if captured.getvalue():
        sys.stderr.write(captured.getvalue())
