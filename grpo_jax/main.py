"""Entry point: `python -m grpo_jax.main --config=configs/default.py[:preset] --workdir=DIR`.

`--config` takes a config file or, from any folder, a job by name (`--config=ppo:smoke`; the
names: `grpo_jax.config_presets.JOBS`: main, ppo, trpo, r1_pipeline, tools, agents, code,
gsm8k). An unknown name is one line listing the names, exit 2.

Nested overrides work on any field, e.g. `--config.rl.beta=0.001 --config.rl.steps=10`.
Running the same command again resumes from the latest checkpoint in the workdir.
`--print_config` validates, prints the resolved config, the model's parameter count, the
devices and the mesh, and exits without creating the workdir. Multi-controller runs (one
process per host, one global mesh) start with `--coordinator_address`, `--num_processes`
and `--process_id`, or without flags where JAX detects them (TPU pods, SLURM, Open MPI);
`python -m grpo_jax.launch_local` starts such a run on one machine. A bad flag or value exits 2
with one line on stderr naming the field; a busy workdir, or one that is a file or not
writable, exits 2; SIGTERM / SIGINT save a checkpoint and exit 0 (a second signal stops at
once, exit 130); repeated non-finite steps exit 3, a failed checkpoint save exits 4 and a
process of a multi-process run that lost another exits 5, each with one line.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import os
import re
import sys

import ml_collections
from absl import app, flags
from ml_collections import config_flags

_DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "configs", "default.py")
# The jobs by name: this file is a config file whose preset is "NAME[:preset]".
_JOBS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config_presets.py")

def _fail(message: str) -> None:
    print(f"config error: {message}", file=sys.stderr)
    sys.exit(2)


def _flag_error_line(err: BaseException) -> str:
    """One line for a flag that could not be parsed (a value of the wrong type, a config
    file whose get_config raised: its exception's own last line, not the traceback)."""
    raw = str(err).replace("\\n", "\n")
    if "Traceback (most recent call last)" in raw:
        last = [line for line in raw.splitlines() if re.match(r"^\w+(Error|Exception): ", line)]
        if last:
            head = raw.split(":", 1)[0] if raw.startswith("--config") else "--config"
            return f"{head}: {last[-1].split(': ', 1)[1]}"
    text = " ".join(raw.split())
    text = re.sub(r"^flag\s+", "", text)
    return text.replace("could not convert string to float:", "expected a float, got") \
               .replace("invalid literal for int() with base 10:", "expected an int, got")


def _config_given(argv: list[str]) -> str | None:
    """The config file argument of `argv` as absl and ml-collections read it: `--config=F`,
    `-config=F`, `--config F` or `-config F` (the first); None without one."""
    for index, arg in enumerate(argv[1:], 1):
        match = re.match(r"^--?config(=|$)", arg)
        if match:
            if match.group(1):
                return arg.split("=", 1)[1]
            return argv[index + 1] if index + 1 < len(argv) else None
    return None


def _is_job_name(path: str) -> bool:
    """Whether a --config value's path names a job rather than a file: no folder, no .py,
    and no such file."""
    return bool(path) and "/" not in path and os.sep not in path and \
        not path.endswith(".py") and not os.path.isfile(path)


def _resolve_job(argv: list[str]) -> list[str]:
    """`argv` with a --config job name (`ppo`, `ppo:smoke`) read as the jobs file with that
    name as its preset (whose get_config names an unknown job in one line, listing the
    names)."""
    argv = list(argv)
    for index, arg in enumerate(argv[1:], 1):
        match = re.match(r"^--?config(=|$)", arg)
        if not match:
            continue
        at = index if match.group(1) else index + 1
        if at >= len(argv):
            break
        value = argv[at].split("=", 1)[1] if match.group(1) else argv[at]
        if not _is_job_name(value.split(":", 1)[0]):
            break
        resolved = f"{_JOBS_FILE}:{value}"
        argv[at] = f"{arg.split('=', 1)[0]}={resolved}" if match.group(1) else resolved
        break
    return argv


def _config_folder_on_path(argv: list[str]) -> None:
    """A config file imports modules beside it (a task, reward functions) from wherever it
    is run, as a script would: its folder goes first on the module search path (not for a
    job by name: the package's own folder stays off the path)."""
    given = _config_given(argv)
    if given and os.path.abspath(given.split(":", 1)[0]) != _JOBS_FILE:
        folder = os.path.dirname(os.path.abspath(given.split(":", 1)[0]))
        if folder not in sys.path:
            sys.path.insert(0, folder)


def _import_problem(err: BaseException, argv: list[str]) -> str | None:
    """The one line for a config file whose loading failed in a module it imports (a task, a
    reward module: its own exception, a syntax error, or a module not found): the module,
    where, and the error; None when the failure is not an import's."""
    seen, chain = set(), []
    while err is not None and id(err) not in seen:  # ml-collections and absl re-raise it
        seen.add(id(err))
        chain.append(err)
        err = err.__cause__ or err.__context__
    given = os.path.abspath((_config_given(argv) or _DEFAULT_CONFIG).split(":", 1)[0])
    for cause in reversed(chain):  # the first exception raised
        modules = []  # (file, line, module name) of each module body on the stack
        frame = cause.__traceback__
        while frame is not None:
            code = frame.tb_frame.f_code
            if code.co_name == "<module>":
                modules.append((code.co_filename, frame.tb_lineno,
                                frame.tb_frame.f_globals.get("__name__", "?")))
            frame = frame.tb_next
        if not modules and not isinstance(cause, SyntaxError):
            continue
        text = " ".join(str(cause).split()) or type(cause).__name__
        if isinstance(cause, SyntaxError) and cause.filename and \
                os.path.abspath(cause.filename) != given:
            name = os.path.splitext(os.path.basename(cause.filename))[0]
            return (f"--config: importing module {name!r} failed: {cause.filename}:"
                    f"{cause.lineno}: SyntaxError: {cause.msg}")
        if isinstance(cause, ModuleNotFoundError) and cause.name and modules:
            file, line, _ = modules[-1]
            return (f"--config: {file}:{line}: no module named {cause.name!r} (expected it "
                    "beside the config file, or installed)")
        inner = [m for m in modules if os.path.abspath(m[0]) != given]
        if inner:
            file, line, name = inner[-1]
            return (f"--config: importing module {name!r} failed: {file}:{line}: "
                    f"{type(cause).__name__}: {text}")
    return None


def _loaded_config(argv: list[str]):
    """The config `argv` names (`--config`, else the default), loaded as ml-collections loads
    it (the file's get_config(preset)); None when it does not load (`_config` reports that)."""
    path, *preset = (_config_given(argv) or _DEFAULT_CONFIG).split(":", 1)
    try:
        spec = importlib.util.spec_from_file_location("grpo_jax_config_check", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        config = module.get_config(*preset)
    except Exception:  # noqa: BLE001  reported when ml-collections loads it
        return None
    return config if isinstance(config, ml_collections.ConfigDict) else None


# --config.task.kwargs.NAME=VALUE naming a keyword the config's task.kwargs lacks (another
# task's, e.g. reasoning_gym's datasets): taken out of argv before ml-collections, which
# refuses new keys, and set on the loaded config (`_config`).
_NEW_TASK_KWARGS: dict = {}
_TASK_KWARG = re.compile(r"^--config\.task\.kwargs\.([A-Za-z_]\w*)=(.*)$", re.S)


def _kwarg_value(text: str):
    """A command-line value: a Python literal (3, 0.5, [1, 2], None), true / false, else the
    text itself ("countdown,chain_sum")."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text


def _take_new_task_kwargs(argv: list[str], config) -> list[str]:
    """`argv` without its --config.task.kwargs.NAME=VALUE overrides whose NAME `config`'s
    (`_loaded_config`) task.kwargs does not have; those go into `_NEW_TASK_KWARGS` (and out
    of sys.argv, where ml-collections reads overrides)."""
    kwargs = config.get("task", {}).get("kwargs") if config is not None else None
    if not isinstance(kwargs, ml_collections.ConfigDict):
        return argv
    taken = []
    for arg in argv[1:]:
        match = _TASK_KWARG.match(arg)
        if match and match.group(1) not in kwargs:
            _NEW_TASK_KWARGS[match.group(1)] = _kwarg_value(match.group(2))
            taken.append(arg)
    if taken:
        sys.argv[:] = [a for a in sys.argv if a not in taken]
    return [a for a in argv if a not in taken]


_LOAD = object()  # `_override_problem`'s default: load the config `argv` names


def _override_problem(argv: list[str], config=_LOAD) -> str | None:
    """The one line for the first `--config.*` override in `argv` that names no field of
    `config` (default: `_loaded_config(argv)`), found by walking its dotted name through
    that config before ml-collections applies the overrides; None when each names a field
    (or the config file does not load: `_config` reports that)."""
    if config is _LOAD:
        config = _loaded_config(argv)
    if config is None:
        return None
    for arg in argv[1:]:
        match = re.match(r"^--?(?:no)?config\.([^=]+)", arg)
        if not match:
            continue
        node = config
        for part in match.group(1).split("."):
            name = part.split("[", 1)[0]  # an index, e.g. stages[0], reads the field
            if isinstance(node, ml_collections.ConfigDict) and name in node:
                node = node[name]
                continue
            keys = list(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
            close = difflib.get_close_matches(name, keys, 1, 0.75)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            return f"--config.{match.group(1)}: no such config field {name!r}{hint}"
    return None


_config_folder_on_path(_resolve_job(sys.argv))

try:
    # Without --config, the default config is loaded and the --config.* overrides applied
    # here, at import (their names checked first): a bad override is one line too.
    if _config_given(sys.argv) is None:
        _loaded = _loaded_config(sys.argv)
        _problem = _override_problem(_take_new_task_kwargs(sys.argv, _loaded), _loaded)
        if _problem:
            _fail(_problem)
    _CONFIG = config_flags.DEFINE_config_file(
        "config", _DEFAULT_CONFIG, "A job by name (main, ppo, trpo, r1_pipeline, tools, agents, code, gsm8k) or "
        "the path of an ml-collections config file, optionally :preset.",
        lock_config=True,
    )
except (KeyError, AttributeError, TypeError, ValueError) as _err:
    _fail(_flag_error_line(_err))


def _config():
    """The parsed config; a config file that did not load is one line, exit 2."""
    config = _CONFIG.value
    try:
        config.get("seed")  # ml-collections reports a failed load when the value is used
    except OSError as err:
        text = " ".join(str(err).split())
        reason = re.search(r"\[Errno \d+\] (.*)", text)
        _fail(f"--config: {reason.group(1) if reason else text}; expected a config file "
              "such as configs/default.py[:preset] or a job by name, e.g. --config=ppo:smoke")
    if _NEW_TASK_KWARGS:
        with config.unlocked():
            for name, value in _NEW_TASK_KWARGS.items():
                config.task.kwargs[name] = value
    return config



_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Run directory (checkpoints, metrics.jsonl, report): a path, or a "
    "gs:// URL (file:// for a local directory). Default: runs/<config name>[_<preset>]."
)
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "Multi-controller runs: host:port of process 0 (TPU pods, "
    "SLURM and Open MPI are detected without it).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Multi-controller runs: "
                                      "number of processes.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "Multi-controller runs: this "
                                   "process's index.")
_PRINT_CONFIG = flags.DEFINE_boolean(
    "print_config", False, "Validate, print the resolved config, the model's parameter "
    "count, the devices and the mesh, and exit without running or writing anything.")


def default_workdir(config_arg: str) -> str:
    """runs/<config file's name or job name>[_<preset>]; the main job's is runs/default."""
    path, _, preset = config_arg.partition(":")
    if os.path.abspath(path) == _JOBS_FILE:
        path, _, preset = (preset or "main").partition(":")
        path = "default" if path == "main" else path
    name = os.path.splitext(os.path.basename(path))[0]
    return os.path.join("runs", name + (f"_{preset}" if preset else ""))


_HELP = ("--help", "-h", "-?", "--helpshort", "--helpfull", "--helpxml")


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing with bad flags / unknown fields reported in one line, exit 2; a
    positional argument (a config path without --config=) is one line, exit 2; a module
    the config file imports that fails to is one line naming it, exit 2; --help (or -h)
    prints the flags and exits 0."""
    argv = _resolve_job([argv[0], *("--help" if a == "-h" else a for a in argv[1:])])
    _config_folder_on_path(argv)
    try:
        config = _loaded_config(argv)
        argv = _take_new_task_kwargs(argv, config)
        problem = _override_problem(argv, config)  # before ml-collections applies them
        if problem:
            _fail(problem)
        rest = flags.FLAGS(argv)
    except SystemExit:  # absl's --help prints the flags, then exits 1
        if any(a in _HELP for a in argv[1:]):
            sys.exit(0)
        raise
    except (flags.Error, KeyError, AttributeError, TypeError, ValueError) as err:
        _fail(_import_problem(err, argv) or _flag_error_line(err))
        return []
    except Exception as err:  # noqa: BLE001  the config file's own code (a module it imports)
        _fail(_import_problem(err, argv) or
              f"--config: {type(err).__name__}: {' '.join(str(err).split())}")
        return []
    if len(rest) > 1:
        extra = rest[1]
        hint = (f"; a config file is given as --config={extra}"
                if extra.split(":", 1)[0].endswith(".py") else "")
        _fail(f"unexpected argument {extra!r}: every argument is a --flag{hint}")
    return rest


def main(argv) -> None:
    del argv
    from absl import logging

    logging.set_verbosity(logging.WARNING)  # orbax logs every checkpoint write at INFO
    from grpo_jax.pipeline import describe, train_and_evaluate
    from grpo_jax.runner import ConfigError
    from grpo_jax.checkpoint import CheckpointSaveError
    from grpo_jax.runner.guards import NonFiniteError, Preempted, WorkdirBusyError

    config_arg = getattr(flags.FLAGS["config"], "config_filename", _DEFAULT_CONFIG)
    workdir = default_workdir(config_arg) if _WORKDIR.value is None else _WORKDIR.value
    from grpo_jax import host_memory, parallel

    config = _config()
    if config.get("reuse_host_memory", True) is True:
        host_memory.reuse_freed_memory()  # before XLA's threads start (see host_memory)

    # Before anything touches devices; a no-op for one process without these flags.
    parallel.initialize_distributed(coordinator_address=_COORDINATOR.value,
                                    num_processes=_NUM_PROCESSES.value,
                                    process_id=_PROCESS_ID.value)
    try:
        if _PRINT_CONFIG.value:
            print(describe(config))
            return
        _check_workdir(workdir)
        summary = train_and_evaluate(config, workdir)
    except ConfigError as err:
        _fail(str(err))
    except Preempted as stopped:
        print(str(stopped), flush=True)
        sys.exit(stopped.status)
    except WorkdirBusyError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except NonFiniteError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(3)
    except CheckpointSaveError as err:
        _exit_if_lost_peer(err)
        print(f"error: {err}", file=sys.stderr)
        sys.exit(4)
    except Exception as err:  # noqa: BLE001
        _exit_if_lost_peer(err)
        raise
    if jax_process_index() != 0:
        return
    from grpo_jax import storage

    print(f"[grpo_jax] report: {storage.join(workdir, 'report.md')}")
    labels = _report_labels(workdir)
    for name, figures in summary.items():
        shown = {k: round(v, 4) for k, v in figures.items() if isinstance(v, float)}
        print(f"[grpo_jax] {labels.get(name, name)}: {shown}")


def _report_labels(workdir: str) -> dict:
    """The report's column headers (column key -> the stage it evaluates)."""
    import json

    from grpo_jax import storage

    try:
        return dict(json.loads(storage.read_text(storage.join(workdir, "report.json")))
                    .get("labels") or {})
    except (OSError, ValueError, AttributeError):
        return {}


def _check_workdir(workdir: str) -> None:
    """A --workdir that cannot hold the run (a file, under a file, not writable, a store
    orbax cannot write checkpoints to) is one line and exit 2, before anything is built or
    written."""
    from grpo_jax.runner.checks import workdir_problem

    problem = workdir_problem(workdir)
    if problem:
        print(f"error: --workdir: {problem}; expected a directory this process can write "
              "(existing, or created when missing)", file=sys.stderr)
        sys.exit(2)


def _exit_if_lost_peer(err: BaseException) -> None:
    """In a multi-process run whose peer died: one line and exit 5 at once. A graceful
    exit would wait in JAX's shutdown barrier for the dead process (a heartbeat timeout,
    then an abort with a stack trace)."""
    from grpo_jax import parallel

    lost = parallel.lost_peer(err)
    if lost is None:
        return
    print(f"error: process {jax_process_index()} lost another process of this run ({lost}); "
          "stopping; the same command resumes from the last complete checkpoint",
          file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(5)  # pylint: disable=protected-access


def jax_process_index() -> int:
    import jax

    return jax.process_index()


def cli(argv: list[str]) -> int:
    """The command line in-process (for tests): parse `argv`, run, return the exit code."""
    saved, sys.argv = sys.argv, list(argv)  # ml-collections reads overrides from sys.argv
    _NEW_TASK_KWARGS.clear()
    app.define_help_flags()  # --help / -h as app.run defines them
    try:
        main(parse_flags(argv))
    except SystemExit as exit_:
        return int(exit_.code or 0)
    finally:
        sys.argv = saved
        flags.FLAGS.unparse_flags()
        for name in [n for n in flags.FLAGS if n.startswith("config.")]:
            delattr(flags.FLAGS, name)  # override flags are defined anew by the next parse
    return 0


def run() -> None:
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    run()
