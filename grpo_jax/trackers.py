"""Experiment trackers beside metrics.jsonl: TensorBoard, Weights & Biases and MLflow.

`config.loggers` names them, comma-separated ("tensorboard" by default; "" for none:
metrics.jsonl is always written and is what reports, sweeps and studies read). Each tracker
receives what `metrics.MetricWriter` writes: the run's config once as hyperparameters
(flattened to dotted names, `rl.lr`), every metric line as scalars tagged `<stage>/<name>`,
and the generated samples as a table. Only process 0 of a multi-controller run writes.

- tensorboard: event files under `<workdir>/tensorboard/` (tensorboardX, installed with the
  package). Names unchanged (`eval_base/pass@1`).
- wandb (`pip install 'grpo_jax[wandb]'`): a W&B run in `<workdir>/wandb/`, offline unless
  `WANDB_MODE` says otherwise (`wandb sync <workdir>/wandb/offline-run-*` uploads it later;
  `WANDB_MODE=online` logs live), project `$WANDB_PROJECT` or "grpo_jax", named after the
  workdir. Each stage has its own x axis, `<stage>/step` (a run's stages count steps from 0
  each). Samples are a `wandb.Table` per log point under `<stage>/samples`.
- mlflow (`pip install 'grpo_jax[mlflow]'`): a run in `$MLFLOW_TRACKING_URI`, or in a SQLite
  store `<workdir>/mlflow.db` with artifacts in `<workdir>/mlartifacts/` (`mlflow ui
  --backend-store-uri sqlite:///<workdir>/mlflow.db`), experiment `$MLFLOW_EXPERIMENT_NAME`
  or "grpo_jax". MLflow names allow letters, digits and `_-. :/` only: `@` is written `_at_`
  (`eval_base/pass_at_1`) and any other character `_`. Samples are JSON artifacts
  `samples/<stage>_<step>.json`.

A resumed run continues the same tracker run: its id is kept in `<workdir>/trackers.json`.
Steps logged again after a resume appear twice in W&B and MLflow (as in TensorBoard's
append-only events); metrics.jsonl is truncated to the checkpoint and holds each step once.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_jax import storage

__all__ = ["TRACKERS", "TrackerError", "parse_loggers", "missing_package", "open_trackers"]

TRACKERS = ("tensorboard", "wandb", "mlflow")
TENSORBOARD_DIRNAME = "tensorboard"  # the event files, under the workdir
IDS_FILENAME = "trackers.json"  # {"wandb": run id, "mlflow": run id}: a resume continues them
_PACKAGES = {"tensorboard": ("tensorboardX", "tensorboardX"),
             "wandb": ("wandb", "'grpo_jax[wandb]'"),
             "mlflow": ("mlflow", "'grpo_jax[mlflow]'")}


def parse_loggers(value: Any) -> tuple[str, ...]:
    """`config.loggers` ("tensorboard,wandb", a list, or "" / "none") as a tuple of tracker
    names; ValueError naming the unknown one."""
    if value is None:
        return ()
    names = value.split(",") if isinstance(value, str) else list(value)
    out: list[str] = []
    for name in names:
        name = str(name).strip().lower()
        if name in ("", "none"):
            continue
        if name not in TRACKERS:
            raise ValueError(f"expected names from {', '.join(TRACKERS)} (comma-separated, "
                             f"or '' for metrics.jsonl only), got {name!r}")
        if name not in out:
            out.append(name)
    return tuple(out)


def missing_package(name: str) -> str | None:
    """None when tracker `name` can be used here, else how to install what it needs."""
    module, install = _PACKAGES[name]
    try:
        __import__(module)
    except ImportError:
        return f"{name!r} needs the {module} package: pip install {install}"
    return None


def _read_ids(workdir: str) -> dict:
    path = storage.join(workdir, IDS_FILENAME)
    try:
        ids = json.loads(storage.read_text(path))
    except (OSError, ValueError):
        return {}
    return ids if isinstance(ids, dict) else {}


def _write_id(workdir: str, name: str, run_id: str) -> None:
    ids = _read_ids(workdir)
    ids[name] = run_id
    storage.write_text(storage.join(workdir, IDS_FILENAME), json.dumps(ids, indent=1))


class TensorBoard:
    """TensorBoard events through tensorboardX's FileWriter, tags unchanged (its
    `add_scalar` would rewrite `pass@1` to `pass_1`)."""

    def __init__(self, workdir: str):
        from tensorboardX import FileWriter

        logdir, why_not = _tensorboard_logdir(workdir)
        self.writer = None
        if logdir is None:
            print(f"[grpo_jax] TensorBoard: no event files in {workdir} ({why_not}); "
                  "metrics.jsonl has every metric", flush=True)
            return
        # The file is named after the second it was opened in; the suffix keeps a writer
        # reopened within that second (a quick resume) from replacing it.
        self.writer = FileWriter(logdir=logdir,
                                 filename_suffix=f".{os.getpid()}.{time.time_ns()}")

    def hparams(self, flat: Mapping[str, Any]) -> None:
        if self.writer is None or not flat:
            return
        from tensorboardX.summary import hparams as hparams_summaries

        for summary in hparams_summaries(dict(flat), {}):  # experiment, session start, end
            self.writer.add_summary(summary)

    def scalars(self, step: int, stage: str | None, values: Mapping[str, float]) -> None:
        if self.writer is None or not values:
            return
        from tensorboardX.proto.summary_pb2 import Summary

        prefix = f"{stage}/" if stage else ""
        self.writer.add_summary(Summary(value=[
            Summary.Value(tag=prefix + name, simple_value=value)
            for name, value in values.items()]), step)

    def samples(self, step: int, stage: str, rows: Sequence[Mapping[str, Any]]) -> None:
        if self.writer is None:
            return
        from tensorboardX.summary import text as text_summary

        text = "\n\n".join("\n".join(f"**{k}**: `{v}`" for k, v in row.items())
                           for row in rows)
        self.writer.add_summary(text_summary(f"{stage}/samples", text), step)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def _tensorboard_logdir(workdir: str) -> tuple[str | None, str]:
    """(where TensorBoard events go, "") or (None, why there are none) for `workdir`."""
    local = storage.local_path(workdir)
    if local is not None:
        return os.path.join(local, TENSORBOARD_DIRNAME), ""
    from tensorboardX import record_writer

    scheme = storage.scheme(workdir)
    client = {"gs": ("GCS_ENABLED", "google-cloud-storage"), "s3": ("S3_ENABLED", "boto3")}
    if scheme not in client:
        return None, f"tensorboardX has no writer for {scheme}://"
    flag, package = client[scheme]
    if not getattr(record_writer, flag, False):
        return None, f"tensorboardX writes {scheme}:// only with {package} installed"
    return storage.join(workdir, TENSORBOARD_DIRNAME), ""


def _local_dir(workdir: str, name: str) -> str:
    local = storage.local_path(workdir)
    if local is None:
        raise ValueError(f"loggers: {name} keeps its files on a local disk; with a "
                         f"{storage.scheme(workdir)}:// workdir set "
                         + ("WANDB_DIR" if name == "wandb" else "MLFLOW_TRACKING_URI"))
    return local


class WandB:
    """A W&B run (offline unless WANDB_MODE says otherwise), one x axis per stage."""

    def __init__(self, workdir: str):
        import wandb

        directory = os.environ.get("WANDB_DIR") or _local_dir(workdir, "wandb")
        os.makedirs(directory, exist_ok=True)
        run_id = _read_ids(workdir).get("wandb") or uuid.uuid4().hex[:12]
        self._stages: set[str] = set()
        self.session = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or "grpo_jax",
            name=os.path.basename(os.path.normpath(workdir)), id=run_id, resume="allow",
            dir=directory, mode=os.environ.get("WANDB_MODE") or "offline",
            settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
            reinit="create_new")
        _write_id(workdir, "wandb", run_id)
        self._wandb = wandb

    def _axis(self, stage: str) -> str:
        axis = f"{stage}/step"
        if stage not in self._stages:
            self._stages.add(stage)
            self.session.define_metric(axis)
            self.session.define_metric(f"{stage}/*", step_metric=axis)
        return axis

    def hparams(self, flat: Mapping[str, Any]) -> None:
        self.session.config.update(dict(flat), allow_val_change=True)

    def scalars(self, step: int, stage: str | None, values: Mapping[str, float]) -> None:
        stage = stage or "run"
        self.session.log({self._axis(stage): step,
                      **{f"{stage}/{name}": value for name, value in values.items()}})

    def samples(self, step: int, stage: str, rows: Sequence[Mapping[str, Any]]) -> None:
        columns = list(dict.fromkeys(key for row in rows for key in row))
        table = self._wandb.Table(columns=columns, data=[
            [row.get(c) if isinstance(row.get(c), (int, float, str, bool)) or row.get(c) is None
             else json.dumps(row.get(c)) for c in columns] for row in rows])
        self.session.log({self._axis(stage): step, f"{stage}/samples": table})

    def flush(self) -> None:
        pass  # the run's service writes as it goes

    def close(self) -> None:
        if self.session is not None:
            self.session.finish()
            self.session = None


_MLFLOW_NAME = re.compile(r"[^A-Za-z0-9_\-. :/]")


def mlflow_name(name: str) -> str:
    """A metric or parameter name as MLflow accepts it (`pass@1` -> `pass_at_1`)."""
    return _MLFLOW_NAME.sub("_", name.replace("@", "_at_"))


# The start-up calls to an MLflow tracking server (experiment, run) are made once each, with
# this timeout, instead of MLflow's default retries for minutes: an unreachable server is
# one line within seconds (unless MLFLOW_HTTP_REQUEST_* set otherwise).
MLFLOW_START_TIMEOUT_S = 5
_START_UP_SETTINGS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
                      "MLFLOW_HTTP_REQUEST_TIMEOUT": str(MLFLOW_START_TIMEOUT_S)}


def _is_remote(uri: str) -> bool:
    return uri.split("://", 1)[0].lower() in ("http", "https")


@contextlib.contextmanager
def _start_up_requests(uri: str):
    """MLflow's HTTP settings for the start-up calls to a remote `uri`: no retries, a few
    seconds each (only those not set in the environment)."""
    given = {name: value for name, value in _START_UP_SETTINGS.items()
             if _is_remote(uri) and name not in os.environ}
    os.environ.update(given)
    try:
        yield
    finally:
        for name in given:
            os.environ.pop(name, None)


class MLflow:
    """An MLflow run through MlflowClient (no global active run), batched per metric line."""

    MAX_PARAM_CHARS = 6000  # MLflow's limit on a parameter's value

    def __init__(self, workdir: str):
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        artifacts = None
        if not uri:
            local = _local_dir(workdir, "mlflow")
            uri = "sqlite:///" + os.path.join(os.path.abspath(local), "mlflow.db")
            artifacts = "file://" + os.path.join(os.path.abspath(local), "mlartifacts")
        self.client = MlflowClient(tracking_uri=uri)
        try:
            with _start_up_requests(uri):
                self._start(workdir, artifacts)
        except Exception as err:
            if not _is_remote(uri):
                raise
            text = " ".join(str(err).split()) or type(err).__name__
            errno_text = re.search(r"\[Errno -?\d+\] ([^'\")]+)", text)
            reason = (errno_text.group(1).strip() if errno_text else
                      "timed out" if "timeout" in text.lower() else text[:200])
            raise ConnectionError(
                f"the tracking server {uri} (MLFLOW_TRACKING_URI) gave no answer within "
                f"{MLFLOW_START_TIMEOUT_S} s: {reason}; start it, or unset "
                "MLFLOW_TRACKING_URI for a store in the workdir") from None

    def _start(self, workdir: str, artifacts: str | None) -> None:
        self.run_id = _read_ids(workdir).get("mlflow")
        if self.run_id is None:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "grpo_jax"
            experiment = self.client.get_experiment_by_name(name)
            experiment_id = (experiment.experiment_id if experiment else
                             self.client.create_experiment(name, artifact_location=artifacts))
            self.run_id = self.client.create_run(
                experiment_id, run_name=os.path.basename(os.path.normpath(workdir))
            ).info.run_id
            _write_id(workdir, "mlflow", self.run_id)
        else:
            self.client.update_run(self.run_id, status="RUNNING")

    def hparams(self, flat: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(mlflow_name(k), str(v)[:self.MAX_PARAM_CHARS]) for k, v in flat.items()]
        for start in range(0, len(params), 100):  # MLflow takes 100 params per batch
            self.client.log_batch(self.run_id, params=params[start:start + 100])

    def scalars(self, step: int, stage: str | None, values: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        prefix = f"{stage}/" if stage else ""
        metrics = [Metric(mlflow_name(prefix + name), value, now, step)
                   for name, value in values.items()]
        for start in range(0, len(metrics), 1000):  # MLflow takes 1000 metrics per batch
            self.client.log_batch(self.run_id, metrics=metrics[start:start + 1000])

    def samples(self, step: int, stage: str, rows: Sequence[Mapping[str, Any]]) -> None:
        self.client.log_dict(self.run_id, [dict(row) for row in rows],
                             f"samples/{mlflow_name(stage)}_{step:06d}.json")

    def flush(self) -> None:
        pass  # every call is written when made

    def close(self) -> None:
        if self.run_id is not None:
            self.client.set_terminated(self.run_id)
            self.run_id = None


_CLASSES = {"tensorboard": TensorBoard, "wandb": WandB, "mlflow": MLflow}


class TrackerError(RuntimeError):
    """A tracker could not start (the message is one line naming it)."""


def open_trackers(workdir: str, names: Sequence[str]) -> list:
    """The trackers `names` for `workdir`. A tracker whose package is missing is skipped
    with one line (validation refuses such a config before a run starts); one that cannot
    start raises TrackerError, after closing those already started."""
    trackers = []
    for name in names:
        why_not = missing_package(name)
        if why_not is not None:
            print(f"[grpo_jax] loggers: {why_not}; metrics.jsonl has every metric", flush=True)
            continue
        try:
            trackers.append(_CLASSES[name](workdir))
        except Exception as err:  # noqa: BLE001  (the tracker's own failure, in one line)
            for tracker in trackers:
                tracker.close()
            first = (str(err).strip().splitlines() or [""])[0]
            raise TrackerError(f"loggers: {name} could not start: {type(err).__name__}: "
                               f"{first}") from None
    return trackers
