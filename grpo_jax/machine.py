"""The machine a run's floating-point results depend on, recorded and put in words.

`machine()` is read into every run's report.json (`runner.report.code_provenance`);
`machine_words` names a recorded one in report.md's "Code:" line and in a study's
`provenance.run_machines`; `cpuinfo_model_and_flags` is the one /proc/cpuinfo reader (the
studies' CPU mask asks it for `cpuid_fault`). No jax: the study and sweep processes read
finished runs without it.
"""

from __future__ import annotations

import os
import platform
import re

__all__ = ["cpuinfo_model_and_flags", "machine", "machine_words", "seen_isa"]

# the x86 vector sets, widest first: /proc/cpuinfo's flag, numpy's CPUID feature, the name
_ISAS = (("avx512f", "AVX512F", "AVX512"), ("avx2", "AVX2", "AVX2"), ("avx", "AVX", "AVX"),
         ("sse4_2", "SSE42", "SSE4_2"))


def cpuinfo_model_and_flags(cpuinfo: str = "/proc/cpuinfo") -> tuple[str | None, set]:
    """The first CPU's model name (platform.processor() where the file names none) and its
    flags (empty where the file is missing or lists none), from /proc/cpuinfo."""
    model, flags = platform.processor() or None, set()
    try:
        with open(cpuinfo, encoding="utf-8") as info:
            for line in info:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    return model, flags


def machine(cpuinfo: str = "/proc/cpuinfo") -> dict:
    """The CPU a run's floating-point results depend on: its model name, the widest x86
    vector instruction set it offers ("AVX512", "AVX2", "AVX", "SSE4_2"; None when
    /proc/cpuinfo says none of them, e.g. another architecture), its logical CPUs and
    XLA_FLAGS; and "seen_isa" where the process's CPUID reports another set than
    /proc/cpuinfo (a CPUID mask). XLA compiles for the widest set unless `--xla_cpu_max_isa`
    caps it, and one config trained under two sets gives different weights, so a run's
    numbers repeat only where these match."""
    model, flags = cpuinfo_model_and_flags(cpuinfo)
    isa = next((name for flag, _, name in _ISAS if flag in flags), None)
    found = {"cpu": model, "isa": isa, "cpus": os.cpu_count(),
             "xla_flags": os.environ.get("XLA_FLAGS", "")}
    seen = seen_isa()
    if isa and seen and seen != isa:  # CPUID answers otherwise: grpo_jax/studies/cpu_mask.c
        found["seen_isa"] = seen
    return found


def seen_isa() -> str | None:
    """The widest x86 vector set this process's CPUID reports, as numpy detected it on
    import ("AVX512", "AVX2", "AVX", "SSE4_2"; None where it reports none of them, e.g.
    another architecture). It is /proc/cpuinfo's set unless a CPUID mask (the studies'
    `cpu_mask`) makes the process see another CPU."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as features
    except ImportError:
        return None
    return next((name for _, feature, name in _ISAS if features.get(feature)), None)


def machine_words(found: dict | None) -> str:
    """A machine as `machine()` records it, in words: "<cpu> (<isa>)", "<cpu> (<isa>,
    capped at <set>)" where XLA_FLAGS' `--xla_cpu_max_isa` capped the set XLA compiled for,
    "<cpu> (<isa> seen as <set> under a CPUID mask, ...)" where the process's CPUID reported
    another set (the studies' `cpu_mask`); "unrecorded" for None (a run whose code did not
    record it)."""
    if not found:
        return "unrecorded"
    cap = re.search(r"--xla_cpu_max_isa=(\w+)", found.get("xla_flags") or "")
    capped = f", capped at {cap.group(1).upper()}" if cap else ""
    seen = (f" seen as {found['seen_isa']} under a CPUID mask" if found.get("seen_isa")
            else "")
    return f"{found.get('cpu')} ({found.get('isa')}{seen}{capped})"
