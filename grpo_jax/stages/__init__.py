"""The stage kinds, one module each; a config section's `kind` names one of them.

Adding a kind: write `grpo_jax/stages/<kind>.py` defining `KIND = runner.StageKind(...)`
(its run function, default section, validation) and add it to the list below.
"""

from __future__ import annotations

import ml_collections

from grpo_jax.runner.registry import Registry
from grpo_jax.stages import (distill, evaluate, onpolicy_distill, ppo, rejection_sft,
                             reward_model, rl, supervised, trpo)

KINDS = Registry([
    supervised.PRETRAIN,
    supervised.SFT,
    evaluate.KIND,
    rl.KIND,
    ppo.KIND,
    trpo.KIND,
    reward_model.KIND,
    rejection_sft.KIND,
    distill.KIND,
    onpolicy_distill.KIND,
])


def default_section(kind: str) -> ml_collections.ConfigDict:
    """A fresh config section of stage kind `kind` with every field at its default."""
    if kind not in KINDS:
        raise ValueError(f"unknown stage kind {kind!r}; expected one of {sorted(KINDS)}")
    return KINDS[kind].default_section()
