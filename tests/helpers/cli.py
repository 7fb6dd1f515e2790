"""Run the `vitedge` command line in this process, as a user would type it."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys

import pytest


def run_vitedge(args: list[str]) -> tuple[int, str]:
    """(exit code, stdout and stderr together) of ``vitedge ARGS``."""
    from vitedge.cli.entry import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            main(args)
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue()


def vitedge_in_process(*args, cwd=None) -> subprocess.CompletedProcess:
    """``vitedge ARGS`` run by the CLI's entry in this process, as ``subprocess.run(..., capture_output=True, text=True)``
    would report it (returncode, stdout, stderr): for tests about what a command does, not about the process boundary
    (exit status of the interpreter, a traceback on stderr, signals), which keep ``python -m vitedge``. Saves the child's
    start-up (torch and timm imported again) per call."""
    from vitedge.cli.entry import main

    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    code = 0
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(argv)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        os.chdir(old)
    return subprocess.CompletedProcess(["vitedge", *argv], code, out.getvalue(), err.getvalue())


def run_cli(capsys, *args) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``vitedge ARGS``, captured by pytest's ``capsys``."""
    from vitedge.cli.entry import main

    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    cap = capsys.readouterr()
    return int(exc.value.code or 0), cap.out, cap.err


def default_sigint() -> None:
    """``preexec_fn`` for a child the test interrupts with SIGINT: a shell's background job (nohup,
    `cmd &` without job control) runs with SIGINT ignored, children inherit that, and Python then
    leaves it ignored, so the Ctrl-C under test would never arrive."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def spawn_vitedge(*args, **kw) -> subprocess.Popen:
    """``python -m vitedge ARGS`` as a child process (text pipes for stdout and stderr), with SIGINT at its default
    (``default_sigint``) so a test can interrupt it as Ctrl-C would."""
    return subprocess.Popen([sys.executable, "-m", "vitedge", *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=default_sigint, **kw)
