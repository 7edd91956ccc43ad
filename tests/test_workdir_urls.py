"""Workdirs given as URLs (gs://bucket/run): they stay URLs and every file goes through
etils.epath (grpo_jax.storage). A file:// URL is the local stand-in; with the
`object_store` fixture it also has no local path, so the run takes the object-store branches
(no lock, no appends, no free-space check, no TensorBoard) while its files land on disk."""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import storage
from grpo_jax.checkpoint import Checkpointer, latest_meta
from grpo_jax.metrics import MetricWriter, read_metrics
from grpo_jax.runner.checks import workdir_problem


@pytest.fixture
def object_store(monkeypatch):
    """file:// URLs act as an object store: `storage.local_path` gives None for them."""
    real = storage.local_path
    monkeypatch.setattr(storage, "local_path",
                        lambda location: None if storage.scheme(location) == "file"
                        else real(location))


def _url(path) -> str:
    return "file://" + os.fspath(path)


def test_urls_stay_urls_and_plain_paths_become_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert storage.normalize("gs://bucket/run/") == "gs://bucket/run"
    assert storage.normalize("runs/a") == os.path.join(str(tmp_path), "runs", "a")
    assert storage.join("gs://bucket/run", "checkpoints", "3") == "gs://bucket/run/checkpoints/3"
    assert storage.local_path("gs://bucket/run") is None
    assert storage.local_path("file:///tmp/a%20b") == "/tmp/a b"
    assert storage.local_path("runs/a") == "runs/a"
    assert storage.scheme("GS://b") == "gs" and storage.scheme("/tmp") is None
    with pytest.raises(ValueError, match="file:///absolute/path"):
        storage.local_path("file://host/run")
    assert workdir_problem("gs://bucket/run") is None
    assert "orbax cannot write checkpoints to" in workdir_problem("s3://bucket/run")
    (tmp_path / "afile").write_text("")
    assert "is a file" in workdir_problem(_url(tmp_path / "afile" / "run"))
    with pytest.raises(ValueError, match=r"^directory: expected a local path or a gs://"):
        Checkpointer("s3://bucket/run/checkpoints")


def test_metrics_on_an_object_store_are_written_whole_and_resume(tmp_path, object_store,
                                                                 capsys):
    url = _url(tmp_path / "run")
    with MetricWriter(url) as writer:  # tensorboard: no writer for file:// there
        assert not writer.has_tensorboard and writer.path == url + "/metrics.jsonl"
        for step in (1, 2, 3):
            writer.write(step, {"loss": float(step)}, stage="rl")
        writer.write_samples(2, [{"prompt": "1+1", "completion": "2"}], stage="rl")
        writer.write_samples(3, [{"prompt": "2+2", "completion": "4"}], stage="rl")
        assert not (tmp_path / "run" / "metrics.jsonl").exists()  # not yet: every 30 s
        writer.flush()
        assert [r["step"] for r in read_metrics(url)] == [1, 2, 3]
    assert "TensorBoard: no event files in file://" in capsys.readouterr().out
    with MetricWriter(url, loggers=()) as writer:  # a resume from checkpoint 2
        assert writer.truncate_after(2) == 1
        writer.write(3, {"loss": 30.0}, stage="rl")
    assert [(r["step"], r["loss"]) for r in read_metrics(url)] == [(1, 1.0), (2, 2.0),
                                                                   (3, 30.0)]
    samples = (tmp_path / "run" / "samples.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in samples] == [2]
    assert not (tmp_path / "run" / "tensorboard").exists()


def test_checkpoints_under_a_url_save_restore_and_move_aside(tmp_path, object_store):
    url = _url(tmp_path / "ckpt")
    with Checkpointer(url, async_=False) as ckpt:
        assert ckpt.directory == url
        for step in (1, 2):
            ckpt.save(step, state={"x": jnp.arange(4.0) * step}, meta={"step": step})
        assert latest_meta(url) == {"step": 2}
        state, meta = ckpt.restore(target={"x": jnp.zeros(4)})
        np.testing.assert_array_equal(state["x"], np.arange(4.0) * 2)
        assert ckpt.quarantine(2) == url + "_corrupt/2"
        assert ckpt.all_steps() == [1]
    assert sorted(os.listdir(tmp_path / "ckpt_corrupt" / "2")) == sorted(
        os.listdir(tmp_path / "ckpt" / "1"))


def _pretrain_config():
    from configs import default

    config = default.get_config("smoke")
    config.stages = "pretrain"
    config.mesh.num_devices = 1
    config.model.num_layers = 1
    config.pretrain.steps = 2
    config.pretrain.checkpoint_every = 1
    return config


def test_a_url_workdir_trains_resumes_and_reports_under_the_url(tmp_path, monkeypatch,
                                                                 object_store, capsys):
    """A run in file://<dir> crashes at its step 2 and the same call resumes it from the
    checkpoint of step 1 under the URL; then, with the URL's local path back (lock,
    TensorBoard), a third call finds every stage done there and writes the report again."""
    from grpo_jax.pipeline import train_and_evaluate

    monkeypatch.chdir(tmp_path)  # nothing may be written under ./file:
    run_dir, url = tmp_path / "run", _url(tmp_path / "run")
    config = _pretrain_config()
    original = MetricWriter.write

    def crash_at_two(self, step, metrics, *, stage=None):
        if metrics.get("stage_step") == 2:
            raise KeyboardInterrupt("simulated crash")
        return original(self, step, metrics, stage=stage)

    monkeypatch.setattr(MetricWriter, "write", crash_at_two)
    with pytest.raises(KeyboardInterrupt):
        train_and_evaluate(config, url)
    monkeypatch.setattr(MetricWriter, "write", original)
    assert latest_meta(run_dir / "checkpoints")["stage_step"] == 1
    assert [r["stage_step"] for r in read_metrics(run_dir)] == [1]
    train_and_evaluate(config, url)
    out = capsys.readouterr().out
    assert f"resuming {url} (checkpoint 1): stage pretrain at step 1 of 2" in out
    assert [r["stage_step"] for r in read_metrics(run_dir)] == [1, 2]
    names = set(os.listdir(run_dir))
    assert {"checkpoints", "config.json", "metrics.jsonl", "report.md", "report.json"} <= names
    assert not {".lock", "tensorboard"} & names  # an object store: no lock, no events
    assert json.loads((run_dir / "config.json").read_text())["stages"] == "pretrain"
    assert not os.path.exists(tmp_path / "file:")

    monkeypatch.undo()  # file:// is a local directory again
    monkeypatch.chdir(tmp_path)
    report = (run_dir / "report.json").read_text()
    train_and_evaluate(config, url)
    assert f"resuming {url} (checkpoint 3): every stage has finished" in capsys.readouterr().out
    assert {".lock", "tensorboard"} <= set(os.listdir(run_dir))
    assert json.loads((run_dir / "report.json").read_text()) == json.loads(report)
    assert not os.path.exists(tmp_path / "file:")


def test_a_sentencepiece_tokenizer_is_trained_into_and_loaded_from_an_object_store(
        tmp_path, object_store):
    from configs import default

    from grpo_jax.runner.inputs import build_task
    from grpo_jax.runner.tokenizers import build_tokenizer

    config = default.get_config("smoke")
    config.tokenizer = "sentencepiece"
    config.tokenizer_vocab_size = 320  # above its 256 byte pieces and tags
    config.task.train_size = 64
    url = _url(tmp_path / "run")
    trained = build_tokenizer(config, build_task(config), url)
    assert sorted(os.listdir(tmp_path / "run" / "tokenizer")) == ["spm.model", "spm.vocab"]
    loaded = build_tokenizer(config, build_task(config), url)
    assert not loaded.model_file.startswith(str(tmp_path))  # a local copy
    assert loaded.encode("12+34=46") == trained.encode("12+34=46")
