"""grpo_jax.results.FinishedRun: a run directory read one way (the API's Result, a sweep's
runs and a study's records hold one)."""

import json
import os

import pytest

from grpo_jax import api, sweep
from grpo_jax.results import FinishedRun


def _write_run(workdir):
    os.makedirs(workdir)
    config = {"stages": "pretrain,eval_base,rl,eval_final", "seed": 3,
              "pretrain": {"kind": "pretrain"}, "eval_base": {"kind": "eval"},
              "rl": {"kind": "rl"}, "eval_final": {"kind": "eval"}, "_history": [{"x": 1}]}
    rows = [{"stage": "pretrain", "step": 1, "loss": 2.0},
            {"stage": "eval_base", "step": 1, "wall_time": 1.0, "pass@1": 0.1},
            {"stage": "rl", "step": 2, "stage_step": 1, "reward_mean": 0.2, "kl_ref": 0.0},
            {"stage": "rl", "step": 3, "stage_step": 2, "reward_mean": 0.4, "kl_ref": 0.01,
             "completion_length": 9.0},
            {"stage": "eval_final", "step": 3, "wall_time": 2.0, "pass@1": 0.5}]
    with open(os.path.join(workdir, "config.json"), "w") as f:
        json.dump(config, f)
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def test_a_finished_run_read_one_way(tmp_path):
    run = FinishedRun(str(tmp_path / "run"))
    assert not run.finished
    _write_run(run.workdir)
    assert not run.finished  # no report.json yet
    with open(os.path.join(run.workdir, "report.json"), "w") as f:
        json.dump({"summary": {"after": {"pass@1": 0.5, "eval_time_s": 1.0,
                                         "num_problems": 8, "by_difficulty": {}}}}, f)
    assert run.finished
    assert run.config.seed == 3 and "_history" not in run.config
    assert run.evals == {"eval_base": {"pass@1": 0.1}, "eval_final": {"pass@1": 0.5}}
    assert set(run.stage_rows()) == {"pretrain", "eval_base", "rl", "eval_final"}
    assert run.stage_rows()["rl"]["stage_step"] == 2
    assert [r["reward_mean"] for r in run.training_rows()] == [0.2, 0.4]
    assert [r["step"] for r in run.metrics("rl")] == [2, 3] and len(run.metrics()) == 5
    assert run.final_figures() == {"pass@1": 0.5, "train/reward_mean": 0.4,
                                   "train/kl_ref": 0.01, "train/completion_length": 9.0}
    assert run.eval_values(["pass@1", "maj@8"]) == {"pass@1": 0.5, "maj@8": None,
                                                    "base_pass@1": 0.1, "base_maj@8": None}
    # The API's Result is this class; a sweep's run holds one.
    assert api.Result is FinishedRun and api.load(run.workdir).evals == run.evals
    with pytest.raises(FileNotFoundError, match="not a grpo_jax run directory"):
        run.policy  # no checkpoints/
    held = sweep.Run([("rl.beta", "0.0")], 0, str(tmp_path), "cfg.py", ())
    assert isinstance(held.results, FinishedRun) and held.results.workdir == held.workdir
