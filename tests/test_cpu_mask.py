"""The studies' CPU mask (grpo_jax/studies/cpu_mask.c): under it a process's CPUID answers as
the CPU that built the published bases, and a run records that it ran masked."""

import json
import os
import subprocess
import sys

import pytest

from grpo_jax.machine import machine_words
from grpo_jax.studies import cpu_mask

# CPUID from Python: x86-64 machine code for uint32_t f(uint32_t leaf) returning EAX, or
# ECX (subleaf 0), run from an executable page; rbx is saved as the ABI asks.
_PROBE = """
import ctypes, json, mmap, sys
def cpuid(leaf, register):
    code = bytes([0x89, 0xF8, 0x53, 0x31, 0xC9, 0x0F, 0xA2]) \\
        + (b"" if register == "eax" else bytes([0x89, 0xC8])) + bytes([0x5B, 0xC3])
    page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(code)
    address = ctypes.addressof(ctypes.c_char.from_buffer(page))
    return ctypes.CFUNCTYPE(ctypes.c_uint32, ctypes.c_uint32)(address)(leaf)
from grpo_jax.machine import machine
print(json.dumps({"leaf1_eax": cpuid(1, "eax"), "l1d_kib": cpuid(0x80000005, "ecx") >> 24,
                  "machine": machine()}))
"""


def _probe(env):
    done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                          text=True, check=True, timeout=120)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_masked_process_sees_the_canonical_cpu_and_its_runs_say_so(tmp_path):
    """Under LD_PRELOAD of the built mask, CPUID reports family 19h model 01h (leaf 1) and a
    32 KiB L1d (leaf 8000_0005h), numpy's runtime detection sees no AVX-512, and machine()
    records `seen_isa` where /proc/cpuinfo offers AVX-512; without it, the same probe sees
    the real CPU. The library is built once per source: a second build() reuses it."""
    why = cpu_mask.unavailable()
    if why:
        pytest.skip(why)
    library = cpu_mask.build(str(tmp_path))
    assert cpu_mask.build(str(tmp_path)) == library and os.listdir(tmp_path) == [
        os.path.basename(library)]
    env = {**os.environ, "XLA_FLAGS": ""}
    plain = _probe(env)
    masked = _probe({**env, "LD_PRELOAD": library})
    assert masked["leaf1_eax"] == 0x00A00F11 and masked["l1d_kib"] == 32
    assert masked["machine"]["isa"] == plain["machine"]["isa"]  # /proc/cpuinfo's, unmasked
    if plain["machine"]["isa"] == "AVX512":
        assert plain["leaf1_eax"] != 0x00A00F11 and "seen_isa" not in plain["machine"]
        assert masked["machine"]["seen_isa"] == "AVX2"
        assert machine_words(masked["machine"]) == (
            f"{masked['machine']['cpu']} (AVX512 seen as AVX2 under a CPUID mask)")


def test_the_mask_says_in_one_line_why_it_cannot_work(tmp_path):
    """A CPU without CPUID faulting is refused before anything is compiled, naming the flag."""
    info = tmp_path / "cpuinfo"
    info.write_text("model name\t: Some CPU\nflags\t\t: fpu sse2 avx avx2\n")
    why = cpu_mask.unavailable(str(info))
    if why and "x86-64 Linux" in why:
        pytest.skip(why)
    assert "cpuid_fault" in why and "\n" not in why
    info.write_text("model name\t: Some CPU\nflags\t\t: fpu avx2 cpuid_fault\n")
    why = cpu_mask.unavailable(str(info))
    assert why is None or why.startswith("the CPU mask is built with a C compiler")


def test_machine_words_name_a_mask_and_a_cap():
    found = {"cpu": "AMD EPYC", "isa": "AVX512", "cpus": 2,
             "xla_flags": "--xla_cpu_max_isa=AVX2", "seen_isa": "AVX2"}
    assert machine_words(found) == "AMD EPYC (AVX512 seen as AVX2 under a CPUID mask, " \
                                   "capped at AVX2)"
    del found["seen_isa"]
    assert machine_words(found) == "AMD EPYC (AVX512, capped at AVX2)"
