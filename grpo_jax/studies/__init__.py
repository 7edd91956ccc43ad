"""The studies of experiments/, each one command: `python -m grpo_jax.studies run NAME`.

    python -m grpo_jax.studies list
    python -m grpo_jax.studies run NAME --tier=full|mini --workdir=DIR [--publish]

A study is data (`common.Study`, defined in `grpo_jax/studies/<name>.py`): the config of the
pretrained base it needs (a run keyed by its config, built once under DIR/bases/ and reused by
every study that asks for the same config), its arms' configs, the seeds and bases of each
tier, and its analysis. `run` builds the bases, runs the arms with paired seeds (finished runs
are skipped, so the same command resumes), analyses, and writes DIR/NAME/out/: summary.json
(one schema: `grpo_jax.studies.summary`), table.md, the plots and README.md (the study's README
with its results block regenerated from summary.json). `--publish` copies them into
experiments/NAME/; nothing there is written otherwise. The mini tier is the same pipeline at
toy size (its numbers mean nothing); the tests run it for every ported study.
"""

from __future__ import annotations

import importlib
import importlib.util

# Every study of experiments/, in the order of experiments/README.md; `PORTED`: those with
# a study module (the others still run by their scripts in experiments/<name>/).
NAMES = ("baselines", "length_bias", "difficulty_bias", "pass_at_k", "length_growth",
         "distill_vs_rl", "budget_forcing", "cold_start", "kl_beta", "off_policy", "tool_use")
PORTED = tuple(n for n in NAMES if importlib.util.find_spec(f"grpo_jax.studies.{n}"))

# The recorded full-tier cost of the studies not ported yet (their READMEs' wall times on the
# 2-core CPU); their mini tier comes with their port.
RECORDED_COST = {
    "baselines": "about 14 min (3 seeds of 4,096 score functions on the shared base)",
    "length_bias": "about 20 min for the base, 41 min for the 6 runs and held-out checks",
    "difficulty_bias": "about 4 min (3 seeds of 2,048 score functions)",
    "pass_at_k": "about 34 min (6 evaluations at k up to 256)",
    "length_growth": "about 45 min (length_bias's runs plus a redo_rate 0 control)",
    "budget_forcing": "about 10 min (21 evaluations of off_policy's and a redo base's runs)",
}

__all__ = ["NAMES", "PORTED", "RECORDED_COST", "get"]


def get(name: str):
    """The `common.Study` of a ported study."""
    if name not in NAMES:
        raise ValueError(f"unknown study {name!r}; expected one of {', '.join(NAMES)}")
    if name not in PORTED:
        raise ValueError(f"study {name!r} is not ported to grpo_jax.studies yet: run it with "
                         f"the commands of experiments/{name}/README.md")
    return importlib.import_module(f"grpo_jax.studies.{name}").STUDY
