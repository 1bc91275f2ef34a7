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
# Freed heap kept rather than given back: four of the largest bodies the gateway accepts by
# default (16 MB), each held twice on its way to a body-parsing worker (the pieces read off the
# socket, then their join). At 64 MB, four such bodies at once gave more back after each round
# and took it again: a loop of that took 82 ms a round where it took 28 at 128 MB (29,000 page
# faults against 3,300), and a well-behaved client's p99 beside them (bench-abuse's `big`) was
# 28-84 ms, median 74, at 64 MB (five runs), 18-38, median 28, at 128 (three) and 15-44, median
# 27, at 256 (five). The price: after such a burst the process stays near its peak (264 MB
# after a whole bench-abuse run, where it went back to 166 at 64 MB).
TRIM_BYTES = 128 * 1024 * 1024
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
