"""Give freed heap memory back to the operating system.

glibc's malloc serves blocks below its (adaptive, up to 32 MiB) mmap threshold from its heaps and
keeps them when they are freed: after the PyTorch module and the exporter of vit_h_14 (2.5 GB of
weights in 26 MB tensors) were freed, the build process still held ~4.9 GB. ``malloc_trim``
returns those pages; the large-graph stages call it when they drop what they no longer need.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        return libc.malloc_trim  # glibc only
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> bool:
    """Collect garbage, then hand the C heap's free pages back (glibc); False where there is no
    malloc_trim (musl, macOS, Windows), which is harmless."""
    gc.collect()
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
