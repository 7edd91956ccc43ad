"""Whether this machine computes what another did: a short run of the main base's
pretraining, hashed. One config trained on two CPUs need not give the same weights (XLA and
the kernel libraries it calls choose their code from the CPU), so a study's runs pair with
runs made elsewhere only when the machines' fingerprints match. Seconds, where rebuilding a
base to find out takes minutes.

    python -m grpo_jax.studies fingerprint            # the full tier's base, 20 steps

The published bases' CPU (the second build: experiments/README.md, Provenance) prints
SECOND_BUILD, with or without `XLA_FLAGS=--xla_cpu_max_isa=AVX2`. Another x86 CPU prints it
under the CPU mask (`cpu_mask`), which makes CPUID answer as that CPU.
"""

from __future__ import annotations

import hashlib
import json
import tempfile

SECOND_BUILD = "74fa3bd59a02c587"  # 20 steps of the full tier's main base on its CPU


def fingerprint(steps: int = 20, tier: str = "full") -> dict:
    """Runs `steps` steps of the `tier`'s main-base pretraining (its config, model and
    seed; no tracker or plot) in a scratch directory removed afterwards, and returns
    {"machine": this CPU in run_machines' words, "xla_flags", "steps", "last_loss",
    "fingerprint": the first 16 hex digits of the sha256 of every step's loss, written in
    full}. Equal fingerprints say two machines computed every loss of the run alike, bit
    for bit."""
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"fingerprint: steps must be a positive integer, got {steps!r}")
    from grpo_jax import pipeline  # jax only when a run is made
    from grpo_jax.machine import machine, machine_words
    from grpo_jax.results import FinishedRun
    from grpo_jax.studies.configs import for_tier_base, main_base

    config = for_tier_base(main_base(tier), tier)
    config.pretrain.steps = steps
    config.loggers = ""
    config.report_plots = False
    with tempfile.TemporaryDirectory(prefix="grpo_jax_fingerprint_") as workdir:
        pipeline.train_and_evaluate(config, workdir)
        rows = FinishedRun(workdir).metrics("pretrain")
    losses = [repr(float(row["loss"])) for row in rows if "loss" in row]
    if len(losses) != steps:
        raise RuntimeError(f"fingerprint: the run logged {len(losses)} losses for {steps} steps")
    digest = hashlib.sha256(json.dumps(losses).encode()).hexdigest()[:16]
    found = machine()
    return {"machine": machine_words(found), "xla_flags": found["xla_flags"], "steps": steps,
            "last_loss": float(losses[-1]), "fingerprint": digest}
