"""How a CPU rank's memory allocator treats freed activations: kept for the next step, as a
GPU's caching allocator keeps them, or handed back to the operating system.

glibc's malloc (the CPU tensors' allocator) by default maps blocks above a threshold that starts
at 128 KiB straight from the kernel and unmaps them when freed, and gives the top of its heap
back once more than twice that threshold lies free there. A pipeline step allocates its
activations in the forwards and frees them in the backwards, so every step the kernel maps,
faults in and zeroes them again, page by page: the more activations a schedule holds, the slower
its compute. Measured on gpt with 256 rows per microbatch at p=2 (README, "Freed memory kept";
bench/freed_memory.py), GPipe m=8 (4.6 GB of activations per rank) stepped x1.43 of 1F1B m=8's
(1.1 GB) with memory handed back and x1.00 with it kept. A GPU run knows no such cost (torch's CUDA caching allocator keeps
freed blocks), so the executor keeps them on CPU too, unless told to hand them back.

Kept means (mallopt, glibc's malloc.h): blocks up to 32 MiB (glibc's largest threshold on 64-bit)
come from the heap, never from their own mapping, and the heap is never trimmed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import enum

# mallopt parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 32 << 20  # glibc's ceiling for it on 64-bit hosts (HEAP_MAX_SIZE / 2)
TOP_PAD = 64 << 20  # grow the heap in steps this much beyond a request, so that it grows seldom
NEVER_TRIM = -1  # mallopt(M_TRIM_THRESHOLD, -1) turns trimming off (man 3 mallopt)


class FreedMemory(str, enum.Enum):
    """What a CPU rank's allocator does with freed blocks."""

    KEEP = "keep"  # kept for reuse (the default: as a GPU's caching allocator)
    RELEASE = "release"  # glibc's defaults: large blocks unmapped, the heap's top trimmed


def configure(freed: FreedMemory) -> str:
    """Set this process's malloc for `freed` and say what was done, for the run's summary:
    "keep" or "release", or why nothing could be set (not glibc). Release leaves glibc's
    defaults as they are, so a process told to keep does not go back (the executor sets it
    once per rank, before the first activation)."""
    if freed is FreedMemory.RELEASE:
        return FreedMemory.RELEASE.value
    libc = _glibc()
    if libc is None:
        return "unchanged: the C library is not glibc"
    settings = ((_M_MMAP_THRESHOLD, MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, NEVER_TRIM), (_M_TOP_PAD, TOP_PAD))
    failed = [name for name, value in settings if libc.mallopt(name, value) != 1]
    if failed:
        return f"unchanged: mallopt refused parameter(s) {failed}"
    return FreedMemory.KEEP.value


def _glibc() -> ctypes.CDLL | None:
    """The process's glibc, or None on another C library (musl, macOS, Windows)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.gnu_get_libc_version()
    except (OSError, AttributeError):
        return None
    libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    libc.mallopt.restype = ctypes.c_int
    return libc
