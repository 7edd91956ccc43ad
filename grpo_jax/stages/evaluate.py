"""Stage kind "eval": pass@k, maj@k, format rate and length on held-out problems.

pass@k is the unbiased estimator of Chen et al. (2021) and maj@k the exact mean of a
majority vote over every k-subset of a problem's samples (`grpo_jax.evals.metrics`), for
each k in the section's `ks`. Tasks with an "accuracy_lenient" reward (GSM8K) also get
pass@k_lenient / maj@k_lenient: the same figures when the last number anywhere in the
completion counts as its answer. Budget forcing (s1, Muennighoff et al. 2025,
https://arxiv.org/abs/2501.19393) sets how long the model thinks: `min_thinking_tokens`
replaces an early end of thinking by `continuation` ("Wait"), `max_thinking_tokens` forces
the end-of-thinking delimiter."""

from __future__ import annotations

import dataclasses
import time

import ml_collections
import numpy as np

from grpo_jax import evals as evals_lib
from grpo_jax.rewards.parsing import last_number
from grpo_jax.rewards.python import is_python_reward
from grpo_jax.runner import StageKind
from grpo_jax.runner.inputs import eval_seed
from grpo_jax.runner.rewards import BUILTIN_REWARDS
from grpo_jax.runner.rollouts import sample_and_score, tool_episodes
from grpo_jax.runner.fields import TOOLS
from grpo_jax.runner.toolkit import (SAMPLES_PER_LOG, log_samples, sampling_config,
                                     stage_record_step)


def default_section() -> ml_collections.ConfigDict:
    """Config section of an "eval" stage (every field commented)."""
    s = ml_collections.ConfigDict()
    s.kind = "eval"
    s.num_samples = 8  # k samples per held-out problem (pass@1, pass@k, maj@k)
    s.temperature = 1.0  # sampling temperature (1 = the distribution RL trains)
    s.max_new_tokens = 40  # completion budget
    s.batch_size = 256  # sequences per sampler call (compile once)
    # The k of pass@k and maj@k (maj@k for k > 1), each <= num_samples, e.g. (1, 4, 16);
    # () = 1, 2, 4, ... and num_samples.
    s.ks = ()
    # Budget forcing (s1, https://arxiv.org/abs/2501.19393); thinking is what the model
    # writes before `end_thinking`. min_thinking_tokens: before this many thinking tokens,
    # the delimiter and EOS are replaced by `continuation` ("" masks them out instead);
    # max_thinking_tokens: after this many the delimiter is forced. 0 turns each off.
    s.min_thinking_tokens = 0
    s.max_thinking_tokens = 0
    s.end_thinking = "</think>"  # the end-of-thinking delimiter, as text
    s.continuation = "Wait"  # written in place of an early end of thinking, as text
    # Completions written to samples.jsonl: the first of each of the first samples_logged
    # problems, with `reward` the run's training reward (its RL stage's weights) and each
    # component beside it; -1: every one, problems x num_samples (for a study).
    s.samples_logged = SAMPLES_PER_LOG
    TOOLS.add(s)  # tools: multi-turn episodes with a tool (e.g. calc), as in rl
    return s


def resolved_ks(section) -> list[int]:
    """The section's `ks` with () resolved: 1, 2, 4, ... and num_samples."""
    if len(section.ks):
        return sorted(set(section.ks))
    ks, k = [], 1
    while k < section.num_samples:
        ks.append(k)
        k *= 2
    return ks + [section.num_samples]


def validate(check) -> None:
    n = check.integer("num_samples")
    check.positive("temperature")
    new = check.fits_context("max_new_tokens")
    check.integer("batch_size")
    check.divides("batch_size", check.section.batch_size, micro_field=None)
    ks = check.value("ks")
    if not isinstance(ks, (tuple, list)) or not all(
            isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= n for k in ks):
        check.fail("ks", f"expected a tuple of ints in [1, num_samples = {n}] (pass@k and "
                         f"maj@k need k of the num_samples samples), got {ks!r}")
    if check.integer("samples_logged", low=-1) == 0:
        check.fail("samples_logged", "expected -1 (every completion) or a positive count, "
                                     "got 0")
    low = check.integer("min_thinking_tokens", low=0)
    high = check.integer("max_thinking_tokens", low=0)
    if low > new:
        check.fail("min_thinking_tokens", f"{low} exceeds max_new_tokens {new}")
    if high >= new:
        check.fail("max_thinking_tokens", f"{high} leaves no room for the delimiter it forces "
                                          f"within max_new_tokens {new}")
    if high and low > high:
        check.fail("min_thinking_tokens", f"{low} exceeds max_thinking_tokens {high}")
    check.string("continuation")
    if check.section.tools and (low or high):  # the tools group is checked already
        check.fail("tools", "budget forcing and multi-turn episodes do not combine: set "
                            "tools to '' or min/max_thinking_tokens to 0")
    if check.string("end_thinking") == "" and (low or high):
        check.fail("end_thinking", "budget forcing (min_thinking_tokens / "
                                   "max_thinking_tokens) needs the delimiter's text")
    if check.tokenizer is not None and (low or high):
        for field in ("end_thinking", "continuation"):
            _token_ids(check, field, check.tokenizer)


def _token_ids(check, field: str, tokenizer) -> tuple[int, ...]:
    """The ids of a text field in the run's tokenizer (ConfigError naming the field)."""
    try:
        ids = tuple(tokenizer.encode(check.section[field]))
    except ValueError as err:
        check.fail(field, f"the run's tokenizer cannot encode {check.section[field]!r}: {err}")
    if field == "end_thinking" and not ids:
        check.fail(field, f"{check.section[field]!r} encodes to no token")
    return ids


def eval_sampling(run, section):
    """The sampler settings of an eval section, budget forcing included."""
    sampling = sampling_config(run, max_new_tokens=section.max_new_tokens,
                               temperature=section.temperature)
    if not (section.min_thinking_tokens or section.max_thinking_tokens):
        return sampling
    return dataclasses.replace(
        sampling, min_thinking_tokens=section.min_thinking_tokens,
        max_thinking_tokens=section.max_thinking_tokens,
        end_thinking_ids=tuple(run.tokenizer.encode(section.end_thinking)),
        continuation_ids=tuple(run.tokenizer.encode(section.continuation)))


def training_weights(run, stage) -> dict[str, float] | None:
    """The reward weights of the run's training reward, for the `reward` of the eval's logged
    samples: the rewards of the nearest earlier stage that has them (else the first later
    one), keeping the names an eval can score on text (the task's, built-in and Python
    rewards; not a learned reward model or the length rewards). None without such a stage
    (each of the task's rewards weighted 1)."""
    names = list(run.stage_names)
    here = names.index(stage.name)
    order = names[:here][::-1] + names[here + 1:]
    for name in order:
        rewards = run.config[name].get("rewards")
        if isinstance(rewards, (ml_collections.ConfigDict, dict)):
            task_fns = run.task.reward_fns()
            return {n: float(w) for n, w in dict(rewards).items()
                    if n in task_fns or is_python_reward(n) or n in BUILTIN_REWARDS}
    return None


def run_eval(run, stage) -> None:
    """Samples num_samples completions per task.eval_size held-out problem; records the
    figures in the run (for the report) and the metrics log."""
    section, task = stage.section, run.task
    examples = task.examples("test", run.config.task.eval_size, seed=eval_seed(run.config))
    sampling = eval_sampling(run, section)
    t0 = time.time()
    records = sample_and_score(run, examples, num_samples=section.num_samples,
                               batch_size=section.batch_size, sampling=sampling,
                               key=run.stage_key(stage.name, 0),
                               weights=training_weights(run, stage),
                               episodes=tool_episodes(run, section, sampling))
    k = section.num_samples
    ks = resolved_ks(section)

    def figures_of(correct: str, answer_of):
        per_problem = []
        for start in range(0, len(records), k):
            group = records[start:start + k]
            per_problem.append({"difficulty": group[0]["example"].difficulty, "samples": [{
                "answer": answer_of(r["text"]),
                "correct": evals_lib.solved(r["components"][correct]),
                "formatted": r["components"]["format"] >= 1.0,
                "length": r["length"],
            } for r in group]})
        return evals_lib.evaluate_samples(per_problem, ks=ks, maj_ks=[j for j in ks if j > 1])

    figures = figures_of("accuracy", task.extract_answer)
    if "accuracy_lenient" in records[0]["components"]:
        # The lenient reading (the last number anywhere in the completion), next to the
        # strict one (the answer inside the tags): e.g. GSM8K.
        lenient = figures_of("accuracy_lenient", last_number)
        figures.update({f"{name}_lenient": value for name, value in lenient.items()
                        if name.startswith(("pass@", "maj@"))})
    if "turns" in records[0]:  # multi-turn: how the tool was used
        turns = np.asarray([r["turns"] for r in records])
        figures.update(tool_calls=float(turns.mean()), tool_call_rate=float((turns > 0).mean()),
                       tool_errors=float(np.mean([r["tool_errors"] for r in records])),
                       tool_parse_failures=float(np.mean([r["tool_parse_failures"]
                                                          for r in records])))
        solved = np.asarray([evals_lib.solved(r["components"]["accuracy"]) for r in records])
        if solved.any():  # the turns a successful episode took (an agent's cost)
            figures["turns_to_success"] = float(turns[solved].mean())
    if "correct_call" in records[0]["components"]:
        figures["correct_call_rate"] = float(np.mean([r["components"]["correct_call"]
                                                      for r in records]))
    # the mean of every reward the samples were scored with (e.g. the language consistency
    # a study measures), as the RL steps log theirs
    for name in records[0]["components"]:
        figures[f"reward/{name}"] = float(np.mean([r["components"][name] for r in records]))
    figures["eval_time_s"] = time.time() - t0
    run.evals[stage.name] = figures
    flat = {k: v for k, v in figures.items() if isinstance(v, (int, float))}
    step = stage_record_step(run)
    run.writer.write(step, flat, stage=stage.name)
    limit = stage.section.get("samples_logged", SAMPLES_PER_LOG)
    # -1: every completion; else one completion of each of the first `limit` problems
    shown = records if limit < 0 else records[::k][:limit]
    log_samples(run, stage, [r["example"] for r in shown], [r["text"] for r in shown],
                [r["reward"] for r in shown],
                {name: [r["components"][name] for r in shown] for name in shown[0]["components"]},
                limit=len(shown), step=step)
    print(f"[grpo_jax] {stage.name}: " + ", ".join(
        f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in flat.items()),
        flush=True)
    run.finish_stage(stage)


KIND = StageKind("eval", run_eval, default_section, validate,
                 description="pass@k, maj@k, format rate and length on held-out problems",
                 lora=True, groups=(TOOLS,))
