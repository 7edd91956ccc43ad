"""Test-time scaling: accuracy against samples and against the thinking budget, for the base
and its GRPO policy; how many samples RL's gain is worth; and whether a policy trained at one
token budget gains from a longer one (s1, arXiv:2501.19393; e3, arXiv:2506.09026). The samples
part runs on two task families: arithmetic and reasoning-gym's spell_backward
(`families.SECOND`); the thinking-budget part on arithmetic only.

Bases (per base seed, shared by config with the other studies; one role set per base seed,
`families.with_family` plus budget_forcing's role): `base`, the main job's pretraining
(`common.main_base`); `wait_redo`, budget_forcing's base of the same pretraining on traces
that redo a step with probability 0.3 after the word "Wait" ("9*6=15 Wait 9*6=54", a redone
step always right), the model that has seen the word s1 appends; `spell_backward:base` (full
tier only), the spell_backward preset's pretraining (tiny-1m, 800 steps on noisy worked
solutions "e s u o h", each letter wrong with probability 0.3; replication's role of the same
name). Three arms:

  rl: from `base`, the main job's RL stage (GRPO, accuracy + 0.2 x format, lr 2e-4, groups of
      8; 60 steps of 16 prompts at the full tier, `jobs.rl_alone`); pass_at_k's run (and
      sharpening's, and budget_forcing's "wait" arm's): one config, so one run in a shared
      workdir
  e3: the same stage from `wait_redo`, on its traces, trained at a budget of 32 new tokens
      (`TRAIN_BUDGET`; budget_forcing's "wait seen" arm trains at 48)
  spell_backward: rl (full tier only): from `spell_backward:base`, the preset's GRPO stage
      (`families.grpo`: eval_base, 40 steps of 32 prompts x 8, accuracy = the dataset's
      scorer, partial credit, + 0.2 x format, eval_final); replication's `spell_backward:
      all` run (one config, so one run in a shared workdir)

The mini tier runs the arithmetic arms on the arithmetic roles only (`MINI_ARMS`); the
family's configs, its attachment and its analysis are covered by unit tests without
training.

After the runs, `measure` samples every (base, seed) with keys that are a function of the
seed only (the models of one (base, seed) share them):

* samples, per family: the family's base model and its RL policy, 256 completions of each of
  the family's 128 held-out problems (fixed across seeds) at temperature 1, the family's
  evaluation token limit (max_new_tokens 40 on arithmetic, 32 on spell_backward), with
  pass_at_k's key (so arithmetic's draws are pass_at_k's); per problem the correct (the
  accuracy reward >= 1: on spell_backward the scorer's 1, its partial credit below counting
  as wrong), well-formed and token counts, and maj@k (`evals.metrics.maj_at_k`, unbiased)
  for k up to 64 over the extracted answers (`measure.answer_key`: normalised text; a
  spelled word is a string, and a vote is an answer with its grade, so that two answers the
  normalisation merges but the scorer grades apart, "olleh" and "olleh.", vote apart:
  `vote_keys`). pass@k (unbiased) for k = 1, 2, 4, ..., 256 comes from the counts. The
  compute of k samples is k x the policy's mean completion length (tokens).
* thinking budget (arithmetic only; budget forcing, `measure.sampling_config`), 8 completions
  of each of the 128 problems, max_new_tokens 48: the base model and the RL policy unforced
  and with the end of thinking forced after 4, 8, 12 or 16 thinking tokens (caps: no word
  needed); the `wait_redo` base model unforced and with at least 16, 24 or 32 thinking
  tokens, an earlier end replaced by " Wait" (a model that has seen the word:
  budget_forcing's base role), and unforced at the e3 arm's training budget
  (max_new_tokens 32: the base's own gain from the longer budget, before RL at the shorter
  one); the e3 policy at total budgets (max_new_tokens) of 16, 24, 32, 40 and 48 tokens,
  unforced.

The analysis reports, per family and (base, seed), the samples k* at which the base's pass@k
and its maj@k first reach the RL policy's pass@1 (`crossing_samples`: linear in log2 k
between the two measured k around the crossing; none when the largest k does not reach it)
and the tokens k* x the base's mean length, against the RL policy's tokens for one answer: an
estimate of the samples RL's gain is worth, not a claim of a source.

Claims on the family: the claims whose test is from the samples part (maj@64 against maj@1
for the base and for the RL policy, and the pass@k check) are twinned on spell_backward:
the same text, source and margin, the family's arms, and a can-fail statement of their own
(`FAMILY_WHY`). The thinking-budget claims are not twinned: the " Wait" minimum and e3's
extrapolation need a base that read "Wait" before a re-check (budget_forcing's `wait_redo`,
a format of arithmetic's traces; spell_backward's worked solutions hold no re-check and no
such base exists for it), and the cap check is true by construction of arithmetic's trace
lengths (a cap of 8 thinking tokens cuts a two-operator trace before its answer step), which
spell_backward's traces (one letter and a space per step, 3-5 letters) do not share. Every
contrast stays within a family; the Holm family holds both families' claims and each
family's RL pass@1 against its base's.
"""

from __future__ import annotations

import dataclasses
import json
import math

from grpo_jax import storage
from grpo_jax.stats import interval, paired_interval
from grpo_jax.studies import common, families, jobs, tiers
from grpo_jax.studies import measure as measure_lib

RL, E3 = "rl", "e3"
FAMILY = families.SECOND  # the reasoning-gym family of the samples part
FAMILY_RL = families.arm_name(FAMILY, RL)  # "spell_backward: rl"
ARMS = (RL, E3, FAMILY_RL)
MINI_ARMS = (RL, E3)  # the mini tier: arithmetic only
MAIN_ROLE, WAIT_ROLE = families.MAIN_ROLE, "wait_redo"  # the arithmetic roles of a base set
BASE, WAIT_BASE = "base", "wait base"  # the base models (samples per (base, seed))
FAMILY_BASE = families.arm_name(FAMILY, BASE)  # the family's base model, "spell_backward: base"
REDO_RATE, WAIT_WORD = 0.3, "Wait"  # budget_forcing's "Wait" base (its `wait_redo` role)
KS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MAJ_MAX_K = 64  # maj@k is computed for k up to this (its exact estimator's cost grows with k)
CLAIM_K = 64  # the claims' k (DeepSeekMath's figure 7 and sharpening's maj@64)
TRAIN_BUDGET = 32  # the e3 arm's rl.max_new_tokens
FORCED_MAX_NEW = 48  # every thinking-budget condition's max_new_tokens but the e3 budgets
SAMPLES_KEY = measure_lib.KEY  # pass_at_k's key root: the samples draws are pass_at_k's
BUDGET_KEY = 20250609  # the thinking-budget draws' key root (e3's arXiv date); seeds fold in
CONTINUATION = " Wait"
# condition -> (min_thinking_tokens, max_thinking_tokens, max_new_tokens)
CAPS = {"unforced": (0, 0, FORCED_MAX_NEW), "cap=4": (0, 4, FORCED_MAX_NEW),
        "cap=8": (0, 8, FORCED_MAX_NEW), "cap=12": (0, 12, FORCED_MAX_NEW),
        "cap=16": (0, 16, FORCED_MAX_NEW)}
MINIMA = {"unforced": (0, 0, FORCED_MAX_NEW), "min=16": (16, 0, FORCED_MAX_NEW),
          "min=24": (24, 0, FORCED_MAX_NEW), "min=32": (32, 0, FORCED_MAX_NEW)}
BUDGETS = {f"budget={b}": (0, 0, b) for b in (16, 24, 32, 40, 48)}
TRAINED = f"budget={TRAIN_BUDGET}"  # the e3 policy's training budget as a condition
# the "Wait" base: its minima, and unforced at the e3 arm's training budget (the base's own
# gain from the longer budget, before RL at the shorter one)
WAIT_CONDITIONS = {TRAINED: BUDGETS[TRAINED], **MINIMA}
# the budget axis' models: (name, conditions), in table order
BUDGET_MODELS = ((BASE, CAPS), (RL, CAPS), (WAIT_BASE, WAIT_CONDITIONS), (E3, BUDGETS))
# each model's reference condition (the table's paired differences are to it)
REFERENCE = {BASE: "unforced", RL: "unforced", WAIT_BASE: "unforced", E3: TRAINED}
# the conditions the mini tier measures: those the claims test
MINI = {BASE: ("unforced", "cap=8"), RL: ("unforced", "cap=8"),
        WAIT_BASE: ("unforced", "min=24"), E3: ("budget=32", "budget=48")}
SAMPLES_FILE, BUDGET_FILE = "tts_samples.json", "tts_budget.json"
GAIN = "rl gain as samples"  # the pseudo-arm of the exchange estimate (no contrast)
FAMILY_GAIN = families.arm_name(FAMILY, GAIN)
# the samples part per family: (family, base model, RL policy, exchange pseudo-arm)
SAMPLES = (("arithmetic", BASE, RL, GAIN), (FAMILY, FAMILY_BASE, FAMILY_RL, FAMILY_GAIN))
BUDGET_FIGURES = ("pass@1", "mean_length", "format_rate")

MAJ_MARGIN = 0.05  # maj@64 - maj@1: five points, far below what voting adds on MATH
S1_MARGIN = 0.02  # as budget_forcing's (s1: 50% -> 57% on AIME24)
E3_MARGIN = 0.02  # two points of pass@1 from the longer budget


def samples_arm(policy: str, k: int) -> str:
    """The summary's arm of one policy's figures at k samples, e.g. "base x64"."""
    return f"{policy} x{k}"


def budget_arm(model: str, condition: str) -> str:
    """The summary's arm of one model under one thinking-budget condition, e.g.
    "wait base min=24"."""
    return f"{model} {condition}"


def _sizes(tier: str) -> dict:
    """Problems, samples per problem and rows per sampling batch of the two measurements."""
    if tier == "full":
        return {"problems": 128, "samples": 256, "batch_rows": 1024, "ks": KS,
                "budget_samples": 8, "budget_rows": 256}
    return {"problems": 4, "samples": 64, "batch_rows": 256, "ks": KS[:7],
            "budget_samples": 8, "budget_rows": 32}


def _conditions(tier: str, model: str, conditions: dict) -> dict:
    return conditions if tier == "full" else {k: v for k, v in conditions.items()
                                              if k in MINI[model]}


# ---- the configs ------------------------------------------------------------------------------

def _wait_base(tier: str):
    """budget_forcing's `wait_redo` base: the main pretraining on traces whose redos follow
    "Wait" (one config, so one base in a shared workdir)."""
    config = common.main_base(tier)
    config.task.kwargs.redo_rate = REDO_RATE
    config.task.kwargs.redo_word = WAIT_WORD
    return config


def base_config(tier: str) -> dict:
    """The main job's pretraining (role `base`), the same on traces with "Wait" redos
    (`wait_redo`) and, at the full tier, the family's pretraining (`families.with_family`);
    the mini tier builds the arithmetic roles only."""
    roles = {MAIN_ROLE: common.main_base(tier), WAIT_ROLE: _wait_base(tier)}
    if tier == "full":
        roles.update(families.with_family(roles[MAIN_ROLE], tier, FAMILY))
    return roles


def arm_config(tier: str = "full", arm: str = RL):
    """One arm's RL run (model.init_from: its base, set by `attach`; the family arm holds its
    role's name until then); the held-out sampling is `measure`'s."""
    if arm not in ARMS:
        raise ValueError(f"test_time_scaling: arm {', '.join(ARMS)}; got {arm!r}")
    if arm == FAMILY_RL:
        return families.grpo(tier, FAMILY)
    config = jobs.rl_alone(tier)
    if arm == E3:
        config.task.kwargs.redo_rate = REDO_RATE  # as its base was pretrained
        config.task.kwargs.redo_word = WAIT_WORD
        config.rl.max_new_tokens = TRAIN_BUDGET
    return config


def arm_configs(tier: str) -> dict:
    return {arm: arm_config(tier, arm) for arm in ARMS}


def attach(config, base: dict) -> None:
    """The e3 arm (its task writes "Wait" redos) from the `wait_redo` base; every other arm
    from the role its model.init_from names (`families.attach`: rl's "" is `base`, the
    family arm's "spell_backward:base" its family's base)."""
    if config.task.kwargs.get("redo_word") == WAIT_WORD:
        config.model.init_from = base["roles"][WAIT_ROLE]
    else:
        families.attach(config, base)


# ---- the measurement --------------------------------------------------------------------------

# a base model's folder of draws under the study's directory (made by `measure`)
MODEL_FOLDERS = {BASE: "base_model", WAIT_BASE: "wait_base_model",
                 FAMILY_BASE: f"{FAMILY}_base_model"}


def _model_path(runs: common.StudyRuns, model: str, key: str, seed: int, file: str) -> str:
    """Where a base model's draw with `seed`'s key is kept (under the study's directory)."""
    return storage.join(runs.root, MODEL_FOLDERS[model], f"{key},seed={seed},{file}")


def vote_keys(answers: list, flags: list[bool]) -> list[str | None]:
    """The votes of a problem's samples: each extracted answer (`measure.answer_key`'s
    normalised text, None: no vote) with its grade, so that every vote is graded alike
    (`maj_at_k` grades an answer by its first sample). On arithmetic an answer's samples
    agree on the grade and the votes are the answers; on spell_backward the scorer compares
    lower-cased strings exactly, so "olleh" (right) and "olleh." (wrong), one normalised
    text, vote apart."""
    return [None if a is None else f"{a}\t{'right' if ok else 'wrong'}"
            for a, ok in zip(answers, flags)]


def reduce_problems(problems: list[dict], max_k: int) -> list[dict]:
    """`measure.sample_problems`' problems (with answers) as counts, distinct votes and
    maj@k over the votes (`vote_keys`) for k = 1, 2, 4, ... up to min(max_k, samples); the
    answers themselves are dropped."""
    from grpo_jax.evals.metrics import maj_at_k

    out = []
    for p in problems:
        flags = [f == "1" for f in p["correct_flags"]]
        votes = vote_keys(p["answers"], flags)
        ks = [k for k in KS if k <= min(max_k, p["samples"])]
        out.append({"operators": p["operators"], "samples": p["samples"],
                    "correct": p["correct"], "formatted": p["formatted"], "tokens": p["tokens"],
                    "distinct": len({v for v in votes if v is not None}),
                    "maj": {str(k): maj_at_k(votes, flags, k) for k in ks}})
    return out


def _draw_samples(path: str, setup, params, seed: int, sizes: dict, label: str) -> None:
    """The samples draw of a policy (`setup()`: the held-out problems and prompts; `params()`:
    the policy's parameters) with `seed`'s key into `path`, unless it is there."""
    import time

    if storage.isfile(path):
        return
    t0 = time.time()
    problems = measure_lib.sample_problems(
        setup(), params(), samples=sizes["samples"], seed=seed,
        max_new_tokens=int(setup().run.config.eval_final.max_new_tokens),
        batch_rows=sizes["batch_rows"], keep_answers=True, key=SAMPLES_KEY)
    storage.write_text(path, json.dumps(
        {"key": SAMPLES_KEY, "seed": seed, "eval_seed": setup().eval_seed,
         "problems": reduce_problems(problems, MAJ_MAX_K)}))
    print(f"[studies] test_time_scaling: {label} samples in {time.time() - t0:.0f}s",
          flush=True)


def _budget_figures(problems: list[dict]) -> dict:
    total = sum(p["samples"] for p in problems)
    return {"pass@1": sum(p["correct"] for p in problems) / total,
            "mean_length": sum(p["tokens"] for p in problems) / total,
            "format_rate": sum(p["formatted"] for p in problems) / total,
            "examples": problems[0].get("texts", [])}


def _draw_budgets(path: str, setup, seed: int, conditions: dict, sizes: dict,
                  label: str) -> None:
    """The figures of `setup`'s policy under each condition, written after each (a
    condition measured already is skipped)."""
    import time

    done = json.loads(storage.read_text(path)) if storage.isfile(path) else {
        "key": BUDGET_KEY, "seed": seed, "continuation": CONTINUATION, "conditions": {}}
    for name, (low, high, max_new) in conditions.items():
        if name in done["conditions"]:
            continue
        t0 = time.time()
        forcing = ({"min_thinking_tokens": low, "max_thinking_tokens": high,
                    "end_thinking": "</think>", "continuation": CONTINUATION}
                   if low or high else None)
        problems = measure_lib.sample_problems(
            setup(), setup().run.params, samples=sizes["budget_samples"], seed=seed,
            max_new_tokens=max_new, batch_rows=sizes["budget_rows"], forcing=forcing,
            keep_texts=4, key=BUDGET_KEY)
        done["conditions"][name] = _budget_figures(problems)
        storage.write_text(path, json.dumps(done, indent=1))
        print(f"[studies] test_time_scaling: {label} {name}: pass@1 "
              f"{done['conditions'][name]['pass@1']:.3f} ({time.time() - t0:.0f}s)", flush=True)


def _lazy(make):
    """`make()` once, when first asked for."""
    cache = []

    def get():
        if not cache:
            cache.append(make())
        return cache[0]
    return get


def _measure_family(runs: common.StudyRuns, key: str, roles: dict, seeds: list[int],
                    sizes: dict) -> None:
    """The family's samples draws on base set `key`: its base model with each seed's key
    and every finished `spell_backward: rl` run, on the family's held-out problems (its
    task.eval_size, fixed across seeds) at its evaluation's token limit."""
    records = [r for r in runs.arm(FAMILY_RL) if r.base == key and r.finished]
    if not records:
        return
    path = roles[families.role(FAMILY)]
    family = _lazy(lambda: measure_lib.held_out(path))
    for seed in seeds:
        _draw_samples(_model_path(runs, FAMILY_BASE, key, seed, SAMPLES_FILE), family,
                      lambda: family().run.params, seed, sizes,
                      f"{FAMILY_BASE} model {key} seed={seed}")
    for record in records:
        _draw_samples(storage.join(record.workdir, SAMPLES_FILE), family,
                      lambda path=record.workdir: common.load_run_params(
                          path, family().run.tokenizer),
                      record.seed, sizes, f"{FAMILY_RL} {key} seed={record.seed}")


def measure(runs: common.StudyRuns) -> None:
    """The samples draws (`SAMPLES_FILE`) of each family's base model and every finished RL
    run of the family, and the thinking-budget draws (`BUDGET_FILE`) of the base model, the
    rl runs, the "Wait" base model and the e3 runs; each base model once per seed with that
    seed's keys. A finished draw (or condition) is skipped."""
    tier, sizes = runs.tier, _sizes(runs.tier)
    seeds = sorted({r.seed for r in runs.runs})
    for folder in MODEL_FOLDERS.values():
        storage.makedirs(storage.join(runs.root, folder))
    for key, base in runs.bases.items():
        roles = base["roles"]
        _measure_family(runs, key, roles, seeds, sizes)
        main = _lazy(lambda path=roles[MAIN_ROLE]: measure_lib.held_out(
            path, sizes["problems"]))
        wait = _lazy(lambda path=roles[WAIT_ROLE]: measure_lib.held_out(
            path, sizes["problems"]))
        if any(r.finished for r in runs.runs if r.base == key):
            for seed in seeds:
                label = f"base model {key} seed={seed}"
                if runs.arm(RL):
                    _draw_samples(_model_path(runs, BASE, key, seed, SAMPLES_FILE), main,
                                  lambda main=main: main().run.params, seed, sizes, label)
                    _draw_budgets(_model_path(runs, BASE, key, seed, BUDGET_FILE), main, seed,
                                  _conditions(tier, BASE, CAPS), sizes, label)
                if runs.arm(E3):
                    _draw_budgets(_model_path(runs, WAIT_BASE, key, seed, BUDGET_FILE), wait,
                                  seed, _conditions(tier, WAIT_BASE, WAIT_CONDITIONS), sizes,
                                  f"\"Wait\" {label}")
        for record in runs.arm(RL):
            if record.base != key or not record.finished:
                continue
            _draw_samples(storage.join(record.workdir, SAMPLES_FILE), main,
                          lambda path=record.workdir, main=main: common.load_run_params(
                              path, main().run.tokenizer),
                          record.seed, sizes, f"rl {key} seed={record.seed}")
            setup = _lazy(lambda path=record.workdir: measure_lib.held_out(
                path, sizes["problems"]))
            _draw_budgets(storage.join(record.workdir, BUDGET_FILE), setup, record.seed,
                          _conditions(tier, RL, CAPS), sizes, f"rl {key} seed={record.seed}")
        for record in runs.arm(E3):
            if record.base != key or not record.finished:
                continue
            setup = _lazy(lambda path=record.workdir: measure_lib.held_out(
                path, sizes["problems"]))
            _draw_budgets(storage.join(record.workdir, BUDGET_FILE), setup, record.seed,
                          _conditions(tier, E3, BUDGETS), sizes, f"e3 {key} seed={record.seed}")


# ---- the analysis -----------------------------------------------------------------------------

def curves(problems: list[dict], ks) -> dict:
    """A policy's mean pass@k and maj@k over the problems at each k of `ks` (maj@k where
    every problem has it, else None), its mean completion length (tokens) and distinct
    answers per problem."""
    from grpo_jax.evals.metrics import pass_at_k

    n = len(problems)
    total = sum(p["samples"] for p in problems)
    out = {"pass": {}, "maj": {},
           "length": sum(p["tokens"] for p in problems) / total,
           "distinct": sum(p["distinct"] for p in problems) / n}
    for k in ks:
        out["pass"][k] = sum(pass_at_k(p["samples"], p["correct"], k) for p in problems) / n
        values = [p["maj"].get(str(k)) for p in problems]
        out["maj"][k] = sum(values) / n if all(v is not None for v in values) else None
    return out


def crossing_samples(ks, accuracy, target: float) -> float | None:
    """The samples k at which a curve of accuracy against k first reaches `target`: `ks` in
    increasing order with `accuracy` at each (None where not measured: the curve ends
    there); 1.0 when the first point already reaches it; between the two points around the
    first crossing, linear in log2 k (k = 2 ** (log2 k0 + (target - a0) / (a1 - a0) x
    (log2 k1 - log2 k0))); None when no measured point reaches it."""
    points = [(k, a) for k, a in zip(ks, accuracy) if a is not None]
    previous = None
    for k, a in points:
        if a >= target:
            if previous is None:
                return float(k)
            k0, a0 = previous
            share = (target - a0) / (a - a0)
            return 2.0 ** (math.log2(k0) + share * (math.log2(k) - math.log2(k0)))
        previous = (k, a)
    return None


def exchange(base: dict, rl: dict, ks) -> dict:
    """The samples (and tokens) at which the base's pass@k and maj@k reach the RL policy's
    pass@1 (`crossing_samples`), the RL policy's tokens for one answer, and log2 of the
    samples (the scale their interval is taken on)."""
    target = rl["pass"][1]
    out = {"rl_tokens": rl["length"]}
    for name in ("pass", "maj"):
        k = crossing_samples(ks, [base[name].get(k) for k in ks], target)
        out[f"k_{name}"] = k
        out[f"log2_k_{name}"] = None if k is None else math.log2(k)
        out[f"tokens_{name}"] = None if k is None else k * base["length"]
    return out


def _load(path: str) -> dict | None:
    return json.loads(storage.read_text(path)) if storage.isfile(path) else None


def _samples_rows(rows: common.ArmRows, runs: common.StudyRuns, record, ks, base_model: str,
                  policy: str, gain: str) -> None:
    """One finished RL run's samples rows: the base model's and the policy's pass@k, maj@k
    and tokens at each k (`samples_arm`), and the exchange estimate (`gain`), when both
    draws are made."""
    rl = _load(storage.join(record.workdir, SAMPLES_FILE))
    base = _load(_model_path(runs, base_model, record.base, record.seed, SAMPLES_FILE))
    if rl is None or base is None:
        return
    found = {base_model: curves(base["problems"], ks), policy: curves(rl["problems"], ks)}
    for name, curve in found.items():
        for k in ks:
            rows.add(samples_arm(name, k), record.base, record.seed,
                     {"pass@k": curve["pass"][k], "maj@k": curve["maj"][k],
                      "tokens": k * curve["length"]})
    rows.add(gain, record.base, record.seed,
             {**exchange(found[base_model], found[policy], ks),
              "rl_pass@1": found[policy]["pass"][1], "base_pass@1": found[base_model]["pass"][1],
              "base_distinct": found[base_model]["distinct"],
              "rl_distinct": found[policy]["distinct"]})


def analyze(runs: common.StudyRuns) -> common.Analysis:
    sizes = _sizes(runs.tier)
    ks = sizes["ks"]
    rows = common.ArmRows()
    examples: dict = {}
    seeds = sorted({r.seed for r in runs.runs})

    def budget_rows(model, path, seed, key):
        measured = _load(path)
        if measured is None:
            return
        for condition in BUDGET_MODELS_DICT[model]:
            if condition in measured["conditions"]:
                figures = measured["conditions"][condition]
                name = budget_arm(model, condition)
                rows.add(name, key, seed, {k: figures[k] for k in BUDGET_FIGURES})
                examples.setdefault(name, figures.get("examples", []))

    for key in runs.bases:
        for seed in seeds:
            budget_rows(BASE, _model_path(runs, BASE, key, seed, BUDGET_FILE), seed, key)
            budget_rows(WAIT_BASE, _model_path(runs, WAIT_BASE, key, seed, BUDGET_FILE), seed,
                        key)
    for record in runs.arm(RL):
        if record.finished:
            budget_rows(RL, storage.join(record.workdir, BUDGET_FILE), record.seed, record.base)
    for _, base_model, policy, gain in SAMPLES:
        for record in runs.arm(policy):
            if record.finished:
                _samples_rows(rows, runs, record, ks, base_model, policy, gain)
    for record in runs.arm(E3):
        if record.finished:
            budget_rows(E3, storage.join(record.workdir, BUDGET_FILE), record.seed, record.base)
    arms = rows.arms([name for _, base_model, policy, gain in SAMPLES
                      for name in [samples_arm(p, k) for p in (base_model, policy) for k in ks]
                      + [gain]]
                     + [budget_arm(m, c) for m, conditions in BUDGET_MODELS for c in conditions])
    return common.Analysis(
        arms=arms, specs=SPECS, table=table(arms, ks),
        extra={"examples_first_seed": examples, "samples_key": SAMPLES_KEY,
               "budget_key": BUDGET_KEY, "maj_max_k": MAJ_MAX_K,
               "train_budget": TRAIN_BUDGET,
               "exchange": {family: exchange_summary(arms, gain)
                            for family, _, _, gain in SAMPLES}},
        protocol={"problems": sizes["problems"], "samples_per_problem": sizes["samples"],
                  "notes": (f"measured after training: the samples axis draws "
                            f"{sizes['samples']} completions per problem with pass_at_k's "
                            f"key ({SAMPLES_KEY} folded with the seed), on each family's "
                            f"held-out problems (arithmetic: {sizes['problems']}; "
                            f"{FAMILY}: its task.eval_size) at max_new_tokens of the family's "
                            "evaluation; the thinking-budget axis (arithmetic) "
                            f"{sizes['budget_samples']} per problem and condition with "
                            f"{BUDGET_KEY} folded with the seed, max_new_tokens "
                            f"{FORCED_MAX_NEW} (the e3 budgets: their own); temperature 1")},
        plots=lambda out: plot(arms, ks, out))


BUDGET_MODELS_DICT = dict(BUDGET_MODELS)


def _geometric(values) -> dict:
    """The interval of log2 of the values (those not None), as 2 ** (mean, ci95)."""
    found = interval([v for v in values if v is not None])
    return {"n": found["n"], "mean": 2.0 ** found["mean"] if found["n"] else None,
            "ci95": [2.0 ** v if math.isfinite(v) else None for v in found["ci95"]]}


def exchange_summary(arms: dict, gain: str = GAIN) -> dict:
    """A family's exchange estimate (its pseudo-arm `gain`) over (base, seed): per figure
    (pass, maj) the geometric mean of k* with its 95% interval, the runs whose base curve
    reaches the target within the largest k (and those it does not), and the mean tokens."""
    if gain not in arms:
        return {}
    metrics = arms[gain]["metrics"]
    out = {}
    for name in ("pass", "maj"):
        logs = metrics.get(f"log2_k_{name}", [])
        out[name] = {"samples": _geometric(logs),
                     "reached": sum(v is not None for v in logs),
                     "not_reached": sum(v is None for v in logs),
                     "tokens": interval([v for v in metrics.get(f"tokens_{name}", [])
                                         if v is not None])["mean"]}
    out["rl_tokens"] = interval(metrics.get("rl_tokens", []))["mean"]
    return out


def _cell(values, scale=100.0, digits=1) -> str:
    values = [v for v in values if v is not None]
    return common.cell(values, scale, digits) if values else "-"


def _number(value, digits=1) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _samples_table(arms: dict, ks, family: str, base_model: str, policy: str,
                   gain: str) -> list[str]:
    """A family's samples axis (pass@k, maj@k and their tokens for its base model and RL
    policy) and its exchange estimate, as table lines (none where not measured)."""
    lines = []
    if all(samples_arm(p, k) in arms for p in (base_model, policy) for k in ks):
        lines += ["", (f"Samples on {family}: mean ± 95% half-width over every (base, seed); "
                       "tokens = k x the policy's mean completion length (the compute of k "
                       "samples)."), "",
                  ("| k | base pass@k | base maj@k | base tokens | RL pass@k | RL maj@k | "
                   "RL tokens |"), "|---|---|---|---|---|---|---|"]
        for k in ks:
            cells = []
            for name in (base_model, policy):
                m = arms[samples_arm(name, k)]["metrics"]
                cells += [_cell(m["pass@k"]), _cell(m["maj@k"]), _cell(m["tokens"], 1.0, 0)]
            lines.append(f"| {k} | " + " | ".join(cells) + " |")
    summary = exchange_summary(arms, gain)
    if summary:
        lines += ["", (f"RL's gain as samples on {family}: the samples k* at which the base's "
                       "curve first reaches the RL policy's pass@1 (linear in log2 k between "
                       "the measured k around the crossing), geometric mean [95% interval] "
                       "over the (base, seed) that reach it; tokens = k* x the base's mean "
                       "length. An estimate, not a verdict."), "",
                  ("| base's curve | k* (samples) | tokens at k* | RL's tokens for one answer "
                   "| runs reaching it / not within the largest k |"), "|---|---|---|---|---|"]
        for name, label in (("pass", "pass@k"), ("maj", "maj@k")):
            found = summary[name]
            s = found["samples"]
            interval_text = (f"{_number(s['mean'], 2)} [{_number(s['ci95'][0], 2)}, "
                             f"{_number(s['ci95'][1], 2)}]" if s["n"] else "-")
            lines.append(f"| {label} | {interval_text} | {_number(found['tokens'], 0)} | "
                         f"{_number(summary['rl_tokens'], 1)} | {found['reached']} / "
                         f"{found['not_reached']} |")
    return lines


def table(arms: dict, ks) -> str:
    """Per family the samples axis (pass@k, maj@k and their tokens for both policies) and
    the exchange estimate, then arithmetic's thinking-budget axis (pass@1, its paired
    difference to the model's reference condition (`REFERENCE`), length, format rate)."""
    lines = [line for family in SAMPLES for line in _samples_table(arms, ks, *family)]
    budget = [(m, c) for m, conditions in BUDGET_MODELS for c in conditions
              if budget_arm(m, c) in arms]
    if budget:
        lines += ["", ("Thinking budget: mean ± 95% half-width over every (base, seed); "
                       "\"- reference\": the paired difference to the model's reference "
                       f"condition (unforced; for e3 its training budget, {TRAINED}), same "
                       "model and key (descriptive: the tests are the claims' contrasts)."), "",
                  ("| model | condition | pass@1 | pass@1 - reference | mean length (tokens) | "
                   "format rate |"), "|---|---|---|---|---|---|"]
        for model, condition in budget:
            m = arms[budget_arm(model, condition)]
            reference = budget_arm(model, REFERENCE[model])
            diff = "-"
            if budget_arm(model, condition) != reference and reference in arms:
                ref = arms[reference]
                keyed = dict(zip(zip(ref["bases"], ref["seeds"]), ref["metrics"]["pass@1"]))
                stats = paired_interval(m["metrics"]["pass@1"],
                                        [keyed.get(k) for k in zip(m["bases"], m["seeds"])])
                diff = common.paired_cell({"n": stats["n"], "diff": stats["mean"],
                                           "ci95": stats["ci95"]})
            lines.append(f"| {model} | {condition} | {_cell(m['metrics']['pass@1'])}% | {diff} "
                         f"| {_cell(m['metrics']['mean_length'], 1.0)} | "
                         f"{_cell(m['metrics']['format_rate'])}% |")
    return "\n".join(lines).strip("\n") + "\n"


def _samples_panel(ax, arms: dict, ks, family: str, base_model: str, policy: str,
                   caps: bool) -> None:
    """A family's samples curves against the tokens per problem (pass@k and maj@k at k x
    the mean length) for its base model and RL policy, the RL policy's pass@1 as a line, and
    (`caps`, arithmetic) pass@1 under the caps at the mean length."""
    import numpy as np

    for name, short, color in ((base_model, BASE, "C0"), (policy, RL, "C3")):
        names = [samples_arm(name, k) for k in ks]
        if not all(n in arms for n in names):
            continue
        tokens = [np.mean(arms[n]["metrics"]["tokens"]) for n in names]
        for metric, style in (("pass@k", "o-"), ("maj@k", "s--")):
            stats = [interval([v for v in arms[n]["metrics"][metric] if v is not None])
                     for n in names]
            keep = [i for i, st in enumerate(stats) if st["n"]]
            mean, err = common.error_bars([stats[i] for i in keep], 100)
            ax.errorbar([tokens[i] for i in keep], mean, yerr=err, fmt=style, ms=3,
                        capsize=2, color=color, label=f"{short}: {metric}")
        capped = [budget_arm(short, c) for c in CAPS if budget_arm(short, c) in arms]
        if caps and capped:
            ax.plot([np.mean(arms[n]["metrics"]["mean_length"]) for n in capped],
                    [np.mean(arms[n]["metrics"]["pass@1"]) * 100 for n in capped], "^:",
                    color=color, label=f"{short}: pass@1 under caps")
    if samples_arm(policy, 1) in arms:
        ax.axhline(np.mean(arms[samples_arm(policy, 1)]["metrics"]["pass@k"]) * 100,
                   color="gray", lw=0.8, ls=":", label="RL pass@1")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens per problem (samples x mean length)")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(f"{family}: samples{' and caps' if caps else ''}, 95% intervals",
                 fontsize=9)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6)


def plot(arms: dict, ks, out: str) -> None:
    """test_time_scaling.png: accuracy against the tokens per problem (samples: pass@k and
    maj@k at k x the mean length; caps: pass@1 at the mean length), for the base and the RL
    policy, with the RL policy's pass@1 as a line, on arithmetic; pass@1 against the mean
    length of the "Wait" base's minima and the e3 policy's budgets (the training budget
    marked); and, where measured, the family's samples curves as on arithmetic."""
    import numpy as np

    plt = common.pyplot()
    family = SAMPLES[1]
    with_family = samples_arm(family[2], 1) in arms
    fig, axes = plt.subplots(1, 3 if with_family else 2, figsize=(18 if with_family else 12, 4))
    _samples_panel(axes[0], arms, ks, *SAMPLES[0][:3], caps=True)
    if with_family:
        _samples_panel(axes[2], arms, ks, *family[:3], caps=False)
    ax = axes[1]
    lines = ((WAIT_BASE, MINIMA, "o-", "C2", "\"Wait\" base: unforced, then minima"),
             (WAIT_BASE, {TRAINED: None}, "x", "C2",
              f"\"Wait\" base: unforced at {TRAINED}"),
             (E3, BUDGETS, "o-", "C4", "e3 policy: total budgets"))
    for model, conditions, style, color, label in lines:
        names = [budget_arm(model, c) for c in conditions if budget_arm(model, c) in arms]
        if not names:
            continue
        stats = [interval(arms[n]["metrics"]["pass@1"]) for n in names]
        mean, err = common.error_bars(stats, 100)
        ax.errorbar([np.mean(arms[n]["metrics"]["mean_length"]) for n in names], mean,
                    yerr=err, fmt=style, capsize=3, color=color, label=label)
    ax.axvline(TRAIN_BUDGET, color="gray", lw=0.8, ls=":",
               label="e3's training budget (its longest completion in training)")
    ax.set_xlabel("mean completion length (tokens)")
    ax.set_ylabel("pass@1 (%)")
    ax.set_title("longer thinking, 95% intervals", fontsize=9)
    ax.legend(fontsize=6)
    common.save_figure(fig, out, "test_time_scaling.png")


# ---- the claims -------------------------------------------------------------------------------

LECTURE = ("the lecture on RL for LLMs (close paraphrase: sampling as a new axis of scaling, "
           "accuracy growing with test-time compute)")
S1 = "Muennighoff et al. 2025 (s1), arXiv:2501.19393"
E3_SOURCE = "Setlur et al. 2025 (e3), arXiv:2506.09026"
VOTE = ("the task's noisy traces make the correct value the likeliest at each step, so a "
        "policy that learned them votes right; it fails where the policy's modal answer is "
        "wrong on enough problems that voting more samples settles on the wrong answer")

ARITHMETIC_CLAIMS = (
    common.Claim(
        text="sampling is a new axis of scaling: accuracy grows with test-time compute, more "
             "samples with a majority vote",
        source=f"{LECTURE}; tested as the base model's maj@{CLAIM_K} against maj@1",
        test=(samples_arm(BASE, CLAIM_K), samples_arm(BASE, 1), "maj@k"), expect=">",
        margin=MAJ_MARGIN, headroom=(samples_arm(BASE, 1), "maj@k", 1.0),
        why="on a problem where the base's modal answer is wrong (an operator confusion "
            "it samples more often than the right step), a larger vote settles on the "
            "wrong answer and maj@k falls with k there; the test fails if such problems "
            "outweigh those where the vote finds the right answer",
        note=VOTE),
    common.Claim(
        text="sampling is a new axis of scaling: accuracy grows with test-time compute, more "
             "samples with a majority vote",
        source=f"{LECTURE}; tested as the RL policy's maj@{CLAIM_K} against maj@1",
        test=(samples_arm(RL, CLAIM_K), samples_arm(RL, 1), "maj@k"), expect=">",
        margin=MAJ_MARGIN, headroom=(samples_arm(RL, 1), "maj@k", 1.0),
        why="GRPO concentrates the policy's mass on one answer per problem: where that "
            "answer is wrong the vote keeps it, and where it is right maj@1 leaves "
            "little to add (the headroom is computed from maj@1 before the verdict); "
            "the test fails if the samples agree so often that the vote adds less than "
            "the margin",
        note="RL concentrates the policy's mass: where it concentrates on a wrong answer, "
             "more votes do not help"),
    common.Claim(
        text="sampling is a new axis of scaling: accuracy grows with test-time compute, more "
             "samples (any of them correct)",
        source=f"{LECTURE}; tested as the base model's pass@{CLAIM_K} against pass@1",
        test=(samples_arm(BASE, CLAIM_K), samples_arm(BASE, 1), "pass@k"), expect=">",
        margin=MAJ_MARGIN, kind="check",
        can_fail="no: the unbiased pass@k, 1 - C(n-c, k) / C(n, k), cannot fall as k grows on "
                 "any problem; only its size is measured"),
    common.Claim(
        text="we develop budget forcing to control test-time compute by forcefully "
             "terminating the model's thinking process",
        source=f"{S1}, abstract (quoted); tested as the base model with at most 8 thinking "
               "tokens against unforced: accuracy scales with the budget (Fig. 1)",
        test=(budget_arm(BASE, "cap=8"), budget_arm(BASE, "unforced"), "pass@1"),
        expect="<", margin=S1_MARGIN, kind="check",
        can_fail="no: a cap of 8 thinking tokens cuts a two-operator trace before the step "
                 "that computes the answer"),
    common.Claim(
        text="scaling s1-32B with budget forcing allows extrapolating beyond its performance "
             "without test-time intervention",
        source=f"{S1}, abstract (quoted, as on the project page; an arXiv version writes "
               "\"s1\"); tested on the base pretrained on traces where \"Wait\" introduces a "
               "re-check (budget_forcing's wait_redo base), at least 24 thinking tokens "
               "(\" Wait\") against unforced",
        test=(budget_arm(WAIT_BASE, "min=24"), budget_arm(WAIT_BASE, "unforced"), "pass@1"),
        expect=">", margin=S1_MARGIN,
        why="both conditions share one key, so they differ only where the model ends its "
            "thinking before the minimum: there the forced \" Wait\" may lead it to "
            "repeat or garble a step instead of recomputing it (its pretraining traces "
            "put the word right after a step, to recompute that step), or to use up the "
            "new tokens before it answers; the test fails when the forced completions "
            "are right no more often than the ones they replace",
        note="s1 forces a fine-tuned model whose traces hold \"Wait\"; here a base model "
             "that saw the word before a correct re-check (budget_forcing tests the same "
             "base at a minimum of 16)"),
    common.Claim(
        text="improvement in performance on hard problems as LLMs keep \"thinking\" for "
             "longer, beyond the maximum token budget they were trained on",
        source=f"{E3_SOURCE}, abstract (quoted; e3 \"extrapolates to 2x the training token "
               f"budget\"); tested as the policy trained with RL at {TRAIN_BUDGET} new tokens "
               f"from the \"Wait\" base (in-context re-checks) sampled at {FORCED_MAX_NEW} "
               f"against {TRAIN_BUDGET} (the 64-token context leaves no room for twice the "
               "budget)",
        test=(budget_arm(E3, f"budget={FORCED_MAX_NEW}"),
              budget_arm(E3, f"budget={TRAIN_BUDGET}"), "pass@1"),
        expect=">", margin=E3_MARGIN,
        why=("both budgets share one key, so the longer budget only lets the completions "
             "cut at the training budget finish (up to float rounding): the test fails "
             "when RL, which scores a cut completion 0, taught the policy to finish "
             "within the training budget, or when its longer traces are rarely right"),
        note="e3's recipe has three parts (asymmetric skills, negative gradients, a "
             "difficulty-budget curriculum); here only in-context re-checks learned in "
             "pretraining and plain GRPO at one budget"),
)



# The samples part's claims on the family: the original (ARITHMETIC_CLAIMS[i]) with its
# arms on the family, and why its test could fail there (a check: why it cannot).
FAMILY_DOC = "docs/reasoning_gym.md's Results"
FAMILY_WHY = {
    0: ("spell_backward's base is far from its coverage ceiling (pass@1 0.10, pass@8 0.55 in "
        f"{FAMILY_DOC}): on a problem where its modal spelling is wrong (a letter replaced "
        "by another of the word's, as its noisy traces replace them), a larger vote settles "
        "on that spelling and maj@k falls with k there; its traces make the right spelling "
        "the likeliest whole string (each letter wrong with probability 0.3), but a base "
        "this weak may not have learned every letter's place, and can hold a wrong modal "
        "spelling on enough problems to fail the test. The reward's partial credit gives a vote nothing: a "
        "vote is right only when the scorer gives 1"),
    1: ("GRPO on the preset raised spell_backward's pass@1 to 0.84 in "
        f"{FAMILY_DOC}, so maj@1 leaves little room (the headroom is computed from maj@1 "
        "before the verdict); the partial-credit reward pays a spelling with most letters in "
        "place, so GRPO can concentrate a problem's samples on a near-miss the vote then "
        "keeps; and a completion is a few letters, so the policy's samples on a problem may "
        "agree so often that the vote adds little"),
    2: ("no: the unbiased pass@k, 1 - C(n-c, k) / C(n, k), cannot fall as k grows on any "
        "problem, on spell_backward as on arithmetic (a sample counts when the scorer gives "
        "1; partial credit below it counts as wrong); only its size is measured, far from "
        f"the ceiling on this base (pass@1 0.10 against pass@8 0.55 in {FAMILY_DOC})"),
}
FAMILY_NOTES = {
    0: ("spell_backward's noisy traces replace each letter with probability 0.3 by another "
        "of the word's letters, so the right spelling is the likeliest whole string of the "
        "data; a vote groups samples by their normalised answer and grade (`vote_keys`)"),
}


def _on_family(arm: str) -> str:
    """A samples arm of arithmetic as the family's ("base x64" -> "spell_backward: base
    x64")."""
    return families.arm_name(FAMILY, arm)


def _family_claim(index: int) -> common.Claim:
    """ARITHMETIC_CLAIMS[index] on the family: the same text, source (said rerun on the
    family), margin and kind; its test and headroom on the family's arms."""
    original = ARITHMETIC_CLAIMS[index]
    a, b, metric = original.test
    headroom = original.headroom and (_on_family(original.headroom[0]),
                                      *original.headroom[1:])
    check = original.kind == "check"
    return dataclasses.replace(
        original, test=(_on_family(a), _on_family(b), metric),
        can_fail=FAMILY_WHY[index] if check else "", why="" if check else FAMILY_WHY[index],
        source=f"{original.source}; rerun on reasoning-gym's {FAMILY}", headroom=headroom,
        note=FAMILY_NOTES.get(index, original.note))


FAMILY_CLAIMS = tuple(_family_claim(i) for i in sorted(FAMILY_WHY))
CLAIMS = ARITHMETIC_CLAIMS + FAMILY_CLAIMS
# the Holm family: every claim's contrast, and each family's RL pass@1 against its base's
# (the gain the exchange estimate converts: pass_at_k's first claim on arithmetic)
SPECS = [tuple(claim.test) for claim in CLAIMS if claim.test is not None] + [
    (samples_arm(policy, 1), samples_arm(base_model, 1), "pass@k")
    for _, base_model, policy, _ in SAMPLES]


STUDY = common.Study(
    name="test_time_scaling",
    question="accuracy against samples (pass@k, maj@k) and against the thinking budget "
             "(caps, \"Wait\" minima, total budgets) for the base and its GRPO policy, paired "
             "by (base, seed); the samples the RL policy's pass@1 gain is worth; and whether a "
             "policy trained at one budget gains beyond it; the samples part on arithmetic "
             f"and on reasoning-gym's {FAMILY}",
    tiers=tiers.standard(
        full="about 50-95 min on 2 cores (estimated from measured runs of the same "
             "kinds. Arithmetic: 6 rl runs (pass_at_k's, made once in a shared workdir) "
             "and 6 e3 runs of 60 steps, 1-1.5 min each (budget_forcing's); 12 samples "
             "draws of 128 x 256, 35-57 s each (sharpening's), and their maj@k up to 64, "
             "2-4 min; 120 thinking-budget samplings of 128 x 8, 5-10 s each "
             "(budget_forcing's). spell_backward: 6 GRPO runs of the preset's 40 steps, "
             "1-1.5 min each (replication's `spell_backward: all` runs, made once in a "
             "shared workdir); 12 samples draws of 128 x 256 at 32 new tokens, 1-2 min "
             "each (about twice an arithmetic draw: 6.8 s against 3.4 s for 16 problems "
             "x 256 measured side by side, the family's prompts longer and its barely "
             "trained model's completions near the limit), and their maj@k, 1-4 min. Plus, when not built yet, per base seed the shared 9-min "
             "main base, budget_forcing's 9-18-min \"Wait\" base and the family's base "
             "(the preset's 800 pretraining steps, 158-938 s in docs/reasoning_gym.md, "
             "shared with replication))",
        mini="about 1 min on 2 cores (measured: 64 s under a load of about 8, "
             "the two toy bases built in; 2 toy RL runs, 4 problems x 64 "
             "samples, the claimed conditions on 4 x 8; arithmetic only)",
        mini_arms=MINI_ARMS),
    arms=ARMS, base_config=base_config, arm_configs=arm_configs, attach=attach,
    analyze=analyze, measure=measure, claims=CLAIMS,
)
