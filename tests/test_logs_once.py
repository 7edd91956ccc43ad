"""metrics.jsonl and samples.jsonl hold every step and stage exactly once, whatever the kill
point: a short pipeline is killed at each of its checkpoint saves (during the save, so the
checkpoint is never written), and after each eval stage's save with that checkpoint then
damaged (so that the resume falls back past it), and resumed; its logs equal an
uninterrupted run's. The runs' report plots are not drawn (they read the logs and write
none; tests/test_evals.py draws them)."""

from __future__ import annotations

import json
import shutil

import pytest

from grpo_jax.config_presets import main_job
from grpo_jax.pipeline import train_and_evaluate
from grpo_jax.runner.run import Run

VOLATILE = ("wall_time", "stage_clock")  # and every *_time_s: when, not what


def _config():
    config = main_job("smoke")  # pretrain, eval_base, rl, eval_final
    config.mesh.num_devices = 1
    config.model.num_layers = 1
    config.pretrain.steps = 2
    config.pretrain.checkpoint_every = 1
    config.rl.steps = 2
    config.rl.checkpoint_every = 1
    config.checkpoint.max_to_keep = 20  # every checkpoint kept: a fallback finds the one before
    return config


def _logs(workdir) -> tuple[list, list]:
    def rows(name):
        out = []
        for line in (workdir / name).read_text().splitlines():
            row = json.loads(line)
            out.append({k: v for k, v in row.items()
                        if k not in VOLATILE and not k.endswith("_time_s")})
        return out

    return rows("metrics.jsonl"), rows("samples.jsonl")


class Killed(KeyboardInterrupt):
    """A kill at a checkpoint save (KeyboardInterrupt: what a second SIGINT raises)."""


@pytest.mark.slow
def test_every_kill_point_leaves_each_line_logged_once(tmp_path, monkeypatch):
    from grpo_jax.evals import report

    for plot in ("_plot_series", "_plot_at_k"):  # 10 reports' plots: about 5 CPU s
        monkeypatch.setattr(report, plot, lambda *args, **kwargs: None)
    config = _config()
    saves = []
    original = Run.save

    def counting(self, stage, state, **kwargs):
        saves.append((stage.name, kwargs.get("stage_step"), self.global_step))
        return original(self, stage, state, **kwargs)

    monkeypatch.setattr(Run, "save", counting)
    train_and_evaluate(config, str(tmp_path / "straight"))
    metrics, samples = _logs(tmp_path / "straight")
    assert {r["stage"] for r in metrics} == {"pretrain", "eval_base", "rl", "eval_final"}
    assert len([s for s in samples if s["stage"] == "eval_final"]) == 4
    stages_saved = {stage for stage, _, _ in saves}
    assert stages_saved == {"pretrain", "eval_base", "rl", "eval_final"}, saves

    # during every save; after an eval stage's save with that checkpoint damaged (the
    # checksum fallback that duplicated an eval's rows)
    evals = [i for i, (stage, _, _) in enumerate(saves) if stage.startswith("eval")]
    assert len(evals) == 2, saves
    for when, points in (("during", range(len(saves))), ("after, then damaged", evals)):
        for kill_at in points:
            workdir = tmp_path / f"{when[:5]}{kill_at}"
            calls = []

            def killing(self, stage, state, *, calls=calls, kill_at=kill_at, when=when,
                        **kwargs):  # (this iteration's values, bound)
                calls.append(self.global_step)
                if len(calls) - 1 == kill_at and when == "during":
                    raise Killed(f"killed while saving checkpoint {self.global_step}")
                saved = original(self, stage, state, **kwargs)
                if len(calls) - 1 == kill_at:
                    self.checkpointer.wait()
                    raise Killed(f"killed after checkpoint {self.global_step}")
                return saved

            monkeypatch.setattr(Run, "save", killing)
            with pytest.raises(Killed):
                train_and_evaluate(config, str(workdir))
            if when != "during":  # the checkpoint just written is damaged: the resume
                state = workdir / "checkpoints" / str(calls[-1]) / "state"  # falls back
                shutil.rmtree(state)
                state.mkdir()
            monkeypatch.setattr(Run, "save", original)
            train_and_evaluate(config, str(workdir))
            got_metrics, got_samples = _logs(workdir)
            where = f"killed {when} save {kill_at} {saves[kill_at]}"
            assert [(r["stage"], r["step"]) for r in got_metrics] == \
                [(r["stage"], r["step"]) for r in metrics], where
            assert got_metrics == metrics, where  # the same figures, bit for bit
            assert got_samples == samples, where
