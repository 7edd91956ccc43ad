"""Metric logging: one JSON line per step in ``<workdir>/metrics.jsonl``, plus the trackers.

Each line is ``{"step": int, "stage": str | None, "wall_time": float, **metrics}`` with
jax / numpy scalars converted to Python numbers. The experiment trackers `config.loggers`
names (`grpo_jax.trackers`: TensorBoard by default, W&B, MLflow) receive every scalar tagged
``<stage>/<name>`` (``eval_base/pass@1``, ``rl/reward/accuracy``; TensorBoard keeps the name
exactly, tensorboardX's ``add_scalar`` would write ``pass_1``), the sample texts, and the
run's config (``<workdir>/config.json``, flattened to dotted names such as ``rl.lr``) once
per run as hyperparameters, with the run's first metric line (TensorBoard's HPARAMS tab
compares runs by it).

Resume: reopening a writer appends to the existing file. Call ``truncate_after(step)``
(global step numbering) or ``truncate_after(step, stage=name)`` (per-stage numbering) right
after restoring the checkpoint of that step: it drops the lines logged after the checkpoint,
so a resumed run does not repeat steps in the log. (The trackers are append-only: TensorBoard,
W&B and MLflow show the re-logged points after the old ones.)

A workdir may be a URL (``gs://bucket/run``; `grpo_jax.storage`). An object store has no
appends: there the writer keeps metrics.jsonl in memory and writes the object whole at most
every `UPLOAD_INTERVAL_SECONDS` and on ``flush`` (which the Run calls before every checkpoint,
so the log on the store always reaches the newest checkpoint) and ``close``. TensorBoard
events go there only where tensorboardX has a writer for the scheme (``gs://`` with
google-cloud-storage, ``s3://`` with boto3); elsewhere one line says they are skipped.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from grpo_jax import storage
from grpo_jax import trackers as trackers_lib

__all__ = ["MetricWriter", "flatten_hparams", "read_metrics", "to_python_scalar"]

METRICS_FILENAME = "metrics.jsonl"
SAMPLES_FILENAME = "samples.jsonl"  # generated texts, a few per eval and RL log point
RUN_CONFIG_FILENAME = "config.json"  # the run's config, written by the Run before any step
UPLOAD_INTERVAL_SECONDS = 30.0  # object stores: the longest metrics.jsonl waits for a write


def to_python_scalar(name: str, value: Any) -> Any:
    """Converts a jax/numpy scalar (or 0-d / 1-element array) to a Python int/float/bool/str.

    NaN and infinities become the strings "nan", "inf", "-inf" so that the line stays valid
    JSON; `read_metrics` converts them back.
    """
    if isinstance(value, (str, bool)) or value is None:
        return value
    if isinstance(value, (int, float)):
        scalar = value
    else:
        array = np.asarray(value)
        if array.size != 1:
            raise ValueError(
                f"metrics[{name!r}]: expected a scalar, got an array of shape {array.shape}"
            )
        scalar = array.reshape(()).item()
    if isinstance(scalar, float) and not math.isfinite(scalar):
        return "nan" if math.isnan(scalar) else ("inf" if scalar > 0 else "-inf")
    return scalar


def _restore_non_finite(record: dict) -> dict:
    special = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
    return {
        k: (special[v] if isinstance(v, str) and v in special and k not in ("stage",) else v)
        for k, v in record.items()
    }


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """Reads a metrics.jsonl file (or the one in a workdir) into a list of dicts: the one
    reader of the file (reports, sweeps, benchmarks, tests).

    A truncated last line (a run killed mid-write) is skipped; any other malformed line
    raises ValueError naming the line number. No file reads as no rows. `path` may be a URL.
    """
    path = os.fspath(path)
    if storage.isdir(path):
        path = storage.join(path, METRICS_FILENAME)
    if not storage.exists(path):
        return []
    lines = storage.read_text(path).split("\n")
    return [_restore_non_finite(record) for _, record in _parse_lines(lines, path)]


def _parse_lines(lines: list[str], path: str) -> list[tuple[int, dict]]:
    """(index in `lines`, record) of every non-blank line; a malformed line is a ValueError
    naming it, unless it is the last non-blank one (a write cut short)."""
    records = []
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if all(not rest.strip() for rest in lines[index + 1:]):
                continue
            raise ValueError(f"{path}:{index + 1}: expected one JSON object per line") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{index + 1}: expected one JSON object per line")
        records.append((index, record))
    return records


def flatten_hparams(record: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as {"rl.lr": 0.0002, ...}: bools, numbers and strings as they are,
    lists and tuples as JSON text, None and private fields (leading "_") left out."""
    flat: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if str(key).startswith("_") or value is None:
            continue
        if isinstance(value, Mapping):
            flat.update(flatten_hparams(value, name + "."))
        elif isinstance(value, (list, tuple)):
            flat[name] = json.dumps(value)
        elif isinstance(value, float) and not math.isfinite(value):
            flat[name] = str(value)
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
        else:
            flat[name] = str(value)
    return flat


def _lines(text: str) -> list[str]:
    """`text` split after every newline, as a file's `readlines` (the last line may lack
    one)."""
    lines = text.split("\n")
    return [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])


class _ObjectLog:
    """An append-only text file on an object store, which has no appends: the text is kept
    here and the object written whole by `flush` (at most every `interval` seconds) and
    `sync` (now). A last line without its newline (a write cut short) is dropped on open."""

    def __init__(self, location: str, interval: float):
        self.location, self.interval = location, interval
        text = storage.read_text(location) if storage.exists(location) else ""
        self.lines = _lines(text[:text.rfind("\n") + 1])
        self.closed, self._dirty, self._written = False, False, time.monotonic()

    def write(self, text: str) -> None:
        self.lines.append(text)
        self._dirty = True

    def replace(self, lines: list[str]) -> None:
        """Makes `lines` the file's content and writes it."""
        self.lines, self._dirty = list(lines), True
        self.sync()

    def flush(self) -> None:
        if self._dirty and time.monotonic() - self._written >= self.interval:
            self.sync()

    def sync(self) -> None:
        if self._dirty:
            storage.write_text(self.location, "".join(self.lines))
            self._dirty, self._written = False, time.monotonic()

    def close(self) -> None:
        self.sync()
        self.closed = True


class MetricWriter:
    """Appends per-step metrics to ``<workdir>/metrics.jsonl`` and forwards them to the
    experiment trackers.

    Args:
      workdir: run directory (created if missing), or a URL (see the module docstring).
      loggers: tracker names (`grpo_jax.trackers`: tensorboard, wandb, mlflow) that also
        receive the scalars, the sample texts and the run's hparams; () for metrics.jsonl
        only.
      active: False makes a writer that writes nothing (the processes other than 0 of a
        multi-controller run: `write` still returns the record).
    """

    def __init__(self, workdir: str | os.PathLike, *,
                 loggers: Sequence[str] = ("tensorboard",), active: bool = True):
        self.workdir = os.fspath(workdir)
        self.path = storage.join(self.workdir, METRICS_FILENAME)
        self.active = active
        self.trackers: list = []
        self._hparams_pending = False
        if not active:
            self._file = None
            return
        storage.makedirs(self.workdir)
        self._local = storage.local_path(self.path)  # None on an object store
        if self._local is None:
            self._file = _ObjectLog(self.path, UPLOAD_INTERVAL_SECONDS)
            empty = not self._file.lines
        else:
            self._drop_partial_last_line()
            empty = not (os.path.exists(self._local) and os.path.getsize(self._local))
            self._file = open(self._local, "a", encoding="utf-8")
        # A run's first metric line carries its hparams to the trackers; a resumed run (lines
        # already there) wrote them when it started.
        self._hparams_pending = empty
        self.trackers = trackers_lib.open_trackers(self.workdir, tuple(loggers))

    @property
    def has_tensorboard(self) -> bool:
        return any(isinstance(t, trackers_lib.TensorBoard) and t.writer is not None
                   for t in self.trackers)

    def _drop_partial_last_line(self) -> None:
        """A run killed mid-write can leave a line without its newline: cut it off."""
        if not os.path.exists(self._local):
            return
        with open(self._local, "rb+") as f:
            data = f.read()
            if data and not data.endswith(b"\n"):
                f.truncate(data.rfind(b"\n") + 1)

    def write(self, step: int, metrics: Mapping[str, Any], *, stage: str | None = None) -> dict:
        """Appends one line {"step", "stage", "wall_time", **metrics}; returns that record.

        Args:
          step: int step number (within `stage`).
          metrics: name -> scalar (Python, numpy or jax 0-d array).
          stage: optional stage name ("pretrain", "sft", "rl", "eval", ...).
        """
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
            step = to_python_scalar("step", step)
            if not isinstance(step, int):
                raise ValueError(f"step: expected an int, got {step!r}")
        reserved = {"step", "stage", "wall_time"} & set(metrics)
        if reserved:
            raise ValueError(f"metrics: the names {sorted(reserved)} are reserved")
        record = {"step": int(step), "stage": stage, "wall_time": time.time()}
        for name, value in metrics.items():
            record[str(name)] = to_python_scalar(name, value)
        if not self.active:
            return record
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self.trackers:
            if self._hparams_pending:
                self._write_run_hparams()
            values = {name: float(value) for name, value in record.items()
                      if name not in ("step", "stage", "wall_time")
                      and not isinstance(value, (str, type(None)))}
            for tracker in self.trackers:
                tracker.scalars(int(step), stage, values)
        return record

    def write_hparams(self, hparams: Mapping[str, Any]) -> dict:
        """Writes `hparams` (a config as nested mappings) to TensorBoard's HPARAMS tab,
        flattened to dotted names; returns the flattened dict. `write` does this once per
        run with the run's config.json."""
        flat = flatten_hparams(hparams)
        self._hparams_pending = False
        if flat:
            for tracker in self.trackers:
                tracker.hparams(flat)
        return flat

    def _write_run_hparams(self) -> None:
        self._hparams_pending = False
        try:
            record = json.loads(storage.read_text(storage.join(self.workdir,
                                                               RUN_CONFIG_FILENAME)))
        except (OSError, ValueError, RecursionError):  # no run config: no hparams
            return
        if isinstance(record, dict):
            self.write_hparams(record)

    def write_samples(self, step: int, samples: list[Mapping[str, Any]], *,
                      stage: str) -> None:
        """Appends generated texts to ``<workdir>/samples.jsonl``, one line per sample
        {"step", "stage", **sample} (e.g. prompt, completion, reward), and to the trackers
        (a table or text under ``<stage>/samples``): what one reads first when a template or a
        format goes wrong."""
        if not self.active or not samples:
            return
        rows = [{k: to_python_scalar(k, v) if not isinstance(v, str) else v
                 for k, v in sample.items()} for sample in samples]
        lines = [json.dumps({"step": int(step), "stage": stage, **row}) + "\n" for row in rows]
        storage.append_text(storage.join(self.workdir, SAMPLES_FILENAME), "".join(lines))
        for tracker in self.trackers:
            tracker.samples(int(step), stage, rows)

    def truncate_after(self, step: int, *, stage: str | None = None) -> int:
        """Drops logged lines that come after a resumed checkpoint; returns how many.

        Without `stage` (steps numbered globally and increasing through the run, as the
        pipeline does) everything from the first line with a step greater than `step` on
        is dropped. With `stage` (steps counted per stage), everything after the last line
        of `stage` with a step <= `step` is dropped (later steps of `stage` and any later
        stage, which ran after the checkpoint); if `stage` has no such line, the cut is at
        its first line with a larger step (nothing is dropped when there is none). Stage
        names are assumed unique within a run (e.g. "eval_before" / "eval_after").
        """
        if not self.active:
            return 0
        self._file.flush()
        if self._local is None:
            lines = list(self._file.lines)
        else:
            with open(self._local, encoding="utf-8") as f:
                lines = f.readlines()
        records = _parse_lines(lines, self.path)  # (line index, record)
        if stage is None:
            later = [i for i, r in records if r.get("step", -1) > step]
            cut = later[0] if later else len(lines)
        else:
            in_stage = [(i, r) for i, r in records if r.get("stage") == stage]
            kept = [i for i, r in in_stage if r.get("step", -1) <= step]
            if kept:
                cut = kept[-1] + 1
            else:
                later = [i for i, r in in_stage if r.get("step", -1) > step]
                cut = later[0] if later else len(lines)
        if stage is None:
            self._truncate_samples(step)
        dropped = len(lines) - cut
        if dropped and self._local is None:
            self._file.replace(lines[:cut])
        elif dropped:
            self._file.close()
            storage.write_text(self._local, "".join(lines[:cut]))  # atomic
            self._file = open(self._local, "a", encoding="utf-8")
        return dropped

    def _truncate_samples(self, step: int) -> None:
        """Drops the samples.jsonl lines of global steps after `step` (a resumed run writes
        them again)."""
        path = storage.join(self.workdir, SAMPLES_FILENAME)
        if not storage.isfile(path):
            return
        lines = _lines(storage.read_text(path))
        kept = []
        for line in lines:
            try:
                later = json.loads(line).get("step", -1) > step
            except (ValueError, AttributeError, TypeError):
                later = True  # a line cut short by the crash
            if not later:
                kept.append(line)
        if len(kept) < len(lines):
            storage.write_text(path, "".join(kept))  # atomic

    def flush(self) -> None:
        """Everything written so far into the files (on an object store: written now)."""
        if self._file is not None:
            getattr(self._file, "sync", self._file.flush)()
        for tracker in self.trackers:
            tracker.flush()

    def close(self) -> None:
        if self._file is not None and not self._file.closed:
            self._file.close()
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []

    def __enter__(self) -> MetricWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
