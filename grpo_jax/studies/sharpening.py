"""Sharpening: per problem, what does RL change in the base model's answer distribution?

Yue et al. 2025 (arXiv:2504.13837) read base-against-RL pass@k as "RL sharpens what the base
already samples"; DeepSeekMath (Shao et al. 2024, section 5.2.2) reads Maj@K rising while
Pass@K does not as RL "boosting the correct response from TopK". pass_at_k measures the
counts; this study measures the answers themselves.

Runs: pass_at_k's (one config, so one run directory when both studies share a workdir): the
main job's RL stage (GRPO, 60 steps of 16 prompts x 8) from the main base. `measure` samples,
for each (base, seed), the base model and the RL model on the same held-out problems (fixed
across seeds) with the same key (a function of the seed, as pass_at_k's): 256 completions per
problem at temperature 1; each completion's extracted answer (`measure.answer_key`) and its
correctness are written to `sharpening.json` (the RL run's directory; the base model's under
`<study>/base_model/<base>,seed=<s>.json`).

Three policies per (base, seed): `rl`; `base model`, the base's draw with the seed's key (the
reference draw); `base redraw`, the base's draw with the next seed's key (cyclic over the
tier's seeds): an independent second sample of the same distribution, the noise floor of every
figure measured against the reference draw (a draw's own figures against itself would be
biased: its modal answer is chosen on its own noise).

Measured against the reference draw, per problem then averaged (`figures`):
* coverage: solved by this policy and never in the reference's 256 (`only_solves_rate`),
  both solve and this policy more often (`likelier_rate`);
* where the mass goes: the share of this policy's answers that the reference never wrote
  (`new_answer_rate`); on problems whose reference modal answer is correct, this policy's
  share on it (`mode_mass_right_rate`); on problems whose modal answer is wrong, its share on a
  correct answer (`correct_mass_wrong_rate`);
* promotion: this policy's majority vote over its 256 samples is correct, on the problems
  whose correct answer is the reference's 2nd to 4th most frequent (`topk_promoted_rate`) and on
  those where it is ranked lower or never sampled (`outside_promoted_rate`).
And of each policy alone: pass@1, pass@64, maj@64 (unbiased, `evals.metrics`), distinct
answers per problem.
"""

from __future__ import annotations

import collections

from grpo_jax import storage
from grpo_jax.studies import common, tables, tiers
from grpo_jax.studies import measure as measure_lib
from grpo_jax.studies.pass_at_k import arm_configs, base_config  # pass_at_k's runs

RL, BASE, REDRAW = "rl", "base model", "base redraw"
K = 64  # pass@K and maj@K (DeepSeekMath's figure 7 reaches K = 64)
TOPK = 4  # "TopK": the reference's K most frequent answers
MARGIN = 0.02  # 2 points: the smallest difference that matters
ANSWER_METRICS = ("only_solves_rate", "likelier_rate", "new_answer_rate",
                  "mode_mass_right_rate", "correct_mass_wrong_rate", "topk_promoted_rate",
                  "outside_promoted_rate")
OWN_METRICS = ("pass@1", f"pass@{K}", f"maj@{K}", "distinct_answers")

SPECS = [(RL, BASE, f"maj@{K}"), (RL, BASE, f"pass@{K}"),
         (RL, REDRAW, "only_solves_rate"), (RL, REDRAW, "new_answer_rate"),
         (RL, REDRAW, "topk_promoted_rate"), (RL, REDRAW, "outside_promoted_rate")]


def _sizes(tier: str) -> dict:
    """Problems and samples per problem of the measurement."""
    if tier == "full":
        return {"problems": 128, "samples": 256, "batch_rows": 1024}
    return {"problems": 4, "samples": K, "batch_rows": 256}


# ---- the measurement --------------------------------------------------------------------------

FILE = "sharpening.json"


def measure(runs: common.StudyRuns) -> None:
    """sharpening.json (each completion's answer and correctness) for every finished RL run
    without one, and the base model's draw with each seed's key."""
    measure_lib.measure_samplings(runs, _sizes(runs.tier), FILE, keep_answers=True)


# ---- per-problem figures ----------------------------------------------------------------------

def ranked_answers(problem: dict) -> list[str]:
    """The problem's answers, most frequent first (ties: first sampled first); None left out."""
    counts = collections.Counter(a for a in problem["answers"] if a is not None)
    first = {}
    for i, a in enumerate(problem["answers"]):
        if a is not None:
            first.setdefault(a, i)
    return sorted(counts, key=lambda a: (-counts[a], first[a]))


def _correct_answers(problem: dict) -> set:
    return {a for a, f in zip(problem["answers"], problem["correct_flags"])
            if a is not None and f == "1"}


def correct_rank(reference: dict, correct: set) -> int | None:
    """The 1-based rank in `reference`'s answers of its most frequent correct answer (any of
    `correct`); None when the reference never wrote one."""
    for rank, answer in enumerate(ranked_answers(reference), start=1):
        if answer in correct:
            return rank
    return None


def figures(mine: list[dict], reference: list[dict] | None, k: int = K) -> dict:
    """A policy's figures over the held-out problems (each with "answers" and
    "correct_flags", in the same problem order as `reference`), and against the
    reference draw's when given (see the module docstring). A figure over an empty subset of
    problems is None."""
    from grpo_jax.evals.metrics import maj_at_k, majority_vote, pass_at_k as pass_k

    def mean(values):
        values = list(values)
        return sum(values) / len(values) if values else None

    out = {}
    counts = [p["correct_flags"].count("1") for p in mine]
    sizes = [len(p["answers"]) for p in mine]
    out["pass@1"] = mean(c / n for c, n in zip(counts, sizes))
    out[f"pass@{k}"] = mean(pass_k(n, c, k) for c, n in zip(counts, sizes))
    out[f"maj@{k}"] = mean(maj_at_k(p["answers"], [f == "1" for f in p["correct_flags"]], k)
                           for p in mine)
    out["distinct_answers"] = mean(len({a for a in p["answers"] if a is not None})
                                   for p in mine)
    if reference is None:
        return out
    only, likelier, right, wrong, topk, outside = [], [], [], [], [], []
    new = answered = 0
    for p, q, c, n in zip(mine, reference, counts, sizes):
        c_ref, n_ref = q["correct_flags"].count("1"), len(q["answers"])
        only.append(c > 0 and c_ref == 0)
        likelier.append(c > 0 and c_ref > 0 and c / n > c_ref / n_ref)
        seen = {a for a in q["answers"] if a is not None}
        mine_answered = [a for a in p["answers"] if a is not None]
        answered += len(mine_answered)
        new += sum(a not in seen for a in mine_answered)
        correct = _correct_answers(p) | _correct_answers(q)
        order = ranked_answers(q)
        if order and order[0] in correct:
            right.append(sum(a == order[0] for a in p["answers"]) / n)
        elif order:
            wrong.append(c / n)
        rank = correct_rank(q, correct)
        vote, _ = majority_vote(p["answers"])
        promoted = vote is not None and vote in correct
        if rank is not None and 2 <= rank <= TOPK:
            topk.append(promoted)
        elif rank is None or rank > TOPK:
            outside.append(promoted)
    out.update(only_solves_rate=mean(only), likelier_rate=mean(likelier),
               new_answer_rate=new / answered if answered else None,
               mode_mass_right_rate=mean(right), correct_mass_wrong_rate=mean(wrong),
               topk_promoted_rate=mean(topk), outside_promoted_rate=mean(outside),
               topk_problems=len(topk), outside_problems=len(outside))
    return out


# ---- the analysis -----------------------------------------------------------------------------

def analyze(runs: common.StudyRuns) -> common.Analysis:
    seeds = sorted({r.seed for r in runs.runs})
    rows = common.ArmRows()
    points: list = []  # (reference pass@1, RL pass@1, the correct answer's reference rank)
    for record in runs.arm(RL):
        if not record.finished:
            continue
        rl = measure_lib.load_problems(storage.join(record.workdir, FILE))
        reference = measure_lib.base_problems(runs, record.base, record.seed)
        redraw = measure_lib.base_problems(runs, record.base,
                                           measure_lib.redraw_seed(record.seed, seeds))
        if rl is None or reference is None or redraw is None:
            continue
        for name, mine, ref in ((RL, rl, reference), (BASE, reference, None),
                                (REDRAW, redraw, reference)):
            rows.add(name, record.base, record.seed, figures(mine, ref))
        for p, q in zip(rl, reference):
            rank = correct_rank(q, _correct_answers(p) | _correct_answers(q))
            points.append((q["correct_flags"].count("1") / len(q["answers"]),
                           p["correct_flags"].count("1") / len(p["answers"]), rank))
    arms = rows.arms((RL, BASE, REDRAW))
    sizes = _sizes(runs.tier)
    return common.Analysis(
        arms=arms, specs=SPECS, table=table(arms),
        extra={"sampling_key": measure_lib.KEY, "topk": TOPK, "k": K},
        protocol={"problems": sizes["problems"], "samples_per_problem": sizes["samples"],
                  "notes": (f"measured after training: each (base, seed) samples the base "
                            f"model and the RL model with one key ({measure_lib.KEY} folded "
                            f"with the seed; pass_at_k's), {sizes['samples']} completions per "
                            "problem at temperature 1; the base redraw is the base's draw "
                            "with the next seed's key")},
        plots=lambda out: plot(arms, points, out))


ROWS = (("pass@1", "pass@1", 100.0), (f"pass@{K}", f"pass@{K}", 100.0),
        (f"maj@{K}", f"maj@{K}", 100.0), ("distinct answers per problem", "distinct_answers",
                                          1.0),
        ("solved, never by the reference draw", "only_solves_rate", 100.0),
        ("both solve, this policy more often", "likelier_rate", 100.0),
        ("answers the reference draw never wrote", "new_answer_rate", 100.0),
        ("share on the reference's modal answer, when it is correct", "mode_mass_right_rate",
         100.0),
        ("share on a correct answer, when the modal answer is wrong",
         "correct_mass_wrong_rate", 100.0),
        (f"majority correct, correct answer ranked 2-{TOPK} by the reference",
         "topk_promoted_rate", 100.0),
        (f"majority correct, correct answer ranked below {TOPK} or never sampled",
         "outside_promoted_rate", 100.0),
        (f"problems with the correct answer ranked 2-{TOPK}", "topk_problems", 1.0),
        (f"problems with it ranked below {TOPK} or never sampled", "outside_problems", 1.0))


def table(arms: dict) -> str:
    """Each policy's figures; those against the reference draw for RL and the redraw."""
    names = [n for n in (BASE, REDRAW, RL) if n in arms]
    lines = ["| figure (%, against the reference draw: the base model's with the same key) | "
             + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for label, metric, scale in ROWS:
        cells = [tables.optional_cell(arms[n]["metrics"].get(metric, []), scale,
                                      1 if scale > 1 else 2) for n in names]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", ("Mean ± 95% half-width over (base, seed). The base model is the reference "
                   "draw itself (no figures against itself); the redraw is the same base "
                   "sampled with another key: the noise floor of the figures against the "
                   "reference.")]
    return "\n".join(lines) + "\n"


def plot(arms: dict, points: list, out: str) -> None:
    """sharpening.png: per problem, RL's pass@1 against the base's (pooled over runs, colored
    by the correct answer's rank in the base's draw), and the mass figures of RL and the
    redraw with their 95% intervals."""
    import numpy as np

    from grpo_jax.stats import interval

    if RL not in arms:
        return
    plt = common.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    groups = (("modal answer correct", lambda r: r == 1, "C2"),
              (f"correct answer ranked 2-{TOPK}", lambda r: r is not None and 2 <= r <= TOPK,
               "C1"),
              (f"ranked below {TOPK}", lambda r: r is not None and r > TOPK, "C3"),
              ("never sampled by the base", lambda r: r is None, "C0"))
    for label, member, color in groups:
        chosen = [(x, y) for x, y, r in points if member(r)]
        if chosen:
            xy = np.asarray(chosen) * 100
            ax.scatter(xy[:, 0], xy[:, 1], s=6, alpha=0.5, color=color,
                       label=f"{label} ({len(chosen)})")
    ax.plot([0, 100], [0, 100], color="gray", lw=0.8)
    ax.set_xlabel("base model pass@1 on the problem (%)")
    ax.set_ylabel("RL pass@1 on the problem (%)")
    ax.set_title("per problem and (base, seed)", fontsize=9)
    ax.legend(fontsize=7)
    ax = axes[1]
    metrics = [m for m in ANSWER_METRICS if m != "likelier_rate"]
    x = np.arange(len(metrics))
    for offset, name, color in ((-0.2, REDRAW, "C0"), (0.2, RL, "C3")):
        if name not in arms:
            continue
        stats = [interval([v for v in arms[name]["metrics"].get(m, []) if v is not None])
                 for m in metrics]
        mean, err = common.error_bars(stats, 100)
        ax.bar(x + offset, mean, 0.4, yerr=err, color=color, label=name, capsize=2)
    ax.set_xticks(x, [m.replace("_", " ") for m in metrics], rotation=30, ha="right",
                  fontsize=7)
    ax.set_ylabel("% (against the reference draw)")
    ax.legend(fontsize=7)
    common.save_figure(fig, out, "sharpening.png")


SOURCE_YUE = "Yue et al. 2025, arXiv:2504.13837"
SOURCE_DSM = "Shao et al. 2024 (DeepSeekMath), arXiv:2402.03300, section 5.2.2"

CLAIMS = (
    common.Claim(
        text="RL enhances Maj@K's performance",
        source=SOURCE_DSM + " (quoted; their figure 7, K up to 64)",
        test=(RL, BASE, f"maj@{K}"), expect=">", margin=MARGIN,
        why="maj@64 rises only on problems where RL moves the vote's winner onto the "
            "correct answer: where the base's modal answer is already correct the vote has "
            "nothing to gain, and where an operator confusion's answer leads by far 60 "
            "steps may shift too little mass to overturn it; the test fails when the "
            "problems whose vote RL overturns are fewer than the 2-point margin needs"),
    common.Claim(
        text="but not Pass@K",
        source=SOURCE_DSM + " (quoted, the same sentence)",
        test=(RL, BASE, f"pass@{K}"), expect="=", margin=MARGIN,
        why="RL can raise pass@64 on problems the base solves in fewer than about one "
            "sample of 64, by making their correct answer likelier, or lower it by "
            "concentrating mass on one answer and no longer sampling a rare correct one; "
            "either change of 2 points or more fails the test",
        headroom=(BASE, f"pass@{K}", 1.0),
        note="the base model's pass@K may be near its ceiling here: the headroom test computes "
             "the room it leaves from the base arm"),
    common.Claim(
        text="the improvement is attributed to boosting the correct response from TopK",
        source=SOURCE_DSM + " (quoted); tested as the RL policy's majority vote being "
               f"correct on the problems whose correct answer is the base's 2nd to "
               f"{TOPK}th most frequent, against the base redraw's",
        test=(RL, REDRAW, "topk_promoted_rate"), expect=">", margin=MARGIN,
        why="the rate is over the few problems whose correct answer the base's draw ranks "
            "2nd to 4th, and the redraw's own vote is correct on those where that ranking "
            "was noise (answers of near-equal frequency); the test fails if RL overturns "
            "the leading wrong answer there less than 2 points more often (where it leads "
            "by far, 60 steps may not), and with so few problems each one moves the rate "
            "by a large step"),
    common.Claim(
        text="the reasoning abilities originate from and are bounded by the base model",
        source=SOURCE_YUE + ", abstract (close paraphrase); tested as the problems RL "
               "solves in 256 samples and the base's draw never does, against a second draw "
               "of the base (RL at most 2 points above)",
        test=(RL, REDRAW, "only_solves_rate"), expect="<=", margin=MARGIN,
        why="RL solves a problem the base's 256 samples never solve if it puts mass on a "
            "correct answer the base almost never writes (a step computed exactly where "
            "the base nearly always confuses the operator); the test fails if that happens "
            "on 2 points of problems more than the redraw's chance finds, within the room "
            "the base's draw leaves unsolved (the headroom, from the redraw's pass@64)",
        headroom=(REDRAW, f"pass@{K}", 1.0),  # unsolved by the draw at K: an upper bound of
                                               # what it leaves unsolved at 256
        note="the base solves about 98% of the problems at 256 samples (pass_at_k): at most "
             "a few problems can be new"),
    common.Claim(
        text="RLVR does not elicit fundamentally new reasoning patterns",
        source=SOURCE_YUE + ", abstract (close paraphrase); tested at the level of final "
               "answers: the share of RL's answers the base's draw never wrote in 256 "
               "samples, against a second draw of the base (RL at most 2 points above)",
        test=(RL, REDRAW, "new_answer_rate"), expect="<=", margin=MARGIN,
        why="GRPO's reward moves mass toward correct answers the base already writes, but "
            "its updates can also spill mass onto answers outside the base's support (a "
            "garbled digit, confusions the base rarely combines); the test fails if 2% "
            "or more of RL's answers are such, beyond the redraw's share of rare answers "
            "the reference draw missed by chance"),
)


STUDY = common.Study(
    name="sharpening",
    question="per held-out problem, does RL solve what the base never samples in 256 tries, "
             "write answers the base never writes, or move the base's own mass onto its "
             "correct answers, against a second draw of the base, paired by (base, seed)?",
    tiers=tiers.standard(
        full="about 20 min on 2 cores (measured: 1202 s beside another "
             "study process, the 6 RL runs (pass_at_k's, shared in one "
             "workdir) about 80 s each, 12 samplings of 128 x 256 "
             "completions 35-57 s each, the analysis about 5 min; plus "
             "the shared main bases when not built yet)",
        mini="seconds on 2 cores: one toy base, two seeds (the redraw "
             "needs two), 4 problems x 64 samples",
        mini_seeds=(0, 1)),
    arms=(RL,), base_config=base_config, arm_configs=arm_configs, analyze=analyze, measure=measure,
    claims=CLAIMS,
)
