"""Distillation from a larger RL-trained teacher vs RL on the small student itself
(DeepSeek-R1, arXiv:2501.12948, sec. 4.1: distilled Qwen-32B against RL on Qwen-32B).

Three base runs per base seed (shared, keyed by their configs): the student (tiny-300k, the
main job's pretraining, then its held-out evaluation), the main job's base (tiny-1m
pretraining: the one off_policy, cold_start and kl_beta start from) and the teacher (that
base after off_policy's K = 0 run: 60 GRPO steps of 16 prompts x 8). Every arm starts from
the student's final parameters:

  rl:      eval_base -> 60 GRPO steps of 16 prompts x 8 (7,680 samples of the student,
           each in one update) -> eval_final
  rl_long: the same with 180 GRPO steps
  distill: eval_base -> the teacher samples 8 completions for each of 960 training
           problems (7,680), the verified and well-formed ones are kept, and the student
           is fine-tuned on them for 120 steps of 64 rows (7,680 rows) -> eval_final

Every eval uses the same 128 held-out problems (task.eval_seed). The contrasts are the arms
against each other and against the student before training, paired by (base, seed); the
teacher, one run per base, is shown base by base and never contrasted (a one-sample
comparison is not a paired difference).
"""

from __future__ import annotations

import json
import re

from grpo_jax import storage, sweep
from grpo_jax.stats import interval
from grpo_jax.studies import common, tiers

FIGURES = ("pass@1", "pass@2", "pass@4", "pass@8", "maj@8", "format_rate", "mean_length")
CONTRASTED = ("pass@1", "pass@8", "format_rate")  # the Holm family
KS = (1, 2, 4, 8)
ARMS = ("distill", "rl", "rl_long")
LABELS = {"student": "student (tiny-300k), pretrained",
          "rl": "student after GRPO (60 steps)",
          "rl_long": "student after GRPO (180 steps)",
          "distill": "student distilled from the teacher",
          "teacher": "teacher (tiny-1m after GRPO), one run per base"}


def _student(tier: str):
    config = common.main_job(common.preset(tier))
    config.stages = "pretrain,eval_base"
    config.model.name = "tiny-300k"
    return config


def _main_base(tier: str):
    config = common.main_job(common.preset(tier))
    config.stages = "pretrain"
    return config


def _teacher(tier: str, roles: dict):
    from grpo_jax.studies import off_policy

    config = off_policy.arm_config(tier, 0)  # off_policy's K = 0 arm
    config.model.init_from = roles["main"]
    return config


def base_config(tier: str) -> dict:
    """The student, the main job's base and the teacher made from it, in that order."""
    return {"student": _student(tier), "main": _main_base(tier),
            "teacher": lambda roles: _teacher(tier, roles)}


def arm_config(tier: str = "full", arm: str = "rl"):
    """One arm's run from the student (model.init_from, and for `distill` the teacher's
    workdir in distill.teacher), set per base by `attach`."""
    from grpo_jax.stages import default_section

    if arm not in ARMS:
        raise ValueError(f"distill_vs_rl: arm rl, rl_long or distill, got {arm!r}")
    full = tier == "full"
    config = common.main_job(common.preset(tier))
    del config.pretrain
    config.model.init_from = ""
    config.model.name = "tiny-300k"
    if arm in ("rl", "rl_long"):
        config.rl.steps = (60 if arm == "rl" else 180) if full else (2 if arm == "rl" else 4)
        if full:
            config.rl.num_prompts = 16
        config.rl.fused_steps = 0
        config.stages = "eval_base,rl,eval_final"
        return config
    del config.rl
    config.distill = default_section("distill")
    config.distill.teacher = ""  # the teacher's workdir
    config.distill.student_model = "tiny-300k"
    config.distill.num_problems = 960 if full else 16
    config.distill.num_samples = 8 if full else 2
    config.distill.sample_batch_size = 256 if full else 32
    config.distill.max_new_tokens = config.eval_base.max_new_tokens
    config.distill.steps = 120 if full else 2
    config.distill.batch_size = 64 if full else 8
    config.distill.lr = 1e-3
    config.stages = "eval_base,distill,eval_final"
    return config


def arm_configs(tier: str) -> dict:
    return {arm: arm_config(tier, arm) for arm in ARMS}


def attach(config, base: dict) -> None:
    """The student's parameters for every arm; the teacher's run for distillation."""
    roles = base["roles"]
    config.model.init_from = roles["student"]
    if "distill" in config:
        config.distill.student_init_from = roles["student"]
        config.distill.teacher = roles["teacher"]


def _stage_seconds(record) -> dict[str, float]:
    """Each stage's wall time, from the run's log ("stage NAME (KIND) done in S s")."""
    path = storage.join(record.workdir, "study.log")
    if not storage.isfile(path):
        return {}
    return {m.group(1): float(m.group(2)) for m in re.finditer(
        r"stage (\S+) \(\S+\) done in ([\d.]+)s", storage.read_text(path))}


def _distill_data(record) -> dict:
    path = storage.join(record.workdir, "distill", "data.jsonl")
    if not storage.isfile(path):
        return {}
    return json.loads(storage.read_text(path).splitlines()[0])["info"]


def analyze(runs: common.StudyRuns) -> common.Analysis:
    finished = {arm: {(r.base, r.seed): r for r in runs.arm(arm) if r.finished} for arm in ARMS}
    keys = sorted(set.intersection(*(set(v) for v in finished.values() if v)))
    rows = {arm: {k: common.last_stage_rows(finished[arm][k]) for k in keys}
            for arm in ARMS if finished[arm]}
    seeds, bases = [s for _, s in keys], [b for b, _ in keys]

    def entry(values):
        return {"seeds": list(seeds), "bases": list(bases), "metrics": values}

    arms = {}
    # The student before training: the distill arm's eval_base (every arm's eval_base
    # evaluates the same parameters on the same problems with the seed's keys).
    arms[LABELS["student"]] = entry({n: [rows["distill"][k].get("eval_base", {}).get(n)
                                         for k in keys] for n in FIGURES})
    for arm in ARMS:
        if arm in rows:
            arms[LABELS[arm]] = entry({n: [rows[arm][k].get("eval_final", {}).get(n)
                                           for k in keys] for n in FIGURES})
    teachers = {}
    for key, base in runs.bases.items():
        stages = common.last_stage_rows(common.RunRecord(
            "teacher", key, base["seed"], base["roles"]["teacher"], None))
        teachers[key] = stages.get("eval_final", {})
    arms[LABELS["teacher"]] = entry({n: [teachers.get(b, {}).get(n) for b in bases]
                                     for n in FIGURES})
    pairs = [(LABELS[arm], LABELS["student"]) for arm in ARMS if arm in rows]
    pairs += [(LABELS["distill"], LABELS[arm]) for arm in ("rl", "rl_long") if arm in rows]
    # The teacher is one run per base, not per seed: it is shown beside the arms, never
    # contrasted with them (a one-sample comparison is not a paired difference).
    specs = [(a, b, metric) for metric in CONTRASTED for a, b in pairs]
    cost = {"distill_seconds": [_stage_seconds(finished["distill"][k]).get("distill")
                                for k in keys],
            **{f"{arm}_seconds": [_stage_seconds(finished[arm][k]).get("rl") for k in keys]
               for arm in ("rl", "rl_long") if arm in rows}}
    data = [_distill_data(finished["distill"][k]) for k in keys]
    cost.update({name: [d.get(field) for d in data] for name, field in (
        ("teacher_samples", "sampled"), ("kept_rows", "kept"),
        ("problems_covered", "problems_covered"))})
    problems = next((int(r.config.distill.num_problems) for r in runs.runs
                     if "distill" in r.config), 0)
    return common.Analysis(arms=arms, specs=specs, table=table(arms, cost, problems),
                           extra={"cost_per_seed": cost},
                           plots=lambda out: plot(arms, out))


def table(arms: dict, cost: dict, problems: int) -> str:
    f = sweep.format_interval

    def stat(label, name):
        return interval([v for v in arms[label]["metrics"].get(name, []) if v is not None])

    names = FIGURES[:6]
    lines = ["| held-out | " + " | ".join(names) + " | length |",
             "|---|" + "---|" * (len(names) + 1)]
    for key in ("student", "rl", "rl_long", "distill", "teacher"):
        label = LABELS[key]
        if label not in arms:
            continue
        if key == "teacher":  # one run per base: its values, base by base
            lines.append(f"| {label} | " + " | ".join(
                _per_base(arms[label], n, 100.0, "%") for n in names)
                + f" | {_per_base(arms[label], 'mean_length', 1.0, '')} |")
            continue
        cells = []
        for n in names:
            text = f(stat(label, n))
            cells.append(text if text == "-" else text + "%")
        lines.append(f"| {label} | " + " | ".join(cells)
                     + f" | {f(stat(label, 'mean_length'), 1.0)} |")

    def seconds(name):
        return f(interval([v for v in cost.get(name, []) if v is not None]), 1.0, 0)

    lines += ["", "| cost (per seed) | |", "|---|---|",
              f"| GRPO stage wall time, 60 steps | {seconds('rl_seconds')} s |",
              *([f"| GRPO stage wall time, 180 steps | {seconds('rl_long_seconds')} s |"]
                if "rl_long_seconds" in cost else []),
              (f"| distill stage wall time (teacher sampling + SFT) | "
               f"{seconds('distill_seconds')} s |"),
              f"| teacher samples | {seconds('teacher_samples')} |",
              (f"| verified distinct rows kept | {seconds('kept_rows')} "
               f"(problems covered: {seconds('problems_covered')} of {problems}) |")]
    return "\n".join(lines) + "\n"


def _per_base(entry: dict, name: str, scale: float, unit: str) -> str:
    """A per-base arm's value on each base (its seeds repeat it), " / "-joined."""
    seen = {}
    for base, value in zip(entry["bases"], entry["metrics"].get(name, [])):
        seen.setdefault(base, value)
    return " / ".join("-" if v is None else f"{v * scale:.1f}{unit}" for v in seen.values())


def plot(arms: dict, out: str) -> None:
    """pass_at_k.png: held-out pass@k of the student before, after each arm, and of the
    teacher."""
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for key, color in (("student", "C7"), ("rl", "C0"), ("rl_long", "C2"), ("distill", "C3"),
                       ("teacher", "k")):
        label = LABELS[key]
        if label not in arms:
            continue
        stats = [interval([v for v in arms[label]["metrics"].get(f"pass@{k}", [])
                           if v is not None]) for k in KS]
        means, halves = common.error_bars(stats, 100)
        ax.errorbar(KS, means, yerr=halves, marker="o", capsize=3, color=color, label=label,
                    ls="--" if key == "teacher" else "-")
    ax.set_xscale("log", base=2)
    ax.set_xticks(KS, [str(k) for k in KS])
    ax.set_xlabel("k")
    ax.set_ylabel("held-out pass@k (%)")
    ax.set_title("tiny-300k student: distillation vs GRPO (95% interval over seeds)",
                 fontsize=9)
    ax.legend(fontsize=7)
    common.save_figure(fig, out, "pass_at_k.png")


R1_DISTILL = ("First, distilling more powerful models into smaller ones yields excellent "
              "results, whereas smaller models relying on the large-scale RL mentioned in this "
              "paper require enormous computational power and may not even achieve the "
              "performance of distillation")
# What the two roads share here (the claims' why): the student's errors are a confusion rate.
_BOTH = ("the student's errors are mostly the operator confusions of its pretraining traces, "
         "which GRPO on its own samples removes by sharpening as fine-tuning on correct traces "
         "does; the teacher is the tiny-1m base only 60 GRPO steps on and may know little "
         "the student cannot find among its own samples")
CLAIMS = (
    common.Claim(R1_DISTILL, "DeepSeek-R1, arXiv:2501.12948, sec. 4.1; tested as: the "
                 "distilled student above GRPO on the student for the same number of sequences",
                 (LABELS["distill"], LABELS["rl"], "pass@1"), ">", margin=0.02,
                 why=f"{_BOTH}; and the distilled student learns from the kept traces alone "
                     "(the verified, deduplicated ones, repeated over the fine-tuning's "
                     "steps), drawn from another model's distribution, which a 300k model "
                     "may imitate less well than GRPO sharpens its own: distillation's lead "
                     "may fall short of the margin, or turn"),
    common.Claim(R1_DISTILL, "DeepSeek-R1, arXiv:2501.12948, sec. 4.1; tested as: the "
                 "distilled student above GRPO on the student with 3x the steps",
                 (LABELS["distill"], LABELS["rl_long"], "pass@1"), ">", margin=0.02,
                 why=f"{_BOTH}; with three times the steps (three times distillation's "
                     "sequences) GRPO may reach what the distilled student reaches by "
                     "imitating that teacher, leaving distillation less than the margin "
                     "ahead, or behind"),
)

STUDY = common.Study(
    name="distill_vs_rl",
    question="a tiny-300k student distilled from a GRPO-trained tiny-1m teacher (its verified "
             "traces) vs GRPO on the student for the same 7,680 sequences (R1 sec. 4.1)",
    tiers=tiers.standard(
        full="about 45 min on 2 cores (estimated from the recorded "
             "per-seed GRPO 60 51-78 s, GRPO 180 179-221 s, distillation "
             "57-96 s, each run with its evaluations, for 2 bases x 3 "
             "seeds; plus each base's student, main base and teacher when "
             "not built yet)",
        mini="about 30 s of CPU on 2 cores, measured (28-34 s for its test alone, which "
             "compiles every program itself): a toy student, base and teacher, one seed of "
             "the 3 arms' toy runs"),
    arms=ARMS, base_config=base_config, arm_configs=arm_configs, analyze=analyze, attach=attach,
    claims=CLAIMS,
)
