"""Stage kind "eval": pass@1, pass@k, maj@k, format rate and length on held-out problems.

Tasks with an "accuracy_lenient" reward (GSM8K) also get pass@k_lenient / maj@k_lenient:
the same figures when the last number anywhere in the completion counts as its answer."""

from __future__ import annotations

import time

import ml_collections

from grpo_jax import evals as evals_lib
from grpo_jax.rewards.parsing import last_number
from grpo_jax.runner import StageKind
from grpo_jax.runner.rollouts import sample_and_score
from grpo_jax.runner.toolkit import SAMPLES_PER_LOG, log_samples, sampling_config


def default_section() -> ml_collections.ConfigDict:
    """Config section of an "eval" stage (every field commented)."""
    s = ml_collections.ConfigDict()
    s.kind = "eval"
    s.num_samples = 8  # k samples per held-out problem (pass@1, pass@k, maj@k)
    s.temperature = 1.0  # sampling temperature (1 = the distribution RL trains)
    s.max_new_tokens = 40  # completion budget
    s.batch_size = 256  # sequences per sampler call (compile once)
    return s


def validate(check) -> None:
    check.integer("num_samples")
    check.positive("temperature")
    check.fits_context("max_new_tokens")
    check.integer("batch_size")
    check.divides("batch_size", check.section.batch_size, micro_field=None)


def run_eval(run, stage) -> None:
    """Samples num_samples completions per task.eval_size held-out problem; records the
    figures in the run (for the report) and the metrics log."""
    section, task = stage.section, run.task
    examples = task.examples("test", run.config.task.eval_size, seed=run.config.seed)
    sampling = sampling_config(run, max_new_tokens=section.max_new_tokens,
                               temperature=section.temperature)
    t0 = time.time()
    records = sample_and_score(run, examples, num_samples=section.num_samples,
                               batch_size=section.batch_size, sampling=sampling,
                               key=run.stage_key(stage.index, 0))
    k = section.num_samples

    def figures_of(correct: str, answer_of):
        per_problem = []
        for start in range(0, len(records), k):
            group = records[start:start + k]
            per_problem.append({"difficulty": group[0]["example"].difficulty, "samples": [{
                "answer": answer_of(r["text"]),
                "correct": r["components"][correct] >= 1.0,
                "formatted": r["components"]["format"] >= 1.0,
                "length": r["length"],
            } for r in group]})
        return evals_lib.evaluate_samples(per_problem, ks=sorted({1, k}),
                                          maj_ks=(k,) if k > 1 else ())

    figures = figures_of("accuracy", task.extract_answer)
    if "accuracy_lenient" in records[0]["components"]:
        # The lenient reading (the last number anywhere in the completion), next to the
        # strict one (the answer inside the tags): e.g. GSM8K.
        lenient = figures_of("accuracy_lenient", last_number)
        figures.update({f"{name}_lenient": value for name, value in lenient.items()
                        if name.startswith(("pass@", "maj@"))})
    figures["eval_time_s"] = time.time() - t0
    run.evals[stage.name] = figures
    flat = {k: v for k, v in figures.items() if isinstance(v, (int, float))}
    run.writer.write(run.global_step, flat, stage=stage.name)
    shown = records[:SAMPLES_PER_LOG]
    log_samples(run, stage, [r["example"] for r in shown], [r["text"] for r in shown],
                [r["reward"] for r in shown],
                {name: [r["components"][name] for r in shown] for name in shown[0]["components"]})
    print(f"[grpo_jax] {stage.name}: " + ", ".join(
        f"{k}={v:.3f}" for k, v in flat.items()), flush=True)
    run.finish_stage(stage)


KIND = StageKind("eval", run_eval, default_section, validate,
                 description="pass@k, maj@k, format rate and length on held-out problems")
