"""The experiment trackers (`config.loggers`): W&B offline runs and MLflow stores, read back
with the trackers' own formats (W&B's record protobuf, MlflowClient), never the network."""

from __future__ import annotations

import glob
import json
import os
import struct
import sys

import pytest

from grpo_jax import trackers
from grpo_jax.metrics import MetricWriter
from grpo_jax.runner.checks import ConfigError
from grpo_jax.runner.validation import check_loggers


def read_wandb_offline(directory: str) -> dict:
    """{"config": {...}, "history": [row, ...], "run_ids": [...]} of every offline W&B run in
    `directory`: the .wandb transaction log (LevelDB's log format: 32 KiB blocks of records
    with a 7-byte header, after W&B's own 7-byte file header) parsed with W&B's protobuf."""
    from wandb.proto import wandb_internal_pb2 as pb

    out = {"config": {}, "history": [], "run_ids": []}
    for path in sorted(glob.glob(os.path.join(directory, "wandb", "offline-run-*",
                                              "run-*.wandb"))):
        data = open(path, "rb").read()
        assert data[:4] == b":W&B", path
        chunks, pending, pos = [], b"", 7
        while pos + 7 <= len(data):
            left = 32768 - pos % 32768
            if left < 7:
                pos += left
                continue
            _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
            chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
            if kind == 1:  # FULL
                chunks.append(chunk)
            elif kind == 2:  # FIRST
                pending = chunk
            elif kind == 3:  # MIDDLE
                pending += chunk
            elif kind == 4:  # LAST
                chunks.append(pending + chunk)
        for chunk in chunks:
            record = pb.Record()
            record.ParseFromString(chunk)
            kind = record.WhichOneof("record_type")
            if kind == "run":
                out["run_ids"].append(record.run.run_id)
                out["config"].update({i.key: json.loads(i.value_json)
                                      for i in record.run.config.update})
            elif kind == "config":
                out["config"].update({i.key: json.loads(i.value_json)
                                      for i in record.config.update})
            elif kind == "history":
                row: dict = {}
                for item in record.history.item:
                    path = [item.key] if item.key else list(item.nested_key)
                    node = row
                    for key in path[:-1]:
                        node = node.setdefault(key, {})
                    node[path[-1]] = json.loads(item.value_json)
                out["history"].append(row)
    return out


def _mlflow_run(workdir):
    from mlflow.tracking import MlflowClient

    ids = json.loads((workdir / trackers.IDS_FILENAME).read_text())
    client = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}")
    return client, client.get_run(ids["mlflow"])


def test_the_writer_feeds_wandb_and_mlflow_and_a_resume_continues_their_runs(
        tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    for variable in ("WANDB_MODE", "WANDB_DIR", "WANDB_PROJECT", "MLFLOW_TRACKING_URI",
                     "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(variable, raising=False)
    (tmp_path / "config.json").write_text(json.dumps({"rl": {"lr": 2e-4, "beta": 0.04},
                                                      "stages": "rl,eval"}))
    with MetricWriter(tmp_path, loggers=("wandb", "mlflow")) as writer:
        writer.write(0, {"loss": 1.5, "pass@1": 0.25}, stage="rl")
        writer.write(1, {"loss": 1.25, "pass@1": 0.5}, stage="rl")
        writer.write(0, {"pass@1": 0.75, "note": "text is not a scalar"}, stage="eval")
        writer.write_samples(1, [{"prompt": "1+2=", "completion": "3", "reward": 1.0},
                                 {"prompt": "2*3=", "completion": "5", "reward": 0.0}],
                             stage="rl")
    ids = json.loads((tmp_path / trackers.IDS_FILENAME).read_text())
    with MetricWriter(tmp_path, loggers=("wandb", "mlflow")) as writer:  # a resume
        writer.write(2, {"loss": 1.0, "pass@1": 0.625}, stage="rl")
    assert json.loads((tmp_path / trackers.IDS_FILENAME).read_text()) == ids

    wandb_run = read_wandb_offline(str(tmp_path))
    assert set(wandb_run["run_ids"]) == {ids["wandb"]}  # both sessions, one W&B run
    assert wandb_run["config"]["rl.lr"] == 2e-4 and wandb_run["config"]["stages"] == "rl,eval"
    rl = [(h["rl/step"], h["rl/loss"], h["rl/pass@1"]) for h in wandb_run["history"]
          if "rl/loss" in h]
    assert rl == [(0, 1.5, 0.25), (1, 1.25, 0.5), (2, 1.0, 0.625)]
    assert [(h["eval/step"], h["eval/pass@1"]) for h in wandb_run["history"]
            if "eval/pass@1" in h] == [(0, 0.75)]
    assert not any("eval/note" in h for h in wandb_run["history"])
    table = [h for h in wandb_run["history"] if "rl/samples" in h]
    assert len(table) == 1 and table[0]["rl/samples"]["nrows"] == 2
    table_file = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "files" /
                               table[0]["rl/samples"]["path"]))
    rows = json.loads(open(table_file[0]).read())
    assert rows["columns"] == ["prompt", "completion", "reward"]
    assert rows["data"] == [["1+2=", "3", 1.0], ["2*3=", "5", 0.0]]

    client, run = _mlflow_run(tmp_path)
    assert run.info.run_id == ids["mlflow"] and run.info.status == "FINISHED"
    assert run.data.params == {"rl.lr": "0.0002", "rl.beta": "0.04", "stages": "rl,eval"}
    history = client.get_metric_history(run.info.run_id, "rl/pass_at_1")
    assert [(m.step, m.value) for m in history] == [(0, 0.25), (1, 0.5), (2, 0.625)]
    assert run.data.metrics["eval/pass_at_1"] == 0.75
    assert "eval/note" not in run.data.metrics
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id, "samples")]
    assert artifacts == ["samples/rl_000001.json"]
    local = client.download_artifacts(run.info.run_id, artifacts[0], str(tmp_path / "dl"))
    assert json.loads(open(local).read())[1] == {"prompt": "2*3=", "completion": "5",
                                                 "reward": 0.0}


def test_mlflow_names_keep_what_mlflow_allows():
    assert trackers.mlflow_name("eval_base/pass@1") == "eval_base/pass_at_1"
    assert trackers.mlflow_name("rl/reward/my_rewards:brevity") == "rl/reward/my_rewards:brevity"
    assert trackers.mlflow_name("maj@8 (vote)") == "maj_at_8 _vote_"


def test_loggers_are_checked_before_a_run(monkeypatch):
    assert check_loggers("tensorboard, wandb,wandb") == ("tensorboard", "wandb")
    assert check_loggers("") == () and check_loggers("none") == ()
    with pytest.raises(ConfigError, match=r"^loggers: expected names from tensorboard, wandb, "
                                          r"mlflow .* got 'neptune'$"):
        check_loggers("tensorboard,neptune")
    with pytest.raises(ConfigError, match="^loggers: expected a comma-separated string"):
        check_loggers(3)
    monkeypatch.setitem(sys.modules, "mlflow", None)  # import now raises ImportError
    with pytest.raises(ConfigError, match=r"^loggers: 'mlflow' needs the mlflow package: "
                                          r"pip install 'grpo_jax\[mlflow\]'$"):
        check_loggers("mlflow")


@pytest.mark.slow
def test_a_run_with_loggers_writes_every_stage_to_each_tracker(tmp_path, monkeypatch):
    """The main job's smoke preset with all three trackers: every metric line of every stage
    reaches W&B and MLflow, and the config arrives once as hyperparameters."""
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    for variable in ("WANDB_MODE", "WANDB_DIR", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(variable, raising=False)
    from grpo_jax import api

    config = api.config("smoke")
    config.loggers = "tensorboard,wandb,mlflow"
    workdir = tmp_path / "run"
    result = api.train(config, str(workdir))
    lines = [row for row in result.metrics() if row["stage"] == "rl"]
    assert len(lines) == config.rl.steps
    wandb_run = read_wandb_offline(str(workdir))
    assert wandb_run["config"]["rl.group_size"] == config.rl.group_size
    logged = [h["rl/reward_mean"] for h in wandb_run["history"] if "rl/reward_mean" in h]
    assert logged == pytest.approx([row["reward_mean"] for row in lines])
    client, run = _mlflow_run(workdir)
    assert run.data.params["rl.group_size"] == str(config.rl.group_size)
    final = client.get_metric_history(run.info.run_id, "eval_final/pass_at_1")
    assert [m.value for m in final] == [result.evals["eval_final"]["pass@1"]]
    assert os.listdir(workdir / "tensorboard")


def test_a_tracker_that_cannot_start_is_one_line_and_leaves_no_workdir(tmp_path):
    """MLflow pointed at a store it cannot use: exit 2 with one line naming the tracker, and
    the workdir the run would have created is not left behind (TensorBoard, started first,
    is closed)."""
    pytest.importorskip("mlflow")
    import subprocess

    env = {**os.environ, "MLFLOW_TRACKING_URI": "nosuchscheme://x"}
    done = subprocess.run([sys.executable, "-m", "grpo_jax.main",
                           "--config=configs/default.py:smoke",
                           "--config.loggers=tensorboard,mlflow", f"--workdir={tmp_path / 'w'}"],
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith("config error: loggers: mlflow could not start: ")
    assert not (tmp_path / "w").exists()


def test_an_unreachable_mlflow_server_is_one_line_within_seconds(tmp_path, monkeypatch):
    """MLFLOW_TRACKING_URI naming a loopback port nothing listens on: the start gives up
    after one try of a few seconds (MLflow's own retries took over 200 s), in one line,
    writing nothing, and MLflow's HTTP settings are left as they were."""
    pytest.importorskip("mlflow")
    import threading
    import time

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    outcome = {}

    def start():
        try:
            trackers.open_trackers(str(tmp_path), ["mlflow"])
        except trackers.TrackerError as err:
            outcome["error"] = str(err)

    begun = time.monotonic()
    thread = threading.Thread(target=start, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the MLflow start still waits after 60 s"
    assert time.monotonic() - begun < trackers.MLFLOW_START_TIMEOUT_S + 30
    error = outcome.get("error", "")
    assert error.startswith("loggers: mlflow could not start: ConnectionError: the tracking "
                            "server http://127.0.0.1:9 (MLFLOW_TRACKING_URI) gave no answer "
                            "within 5 s: "), error
    assert "\n" not in error and os.listdir(tmp_path) == []
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ
