"""RL's Razor: does GRPO forget less of the base's other task than SFT, and does the KL moved
on the new task predict the forgetting? (Shenfeld, Pari and Agrawal 2025, arXiv:2509.04259)

From the main base (configs/default.py's pretraining on the whole task: one or two of + - *
on operands 1-9; the full tier's base seeds, `tiers.FULL_BASES`), which knows two tasks: the
*new* task, problems written with + and - only (task.kwargs.operators = `NEW`), and the
*old* task, products only (`OLD`). Three arms post-train on the new task's training problems
at one budget (update_sparsity's pairing: the same steps, sequences per step, Adam, from the
same base):

* `grpo`: the main job's GRPO stage without its KL penalty (rl.beta = 0), so that whatever
  keeps it near the base is implicit, as the claim says;
* `sft`: supervised fine-tuning on the new task's clean worked solutions, as many sequences
  at the same learning rate (generalization's SFT arm: one config);
* `sft_low_lr`: the same SFT at `LOW_LR_FACTOR` of the learning rate: an SFT run that moves
  less, so that the KL spreads within one algorithm too.

Measured (`measure`, after training; every sampling at temperature 1 with its own key,
`measurement_key`: independent across policies, purposes and (base, seed) pairs):

* new-task pass@1: the runs' own `eval_base` / `eval_final` on the new task's held-out
  problems (the `base` arm from `eval_base`, paired by (base, seed));
* old-task pass@1: `OLD_SAMPLES` completions of each of `OLD_PROBLEMS` held-out products
  (the same problems for every seed, task.eval_seed) from each run's final policy and, once
  per (base, seed), from the base model: `pass@1_old`; per run `pass@1_old_drop` = the base
  model's pass@1_old of its (base, seed) less the run's: the forgetting;
* the KL moved on the new task, per completion (nats; the exact per-token KL summed over
  the vocabulary along sampled completions of `KL_PROBLEMS` held-out new-task prompts x
  `KL_SAMPLES`): `kl_forward` = KL(base || fine-tuned), completions sampled from the base
  (the direction of RL's Razor's law, as secondary summaries report it), and
  `kl_reverse` = KL(fine-tuned || base), completions sampled from the fine-tuned policy;
  `log_kl_*` their logarithms.

From those, per (base, seed): `r_drop_kl`, the Pearson correlation of `pass@1_old_drop`
with `kl_forward` over that pair's runs of all arms (the pseudo-arm `forgetting law`;
`no relation` holds 0); and the pseudo-arm `sft law at grpo's kl`: the forgetting that a
line through the origin fitted to that pair's SFT runs (its two SFT arms) predicts at its
grpo run's `kl_forward` (`law_slope`). Each (base, seed) fits its own line, so the line's
error varies from seed to seed and enters the contrast's interval (one line per base, shared
by its seeds, would shift both seeds alike, and the interval, taken from the seeds' spread
within a base, would leave that error out).
"""

from __future__ import annotations

import json
import math

from grpo_jax import storage
from grpo_jax.studies import common, tables, tiers, update_sparsity
from grpo_jax.studies import measure as measure_lib

GRPO, SFT, SFT_LOW, BASE = "grpo", "sft", "sft_low_lr", "base"
LAW, NO_RELATION, SFT_LAW = "forgetting law", "no relation", "sft law at grpo's kl"
ARMS = (GRPO, SFT, SFT_LOW)
SFT_ARMS = (SFT, SFT_LOW)
NEW, OLD = "+-", "*"  # the new task's operators (post-training); the old task's
LOW_LR_FACTOR = 0.125  # sft_low_lr's learning rate over the shared one
OLD_PROBLEMS = {"full": 64, "mini": 4}  # the task holds 87 held-out problems of products only
OLD_SAMPLES = {"full": 16, "mini": 2}
KL_PROBLEMS = {"full": 64, "mini": 4}
KL_SAMPLES = {"full": 8, "mini": 2}
BATCH_ROWS = {"full": 256, "mini": 8}
FILE = "forgetting.json"
KEY = 20250904  # the root of every measurement's sampling key (`measurement_key`)
ARM_CODES = {BASE: 0, GRPO: 1, SFT: 2, SFT_LOW: 3}
PURPOSES = {"old": 0, "forward": 1, "reverse": 2}
PASS_MARGIN = 0.03  # pass@1 (and its drop), as the other studies
R_BAR = 0.5  # r_drop_kl: the mean correlation a forgetting law must reach
KL_RATIO_MARGIN = math.log(2.0)  # log KL: grpo's KL at most half of sft's
SPECS = [(GRPO, SFT, "pass@1_old_drop"), (LAW, NO_RELATION, "r_drop_kl"),
         (GRPO, SFT, "log_kl_forward"), (GRPO, SFT_LAW, "pass@1_old_drop"),
         (GRPO, SFT, "log_kl_reverse"), (SFT_LOW, SFT, "log_kl_forward"),
         (GRPO, SFT, "pass@1")]

base_config = common.main_base


def arm_config(arm: str, tier: str = "full"):
    """One arm's run from the base in model.init_from: update_sparsity's arm (GRPO with
    rl.beta = 0, or SFT of the same steps, sequences per step and learning rate; `sft_low_lr`
    at `LOW_LR_FACTOR` of it), training and evaluated on the new task's problems (operators
    `NEW`)."""
    if arm not in ARMS:
        raise ValueError(f"forgetting: unknown arm {arm!r}; expected one of {', '.join(ARMS)}")
    config = update_sparsity.arm_config(update_sparsity.RL if arm == GRPO else SFT, tier)
    config.task.kwargs.operators = NEW
    if arm == GRPO:
        config.rl.beta = 0.0  # no explicit KL penalty: the claim is about an implicit bias
    if arm == SFT_LOW:
        config.sft.lr = config.sft.lr * LOW_LR_FACTOR
    return config


def arm_configs(tier: str) -> dict:
    return {arm: arm_config(arm, tier) for arm in ARMS}


# ---- the measurements ------------------------------------------------------------------------

def measurement_key(base_seed: int, seed: int, arm: str, purpose: str) -> int:
    """The sampling key's seed of one measurement: of `arm`'s policy (BASE: the base model)
    on the base built with `base_seed`, the arms' seed `seed`, for `purpose` ("old": the old
    task's draw; "forward": base samples for KL(base || run); "reverse": the run's samples
    for KL(run || base)). Drawn from `KEY` by numpy's SeedSequence, so any two measurements
    sample with independent keys."""
    import numpy as np

    entropy = [KEY, int(base_seed), int(seed), ARM_CODES[arm], PURPOSES[purpose]]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0]) & 0x7FFFFFFF


def examples(config, operators: str, problems: int) -> list:
    """`problems` held-out problems of `config`'s task drawn with `operators` only (its other
    keywords kept), chosen by its task.eval_seed: the same for every seed."""
    from grpo_jax import tasks as tasks_lib

    kwargs = {**config.task.kwargs.to_dict(), "operators": operators}
    task = tasks_lib.task_of(config.task.name, kwargs)[0]
    return task.examples("test", problems, seed=common.eval_seed(config))


def _kl_fn(policy, prompt_len: int):
    """jit(params_p, params_q, tokens, attention) -> [B, N] the exact KL(p || q) at each
    completion position, summed over the vocabulary (`losses.full_kl`)."""
    import jax

    from grpo_jax import losses

    @jax.jit
    def fn(params_p, params_q, tokens, attention):
        logits_p = policy.bind(params_p)(tokens, attention_mask=attention)
        logits_q = policy.bind(params_q)(tokens, attention_mask=attention)
        # the logits at position j predict token j + 1
        return losses.full_kl(logits_p[:, prompt_len - 1:-1], logits_q[:, prompt_len - 1:-1])

    return fn


def sequence_kl(token_kl, mask) -> dict:
    """Per-completion KL (the masked per-token KLs summed over each completion, then averaged
    over completions) and per-token KL (over every masked token) of [B, N] arrays."""
    import numpy as np

    token_kl, mask = np.asarray(token_kl, np.float64), np.asarray(mask, bool)
    kept = np.where(mask, token_kl, 0.0)
    tokens = int(mask.sum())
    return {"per_completion": float(kept.sum(1).mean()) if len(kept) else math.nan,
            "per_token": float(kept.sum() / tokens) if tokens else math.nan,
            "tokens": tokens}


def _kl(setup: dict, sampler, params_p, params_q, key: int) -> dict:
    """KL(p || q) per completion along completions of the new-task rows sampled from the
    policy `sampler` (params_p: p is the sampler) with `key`."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    run = setup["run"]
    ro = measure_lib.sample(run, sampler, setup["rows"], jax.random.key(key),
                            sampling=setup["sampling"], weights=measure_lib.WEIGHTS,
                            batch_rows=setup["batch_rows"])
    full = np.concatenate([ro.prompt_tokens, ro.tokens], 1)
    attention = np.concatenate([ro.prompt_mask, ro.attention_mask], 1)
    chunk = setup["batch_rows"]
    parts = [np.asarray(setup["kl_fn"](params_p, params_q, jnp.asarray(full[i:i + chunk]),
                                       jnp.asarray(attention[i:i + chunk])))
             for i in range(0, len(full), chunk)]
    return sequence_kl(np.concatenate(parts), ro.loss_mask)


def base_old_path(runs: common.StudyRuns, key: str, seed: int) -> str:
    """Where the study keeps the base model's old-task draw for (base `key`, `seed`)."""
    return storage.join(runs.root, "base_model", f"old,{key},seed={seed}.json")


def measure(runs: common.StudyRuns) -> None:
    """FILE in every finished run without one (its old-task draw and both KLs, each with its
    own key) and the base model's old-task draw for each (base, seed) (`base_old_path`); a
    finished measurement is not made again."""
    import time

    tier = runs.tier
    for key, base, todo, base_todo in measure_lib.pending(runs, measure_lib.has_file(FILE),
                                                          base_old_path):
        run = common.load_finished(base["workdir"])
        eval_seed = common.eval_seed(run.config)
        max_new = int(run.config.eval_final.max_new_tokens)
        old = measure_lib.HeldOut(run, examples(run.config, OLD, OLD_PROBLEMS[tier]), eval_seed)
        samples = KL_SAMPLES[tier]
        setup = {"run": run, "batch_rows": BATCH_ROWS[tier],
                 "rows": [ex for ex in examples(run.config, NEW, KL_PROBLEMS[tier])
                          for _ in range(samples)],
                 "sampling": measure_lib.sampling_config(run, max_new, group=samples),
                 "kl_fn": _kl_fn(run.policy, int(run.config.task.prompt_len))}

        def old_draw(params, seed, arm, base_seed=base["seed"], old=old, max_new=max_new):
            code = measurement_key(base_seed, seed, arm, "old")
            return code, measure_lib.sample_problems(
                old, params, samples=OLD_SAMPLES[tier], seed=0, key=code,
                max_new_tokens=max_new, batch_rows=BATCH_ROWS[tier])

        storage.makedirs(storage.join(runs.root, "base_model"))
        for seed in base_todo:
            code, problems = old_draw(run.params, seed, BASE)
            storage.write_text(base_old_path(runs, key, seed), json.dumps(
                {"model": base["workdir"], "seed": seed, "key": code, "eval_seed": eval_seed,
                 "operators": OLD, "problems": problems}, indent=1))
        for record in todo:
            t0 = time.time()
            params = common.load_run_params(record.workdir, run.tokenizer)
            code, problems = old_draw(params, record.seed, record.arm)
            keys = {p: measurement_key(base["seed"], record.seed, record.arm, p)
                    for p in ("forward", "reverse")}
            forward = _kl(setup, run.params, run.params, params, keys["forward"])
            reverse = _kl(setup, params, params, run.params, keys["reverse"])
            row = {"arm": record.arm, "seed": record.seed, "eval_seed": eval_seed,
                   "old": {"operators": OLD, "key": code, "problems": problems},
                   "kl": {"operators": NEW, "problems": KL_PROBLEMS[tier], "samples": samples,
                          "forward": {**forward, "key": keys["forward"]},
                          "reverse": {**reverse, "key": keys["reverse"]}}}
            storage.write_text(storage.join(record.workdir, FILE), json.dumps(row, indent=1))
            print(f"[studies] forgetting {record.arm} {key} seed={record.seed}: KL(base||run) "
                  f"{forward['per_completion']:.4f}, KL(run||base) "
                  f"{reverse['per_completion']:.4f} per completion, measured in "
                  f"{time.time() - t0:.0f}s", flush=True)


# ---- the analysis's arithmetic ---------------------------------------------------------------

def pass_rate(problems: list[dict] | None) -> float | None:
    """pass@1 over a draw's completions (every problem has the same number of samples); None
    without a draw."""
    if not problems:
        return None
    return sum(p["correct"] for p in problems) / sum(p["samples"] for p in problems)


def pearson(x, y) -> float | None:
    """The Pearson correlation of paired values (pairs with a None left out); None with
    fewer than three pairs or no spread in either."""
    pairs = [(a, b) for a, b in zip(x, y) if a is not None and b is not None
             and math.isfinite(a) and math.isfinite(b)]
    if len(pairs) < 3:
        return None
    mx = sum(a for a, _ in pairs) / len(pairs)
    my = sum(b for _, b in pairs) / len(pairs)
    sxy = sum((a - mx) * (b - my) for a, b in pairs)
    sxx = sum((a - mx) ** 2 for a, _ in pairs)
    syy = sum((b - my) ** 2 for _, b in pairs)
    if sxx <= 0.0 or syy <= 0.0:
        return None
    return sxy / math.sqrt(sxx * syy)


def law_slope(kl, drop) -> float | None:
    """The least-squares slope b of drop = b * kl through the origin (no KL moved, nothing
    forgotten): sum(kl * drop) / sum(kl^2), pairs with a None left out; None without a
    positive sum of squares."""
    pairs = [(a, b) for a, b in zip(kl, drop) if a is not None and b is not None]
    sxx = sum(a * a for a, _ in pairs)
    return sum(a * b for a, b in pairs) / sxx if sxx > 0.0 else None


def _log(value):
    return math.log(value) if value is not None and value > 0.0 else None


def _run_values(record, runs: common.StudyRuns) -> dict:
    values = common.eval_values(record, ("pass@1",))
    base_old = pass_rate(measure_lib.load_problems(
        base_old_path(runs, record.base, record.seed)))
    out = {"pass@1": values["pass@1"], "base_pass@1": values["base_pass@1"],
           "base_pass@1_old": base_old, "pass@1_old": None, "pass@1_old_drop": None,
           "kl_forward": None, "kl_reverse": None}
    path = storage.join(record.workdir, FILE)
    if storage.isfile(path):
        row = json.loads(storage.read_text(path))
        out["pass@1_old"] = pass_rate(row["old"]["problems"])
        if base_old is not None:
            out["pass@1_old_drop"] = base_old - out["pass@1_old"]
        out["kl_forward"] = row["kl"]["forward"]["per_completion"]
        out["kl_reverse"] = row["kl"]["reverse"]["per_completion"]
    out["log_kl_forward"] = _log(out["kl_forward"])
    out["log_kl_reverse"] = _log(out["kl_reverse"])
    if out["pass@1"] is not None and out["base_pass@1"] is not None:
        out["pass@1_gain"] = out["pass@1"] - out["base_pass@1"]
    return out


def arms_of(rows: dict) -> tuple[dict, dict]:
    """The summary's arms from each run's values ({(arm, base, seed): values}, `_run_values`)
    and the SFT law's slope per (base, seed) ({"<base>,seed=<s>": slope}): the base model,
    the three arms, and per (base, seed) the pseudo-arms LAW (`pearson` of the drop with
    kl_forward over that pair's runs), NO_RELATION (0) and SFT_LAW (`law_slope` over that
    pair's SFT runs, times its grpo run's kl_forward)."""
    pairs = sorted({(b, s) for _, b, s in rows}, key=lambda k: (str(k[0]), k[1]))
    built = common.ArmRows()
    add = built.add
    slopes = {}
    for base, seed in pairs:
        members = {arm: rows[(arm, base, seed)] for arm in ARMS if (arm, base, seed) in rows}
        sft = [members[arm] for arm in SFT_ARMS if arm in members]
        slope = law_slope([v["kl_forward"] for v in sft], [v["pass@1_old_drop"] for v in sft])
        slopes[f"{base},seed={seed}"] = slope
        first = next(iter(members.values()))
        add(BASE, base, seed, {"pass@1": first["base_pass@1"],
                               "pass@1_old": first["base_pass@1_old"]})
        for arm, values in members.items():
            add(arm, base, seed, {k: v for k, v in values.items() if not k.startswith("base_")})
        r = pearson([v["kl_forward"] for v in members.values()],
                    [v["pass@1_old_drop"] for v in members.values()])
        add(LAW, base, seed, {"r_drop_kl": r})
        add(NO_RELATION, base, seed, {"r_drop_kl": 0.0})
        if GRPO in members and slope is not None and members[GRPO]["kl_forward"] is not None:
            add(SFT_LAW, base, seed, {"pass@1_old_drop": slope * members[GRPO]["kl_forward"]})
    return built.arms((BASE, *ARMS, LAW, NO_RELATION, SFT_LAW)), slopes


def analyze(runs: common.StudyRuns) -> common.Analysis:
    rows = {}  # (arm, base, seed) -> values
    for record in runs.runs:
        if record.finished and record.arm in ARMS:
            rows[(record.arm, record.base, record.seed)] = _run_values(record, runs)
    arms, slopes = arms_of(rows)
    everything = [v for v in rows.values()]
    pooled = pearson([v["kl_forward"] for v in everything],
                     [v["pass@1_old_drop"] for v in everything])
    pooled_reverse = pearson([v["kl_reverse"] for v in everything],
                             [v["pass@1_old_drop"] for v in everything])
    tier = runs.tier
    return common.Analysis(
        arms=arms, specs=SPECS, table=table(arms, tier, pooled, pooled_reverse, slopes),
        extra={"new_operators": NEW, "old_operators": OLD, "low_lr_factor": LOW_LR_FACTOR,
               "old_problems": OLD_PROBLEMS[tier], "old_samples": OLD_SAMPLES[tier],
               "kl_problems": KL_PROBLEMS[tier], "kl_samples": KL_SAMPLES[tier],
               "key_root": KEY, "pooled_r_drop_kl_forward": pooled,
               "pooled_r_drop_kl_reverse": pooled_reverse,
               "sft_law_slope_per_pair": slopes},
        protocol={"notes": (
            f"new task: the runs' eval stages on the held-out problems of operators {NEW!r}; "
            f"old task: {OLD_PROBLEMS[tier]} held-out problems of operators {OLD!r} x "
            f"{OLD_SAMPLES[tier]} samples; KL: {KL_PROBLEMS[tier]} held-out new-task prompts "
            f"x {KL_SAMPLES[tier]} samples; every sampling at temperature 1 with its own key "
            f"(root {KEY}; independent across policies, purposes and (base, seed) pairs)")},
        plots=lambda out: plot(arms, out),
        scales={"kl_forward": (1.0, 3), "kl_reverse": (1.0, 3), "log_kl_forward": (1.0, 2),
                "log_kl_reverse": (1.0, 2), "r_drop_kl": (1.0, 2)})


def table(arms: dict, tier: str, pooled, pooled_reverse, slopes: dict) -> str:
    def show(value, digits=2):
        return "-" if value is None else f"{value:+.{digits}f}"

    text = tables.arm_table(
        arms, (BASE, *ARMS),
        (f"new-task pass@1 ({NEW})", f"old-task pass@1 ({OLD})", "old-task drop",
         "KL(base‖run), nats", "KL(run‖base), nats"),
        tables.metric_row("pass@1", "pass@1_old", "pass@1_old_drop", ("kl_forward", 1.0, 3),
                          ("kl_reverse", 1.0, 3)),
        f"Pass rates and the drop in %, KL per completion in nats; mean ± 95% half-width over "
        f"(base, seed) runs. New task: the runs' own held-out evaluation; old task: "
        f"{OLD_PROBLEMS[tier]} held-out products x {OLD_SAMPLES[tier]} samples; drop: the "
        f"base model's old-task pass@1 less the run's; KL on {KL_PROBLEMS[tier]} held-out "
        f"new-task prompts x {KL_SAMPLES[tier]} completions, sampled from the first policy "
        f"named.", first="arm")
    law = arms.get(LAW, {}).get("metrics", {}).get("r_drop_kl", [])
    text += (f"\nThe drop against KL(base‖run): correlation within each (base, seed) over its "
             f"runs {tables.optional_cell(law, 1.0, 2)} (mean ± 95% half-width); over all runs "
             f"pooled {show(pooled)} (against KL(run‖base): {show(pooled_reverse)}); the SFT "
             f"runs' slope through the origin per (base, seed), drop per nat: "
             + ", ".join(f"{b} {show(s, 3)}" for b, s in slopes.items()) + ".\n")
    return text


def plot(arms: dict, out: str) -> None:
    """forgetting.png: each run's old-task drop against its KL(base || run) on the new task,
    one colour per arm."""
    plt = common.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9.2, 3.4))
    for ax, metric, label in ((axes[0], "kl_forward", "KL(base‖run) on the new task, nats"),
                              (axes[1], "kl_reverse", "KL(run‖base) on the new task, nats")):
        for index, arm in enumerate(ARMS):
            if arm not in arms:
                continue
            metrics = arms[arm]["metrics"]
            points = [(x, 100.0 * y) for x, y in zip(metrics.get(metric, []),
                                                      metrics.get("pass@1_old_drop", []))
                      if x is not None and y is not None]
            if points:
                ax.scatter(*zip(*points), label=arm, color=f"C{index}", s=18)
        ax.axhline(0.0, color="grey", lw=0.5)
        ax.set_xlabel(label, fontsize=8)
        ax.set_ylabel("old-task pass@1 drop, points", fontsize=8)
        ax.legend(fontsize=7)
    common.save_figure(fig, out, "forgetting.png")


# ---- the claims ------------------------------------------------------------------------------

SOURCE = ("Shenfeld, Pari and Agrawal 2025, \"RL's Razor: Why Online Reinforcement Learning "
          "Forgets Less\", arXiv:2509.04259v1, abstract")
LATER = ("Shenfeld, Pari and Agrawal 2025, \"RL's Razor: Why Online Reinforcement Learning "
         "Forgets Less\", the abstract's later version (as on the authors' page, "
         "jyopari.github.io/posts/rl_razor)")
CLAIMS = (
    common.Claim("despite similar performance at a new task, RL preserves prior knowledge and "
                 "capabilities significantly better", SOURCE + " (quoted); tested as GRPO's "
                 "old-task pass@1 drop below SFT's, at one budget from one base",
                 (GRPO, SFT, "pass@1_old_drop"), "<", margin=PASS_MARGIN,
                 headroom=(BASE, "pass@1_old", 0.0),
                 can_fail="fails unless SFT's drop on products exceeds GRPO's by the margin "
                          "(Holm p < 0.05, no base the other way): when SFT on clean sums "
                          "and differences leaves products intact (the traces share their "
                          "layout), or when GRPO forgets as much; it cannot be tested when the "
                          "base's pass@1 on products is below the margin (nothing to forget)",
                 note="at one budget, not at matched new-task pass@1: the table gives both "
                      "arms' new-task pass@1"),
    common.Claim("the degree of forgetting is determined by the distributional shift, "
                 "measured as the KL-divergence between the fine-tuned and base policy "
                 "evaluated on the new task", SOURCE + " (quoted); tested as the correlation "
                 "of the old-task drop with KL(base || fine-tuned) on new-task prompts (the "
                 "forward KL, the direction of the paper's law as secondary summaries report "
                 "it; the abstract names none) over each (base, seed)'s runs of the three arms, its "
                 "mean above 0 by the margin",
                 (LAW, NO_RELATION, "r_drop_kl"), ">", margin=R_BAR,
                 can_fail="fails unless the mean within-(base, seed) correlation reaches 0.5 "
                          "with Holm p < 0.05 and no base below 0: when the drop is sampling "
                          "noise (all arms forget alike, or none forgets), or when the run "
                          "that moves most on sums is not the one that loses most on products",
                 note="read with the first claim's ceiling: where the base leaves nothing to "
                      "forget, the drops are noise and this test fails for want of "
                      "forgetting, not against the law"),
    common.Claim("on-policy RL is implicitly biased towards KL-minimal solutions among the "
                 "many that solve the new task, whereas SFT can converge to distributions "
                 "arbitrarily far from the base model", SOURCE + " (quoted); tested as GRPO's "
                 "log KL(base || fine-tuned) on new-task prompts below SFT's by log 2 (at most "
                 "half the KL), at one budget",
                 (GRPO, SFT, "log_kl_forward"), "<", margin=KL_RATIO_MARGIN,
                 can_fail="fails unless GRPO's KL moved on the new task is at most half of "
                          "SFT's (Holm p < 0.05, no base the other way): SFT's targets are the "
                          "clean worked solutions, near the mode of a base pretrained on "
                          "noisy ones, so SFT may move no further than GRPO's sharpening; "
                          "GRPO runs without a KL penalty, so nothing explicit holds it "
                          "near the base"),
    common.Claim("the degree of forgetting is not determined by the training algorithm "
                 "itself, but by the distributional shift, namely the KL divergence between "
                 "the fine-tuned and base policy when evaluated on the new task distribution",
                 LATER + " (quoted); tested as GRPO's old-task drop equal, within the margin, "
                 "to what a line through the origin fitted to the same (base, seed)'s two SFT "
                 "runs (drop on KL(base || fine-tuned)) predicts at GRPO's KL",
                 (GRPO, SFT_LAW, "pass@1_old_drop"), "=", margin=PASS_MARGIN,
                 headroom=(BASE, "pass@1_old", 0.0),
                 can_fail="fails if the 95% interval of GRPO's drop less SFT's law's "
                          "prediction reaches past ±3 points: GRPO forgets less (or more) "
                          "than an SFT run that moved as far; a near-zero drop and KL for "
                          "GRPO make the prediction near zero too, so the test is weak when "
                          "GRPO barely moves"),
)

STUDY = common.Study(
    name="forgetting",
    question="post-trained on sums and differences at one budget from a base that also knows "
             "products, does GRPO lose less of products than SFT, does the KL moved on the "
             "new task predict the loss across runs of both algorithms, and does GRPO move "
             "less KL, paired by seed?",
    tiers=tiers.standard(
        full="about 2 hours on 2 cores, estimated, not yet run: 24 runs at about 2-2.5 min "
             "each (one_shot's 61 min measured for 24 GRPO runs with two evaluations; SFT "
             "runs of as many sequences no longer, update_sparsity's 12 runs of both kinds in "
             "about 20 min), about 55 min; per run an old-task draw of 1,024 completions and "
             "two KL samplings of 512 completions with a teacher-forced pass of both models, "
             "about 50 s (generalization's 20 s per 1,024 completions, kl_beta's KL "
             "measurement), about 20 min; plus the main bases, about 9 min each, when not "
             "built yet (shared with the other studies of the main base); the sft runs (8) "
             "are generalization's, so beside it this study adds 16 runs and its "
             "measurements, about 60 min",
        mini="about 50 s on 2 cores, measured (54 s for `run --tier=mini`, 46 s in the "
             "test): one toy base, one seed, the three arms and their draws",
        full_sized=True),
    arms=ARMS, base_config=base_config, arm_configs=arm_configs, analyze=analyze,
    measure=measure, claims=CLAIMS,
)
