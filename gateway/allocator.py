"""The C allocator of a serving process: memory a request freed is kept for the next one.

glibc's malloc gives the free top of its heap back to the kernel once more than its trim
threshold lies there, and serves blocks above its mmap threshold with mappings of their own;
both thresholds follow the largest block freed so far. A large request's copies (its body as
read, joined, parsed and written) are all freed together when it ends, more than that threshold
at once, so the heap shrank after a request and grew again for the next, and the kernel zeroed
fresh pages for each: under 200 KB prompts at four at once, 45,000 page faults and 780 `brk`
calls a second in the gateway (perf stat, 8 s), 143 page faults in all with the thresholds
fixed. Fixed, up to TRIM_BYTES of freed heap stay with the process for reuse.
"""

from __future__ import annotations

import ctypes

# mallopt's parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# Freed heap kept rather than given back: four times the largest body the gateway accepts by
# default (16 MB).
TRIM_BYTES = 64 * 1024 * 1024
# Blocks up to this size come from the heap (every body the gateway accepts by default), where
# freed memory is reused; glibc refuses more than 32 MB here on 64-bit machines.
MMAP_BYTES = 32 * 1024 * 1024


def tune_allocator() -> bool:
    """Fix glibc's trim and mmap thresholds for this process; False where the C library has no
    such settings (musl, macOS) or refuses one, and then keeps its own ways."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_BYTES)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_BYTES)
    )
