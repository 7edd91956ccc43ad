"""Stage kind "rejection_sft" (DeepSeek-R1, https://arxiv.org/abs/2501.12948, sec. 2.3.3):
sample k completions per training problem from the current policy, keep the verified-correct
and well-formed ones, optionally mix in clean worked solutions, fine-tune on them.

The kept rows are written to `<workdir>/<stage>/data.jsonl` the first time and read back on
a resume."""

from __future__ import annotations

import ml_collections

from grpo_jax.runner import StageKind
from grpo_jax.runner.supervised import (VERIFIED_GROUPS, clean_solutions, sample_verified,
                                        stage_rows, train_on_rows,
                                        validate_verified_sampling, verified_sampling_fields)


def default_section() -> ml_collections.ConfigDict:
    """Config section of a "rejection_sft" stage (every field commented)."""
    s = ml_collections.ConfigDict()
    s.kind = "rejection_sft"
    verified_sampling_fields(s)
    s.mix_sft_examples = 0  # clean worked solutions mixed into the kept rows
    return s


def validate(check) -> None:
    validate_verified_sampling(check)
    check.integer("mix_sft_examples", low=0)


def run_rejection_sft(run, stage) -> None:
    section = stage.section

    def sample():
        prompts, completions, info = sample_verified(
            run, stage, run.policy, run.params, seed=run.stage_seed(stage.name, "problems"))
        mix_p, mix_c = clean_solutions(run, section.mix_sft_examples,
                                       seed=run.stage_seed(stage.name, "mixed_in"))
        info["mixed_in"] = len(mix_p)
        return prompts + mix_p, completions + mix_c, info

    train_on_rows(run, stage, *stage_rows(run, stage, sample))


KIND = StageKind("rejection_sft", run_rejection_sft, default_section, validate,
                 description="rejection-sampling SFT on the policy's verified samples",
                 lora=True, groups=VERIFIED_GROUPS)
