#!/usr/bin/env python
"""A stand-in for one long native call that never returns to Python while it runs and is not interrupted by
signals: pthread_join on a C thread sleeping (SIGTERM blocked in that thread, so the signal reaches this one)."""
import ctypes, os, signal, sys, tempfile
from pathlib import Path
from vitedge.core import signals
from vitedge.files.atomic import atomic_output_dir
from vitedge.files.lock import output_locks
from vitedge.files.swap import work_prefix
signals.install()
out = Path(sys.argv[1]); seconds = int(sys.argv[2])
libc = ctypes.CDLL(None)
libc.pthread_create.argtypes = [ctypes.POINTER(ctypes.c_ulong), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
libc.pthread_join.argtypes = [ctypes.c_ulong, ctypes.c_void_p]
try:
    with output_locks([out]), atomic_output_dir(out, force=True) as tmp, tempfile.TemporaryDirectory(prefix=work_prefix("build")) as work:
        (tmp / "half.bin").write_bytes(b"x" * 1000)
        (Path(work) / "w.bin").write_bytes(b"y")
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        tid = ctypes.c_ulong()
        assert libc.pthread_create(ctypes.byref(tid), None, ctypes.cast(libc.sleep, ctypes.c_void_p), ctypes.c_void_p(seconds)) == 0
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        print("in the native call", flush=True)
        libc.pthread_join(tid.value, None)
        print("native call returned", flush=True)
except KeyboardInterrupt as err:  # the signal landed in Python, just before or after the call: the CLI's own path
    message, code = signals.exit_for(err)
    print(f"vitedge: {message}", file=sys.stderr)
    sys.exit(code)
