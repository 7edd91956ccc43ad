"""Entry point: `python -m grpo_jax.main --config=configs/default.py[:preset] --workdir=DIR`.

Nested overrides work on any field, e.g. `--config.rl.beta=0.001 --config.rl.steps=10`.
Running the same command again resumes from the latest checkpoint in the workdir.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags
from ml_collections import config_flags

_DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "configs", "default.py")

_CONFIG = config_flags.DEFINE_config_file(
    "config", _DEFAULT_CONFIG, "Path to an ml-collections config file, optionally :preset.",
    lock_config=True,
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Run directory (checkpoints, metrics.jsonl, report). "
    "Default: runs/<config name>[_<preset>]."
)


def default_workdir(config_arg: str) -> str:
    path, _, preset = config_arg.partition(":")
    name = os.path.splitext(os.path.basename(path))[0]
    return os.path.join("runs", name + (f"_{preset}" if preset else ""))


def main(argv) -> None:
    del argv
    from absl import logging

    logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint write at INFO
    from grpo_jax.config_validation import ConfigError
    from grpo_jax.pipeline import train_and_evaluate

    config_arg = flags.FLAGS["config"].config_filename if hasattr(
        flags.FLAGS["config"], "config_filename") else _DEFAULT_CONFIG
    workdir = _WORKDIR.value or default_workdir(config_arg)
    try:
        summary = train_and_evaluate(_CONFIG.value, workdir)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        sys.exit(2)
    print(f"[grpo_jax] report: {os.path.join(workdir, 'report.md')}")
    for name, figures in summary.items():
        shown = {k: round(v, 4) for k, v in figures.items() if isinstance(v, float)}
        print(f"[grpo_jax] {name}: {shown}")


def run() -> None:
    app.run(main)


if __name__ == "__main__":
    run()
