"""The measurements several studies share, made on finished runs' policies after training.

* Held-out sampling (`held_out`, `sampling_config`, `sample`): a finished run's policy on its
  held-out problems through the eval stage's sampler (`runner.rollouts.sample_batch`: the
  run's prompts, the task's rewards as components) in the eval stage's fixed-shape batches
  (`runner.rollouts.fixed_batches`), so padding and scoring exist once.
* Per-problem counts of a held-out sampling (`sample_problems`) and a study's draws of every
  finished run and of its base model with each seed's key (`measure_samplings`): pass_at_k,
  sharpening, budget_forcing.
* Score-function pools (`sample_scores`, `measure_pools`): per problem, a pool of completions
  with their rewards and the Gram matrix of their per-sequence score functions: baselines,
  difficulty_bias.
* Completion figures of the arithmetic traces (`figures_all_and_2op`) and means over the first
  / last RL steps (`window_mean`): length_bias, length_growth.
"""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from grpo_jax import storage
from grpo_jax.studies import common

KEY = 20250418  # the held-out draws' key root (pass_at_k's, sharpening's); a seed folds in
WEIGHTS = {"accuracy": 1.0, "format": 0.2}  # the main job's rl.rewards


# ---- a finished run's policy on held-out problems ---------------------------------------------

class HeldOut(NamedTuple):
    """A finished run (`common.load_finished`: config, task, tokenizer, policy, params) with
    held-out problems of its task and the seed that chose them."""
    run: Any
    examples: list
    eval_seed: int


def held_out(workdir: str, problems: int | None = None, *, config=None) -> HeldOut:
    """The finished run in `workdir` with `problems` held-out problems (None: task.eval_size)
    of `config`'s evaluation (None: the run's own), chosen by its task.eval_seed: the same
    problems for every seed."""
    run = common.load_finished(workdir)
    config = run.config if config is None else config
    count = int(config.task.eval_size) if problems is None else problems
    seed = common.eval_seed(config)
    return HeldOut(run, run.task.examples("test", count, seed=seed), seed)


def sampling_config(run, max_new_tokens: int, *, group: int = 1, forcing: dict | None = None):
    """Temperature 1 with the run's end and pad tokens (`runner.toolkit.sampling_config`),
    rows in contiguous groups of `group` sharing a prompt; `forcing`: budget forcing (s1) as
    {min_thinking_tokens, max_thinking_tokens, end_thinking, continuation}."""
    import dataclasses

    from grpo_jax.runner.toolkit import sampling_config as run_sampling

    sampling = dataclasses.replace(
        run_sampling(run, max_new_tokens=max_new_tokens, temperature=1.0), prompt_group=group)
    if forcing and (forcing.get("min_thinking_tokens") or forcing.get("max_thinking_tokens")):
        sampling = dataclasses.replace(
            sampling, min_thinking_tokens=int(forcing.get("min_thinking_tokens", 0)),
            max_thinking_tokens=int(forcing.get("max_thinking_tokens", 0)),
            end_thinking_ids=tuple(run.tokenizer.encode(forcing["end_thinking"])),
            continuation_ids=tuple(run.tokenizer.encode(forcing["continuation"])))
    return sampling


def sample(run, params, rows, key, *, sampling, weights: dict, batch_rows: int | None = None):
    """One completion of each of `rows` (examples; a problem repeated for several) from the
    run's policy with `params`, prompted as the run prompts and scored by its task's rewards
    (`weights`: the total's), by the eval stage's sampler. `batch_rows` None: one batch that
    draws with `key`; else the eval stage's fixed-shape batches (`fixed_batches`: the last
    one padded, the batch from row `start` drawing with fold_in(key, start)). The Rollout of
    `rows`, in order."""
    from grpo_jax.rl.rollout import Rollout
    from grpo_jax.runner.rollouts import fixed_batches, sample_batch

    reward_fns = run.task.reward_fns()
    if batch_rows is None:
        return sample_batch(run, run.policy, params, rows, key, sampling=sampling,
                            reward_fns=reward_fns, weights=weights, where="measure")()
    parts = [ro if real == batch_rows else ro.take_rows(range(real))
             for _, real, ro in fixed_batches(run, run.policy, params, rows, key,
                                              batch_size=batch_rows, sampling=sampling,
                                              reward_fns=reward_fns, weights=weights,
                                              where="measure")]
    return parts[0] if len(parts) == 1 else Rollout.concat(parts)


# ---- per-problem counts of a held-out sampling (pass_at_k, sharpening, budget_forcing) -------

def sample_problems(setup: HeldOut, params, *, samples: int, seed: int, max_new_tokens: int,
                    batch_rows: int, forcing: dict | None = None,
                    keep_texts: int = 0, keep_answers: bool = False,
                    key: int = KEY) -> list[dict]:
    """`samples` completions of each held-out problem of `setup` at temperature 1, scored by
    the task's accuracy and format rewards; per problem: its question, operators, and the
    count of correct and well-formed completions and their tokens. The key is a function of
    `seed` only (and of the row), so two models (or two forcings) sampled with one seed
    share it (`key` is its root). `forcing`: budget forcing (`sampling_config`).
    `keep_texts`: the first completions kept as text. `keep_answers`: each problem's
    samples' extracted answers in sample order (`answer_key`; None where none was
    extracted) and their correctness, as "answers" and "correct_flags" (a string of 0 and
    1)."""
    import jax

    from grpo_jax.evals import metrics

    run, examples = setup.run, setup.examples
    if batch_rows % samples and samples % batch_rows:
        raise ValueError(f"batch_rows {batch_rows} and samples {samples}: one must divide "
                         "the other")
    group = samples if batch_rows % samples == 0 else batch_rows
    sampling = sampling_config(run, max_new_tokens, group=group, forcing=forcing)
    rows = [ex for ex in examples for _ in range(samples)]
    root = jax.random.fold_in(jax.random.key(key), seed)
    ro = sample(run, params, rows, root, sampling=sampling, weights=WEIGHTS,
                batch_rows=batch_rows)
    index = np.repeat(np.arange(len(examples)), samples)
    ok = np.asarray(metrics.solved(ro.components["accuracy"]))
    correct = np.zeros(len(examples), int)
    formatted = np.zeros(len(examples), int)
    tokens = np.zeros(len(examples), int)
    np.add.at(correct, index, ok.astype(int))
    np.add.at(formatted, index, (np.asarray(ro.components["format"]) >= 1.0).astype(int))
    np.add.at(tokens, index, np.asarray(ro.lengths).astype(int))
    out = [{"question": ex.prompt, "answer": ex.answer,
            "operators": int(ex.meta.get("steps", 0)), "samples": samples,
            "correct": int(c), "formatted": int(f), "tokens": int(t)}
           for ex, c, f, t in zip(examples, correct, formatted, tokens)]
    if keep_texts:
        out[0]["texts"] = list(ro.texts[:keep_texts])
    if keep_answers:
        answers: list[list] = [[] for _ in examples]
        flags: list[list] = [[] for _ in examples]
        for i, text, good in zip(index, ro.texts, ok):
            answers[i].append(answer_key(run.task.extract_answer(text)))
            flags[i].append("1" if good else "0")
        for problem, mine, good in zip(out, answers, flags):
            problem["answers"], problem["correct_flags"] = mine, "".join(good)
    return out


def answer_key(answer: str | None) -> str | None:
    """An extracted answer as a vote and as a point of the answer distribution: normalised
    text (`rewards.accuracy.normalize_text`), None when absent or empty."""
    from grpo_jax.rewards.accuracy import normalize_text

    if answer is None or not answer.strip():
        return None
    return normalize_text(answer)


def base_path(runs: common.StudyRuns, key: str, seed: int) -> str:
    """Where a study keeps the base model's draw with `seed`'s key."""
    return storage.join(runs.root, "base_model", f"{key},seed={seed}.json")


def base_problems(runs: common.StudyRuns, key: str, seed: int) -> list[dict] | None:
    """The base model's draw with `seed`'s key (`base_path`, `load_problems`)."""
    return load_problems(base_path(runs, key, seed))


def _write(path: str, problems: list[dict], seed: int, setup: HeldOut, model: str,
           indent: int | None) -> None:
    storage.write_text(path, json.dumps(
        {"model": model, "seed": seed, "key": KEY, "eval_seed": setup.eval_seed,
         "problems": problems}, indent=indent))


def pending(runs: common.StudyRuns, done: Callable[[str], bool],
            base_file: Callable[[common.StudyRuns, str, int], str]
            ) -> Iterator[tuple[str, dict, list[common.RunRecord], list[int]]]:
    """What is left to measure, base by base: (key, base, its finished runs whose workdir
    `done` does not accept, the seeds whose base draw `base_file(runs, key, seed)` is not
    written yet), for the bases with anything left."""
    seeds = sorted({r.seed for r in runs.runs})
    for key, base in runs.bases.items():
        todo = [r for r in runs.runs if r.base == key and r.finished and not done(r.workdir)]
        base_todo = [s for s in seeds if not storage.isfile(base_file(runs, key, s))]
        if todo or base_todo:
            yield key, base, todo, base_todo


def has_file(name: str) -> Callable[[str], bool]:
    """`pending`'s `done`: the run's workdir holds `name`."""
    return lambda workdir: storage.isfile(storage.join(workdir, name))


def measure_samplings(runs: common.StudyRuns, sizes: dict, file: str, *,
                      keep_answers: bool = False) -> None:
    """`file` for every finished run without one (its policy's `sample_problems` of
    sizes["problems"] held-out problems x sizes["samples"], with its seed's key), and the base
    model's draw with each seed's key (`base_path`); a finished measurement is not made
    again."""
    import time

    study = runs.study.name
    for key, base, todo, base_todo in pending(runs, has_file(file), base_path):
        setup = held_out(base["workdir"], sizes["problems"])
        max_new = int(setup.run.config.eval_final.max_new_tokens)
        indent = None if keep_answers else 1

        def draw(params, seed, setup=setup, max_new=max_new):
            return sample_problems(setup, params, samples=sizes["samples"], seed=seed,
                                   max_new_tokens=max_new, batch_rows=sizes["batch_rows"],
                                   keep_answers=keep_answers)

        storage.makedirs(storage.join(runs.root, "base_model"))
        for seed in base_todo:
            t0 = time.time()
            _write(base_path(runs, key, seed), draw(setup.run.params, seed), seed, setup,
                   base["workdir"], indent)
            print(f"[studies] {study}: base model {key} seed={seed} sampled in "
                  f"{time.time() - t0:.0f}s", flush=True)
        for record in todo:
            t0 = time.time()
            params = common.load_run_params(record.workdir, setup.run.tokenizer)
            _write(storage.join(record.workdir, file), draw(params, record.seed),
                   record.seed, setup, record.workdir, indent)
            print(f"[studies] {study}: {record.arm} {key} seed={record.seed} sampled in "
                  f"{time.time() - t0:.0f}s", flush=True)


def load_problems(path: str) -> list[dict] | None:
    """A measurement's problems (`measure_samplings`' files), None when not made yet."""
    if not storage.isfile(path):
        return None
    return json.loads(storage.read_text(path))["problems"]


# ---- score-function pools (baselines, difficulty_bias) ----------------------------------------

BASE_EVAL = ("pass@1", "pass@8", "format_rate", "mean_length")  # a pool run's eval_base


def _grad_fn(run):
    """jit(tokens, attention, loss_mask) -> [rows, P] flattened score functions."""
    import jax

    from grpo_jax.rl.update import flat_sequence_score_grads

    policy, params, prompt_len = run.policy, run.params, int(run.config.task.prompt_len)
    return jax.jit(lambda tokens, attention, loss_mask: flat_sequence_score_grads(
        policy, params, tokens, attention, prompt_len, loss_mask=loss_mask))


def _logp_gap(run, ro, rows: int = 16) -> float:
    """max |sum_t teacher-forced log pi - sum_t sampler log pi| over the first rows: the
    score functions are those of the distribution that sampled."""
    from grpo_jax.rl.update import sequence_logp

    full = np.concatenate([ro.prompt_tokens, ro.tokens], 1)[:rows]
    attention = np.concatenate([ro.prompt_mask, ro.attention_mask], 1)[:rows]
    logp, _ = sequence_logp(run.policy, run.params, full, attention,
                            int(run.config.task.prompt_len))
    mask = ro.loss_mask[:rows]
    return float(np.max(np.abs(np.where(mask, np.asarray(logp), 0).sum(1)
                               - np.where(mask, ro.behaviour_logp[:rows], 0).sum(1))))


def sample_scores(run, examples, *, pool: int, key, prompts_per_call: int, grad_rows: int,
                  label: str = "", grad_fn=None) -> dict:
    """`pool` completions of each problem of `examples` sampled from the finished run's
    policy at temperature 1 (its rl.max_new_tokens), scored by the task's reward functions,
    and each problem's Gram matrix of the per-sequence score functions: {"accuracy",
    "format", "lengths", "truncated": [n, pool], "gram": [n, pool, pool], "ids": [n],
    "logp_gap"}. Each call of `prompts_per_call` problems draws with the next key of a
    split chain from `key`; `grad_fn`: a compiled `_grad_fn(run)` to reuse."""
    import jax

    sampling = sampling_config(run, int(run.config.rl.max_new_tokens), group=pool)
    fn = _grad_fn(run) if grad_fn is None else grad_fn
    out = {"accuracy": [], "format": [], "lengths": [], "truncated": [], "gram": []}
    logp_gap = 0.0
    for start in range(0, len(examples), prompts_per_call):
        chunk = examples[start:start + prompts_per_call]
        rows = [ex for ex in chunk for _ in range(pool)]
        key, sub = jax.random.split(key)
        ro = sample(run, run.params, rows, sub, sampling=sampling,
                    weights={"accuracy": 1.0, "format": 1.0})
        if start == 0:
            logp_gap = _logp_gap(run, ro)
        full = np.concatenate([ro.prompt_tokens, ro.tokens], 1)
        attention = np.concatenate([ro.prompt_mask, ro.attention_mask], 1)
        for p in range(len(chunk)):
            block = slice(p * pool, (p + 1) * pool)
            grads = np.concatenate([np.asarray(fn(full[block][i:i + grad_rows],
                                                  attention[block][i:i + grad_rows],
                                                  ro.loss_mask[block][i:i + grad_rows]))
                                    for i in range(0, pool, grad_rows)])
            grads = grads.astype(np.float64)
            out["gram"].append(grads @ grads.T)
        n = len(chunk)
        for name in ("accuracy", "format"):
            out[name].append(np.asarray(ro.components[name]).reshape(n, pool))
        out["lengths"].append(np.asarray(ro.lengths).reshape(n, pool))
        out["truncated"].append(np.asarray(ro.truncated).reshape(n, pool))
        print(f"[studies] {label}: {start + n}/{len(examples)} problems sampled", flush=True)
    data = {k: np.concatenate(v) for k, v in out.items() if k != "gram"}
    data["gram"] = np.stack(out["gram"])
    data["ids"] = np.asarray([str(ex.id) for ex in examples])
    data["logp_gap"] = np.asarray(logp_gap)
    return data


def save_pool(path: str, data: dict) -> None:
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **{k: np.asarray(v) for k, v in data.items()})
    storage.write_bytes(path, buffer.getvalue())


def load_pool(record: common.RunRecord, name: str) -> dict | None:
    """A run's measured pool (`save_pool`), None if it has none."""
    path = storage.join(record.workdir, name)
    if not record.finished or not storage.isfile(path):
        return None
    with np.load(io.BytesIO(storage.read_bytes(path))) as data:
        return {k: data[k] for k in data.files}


def load_pools(records: Sequence[common.RunRecord], name: str) -> tuple[list, list]:
    """The records that have a measured pool `name` and their pools (`load_pool`)."""
    loaded = [(record, load_pool(record, name)) for record in records]
    loaded = [(record, pool) for record, pool in loaded if pool is not None]
    return [record for record, _ in loaded], [pool for _, pool in loaded]


def measure_pools(runs: common.StudyRuns, *, name: str, prompts: int, pool: int,
                  prompts_per_call: int, grad_rows: int) -> None:
    """For every finished run without `name`: `pool` completions of each of the first
    `prompts` held-out problems (the run's task.eval_seed: the same problems for every
    seed), sampled from the run's base with the key jax.random.key(seed), with their Gram
    matrices."""
    import jax

    loaded: dict[str, tuple] = {}
    for record in runs.runs:
        path = storage.join(record.workdir, name)
        if not record.finished or storage.isfile(path):
            continue
        if record.base not in loaded:
            run = common.load_finished(runs.bases[record.base]["workdir"])
            loaded[record.base] = (run, _grad_fn(run))  # compiled once for every seed
        run, grad_fn = loaded[record.base]
        eval_seed = common.eval_seed(record.config)
        examples = run.task.examples("test", prompts, seed=eval_seed)
        label = f"{runs.study.name} {record.base} seed={record.seed}"
        data = sample_scores(run, examples, pool=pool, key=jax.random.key(record.seed),
                             prompts_per_call=prompts_per_call, grad_rows=grad_rows,
                             label=label, grad_fn=grad_fn)
        data.update(seed=np.asarray(record.seed), eval_seed=np.asarray(eval_seed))
        save_pool(path, data)


def task_rewards(data: dict, weights: dict, tier: str) -> np.ndarray:
    """The weighted reward of a pool. The mini tier's toy base earns no task reward, so there
    a stand-in takes accuracy's place: whether the completion ended before the token limit
    (binary, and it varies), so that the arithmetic runs on rewards that vary."""
    components = {"accuracy": np.asarray(data["accuracy"], np.float64),
                  "format": np.asarray(data["format"], np.float64)}
    if tier == "mini":
        components["accuracy"] = 1.0 - np.asarray(data["truncated"], np.float64)
    return sum(w * components[name] for name, w in weights.items())


def pool_protocol(pools: list[dict], records: list[common.RunRecord], samples: int,
                  note: str, *, tier: str) -> dict:
    """The held-out protocol of the measurement: the problems' seed and count, samples per
    problem, and whether every run measured the same problems (compared by id); `note`, with
    the mini tier's stand-in reward said (`task_rewards`)."""
    if tier == "mini":
        note += ("; mini tier: the stand-in reward (accuracy = the completion ended before "
                 "the token limit), since the toy base earns no task reward")
    ids = [tuple(p["ids"].tolist()) for p in pools]
    seeds = {int(p["eval_seed"]) for p in pools} or {common.eval_seed(r.config)
                                                    for r in records}
    return {"eval_seed": seeds.pop() if len(seeds) == 1 else sorted(seeds),
            "problems": len(ids[0]) if ids else None, "samples_per_problem": samples,
            "problems_fixed_across_seeds": bool(ids) and len(set(ids)) == 1,
            "notes": note}


def base_eval_values(record: common.RunRecord) -> dict:
    """The base's held-out figures (BASE_EVAL) from a pool run's eval stage (eval_base)."""
    row = common.last_stage_rows(record).get("eval_base", {})
    return {name: row.get(name) for name in BASE_EVAL}


# ---- completion figures of the arithmetic traces (length_bias, length_growth) ----------------

def completion_figures(items, suffix: str = "") -> dict:
    """Length, length of the correct / incorrect completions, redo rate (" redo " per step
    the problems need), share with a redo and pass@1 with / without a redo, over `items`:
    dicts {"steps", "text", "correct", "length"}."""
    items = list(items)

    def mean(values):
        values = list(values)
        return sum(values) / len(values) if values else math.nan

    redos = [it["text"].count(" redo ") for it in items]
    out = {
        "length": mean(it["length"] for it in items),
        "length_correct": mean(it["length"] for it in items if it["correct"]),
        "length_incorrect": mean(it["length"] for it in items if not it["correct"]),
        "redo_rate": sum(redos) / max(1, sum(it["steps"] for it in items)),
        "with_redo": mean(n > 0 for n in redos),
        "pass@1": mean(bool(it["correct"]) for it in items),
        "pass@1_redo": mean(bool(it["correct"]) for it, n in zip(items, redos) if n),
        "pass@1_no_redo": mean(bool(it["correct"]) for it, n in zip(items, redos) if not n),
    }
    out["gap"] = out["length_incorrect"] - out["length_correct"]
    return {name + suffix: value for name, value in out.items()}


def figures_all_and_2op(items) -> dict:
    """`completion_figures` over all problems and (suffix _2op) the two-operator ones."""
    items = list(items)
    out = completion_figures(items)
    out.update(completion_figures([it for it in items if it["steps"] == 2], "_2op"))
    out["completions"] = len(items)
    return out


def window_mean(rows: list[dict], name: str, first: bool, window: int = 10) -> float:
    """Mean of `name` over the first (or last) `window` RL steps (half the steps when there
    are fewer than 2 x `window`), NaN steps left out."""
    n = max(1, min(window, len(rows) // 2))
    values = [r.get(name) for r in (rows[:n] if first else rows[-n:])]
    values = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return sum(values) / len(values) if values else math.nan


def kept_rl_steps(workdir: str) -> dict[int, int]:
    """RL step -> checkpoint step of a run's kept RL checkpoints (the last one per step)."""
    from grpo_jax.checkpoint import Checkpointer

    found = {}
    with Checkpointer(os.path.join(storage.local_path(workdir) or workdir,
                                   "checkpoints")) as checkpointer:
        for step in checkpointer.all_steps():
            meta = checkpointer.restore_meta(step)
            if meta.get("stage") == "rl":
                found[int(meta["stage_step"])] = step
    return found


def params_at(workdir: str, checkpoint_step: int, like):
    """The parameters of checkpoint `checkpoint_step` of a run, in the structure and dtypes
    of `like` (the base's parameters)."""
    import jax
    import numpy as np

    from grpo_jax.checkpoint import Checkpointer

    with Checkpointer(os.path.join(storage.local_path(workdir) or workdir,
                                   "checkpoints")) as checkpointer:
        state, _ = checkpointer.restore(checkpoint_step)

    def get(path):
        node = state["params"]
        for part in path:
            k = getattr(part, "key", getattr(part, "idx", part))
            node = node[str(k)] if str(k) in node else node[k]
        return node

    return jax.tree_util.tree_map_with_path(
        lambda path, x: jax.numpy.asarray(np.asarray(get(path)), x.dtype), like)


def redraw_seed(seed: int, seeds) -> int:
    """The seed whose base draw is `seed`'s redraw: the next of the tier's seeds, cyclic."""
    order = sorted(seeds)
    if len(order) < 2:
        raise ValueError("the base redraw needs at least two seeds in the tier")
    return order[(order.index(seed) + 1) % len(order)]


def pass_figures(problems: list[dict], ks, other: list[dict] | None, strata: dict) -> dict:
    """pass@k over all problems and per stratum ({suffix name: the problems' operator count},
    pass_at_k's STRATA), format rate, length, and (against `other`, the other model's counts
    on the same problems) the share of problems this model solves in its samples and the
    other never does."""
    from grpo_jax.evals.metrics import pass_at_k

    out = {}
    groups = {"": problems, **{f"/{name}": [p for p in problems if p["operators"] == ops]
                               for name, ops in strata.items()}}
    for suffix, members in groups.items():
        for k in ks:
            out[f"pass@{k}{suffix}"] = (sum(pass_at_k(p["samples"], p["correct"], k)
                                            for p in members) / len(members)
                                        if members else None)
    total = sum(p["samples"] for p in problems)
    out["format_rate"] = sum(p["formatted"] for p in problems) / total
    out["mean_length"] = sum(p["tokens"] for p in problems) / total
    out["never_solved_rate"] = sum(p["correct"] == 0 for p in problems) / len(problems)
    if other is not None:
        out["only_this_solves_rate"] = sum(p["correct"] > 0 and q["correct"] == 0
                                           for p, q in zip(problems, other)) / len(problems)
    return out
