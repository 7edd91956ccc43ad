"""R1 stages: verified-only selection, rejection-sampling SFT, distillation, the R1 pipeline."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from grpo_jax import tasks
from grpo_jax.pipeline import run_stage, train_and_evaluate
from grpo_jax.runner import ConfigError, validate
from grpo_jax.runner import supervised as runner_supervised
from grpo_jax.runner.toolkit import prompt_text
from grpo_jax.sft.verified import fill_rows, select_verified
from grpo_jax.stages import KINDS, default_section
from grpo_jax.metrics import read_metrics
from grpo_jax.rewards import strict_format_reward

from configs import default as default_config
from configs import r1_pipeline


def _record(ex, text, acc, fmt):
    return {"example": ex, "text": text, "length": len(text), "reward": acc + fmt,
            "components": {"accuracy": acc, "format": fmt}}


def test_select_verified_keeps_only_correct_and_well_formed():
    ex = tasks.Example(id="p1", prompt="1+1", answer="2")
    records = [_record(ex, "a", 1.0, 1.0), _record(ex, "b", 1.0, 0.0),
               _record(ex, "c", 0.0, 1.0), _record(ex, "a", 1.0, 1.0),
               _record(ex, "d", 1.0, 1.0)]
    assert [r["text"] for r in select_verified(records)] == ["a", "d"]
    assert [r["text"] for r in select_verified(records, dedupe=False)] == ["a", "a", "d"]
    assert [r["text"] for r in select_verified(records, min_format=0.0)] == ["a", "b", "d"]
    with pytest.raises(ValueError, match="accuracy"):
        select_verified([{"example": ex, "text": "x", "components": {"format": 1.0}}])


def test_fill_rows_repeats_to_a_batch():
    assert fill_rows(["p1", "p2"], ["c1", "c2"], 5) == (["p1", "p2"] * 3, ["c1", "c2"] * 3)
    assert fill_rows(["p"] * 6, ["c"] * 6, 4) == (["p"] * 6, ["c"] * 6)
    assert fill_rows([], [], 4) == ([], [])


def _fake_sampler(monkeypatch):
    """sample_and_score replaced by noisy worked solutions scored by the task's real rewards;
    returns the list of the params each call was given."""
    sampled_with = []

    def fake(run, examples, *, num_samples, batch_size, sampling, key, weights=None,
             policy=None, params=None):
        sampled_with.append(params)
        rng = np.random.default_rng(0)
        fns = run.task.reward_fns()
        out = []
        for ex in examples:
            for _ in range(num_samples):
                text, _ = run.task.solution(ex, rng=rng, error_rate=0.5, format_error_rate=0.4)
                comps = {k: float(fns[k](text, ex)) for k in ("accuracy", "format")}
                out.append({"example": ex, "text": text, "length": len(text),
                            "components": comps, "reward": sum(comps.values())})
        return out

    monkeypatch.setattr(runner_supervised, "sample_and_score", fake)
    return sampled_with


def test_rejection_sft_trains_only_on_verified_completions(tmp_path, monkeypatch):
    _fake_sampler(monkeypatch)
    config = default_config.get_config("smoke")
    config.model.num_layers = 1  # one block: the stage's logic, at a fraction of the compile
    config.rsft = default_section("rejection_sft")
    config.rsft.update(dict(num_problems=16, num_samples=4, sample_batch_size=16,
                            max_new_tokens=24, steps=2, batch_size=8, mix_sft_examples=0))
    config.stages = "rsft"
    run = run_stage(config, "rsft", tmp_path)
    lines = (tmp_path / "rsft" / "data.jsonl").read_text().splitlines()
    info = json.loads(lines[0])["info"]
    rows = [json.loads(line) for line in lines[1:]]
    assert info["sampled"] == 64 and 0 < info["kept"] == len(rows) < 64
    by_prompt = {prompt_text(run, ex): ex for ex in
                 run.task.examples("train", 16, seed=run.stage_seed("rsft", "problems"))}
    for row in rows:
        ex = by_prompt[row["prompt"]]
        assert run.task.is_correct(row["completion"], ex)
        assert strict_format_reward(row["completion"], ex) >= 1.0
    sft = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "loss" in r]
    assert len(sft) == 2 and all(np.isfinite(r["loss"]) for r in sft)


def test_distill_replaces_the_policy_with_a_fresh_student(tmp_path, monkeypatch):
    _fake_sampler(monkeypatch)
    config = default_config.get_config("smoke")
    config.distill = default_section("distill")
    config.distill.update(dict(num_problems=8, num_samples=2, sample_batch_size=16,
                               max_new_tokens=24, steps=1, batch_size=8,
                               student_model="tiny-1m"))
    config.model.num_layers = 1  # the run's model; the student is a fresh tiny-1m (4 blocks)
    config.stages = "distill"
    run = run_stage(config, "distill", tmp_path)
    assert run.model_config.num_layers == 4 and len(run.params["blocks"]) == 4
    assert run.extra_meta["model_name"] == "tiny-1m"
    from grpo_jax.checkpoint import Checkpointer

    with Checkpointer(tmp_path / "checkpoints") as ckpt:
        state, meta = ckpt.restore()
    assert meta["model_name"] == "tiny-1m" and len(state["params"]["blocks"]) == 4


def test_distill_section_errors_name_the_field():
    config = default_config.get_config("smoke")
    config.stages = "distill"
    config.distill = default_section("distill")
    config.distill.student_model = "huge"
    with pytest.raises(ConfigError, match=r"distill\.student_model"):
        validate(config, KINDS)


def test_r1_pipeline_smoke_runs_end_to_end(tmp_path):
    config = r1_pipeline.get_config("smoke")
    config.model.num_layers = 1  # one block: the pipeline's logic, at a fraction of the compile
    summary = train_and_evaluate(config, str(tmp_path))
    assert {"before", "after"} <= set(summary)
    assert (tmp_path / "report.md").exists() and (tmp_path / "report.json").exists()
    seen = {r["stage"] for r in read_metrics(tmp_path / "metrics.jsonl")}
    assert {"cold_start", "reasoning_rl", "rejection_sft", "final_rl"} <= seen
    rl = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["stage"] == "reasoning_rl"]
    assert "reward/language" in rl[0] and np.isfinite(rl[0]["loss"])
    for stage in ("reasoning_rl", "final_rl"):  # the smoke preset has real gradients
        rows = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["stage"] == stage]
        assert all(r["reward_std"] > 0 and r["grad_norm"] > 0 for r in rows), stage
    # The two RL stages' curves are drawn against the global step: the second follows the
    # first (both start at their stage step 1).
    report = json.loads((tmp_path / "report.json").read_text())
    # The code that made the run: this checkout's commit (None outside a git checkout).
    code = report["provenance"]
    import subprocess

    import jax

    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.abspath(__file__)), check=False)
    assert code["commit"] == (head.stdout.strip() if head.returncode == 0 else None)
    assert code["jax"] == jax.__version__ and isinstance(code["modified"], (bool, type(None)))
    assert "Code: grpo_jax " in (tmp_path / "report.md").read_text()
    assert code["machine"]["cpus"] == os.cpu_count() and "; CPU " in (
        tmp_path / "report.md").read_text()
    spans = report["plot_steps"]["reward_mean"]
    assert set(spans) == {"reasoning_rl", "final_rl"}
    assert spans["reasoning_rl"][1] < spans["final_rl"][0]


def test_distill_from_another_runs_teacher_into_a_pretrained_student(tmp_path, monkeypatch):
    """teacher: another finished run's final policy (here after RL) samples the traces;
    student_init_from: the student is a finished run's final policy (here a pretrained
    tiny-300k), not a fresh init; a run of another size is refused with one line."""
    import jax

    from grpo_jax.results import FinishedRun
    from grpo_jax.runner.model_init import load_run_policy
    from grpo_jax.stages import distill as distill_stage
    from grpo_jax.training import Policy

    def pretrained(workdir, **model):
        config = default_config.get_config("smoke")
        config.mesh.num_devices = 1
        config.pretrain.steps = 1
        config.model.update(model)
        run_stage(config, "pretrain", tmp_path / workdir)
        return str(tmp_path / workdir)

    student_dir = pretrained("student", name="tiny-300k")
    # The teacher: another run's final policy after RL (its checkpoints also hold the RL
    # stage's state), of another shape than the student and the run's own model.
    teacher = default_config.get_config("smoke")
    teacher.mesh.num_devices = 1
    teacher.model.num_layers = 2
    teacher.rl.steps = 1
    teacher_run = run_stage(teacher, "rl", tmp_path / "teacher")
    sampled_with = _fake_sampler(monkeypatch)
    started = []
    original = distill_stage.train_on_rows

    def train_on_rows(run, stage, *rows):
        started.append(jax.device_get(run.params))
        return original(run, stage, *rows)

    monkeypatch.setattr(distill_stage, "train_on_rows", train_on_rows)

    def distill_config(student_from):
        config = default_config.get_config("smoke")
        config.mesh.num_devices = 1
        config.model.num_layers = 1  # the teacher (the run's model); the student tiny-300k
        config.distill = default_section("distill")
        config.distill.update(dict(num_problems=8, num_samples=2, sample_batch_size=16,
                                   max_new_tokens=24, steps=1, batch_size=8,
                                   student_model="tiny-300k", student_init_from=student_from,
                                   teacher=str(tmp_path / "teacher")))
        config.stages = "distill"
        return config

    run_stage(distill_config(student_dir), "distill", tmp_path / "distill")
    _, teacher_model, _, _ = load_run_policy(str(tmp_path / "teacher"))
    _, teacher_params = Policy.from_model(teacher_model)
    # What a study loads from a finished run: the same parameters, its task and tokenizer.
    finished = FinishedRun(str(tmp_path / "teacher")).policy
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                 jax.device_get(finished.params), jax.device_get(teacher_params))
    assert finished.config.model.num_layers == 2 and finished.task.name == "arithmetic"
    assert finished.tokenizer.encode("Q: 7*8") == teacher_run.tokenizer.encode("Q: 7*8")
    with pytest.raises(FileNotFoundError, match="not a grpo_jax run directory"):
        FinishedRun(str(tmp_path / "nowhere")).policy
    assert len(sampled_with) == 1 and len(sampled_with[0]["blocks"]) == 2
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                 jax.device_get(sampled_with[0]), jax.device_get(teacher_params))
    _, model, _, _ = load_run_policy(student_dir)
    _, expected = Policy.from_model(model)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                 started[0], jax.device_get(expected))
    # The teacher's run as the student: tiny-1m's shape at 2 layers, not tiny-300k's.
    with pytest.raises(ConfigError, match=r"distill\.student_init_from: .* another shape"):
        run_stage(distill_config(str(tmp_path / "teacher")), "distill", tmp_path / "refused")
    config = distill_config(str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match=r"distill\.student_init_from: .* \(no checkpoints/\)"):
        validate(config, KINDS)
