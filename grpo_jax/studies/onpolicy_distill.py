"""On-policy distillation against R1's distillation and against RL on the student.

The bases are distill_vs_rl's, built per base seed (0 and 1) from the same configs (so a
shared workdir builds them once): the student (tiny-300k, pretrained), the main job's base,
and the teacher (tiny-1m after GRPO from that base). Three arms from the student, each
training on 7,680 sequences (60 x 128):

* `on-policy distillation`: the student samples 16 prompts x 8 completions per step; the
  loss is the reverse KL of its next-token distributions to the teacher's at every token
  (`onpolicy_distill` stage, lr 2e-4, 60 steps: the teacher scores each sampled sequence
  once, 7,680 teacher passes);
* `R1 distillation`: distill_vs_rl's `distill` arm (the teacher samples 8 completions of 960
  problems, 7,680 teacher sequences; SFT on the verified ones);
* `GRPO`: distill_vs_rl's `rl` arm (60 GRPO steps on the student's own 7,680 samples, no
  teacher).
"""

from __future__ import annotations

import ml_collections

from grpo_jax.studies import common, tables, tiers
from grpo_jax.studies.arms import per_arm
from grpo_jax.studies import distill_vs_rl

OPD, R1, RL = "on-policy distillation", "R1 distillation", "GRPO"
METRICS = ("pass@1", "pass@8", "format_rate")
PASS_MARGIN = 0.03
SPECS = [(OPD, R1, "pass@1"), (OPD, RL, "pass@1"), (R1, RL, "pass@1"),
         (OPD, "student", "pass@1")]

base_config = distill_vs_rl.base_config


def arm_config(tier: str = "full", arm: str = OPD):
    """One arm's run from the student (model.init_from) and, for on-policy distillation,
    the teacher's run (onpolicy_distill.teacher), set per base by `attach`."""
    from grpo_jax.stages import default_section

    if arm == R1:
        return distill_vs_rl.arm_config(tier, "distill")
    if arm == RL:
        return distill_vs_rl.arm_config(tier, "rl")
    config = distill_vs_rl.arm_config(tier, "rl")
    rl = config.rl
    config.onpolicy_distill = default_section("onpolicy_distill")
    config.onpolicy_distill.update(
        steps=rl.steps, num_prompts=rl.num_prompts, group_size=rl.group_size,
        max_new_tokens=rl.max_new_tokens, lr=rl.lr, teacher="",  # the teacher's run
        rewards=ml_collections.ConfigDict(dict(rl.rewards)))  # logged, not trained on
    config.stages = "eval_base,onpolicy_distill,eval_final"
    del config.rl
    return config


def arm_configs(tier: str) -> dict:
    return {arm: arm_config(tier, arm) for arm in (OPD, R1, RL)}


def attach(config, base: dict) -> None:
    """The student's parameters for every arm; the teacher's run for the distillations."""
    distill_vs_rl.attach(config, base)
    if "onpolicy_distill" in config:
        config.onpolicy_distill.teacher = base["roles"]["teacher"]


def _values(record) -> dict:
    values = common.eval_values(record, METRICS)
    rows = [r for r in common.training_rows(record) if r.get("reverse_kl") is not None]
    if rows:
        values["reverse_kl_first"] = rows[0]["reverse_kl"]
        last = rows[-10:]
        values["reverse_kl_last10"] = sum(r["reverse_kl"] for r in last) / len(last)
    return values


def analyze(runs: common.StudyRuns) -> common.Analysis:
    arms = per_arm(runs, _values, (OPD, R1, RL))
    common.add_base_arm(arms, RL, METRICS, name="student")
    return common.Analysis(arms=arms, specs=SPECS, table=table(arms),
                           plots=tables.bar_plots(arms, (tables.PASS_AT_1, tables.PASS_AT_8)))


def table(arms: dict) -> str:
    def row(m):
        kl = "-"
        if m.get("reverse_kl_first"):
            kl = (f"{common.cell(m['reverse_kl_first'], 1.0, 3)} → "
                  f"{common.cell(m['reverse_kl_last10'], 1.0, 3)}")
        return [common.cell(m["pass@1"]), common.cell(m["pass@8"]),
                common.cell(m["format_rate"]), kl]

    return tables.arm_table(
        arms, ("student", OPD, R1, RL),
        ("pass@1", "pass@8", "format rate", "reverse KL to the teacher (first step → last 10)"),
        row,
        "In %, the KL in nats per token; mean ± 95% half-width over (base, seed) runs; 128 "
        "held-out problems x 8 samples, the student's before and after.")


SOURCE = ("Agarwal et al. 2024, \"On-Policy Distillation of Language Models: Learning from "
          "Self-Generated Mistakes\", arXiv:2306.13649, abstract (close paraphrase)")
CLAIMS = (
    common.Claim("training the student on its self-generated sequences with the teacher's "
                 "feedback on them outperforms supervised distillation on fixed sequences",
                 SOURCE + "; the supervised arm here is R1's (the teacher's verified samples)",
                 (OPD, R1, "pass@1"), ">", margin=PASS_MARGIN,
                 why="the supervised arm fine-tunes on the teacher's verified, well-formed "
                     "samples only, at its own higher learning rate, while on-policy "
                     "distillation follows the whole distribution of a weak teacher (a "
                     "short GRPO stage on the main base), its wrong answers included, at "
                     "the GRPO arm's learning rate, untuned: R1 distillation can end level "
                     "with it or ahead"),
    common.Claim("distilling a stronger teacher beats RL on the student at the same samples",
                 "DeepSeek-AI 2025, DeepSeek-R1, arXiv:2501.12948, sec. 4.1 (close "
                 "paraphrase); here with on-policy distillation", (OPD, RL, "pass@1"), ">",
                 margin=PASS_MARGIN,
                 why="the teacher (a short GRPO stage on the main base) is wrong on some "
                     "problems, and the reverse KL pulls the student towards its wrong "
                     "answers as towards its right ones, where "
                     "GRPO pays right answers only; at the same steps and learning rate, "
                     "GRPO sharpening the answers the student already samples right can gain "
                     "as much as a 300k-parameter student gains from matching a larger "
                     "teacher's distribution"),
)

STUDY = common.Study(
    name="onpolicy_distill",
    question="does on-policy distillation (reverse KL to the teacher on the student's own "
             "samples) beat R1's distillation and GRPO on the student at 7,680 sequences, "
             "paired by seed?",
    tiers=tiers.standard(
        full="about 25 min on 2 cores (measured: 1465 s beside another "
             "study process, distill_vs_rl's bases built in (the main "
             "base already built); 18 runs of the tiny-300k student)"),
    arms=(OPD, R1, RL), base_config=base_config, arm_configs=arm_configs, analyze=analyze,
    attach=attach, claims=CLAIMS,
)
