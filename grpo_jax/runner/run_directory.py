"""A grpo_jax run directory (a run's workdir): its config.json and its finished checkpoints.

The floor of the runner's builders: `tokenizers`, `model_init` and `inputs` read another
run (model.init_from, a study's finished run) through these.
"""

from __future__ import annotations

import os

import ml_collections

from grpo_jax.checkpoint import Checkpointer
from grpo_jax.json_files import load_json_file

CONFIG_FILE = "config.json"  # a run's config, in its workdir
HISTORY_FIELD = "_history"  # config.json: earlier configs of the run (extensions)


def run_directory_config(path) -> ml_collections.ConfigDict | None:
    """The config of a grpo_jax run directory (config.json with "stages", and checkpoints/),
    or None when `path` is not one (e.g. a Hugging Face checkpoint directory)."""
    file = os.path.join(path or "", CONFIG_FILE)
    if not path or not os.path.isfile(file) or \
            not os.path.isdir(os.path.join(path, "checkpoints")):
        return None
    record = load_json_file(file)  # a ValueError naming the file and line
    if not isinstance(record, dict) or "stages" not in record:
        return None
    record.pop(HISTORY_FIELD, None)
    return ml_collections.ConfigDict(record)


def finished_checkpoint(workdir: str, stage: str | None = None):
    """(step, meta) of the checkpoint holding a run's policy: the latest that ended a stage
    (of `stage`, when given)."""
    with Checkpointer(os.path.join(workdir, "checkpoints")) as checkpointer:
        steps = checkpointer.all_steps()
        kept = []
        for step in reversed(steps):
            meta = checkpointer.restore_meta(step)
            kept.append(meta.get("stage"))
            if meta.get("stage_done") and (stage is None or meta.get("stage") == stage):
                return step, meta
    where = f"of stage {stage!r} " if stage else ""
    raise FileNotFoundError(
        f"{workdir}: no finished checkpoint {where}is kept in its checkpoints/ (kept: "
        f"{sorted(set(map(str, kept))) or 'none'}; train the run first, and "
        "checkpoint.max_to_keep bounds how many are kept)")


def policy_meta(workdir: str) -> dict:
    """The meta of the checkpoint holding a run's final policy (`finished_checkpoint`)."""
    return finished_checkpoint(workdir)[1]
