"""Three results of the arithmetic studies rerun on two reasoning-gym task families, so that a
property of GRPO can be told from a property of the arithmetic task: forking tokens
(forking_tokens), distillation against RL at equal sequences (distill_vs_rl) and stale
rollouts with the decoupled objective (off_policy), each by its strongest contrast.

The families (configs/reasoning_gym_tasks.py's presets, grpo_jax/tasks/reasoning_gym.py):
`letter_counting` (a letter's occurrences in two words of text) and `spell_backward` (a word of
3-5 letters spelled backward), the two presets that are not arithmetic. Per base seed, one
role set holds three roles per family, built as distill_vs_rl builds its own:

  <family>:base     the preset's pretraining (tiny-1m on the family's noisy worked solutions)
  <family>:student  the same pretraining of tiny-300k, then its held-out evaluation
  <family>:teacher  the base after the family's GRPO stage (the preset's rl and eval_final)

Arms, each named "<family>: <arm>", each from its family's roles (`attach`); every GRPO arm is
the preset's GRPO stage (eval_base -> rl -> eval_final; accuracy from the dataset's scorer +
0.2 x format, host rewards) and differs from `all` in one field:

  all              the preset's GRPO stage from the base: every token, on-policy (K = 0)
  top20            the policy gradient on the 20% highest-entropy tokens of each update
                   (rl.entropy_tokens = 0.2, rl.entropy_side = "top"; forking_tokens' arm)
  K=8,ppo-clip     rollouts 8 updates stale (rl.max_staleness), PPO's clipped ratio against
                   the stale sampler (rl.off_policy_correction = "none"; off_policy's arm)
  K=8,decoupled    the same staleness, AReaL's decoupled objective (off_policy's arm)
  rl (student)     the preset's GRPO stage from the student (tiny-300k)
  distill          the student fine-tuned on the teacher's verified samples: the teacher
                   samples as many sequences as `rl (student)` samples (problems x samples =
                   GRPO steps x prompts x group), and the student trains on as many rows

Every evaluation uses the family's held-out problems, fixed across seeds (task.eval_seed).
The contrasts are within a family, paired by (base, seed): top20 - all, K=8,ppo-clip - all,
K=8,decoupled - K=8,ppo-clip and distill - rl (student), in held-out pass@1 (a completion
counts when the dataset's scorer gives it 1).
"""

from __future__ import annotations

import dataclasses
import functools

from grpo_jax.studies import (
    common,
    distill_vs_rl,
    families,
    forking_tokens,
    off_policy,
    tables,
    tiers,
)
from grpo_jax.studies.arms import per_arm

FAMILIES = families.FAMILIES
MINI_FAMILY = families.SECOND
ALL, TOP, PPO, DECOUPLED, RL_STUDENT, DISTILL = (
    "all", "top20", "K=8,ppo-clip", "K=8,decoupled", "rl (student)", "distill")
KINDS = (ALL, TOP, PPO, DECOUPLED, RL_STUDENT, DISTILL)
# The mini tier's arms: the family's roles end to end (base, student, teacher) and the one
# result whose arms only this study runs, distill - rl (student). top20's field is
# forking_tokens' arm and the stale arms' are off_policy's, each run by that study's mini
# tier; their analysis here is the same contrast code, checked on hand-made runs
# (tests/test_replication_study.py).
MINI_KINDS = (ALL, RL_STUDENT, DISTILL)
STALENESS = 8
STUDENT_MODEL = "tiny-300k"
METRICS = ("pass@1", "pass@8", "format_rate")
TEACHER = "teacher"  # a pseudo-arm: the teacher role's final evaluation


arm_name = families.arm_name


ARMS = tuple(arm_name(f, k) for f in FAMILIES for k in KINDS)


# ---- configs ------------------------------------------------------------------------------

def grpo_arm(tier: str, family: str, role: str = "base", stages: str = "eval_base,rl,eval_final"):
    """The preset's GRPO stage from the family's role `role` (the student: tiny-300k)."""
    return families.grpo(tier, family, role, stages,
                         model=STUDENT_MODEL if role == "student" else None)


def _teacher(tier: str, family: str, roles: dict):
    config = grpo_arm(tier, family, stages="rl,eval_final")
    config.model.init_from = roles[families.role(family)]
    return config


def base_config(tier: str) -> dict:
    """Per family the base, the student and the teacher (the mini tier: one family's)."""
    roles = {}
    for family in (FAMILIES if tier == "full" else (MINI_FAMILY,)):
        roles[families.role(family)] = families.base(tier, family)
        roles[families.role(family, "student")] = families.base(tier, family, STUDENT_MODEL)
        roles[families.role(family, "teacher")] = functools.partial(_teacher, tier, family)
    return roles


def distill_arm(tier: str, family: str):
    """The student fine-tuned on the teacher's verified samples, as many sequences sampled
    and trained on as `rl (student)` samples."""
    from grpo_jax.stages import default_section

    config = grpo_arm(tier, family, "student", "eval_base,distill,eval_final")
    rl = config.rl
    sequences = int(rl.steps) * int(rl.num_prompts) * int(rl.group_size)
    del config.rl
    config.distill = default_section("distill")
    config.distill.teacher = f"{family}:teacher"
    config.distill.student_model = STUDENT_MODEL
    config.distill.num_samples = 8 if tier == "full" else 2
    config.distill.num_problems = sequences // config.distill.num_samples
    config.distill.sample_batch_size = 256 if tier == "full" else 32
    config.distill.max_new_tokens = config.eval_base.max_new_tokens
    config.distill.batch_size = 64 if tier == "full" else 8
    config.distill.steps = sequences // config.distill.batch_size
    config.distill.lr = distill_vs_rl.arm_config("full", "distill").distill.lr
    return config


def arm_config(tier: str, family: str, kind: str):
    if kind == DISTILL:
        return distill_arm(tier, family)
    if kind == RL_STUDENT:
        return grpo_arm(tier, family, "student")
    config = grpo_arm(tier, family)
    if kind == TOP:
        config.rl.entropy_tokens, config.rl.entropy_side = forking_tokens.SELECTION[
            forking_tokens.TOP]
    elif kind in (PPO, DECOUPLED):
        # the mini tier's 2 steps allow a staleness of 1 at most (its numbers mean nothing)
        config.rl.max_staleness = min(STALENESS, int(config.rl.steps) - 1)
        config.rl.off_policy_correction = off_policy.OBJECTIVES[kind.split(",")[1]]
    elif kind != ALL:
        raise ValueError(f"replication: arm kind {kind!r}; expected one of {', '.join(KINDS)}")
    return config


def arm_configs(tier: str) -> dict:
    return {arm_name(f, k): arm_config(tier, f, k) for f in FAMILIES for k in KINDS}


def attach(config, base: dict) -> None:
    """Every role name the arm holds (model.init_from; the distillation's student and
    teacher) replaced by the role's directory of this base seed."""
    roles = base["roles"]
    config.model.init_from = roles[config.model.init_from]
    if "distill" in config:
        config.distill.student_init_from = config.model.init_from
        config.distill.teacher = roles[config.distill.teacher]


# ---- analysis -----------------------------------------------------------------------------

def _values(record) -> dict:
    values = common.eval_values(record, METRICS)
    rows = [r for r in common.training_rows(record) if "token_frac" in r]
    if rows:
        values["token_frac"] = sum(r["token_frac"] for r in rows) / len(rows)
    return values


def _add_teacher(arms: dict, runs: common.StudyRuns, family: str) -> None:
    """The pseudo-arm "<family>: teacher": the teacher's final evaluation (one run per base)
    at each (base, seed) of the distill arm; shown, never contrasted (a one-sample
    comparison is not a paired difference)."""
    like = arms.get(arm_name(family, DISTILL))
    if like is None:
        return
    figures = {}
    for key, base in runs.bases.items():
        workdir = base.get("roles", {}).get(f"{family}:teacher")
        if workdir:
            record = common.RunRecord("teacher", key, base["seed"], workdir, None)
            figures[key] = common.last_stage_rows(record).get("eval_final", {})
    arms[arm_name(family, TEACHER)] = {
        "seeds": list(like["seeds"]), "bases": list(like["bases"]),
        "metrics": {m: [figures.get(b, {}).get(m) for b in like["bases"]] for m in METRICS}}


def _specs(family: str) -> list[tuple[str, str, str]]:
    a = functools.partial(arm_name, family)
    return [(a(TOP), a(ALL), "pass@1"), (a(PPO), a(ALL), "pass@1"),
            (a(DECOUPLED), a(PPO), "pass@1"), (a(DISTILL), a(RL_STUDENT), "pass@1")]


SPECS = [spec for family in FAMILIES for spec in _specs(family)]


def analyze(runs: common.StudyRuns) -> common.Analysis:
    arms = per_arm(runs, _values, ARMS)
    for family in FAMILIES:  # each family's bases before RL (the `all` runs' eval_base)
        common.add_base_arm(arms, arm_name(family, ALL), METRICS,
                            name=arm_name(family, "base"))
        common.add_base_arm(arms, arm_name(family, RL_STUDENT), METRICS,
                            name=arm_name(family, "student"))
        _add_teacher(arms, runs, family)
    order = [arm_name(f, k) for f in FAMILIES
             for k in ("base", "student", *KINDS, TEACHER)]
    arms = {name: arms[name] for name in order if name in arms}
    return common.Analysis(arms=arms, specs=SPECS, table=table(arms),
                           plots=tables.bar_plots(arms, (tables.PASS_AT_1, tables.PASS_AT_8)))


def table(arms: dict) -> str:
    def row(m):
        cell = tables.optional_cells(m)
        return [cell("pass@1"), cell("pass@8"), cell("format_rate"), cell("token_frac")]

    return tables.arm_table(
        arms, list(arms), ("pass@1", "pass@8", "format rate", "tokens trained"), row,
        "In %, mean ± 95% half-width over (base, seed) runs on the family's held-out "
        "problems; a base or student row: the same runs' evaluation before training; a "
        "teacher row: the teacher's own run, one per base, repeated at each seed. "
        "\"tokens trained\": the share of the loss mask's tokens that carried the policy "
        "gradient (training mean).", first="arm")


# ---- claims -------------------------------------------------------------------------------

# The originals, quoted as their studies quote them (same text, source and margin).
FORKING = forking_tokens.CLAIMS[0]
STALE_PPO = off_policy.CLAIMS[1]
DECOUPLED_CLAIM = off_policy.CLAIMS[2]
DISTILL_CLAIM = distill_vs_rl.CLAIMS[0]

# family -> (original claim, arm kinds of its test, why the test could fail on the family)
WHY = {
    "letter_counting": {
        TOP: "a letter_counting completion is a few per-word counts and a number; the "
             "high-entropy tokens are the counts, so the top 20% may hold the whole "
             "decision and top20 may equal all, or fall short where the format tokens "
             "need the gradient too",
        PPO: "the completions are short (up to 40 tokens): the sequence weight of a stale "
             "sample moves less than over longer completions, and the policy may drift too "
             "little in 8 updates for the stale clip to cost pass@1",
        DECOUPLED: "the decoupled objective can help only if ppo-clip at K = 8 loses "
                   "something to staleness on this family; without a loss there is nothing "
                   "to recover",
        DISTILL: "the tiny-300k student may learn the per-word counts from GRPO's own reward "
                 "as fast as from the teacher's traces, or the teacher may keep few verified "
                 "samples where it is weak",
    },
    "spell_backward": {
        TOP: "spell_backward's letters are fixed by the word once it is read, so few tokens "
             "are forks; the top 20% by entropy may be spread over letters the gradient "
             "needs whole, and top20 may fall short of all",
        PPO: "the completions are short (a few letters): the stale sampler and the trainer "
             "may not drift apart enough in 8 updates for the stale clip to cost pass@1",
        DECOUPLED: "the decoupled objective can help only if ppo-clip at K = 8 loses "
                   "something to staleness on this family",
        DISTILL: "GRPO's partial-credit reward (the share of letters in place) gives the "
                 "student a dense signal RL can climb alone, so GRPO on the student may "
                 "match the distilled student at equal sequences",
    },
}
TESTS = {TOP: (FORKING, TOP, ALL), PPO: (STALE_PPO, PPO, ALL),
         DECOUPLED: (DECOUPLED_CLAIM, DECOUPLED, PPO), DISTILL: (DISTILL_CLAIM, DISTILL, RL_STUDENT)}


def _claim(family: str, kind: str) -> common.Claim:
    original, a, b = TESTS[kind]
    test = (arm_name(family, a), arm_name(family, b), original.test[2])
    return dataclasses.replace(
        original, test=test, can_fail="", why=WHY[family][kind],
        source=f"{original.source}; rerun on reasoning-gym's {family}")


CLAIMS = tuple(_claim(family, kind) for family in FAMILIES
               for kind in (TOP, PPO, DECOUPLED, DISTILL))

STUDY = common.Study(
    name="replication",
    question="do forking tokens, distillation above RL at equal sequences, and the decoupled "
             "objective under stale rollouts hold on two reasoning-gym families that are "
             "not arithmetic (letter_counting, spell_backward), paired by (base, seed) within "
             "each family?",
    tiers=tiers.standard(
        full="about 4 h on 2 cores, estimated from docs/reasoning_gym.md's measured preset "
             "runs (letter_counting: pretraining 158 s, GRPO 57 s; spell_backward: "
             "pretraining 938 s under the heaviest load seen, GRPO 80 s; the evaluations "
             "seconds): 8 role sets of a base, a tiny-300k student and a teacher (about 6 min "
             "a letter_counting set, 10-20 min a spell_backward set: about 1.3 h), 80 GRPO "
             "runs at about 1.3 min and 16 distillation runs at about 3 min (sampling 10,240 "
             "teacher completions, 160 SFT steps: about 2.5 h); up to about 6.5 h at the "
             "heaviest load measured there",
        mini="about 30 s of CPU on 2 cores, measured (31-33 s for its test alone, which "
             "compiles every program itself; 54-74 s wall beside other jobs): one toy role "
             "set of spell_backward (base, student, teacher) and the toy runs of its three "
             "arms all, rl (student) and distill, one seed",
        mini_arms=tuple(arm_name(MINI_FAMILY, k) for k in MINI_KINDS),
        full_sized=True),
    arms=ARMS, base_config=base_config, arm_configs=arm_configs, analyze=analyze,
    attach=attach, claims=CLAIMS,
)
