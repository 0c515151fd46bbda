"""runtime.allocator: with memory kept, freed tensors stay with the process (no page to map again
next step); released, glibc hands them back to the kernel. Each case in a fresh process, since
the setting is process-wide."""

import os
import platform
import subprocess
import sys
import textwrap

import pytest

from runtime.allocator import FreedMemory

# 256 tensors of 1 MiB, allocated together and freed together (as a step's activations are):
# above glibc's first mmap threshold (128 KiB), below the kept one (32 MiB).
SCRIPT = textwrap.dedent("""
    import os, sys, torch
    from runtime.allocator import FreedMemory, configure

    def resident():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    print(configure(FreedMemory(sys.argv[1])))
    blocks = [torch.ones(1 << 18) for _ in range(256)]
    held = resident()
    del blocks
    print(held - resident())
    blocks = [torch.ones(1 << 18) for _ in range(256)]  # the next step's activations
    print(resident() - held)
""")

MIB = 1 << 20
GLIBC_LINUX = sys.platform == "linux" and platform.libc_ver()[0] == "glibc"


def _run(setting: str) -> tuple[str, int, int]:
    done = subprocess.run([sys.executable, "-c", SCRIPT, setting], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    outcome, given_back, grown = done.stdout.split()
    return outcome, int(given_back), int(grown)


@pytest.mark.skipif(not GLIBC_LINUX, reason="reads /proc and sets glibc's malloc")
def test_kept_memory_stays_with_the_process_and_is_reused():
    outcome, given_back, grown = _run("keep")
    assert outcome == "keep"
    assert given_back < 16 * MIB  # of the 256 MiB freed
    assert grown < 16 * MIB  # the next 256 MiB fit in what was kept


@pytest.mark.skipif(not GLIBC_LINUX, reason="reads /proc and sets glibc's malloc")
def test_released_memory_goes_back_to_the_kernel():
    outcome, given_back, _ = _run("release")
    assert outcome == "release"
    assert given_back > 200 * MIB


def test_settings_are_the_two_documented_words():
    assert [f.value for f in FreedMemory] == ["keep", "release"]
