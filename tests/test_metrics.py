"""Tests for grpo_jax.metrics (JSONL + TensorBoard writer)."""

import json
import math
import os
import re
import sys
import time

import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.metrics import MetricWriter, read_metrics


def test_write_converts_scalars_and_reads_back(tmp_path):
    with MetricWriter(tmp_path, loggers=()) as writer:
        writer.write(1, {"reward_mean": jnp.float32(0.5), "kl": np.float64(0.25),
                         "tokens": np.int32(12), "lr": 1e-3, "loss": jnp.array([2.0])},
                     stage="rl")
        writer.write(2, {"reward_mean": jnp.array(0.75), "kl": float("nan")}, stage="rl")
    lines = open(tmp_path / "metrics.jsonl").read().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])  # plain JSON, Python types
    assert first["step"] == 1 and first["stage"] == "rl"
    assert first["reward_mean"] == 0.5 and first["kl"] == 0.25
    assert first["tokens"] == 12 and isinstance(first["tokens"], int)
    assert first["loss"] == 2.0 and first["lr"] == 1e-3
    assert isinstance(first["wall_time"], float) and first["wall_time"] > 1.6e9
    records = read_metrics(tmp_path)  # a workdir or the file path both work
    assert records == read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    assert records[1]["reward_mean"] == 0.75 and math.isnan(records[1]["kl"])


def test_reopen_appends_and_truncate_after_resume(tmp_path):
    with MetricWriter(tmp_path, loggers=()) as writer:
        for step in range(1, 4):
            writer.write(step, {"loss": float(step)}, stage="pretrain")
        for step in range(1, 6):
            writer.write(step, {"loss": 10.0 + step}, stage="rl")
        writer.write(0, {"pass_at_1": 0.5}, stage="eval_after")
    # Crash; the latest checkpoint is (rl, 3). Reopen, truncate, re-log steps 4, 5.
    with MetricWriter(tmp_path, loggers=()) as writer:
        dropped = writer.truncate_after(3, stage="rl")
        assert dropped == 3  # rl 4, rl 5, eval_after 0
        writer.write(4, {"loss": 99.0}, stage="rl")
    records = read_metrics(tmp_path)
    assert [(r["stage"], r["step"]) for r in records] == (
        [("pretrain", s) for s in (1, 2, 3)] + [("rl", s) for s in (1, 2, 3, 4)]
    )
    assert records[-1]["loss"] == 99.0


def test_truncate_when_checkpoint_precedes_first_logged_step(tmp_path):
    with MetricWriter(tmp_path, loggers=()) as writer:
        writer.write(1, {"loss": 1.0}, stage="sft")
        writer.write(5, {"loss": 2.0}, stage="rl")
        writer.write(6, {"loss": 3.0}, stage="rl")
        # Resume at (rl, 0): nothing of rl logged at <= 0 -> cut at the first rl line.
        assert writer.truncate_after(0, stage="rl") == 2
        assert writer.truncate_after(0, stage="rl") == 0
        assert writer.truncate_after(0, stage="unknown_stage") == 0
    assert [(r["stage"], r["step"]) for r in read_metrics(tmp_path)] == [("sft", 1)]


def test_partial_last_line_from_a_killed_run_is_dropped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "stage": "rl", "loss": 1.0}\n{"step": 2, "sta')
    assert [r["step"] for r in read_metrics(path)] == [1]
    with MetricWriter(tmp_path, loggers=()) as writer:
        writer.write(2, {"loss": 2.0}, stage="rl")
    assert [r["step"] for r in read_metrics(path)] == [1, 2]
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(ValueError, match="metrics.jsonl:2: expected one JSON object"):
        read_metrics(path)


def test_bad_inputs(tmp_path):
    with MetricWriter(tmp_path, loggers=()) as writer:
        with pytest.raises(ValueError, match=r"metrics\['logits'\]: expected a scalar"):
            writer.write(0, {"logits": np.zeros(3)})
        with pytest.raises(ValueError, match="reserved"):
            writer.write(0, {"step": 3})
        with pytest.raises(ValueError, match="step: expected an int"):
            writer.write(1.5, {"x": 1.0})
        writer.write(jnp.int32(3), {"x": 1.0})  # jax integer steps are fine
    assert read_metrics(tmp_path)[0]["step"] == 3


def _read_tfrecord_scalars(logdir):
    """Independent reader of TensorBoard event files: TFRecord framing + Event protos."""
    import struct

    from tensorboardX.proto import event_pb2

    scalars = []
    for name in sorted(os.listdir(logdir)):
        data = open(os.path.join(logdir, name), "rb").read()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            payload = data[offset + 12:offset + 12 + length]  # skip the length crc
            offset += 12 + length + 4  # skip the payload crc
            event = event_pb2.Event.FromString(payload)
            for value in event.summary.value:
                scalars.append((value.tag, event.step, value.simple_value))
    return scalars


def test_tensorboard_scalars_written(tmp_path):
    pytest.importorskip("tensorboardX")
    with MetricWriter(tmp_path) as writer:
        assert writer.has_tensorboard
        writer.write(1, {"reward_mean": 0.5, "note": "text is not a scalar"}, stage="rl")
        writer.write(2, {"reward_mean": 0.75}, stage="rl")
    logdir = tmp_path / "tensorboard"
    assert all(name.startswith("events.out.tfevents") for name in os.listdir(logdir))
    assert _read_tfrecord_scalars(logdir) == [
        ("rl/reward_mean", 1, 0.5), ("rl/reward_mean", 2, 0.75)
    ]


def test_missing_tensorboardx_is_skipped(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # import now raises ImportError
    with MetricWriter(tmp_path) as writer:
        assert not writer.has_tensorboard
        writer.write(1, {"loss": 1.0})
    assert read_metrics(tmp_path)[0]["loss"] == 1.0
    assert not (tmp_path / "tensorboard").exists()


def test_truncate_after_global_step(tmp_path):
    """Pipeline numbering: one global step increasing through all stages."""
    with MetricWriter(tmp_path, loggers=()) as writer:
        for step, stage in [(1, "pretrain"), (2, "pretrain"), (3, "eval_before"), (4, "rl"),
                            (5, "rl"), (6, "rl")]:
            writer.write(step, {"loss": float(step)}, stage=stage)
        assert writer.truncate_after(4) == 2
        assert writer.truncate_after(4) == 0
        writer.write(5, {"loss": 50.0}, stage="rl")
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert records[-1]["loss"] == 50.0


def test_progress_off_a_terminal_is_plain_lines(capsys):
    """Where stderr is not a terminal (as under pytest), progress is printed as plain
    lines: at most one per interval, and one at the end with the last step."""
    import types

    from grpo_jax.runner.toolkit import PlainProgress, progress

    stage = types.SimpleNamespace(name="rl")
    bar = progress(stage, 5, 1, interval=0.0)
    assert isinstance(bar, PlainProgress)
    for step in range(2, 6):
        bar.update(1)
        bar.set_postfix(reward="0.500")
    bar.close()
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[grpo_jax] rl: step 2/5") and "s/step" in lines[0]
    assert lines[-1].startswith("[grpo_jax] rl: step 5/5, reward 0.500") and len(lines) == 4
    quiet = progress(stage, 5, 0, interval=3600.0)
    for _ in range(5):
        quiet.update(1)
    quiet.close()
    (only,) = capsys.readouterr().out.splitlines()  # the interval held back all but the end
    assert only.startswith("[grpo_jax] rl: step 5/5,")


def test_progress_lines_name_compilation_apart(capsys, monkeypatch):
    """A step that compiles for 0.3 s of its 0.4 s: the line's s/step leaves the compilation
    out (0.10) and names it (0.3 s compiling)."""
    import types

    from grpo_jax.runner import toolkit

    compiled = [5.0]
    monkeypatch.setattr(toolkit, "CLOCK", types.SimpleNamespace(seconds=lambda: compiled[0]))
    bar = toolkit.PlainProgress("rl", 2, 0, 0.0)
    time.sleep(0.4)
    compiled[0] += 0.3  # what the clock of compilation counted meanwhile
    bar.update(1)
    found = re.search(r"step 1/2, ([0-9.]+) s/step, ([0-9.]+) s compiling, elapsed ",
                      capsys.readouterr().out.strip())
    assert found and float(found.group(2)) == 0.3
    assert 0.09 <= float(found.group(1)) < 0.2
    bar.update(1)  # a later line: the compilation since the stage started, still apart
    assert "s/step, 0.3 s compiling, elapsed " in capsys.readouterr().out


def test_a_resume_drops_the_samples_of_steps_after_its_checkpoint(tmp_path):
    import json as json_lib

    with MetricWriter(str(tmp_path)) as writer:
        for step in (1, 2, 3, 4):
            writer.write(step, {"loss": float(step)}, stage="rl")
            writer.write_samples(step, [{"completion": f"c{step}", "reward": 1.0}], stage="rl")
    with open(tmp_path / "samples.jsonl", "a") as f:
        f.write('{"step": 5, "comp')  # a line cut short by a crash
    with MetricWriter(str(tmp_path)) as writer:
        assert writer.truncate_after(2) == 2
    rows = [json_lib.loads(line) for line in open(tmp_path / "samples.jsonl")]
    assert [(r["step"], r["completion"]) for r in rows] == [(1, "c1"), (2, "c2")]
