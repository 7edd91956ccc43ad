"""Resuming a run in its workdir: the config drift check and the resume point.

A run's checkpoints carry the stage index, the stage step and whether the stage finished,
so running the same command again continues where the last one stopped. The config must
be the one the run was started with (`check_config_drift`), except that raising the last
stage's `steps` extends a finished run from the full-state checkpoint written after that
stage's last step. `resume_point(run)` tells the pipeline which stage to start and with
which checkpoint meta; a checkpoint that cannot be read is moved aside and the one before it
used.
"""

from __future__ import annotations

import json
import time

from grpo_jax import storage
from grpo_jax.checkpoint import latest_meta
from grpo_jax.json_files import parse_json
from grpo_jax.runner.run_directory import CONFIG_FILE, HISTORY_FIELD
from grpo_jax.runner.checks import ConfigError, extendable_stage, stage_names

# Checkpoint meta field holding the run's config as config.json records it.
RUN_CONFIG_FIELD = "run_config"
# Fields that do not change what a run computes: a resume may set them differently.
NOT_RESULTS = ("compilation_cache_dir", "reuse_host_memory", "loggers")


class CorruptCheckpointError(RuntimeError):
    """A checkpoint could not be restored."""

    def __init__(self, step: int, reason: str):
        super().__init__(f"checkpoint {step}: {reason}")
        self.step, self.reason = step, reason


def _flatten(tree, prefix=""):
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def check_config_drift(config, workdir: str) -> list:
    """Compares the config with the one of the run already in `workdir` (if it has
    checkpoints: its config.json, or without one the config saved in the newest
    checkpoint's meta); returns config.json's history for the new config.json.

    Any difference is a ConfigError listing the fields, except raising the `steps` of the
    last stage that is not an eval (an extension: the run continues that stage and runs
    the evals after it again; the change is recorded in config.json's history), and fields
    the recorded config does not have at all (added to the library since that run started:
    recorded in the history as "added")."""
    path = storage.join(workdir, CONFIG_FILE)
    checkpoints = storage.join(workdir, "checkpoints")
    if storage.exists(path) and not storage.isfile(path):
        raise ConfigError(f"{CONFIG_FILE}: {path} is a directory, not the run's config file; "
                          f"remove it (a run with checkpoints compares with the config they "
                          f"hold) or use another --workdir")
    if not any(name.isdigit() for name in storage.listdir(checkpoints)):
        return []
    old = None
    if storage.isfile(path):
        try:
            old = parse_json(storage.read_text(path), path)
        except (ValueError, UnicodeDecodeError) as err:  # damaged: the checkpoints decide
            print(f"[grpo_jax] warning: {str(err).splitlines()[0]}; comparing with the "
                  "config saved in the newest checkpoint instead (config.json is rewritten)",
                  flush=True)
        else:
            if not isinstance(old, dict):
                raise ConfigError(
                    f"{CONFIG_FILE}: {path} holds {_json_kind(old)}, not the run's config (a "
                    "JSON object); delete it (the run compares with the config its "
                    "checkpoints hold) or use another --workdir")
    saved = (latest_meta(checkpoints) or {}).get(RUN_CONFIG_FIELD)
    if isinstance(old, dict) and isinstance(saved, dict):
        _check_not_edited(old, saved, path)
    if not isinstance(old, dict):  # config.json lost or damaged: the run's identity is
        old = saved  # kept with its checkpoints too
        if old is None:
            return []
    history = old.pop(HISTORY_FIELD, [])
    before, after = _flatten(old), _flatten(json.loads(config.to_json_best_effort()))
    changed = {k: (before.get(k, "<absent>"), after.get(k, "<absent>"))
               for k in sorted(set(before) | set(after))
               if before.get(k) != after.get(k) and k not in NOT_RESULTS}
    # Fields the recorded config lacks came with a newer library: accepted and recorded.
    added = {k: v[1] for k, v in changed.items() if k not in before}
    changed = {k: v for k, v in changed.items() if k in before}
    if added and not changed:
        return history + [{"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "added": added}]
    if not changed:
        return history
    names, index = stage_names(config), extendable_stage(config)
    extension = f"{names[index]}.steps" if index is not None else None
    if set(changed) == {extension} and isinstance(changed[extension][0], int) \
            and changed[extension][1] > changed[extension][0]:
        return history + [{"time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                           "changed": {extension: list(changed[extension])}}]
    shown = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in list(changed.items())[:8])
    more = f" (and {len(changed) - 8} more)" if len(changed) > 8 else ""
    extend = f" (only raising {extension} continues this run)" if extension else ""
    raise ConfigError(
        f"config: differs from the run in {workdir}: {shown}{more}; use another "
        f"--workdir{extend}")


def _json_kind(value) -> str:
    kinds = {list: "a JSON array", str: "a JSON string", bool: "a JSON boolean",
             type(None): "JSON null", int: "a JSON number", float: "a JSON number"}
    return kinds.get(type(value), type(value).__name__)


def _check_not_edited(recorded: dict, saved: dict, path: str) -> None:
    """config.json (`recorded`) says what the newest checkpoint's config (`saved`) says,
    apart from fields that do not change results and the changes config.json's history
    records after the checkpoint's (an extension or fields added, written at start-up
    before that run's first checkpoint); else a ConfigError: config.json was edited."""
    history = recorded.get(HISTORY_FIELD) or []
    known = len(saved.get(HISTORY_FIELD) or [])
    later = set()
    for entry in history[known:] if isinstance(history, list) else []:
        if isinstance(entry, dict):
            for part in ("changed", "added"):
                later |= set(entry.get(part) or {})
    before = _flatten({k: v for k, v in saved.items() if k != HISTORY_FIELD})
    after = _flatten({k: v for k, v in recorded.items() if k != HISTORY_FIELD})
    edited = [k for k in sorted(set(before) | set(after))
              if before.get(k, "<absent>") != after.get(k, "<absent>")
              and k not in NOT_RESULTS and k not in later]
    if not edited:
        return
    shown = ", ".join(f"{k} {before.get(k, '<absent>')!r} -> {after.get(k, '<absent>')!r}"
                      for k in edited[:8])
    more = f" (and {len(edited) - 8} more)" if len(edited) > 8 else ""
    raise ConfigError(
        f"{CONFIG_FILE}: {path} was edited: it differs from the config its checkpoints hold "
        f"({shown}{more}); a run's config is changed on the command line, not in "
        f"{CONFIG_FILE}: delete it to resume the run as it was, or use another --workdir "
        "for the changed config")


def resume_point(run) -> tuple[int, dict | None, str | None]:
    """(first stage to run, meta of an unfinished stage checkpoint, last checkpointed
    stage) of `run`; restores the parameters of a finished stage.

    A finished last stage whose `steps` were raised (an extension) resumes from its
    full-state checkpoint after its old last step. A checkpoint that cannot be read is
    moved aside (`Run.quarantine`) with one line, and the next older one used.
    """
    while True:
        step = run.checkpointer.latest_step()
        if step is None:
            return 0, None, None
        try:
            meta = run.checkpointer.restore_meta(step)
            extension = _extension_meta(run, meta)
            if extension is not None:
                return _resume_from(run, extension)
            if meta["stage_done"]:
                _adopt(run, meta)
                run.params = run.restore_stage({"params": run.params}, step)["params"]
                return int(meta["stage_index"]) + 1, None, meta["stage"]
            return _resume_from(run, meta)
        except CorruptCheckpointError as err:
            run.quarantine(err.step, err.reason)
        except ConfigError:
            raise
        except Exception as err:  # noqa: BLE001  (unreadable meta or arrays)
            run.quarantine(step, f"{type(err).__name__}: {str(err).splitlines()[0]}"
                           if str(err) else type(err).__name__)


def _adopt(run, meta: dict) -> None:
    """The run's model, global step and eval figures as of checkpoint `meta`."""
    if meta.get("model_name"):  # a distill stage made a student the run's model
        # Its parameters come from the checkpoint: the initialisation seed does not matter.
        run.replace_model(meta["model_name"], seed=0)
    run.global_step = int(meta["global_step"])
    run.evals = dict(meta.get("evals", {}))
    run.stage_times = dict(meta.get("stage_times", {}))


def _resume_from(run, meta: dict):
    _adopt(run, meta)
    return int(meta["stage_index"]), meta, meta["stage"]


def _extension_meta(run, meta: dict) -> dict | None:
    """The full-state checkpoint to continue from when the `steps` of the run's extendable
    stage (`checks.extendable_stage`: the last that is not an eval) were raised after it
    finished; None when this is not an extension. The checkpoints after it (the stage's
    end, the evals that followed) are deleted: those stages run again."""
    index = extendable_stage(run.config)
    if index is None or not meta["stage_done"] or int(meta["stage_index"]) < index:
        return None
    name = run.stage_names[index]
    checkpointer = run.checkpointer
    metas = {step: checkpointer.restore_meta(step) for step in checkpointer.all_steps()}
    ends = [m for m in metas.values() if m["stage_index"] == index and m["stage_done"]]
    done = int(ends[-1]["stage_step"]) if ends else None
    if done is None:  # its end rotated out: the steps the run was configured with
        done = int(((meta.get(RUN_CONFIG_FIELD) or {}).get(name) or {}).get("steps", 0))
    if int(run.config[name].get("steps", 0) or 0) <= done:
        return None
    for step in sorted(metas, reverse=True):
        candidate = metas[step]
        if (candidate["stage_index"] == index and not candidate["stage_done"]
                and candidate["stage_step"] == done):
            for later in [s for s in metas if s > step]:
                checkpointer.delete(later)  # the old end of the stage and the evals after
            return candidate
    raise ConfigError(
        f"{name}.steps: the run has no full-state checkpoint after its step {done} to "
        "continue from (checkpoint.max_to_keep too small?)")
