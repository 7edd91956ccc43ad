"""Seeded sweeps: the product of `--set` lists times seeds, run one after another (or K at a
time), with a summary over seeds.

    python -m grpo_jax.sweep --config=configs/default.py --workdir=sweeps/beta \
        --set rl.beta=0.0,0.04 --set rl.algorithm=grpo,dr_grpo --seeds=0,1,2 \
        [--parallel=K] [--print] [-- <--config.<field>=<value> for every run>]

Every run is `python -m grpo_jax.main --config=CFG --workdir=DIR/<name> --config.<k>=<v> ...
--config.seed=<s>` in its own subdirectory named after its overrides
(`rl.beta=0.04,rl.algorithm=grpo,seed=1`). A run whose report.json exists is finished and
skipped, so running the sweep again resumes it (an interrupted run resumes from its own
checkpoints). `--print` prints one command per run instead, for a pod or a cluster queue,
and `--summarize` only (re)writes the summary of the runs that finished. DIR may be a URL
(gs://bucket/sweep; `grpo_jax.storage`): each run's log is then written locally while it
runs and copied into its directory when it ends.

The summary (`DIR/summary.md`, `DIR/summary.json`) has, per arm (a setting of the `--set`
values), every figure of the final evaluation and the last training step's reward, KL to
the reference and completion length as mean, standard deviation, n and a 95% confidence
interval over seeds (Student's t); `DIR/curves.png` draws each arm's training curves
(reward, pass@1, KL, length) as the mean over seeds with a band of +-1 standard deviation.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import itertools
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from grpo_jax import storage
from grpo_jax.json_files import dumps_finite

# A finished run's files only (json and numpy): the runs themselves are subprocesses, and
# the sweep process never imports jax.
from grpo_jax.results import FinishedRun
from grpo_jax.stats import interval

__all__ = ["Run", "check_extra", "expand", "finished_runs", "format_interval", "main",
           "summarize", "write_analysis"]

CURVES = ("reward_mean", "pass@1", "kl_ref", "completion_length")


class Run:
    """One run of the sweep: its overrides (without the seed), seed, name and command, and
    its directory's contents (`results`, a `grpo_jax.results.FinishedRun`)."""

    def __init__(self, overrides: Sequence[tuple[str, str]], seed: int, root: str,
                 config: str, extra: Sequence[str]):
        self.overrides, self.seed = tuple(overrides), seed
        self.arm = ",".join(f"{k}={v}" for k, v in self.overrides) or "base"
        self.name = ",".join([*(f"{k}={v}" for k, v in self.overrides), f"seed={seed}"])
        self.workdir = storage.join(root, self.name)
        self.results = FinishedRun(self.workdir)
        self.command = [sys.executable, "-m", "grpo_jax.main", f"--config={config}",
                        f"--workdir={self.workdir}",
                        *(f"--config.{k}={v}" for k, v in self.overrides),
                        f"--config.seed={seed}", *extra]

    @property
    def finished(self) -> bool:
        return self.results.finished

    @property
    def log(self) -> str:
        """Where the run's output goes while it runs: `<workdir>/sweep.log`, or for a workdir
        on an object store a local file (`copy_log` appends it to that one)."""
        local = storage.local_path(storage.join(self.workdir, "sweep.log"))
        if local is None:
            local = os.path.join(tempfile.gettempdir(), "grpo_jax_sweep",
                                 hashlib.sha1(self.workdir.encode()).hexdigest()[:16] + ".log")
        return local

    def copy_log(self) -> None:
        """Appends the local log of a run on an object store to `<workdir>/sweep.log`."""
        target = storage.join(self.workdir, "sweep.log")
        if storage.local_path(target) is None and os.path.exists(self.log):
            with open(self.log, encoding="utf-8", errors="replace") as f:
                storage.append_text(target, f.read())
            os.remove(self.log)


def _parse_set(item: str) -> tuple[str, list[str]]:
    key, sep, values = item.partition("=")
    if not sep or not key or not values:
        raise ValueError(f"--set {item!r}: expected key=v1,v2,... (e.g. rl.beta=0.0,0.04)")
    key = key.removeprefix("config.")
    values = [v.strip() for v in values.split(",") if v.strip()]
    for part in (key, *values):  # they name the runs' directories under the sweep's
        if "/" in part or "\\" in part or part in (".", "..") or "\0" in part:
            raise ValueError(f"--set {item!r}: {part!r} cannot be part of a directory name "
                             "(no path separators, '.' or '..')")
    return key, values


def expand(sets: Sequence[str], seeds: Sequence[int], root: str, config: str,
           extra: Sequence[str] = ()) -> list[Run]:
    """Every (value combination, seed), in `--set` order then seed order."""
    parsed = [_parse_set(s) for s in sets]
    keys = [k for k, _ in parsed]
    if len(set(keys)) != len(keys):
        raise ValueError(f"--set: a key is given twice: {keys}")
    if "seed" in keys:
        raise ValueError("--set seed=...: use --seeds")
    check_extra(extra)
    runs = []
    for values in itertools.product(*[v for _, v in parsed]):
        for seed in seeds:
            run = Run(list(zip(keys, values)), seed, root, config, extra)
            if len(run.name.encode("utf-8")) > 255:
                raise ValueError(f"--set: the run name {run.name[:40]!r}... is "
                                 f"{len(run.name.encode('utf-8'))} bytes; a directory name "
                                 "holds at most 255 (shorter values, or fewer keys per sweep)")
            runs.append(run)
    return runs


_OVERRIDE = re.compile(r"^--?(no)?config\.([^=\s]+)(=.*)?$", re.S)
_VALUE = re.compile(r"^(?!-[A-Za-z-])")  # not a flag: a value given after a space


def check_extra(extra: Sequence[str]) -> None:
    """The flags after `--`, which go to every run, are `--config.<field>=<value>` overrides
    (`-config.<field>`, `--noconfig.<field>` and a value after a space as absl reads them),
    except the seed; anything else (the run's --workdir, --config, a --flagfile that could
    set them) is a ValueError naming it."""
    index = 0
    while index < len(extra):
        flag = extra[index]
        match = _OVERRIDE.match(flag)
        name = "--" + flag.lstrip("-").split("=", 1)[0]
        if match and match.group(2) != "seed":
            index += 1
            if match.group(3) is None and not match.group(1) and index < len(extra) \
                    and _VALUE.match(extra[index]):
                index += 1  # --config.rl.steps 5
            continue
        if match or name in ("--workdir", "--config"):
            name = "--config.seed" if match else name
            raise ValueError(f"-- {flag}: the sweep sets {name} of each run itself (each run "
                             "works in <sweep workdir>/<its name>); give it to the sweep, or "
                             "--seeds")
        if name == "--flagfile":
            raise ValueError(f"-- {flag}: a flag file could set any flag of the runs (their "
                             "--workdir, --config.seed); give its --config.<field>=<value> "
                             "overrides after -- instead")
        raise ValueError(f"-- {flag}: the sweep passes only --config.<field>=<value> "
                         f"overrides to its runs (not {name}); expected e.g. "
                         "--config.rl.steps=5")


class _RunLock:
    """The sweep's hold on one run (`<run>/.sweep.lock`, flock): a second sweep on the same
    folder skips a run the first is running instead of starting it (and failing on the
    run's own workdir lock). None of it on an object store."""

    def __init__(self, run: Run):
        local = storage.local_path(run.workdir)
        self.path = None if local is None else os.path.join(local, ".sweep.lock")
        self.file = None

    def acquire(self) -> str | None:
        """None when held now; else the pid of the sweep holding it."""
        if self.path is None:
            return None
        import fcntl

        handle = open(self.path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            return holder
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self.file = handle
        return None

    def release(self) -> None:
        if self.file is not None:
            import fcntl

            fcntl.flock(self.file, fcntl.LOCK_UN)
            self.file.close()
            self.file = None


def finished_runs(root: str) -> list[Run]:
    """The finished runs of a local sweep directory, each rebuilt from its directory name
    (`k=v,...,seed=S`: `run.overrides`, `run.arm`, `run.seed`), in name order: what a
    study's analysis script reads."""
    runs = []
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else ():
        parts = [part.split("=", 1) for part in name.split(",")]
        if not all(len(p) == 2 for p in parts) or parts[-1][0] != "seed":
            continue
        try:
            seed = int(parts[-1][1])
        except ValueError:
            continue
        run = Run([tuple(p) for p in parts[:-1]], seed, root, "", ())
        if run.finished:
            runs.append(run)
    return runs


def format_interval(stats: dict, scale: float = 100.0, digits: int = 1,
                    signed: bool = False) -> str:
    """`stats.interval` / `stats.paired_interval` output as "mean ± half-width" (times
    `scale`), "-" without a value, "(n=1)" without a spread; `signed` writes the mean's sign
    (differences)."""
    if stats["n"] == 0 or not math.isfinite(stats["mean"]):
        return "-"
    mean = stats["mean"] * scale
    text = f"{mean:+.{digits}f}" if signed else f"{mean:.{digits}f}"
    if stats["n"] < 2:
        return f"{text} (n=1)"
    return f"{text} ± {(stats['ci95'][1] - stats['ci95'][0]) / 2 * scale:.{digits}f}"


def write_analysis(out: str, summary: dict, table: str) -> None:
    """Writes a study's analysis into the directory `out`: summary.json (`summary`, JSON
    indented by 2, non-finite numbers as null, no final newline) and table.md (`table`, as
    given)."""
    storage.write_text(storage.join(out, "summary.json"), dumps_finite(summary, indent=2))
    storage.write_text(storage.join(out, "table.md"), table)


def summarize(runs: Sequence[Run], root: str) -> dict:
    """Writes summary.json, summary.md and curves.png over the finished runs; returns the
    summary {arm: {"seeds": [...], "figures": {name: interval}}}."""
    arms: dict[str, list[Run]] = {}
    for run in runs:
        if run.finished:
            arms.setdefault(run.arm, []).append(run)
    summary = {}
    for arm, members in arms.items():
        per_seed = [r.results.final_figures() for r in members]
        names = sorted({k for figures in per_seed for k in figures})
        summary[arm] = {"seeds": [r.seed for r in members],
                        "figures": {k: interval([f.get(k) for f in per_seed]) for k in names}}
    storage.write_text(storage.join(root, "summary.json"), dumps_finite(summary, indent=2))
    storage.write_text(storage.join(root, "summary.md"), summary_markdown(summary))
    if summary:
        _plot_curves(arms, storage.join(root, "curves.png"))
    return summary


def _fmt(stats: dict) -> str:
    if stats["n"] == 0:
        return "-"
    mean, (low, high) = stats["mean"], stats["ci95"]
    if stats["n"] < 2:
        return f"{mean:.4g} (n=1)"
    return f"{mean:.4g} ± {(high - low) / 2:.2g}"


def summary_markdown(summary: dict) -> str:
    """One table: arms as rows, figures as columns, mean ± 95% CI half-width (n)."""
    if not summary:
        return "# Sweep summary\n\nNo finished run yet.\n"
    names = sorted({k for arm in summary.values() for k in arm["figures"]})
    preferred = [k for k in ("pass@1", "pass@8", "maj@8", "format_rate", "mean_length",
                             "train/kl_ref", "train/completion_length", "train/reward_mean")
                 if k in names]
    names = preferred + [k for k in names if k not in preferred]
    lines = ["# Sweep summary", "",
             "Mean ± half-width of the 95% confidence interval over seeds (Student's t); "
             "`train/` figures are the last RL step's.", "",
             "| arm | seeds | " + " | ".join(names) + " |",
             "|---|---|" + "---|" * len(names)]
    for arm, entry in summary.items():
        cells = [_fmt(entry["figures"].get(k, {"n": 0})) for k in names]
        lines.append(f"| {arm} | {len(entry['seeds'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _plot_curves(arms: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, len(CURVES), figsize=(4 * len(CURVES), 3.2))
    for index, (arm, members) in enumerate(arms.items()):
        color = f"C{index % 10}"  # one colour per arm in every panel
        curves = [r.results.training_rows() for r in members]
        for ax, name in zip(axes, CURVES):
            series = [[row.get(name, np.nan) for row in rows] for rows in curves if rows]
            if not series:
                continue
            length = min(len(s) for s in series)
            values = np.asarray([s[:length] for s in series], float)
            if not length or np.isnan(values).all():  # e.g. kl_ref of a beta = 0 arm
                continue
            steps = np.arange(1, length + 1)
            mean = np.nanmean(values, axis=0)
            ax.plot(steps, mean, label=arm, color=color)
            if len(values) > 1:
                std = np.nanstd(values, axis=0, ddof=1)
                ax.fill_between(steps, mean - std, mean + std, alpha=0.15, color=color)
    for ax, name in zip(axes, CURVES):
        ax.set_title(name)
        ax.set_xlabel("RL step")
    axes[0].legend(fontsize=7)
    axes[0].set_title(f"{CURVES[0]} (mean over seeds, band: ±1 std)", fontsize=9)
    fig.tight_layout()
    data = io.BytesIO()
    fig.savefig(data, format="png", dpi=110)
    plt.close(fig)
    storage.write_bytes(path, data.getvalue())


def _run_all(runs: list[Run], parallel: int, root: str) -> int:
    """Runs the unfinished runs, `parallel` at a time. SIGTERM / SIGINT to the sweep reach
    its running children (each in a session of its own, so a terminal's Ctrl-C arrives once,
    through here): they save and stop, no new run starts, and the sweep exits 0 once they
    have (a second signal is passed on too: they stop at once). The same command resumes."""
    todo = [r for r in runs if not r.finished]
    print(f"[sweep] {len(runs)} runs, {len(runs) - len(todo)} finished, {len(todo)} to run",
          flush=True)
    failures, skipped, active, stopping = 0, 0, [], []

    def forward(signum, frame):
        del frame
        stopping.append(signum)
        print(f"[sweep] {signal.Signals(signum).name}: passed to {len(active)} running "
              "run(s), which save and stop; the same command resumes the sweep", flush=True)
        for _, proc, _, _, _ in active:
            if proc.poll() is None:
                os.kill(proc.pid, signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while (todo and not stopping) or active:
            while todo and not stopping and len(active) < parallel:
                run = todo.pop(0)
                storage.makedirs(run.workdir)
                lock = _RunLock(run)
                holder = lock.acquire()
                if holder is not None:
                    skipped += 1
                    print(f"[sweep] skip {run.name}: another sweep (process {holder}) is "
                          "running it", flush=True)
                    continue
                os.makedirs(os.path.dirname(run.log), exist_ok=True)
                log = open(run.log, "a")
                print(f"[sweep] start {run.name}", flush=True)
                active.append((run, subprocess.Popen(run.command, stdout=log,
                                                     stderr=subprocess.STDOUT,
                                                     start_new_session=True), log,
                               time.time(), lock))
            time.sleep(0.5)
            for item in list(active):
                run, proc, log, t0, lock = item
                if proc.poll() is None:
                    continue
                lock.release()
                log.close()
                run.copy_log()
                active.remove(item)
                if proc.returncode == 0:
                    status = "done" if run.finished else "stopped"
                else:
                    status = f"FAILED (exit {proc.returncode})"
                failures += proc.returncode != 0
                print(f"[sweep] {status} {run.name} in {time.time() - t0:.0f}s (log: "
                      f"{storage.join(run.workdir, 'sweep.log')})", flush=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stopping:
        return 1 if failures else 0
    summarize(runs, root)
    done = sum(r.finished for r in runs)
    print(f"[sweep] {done} of {len(runs)} runs finished"
          + (f" ({skipped} skipped: another sweep runs them)" if skipped else "")
          + f"; summary: {storage.join(root, 'summary.md')}, "
          f"{storage.join(root, 'summary.json')}, curves: {storage.join(root, 'curves.png')}",
          flush=True)
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, extra = argv[:split], argv[split + 1:]
    parser = argparse.ArgumentParser(prog="python -m grpo_jax.sweep",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="config file[:preset]")
    parser.add_argument("--workdir", required=True, help="the sweep directory")
    parser.add_argument("--set", action="append", default=[], dest="sets",
                        help="key=v1,v2,... (repeatable; the product is swept)")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds")
    parser.add_argument("--parallel", type=int, default=1, help="runs at a time")
    parser.add_argument("--print", action="store_true", dest="print_only",
                        help="print one command per run and exit")
    parser.add_argument("--summarize", action="store_true",
                        help="only write the summary of the finished runs")
    try:
        args = parser.parse_args(argv)
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        if not seeds:
            raise ValueError("--seeds: expected at least one seed")
        if args.parallel < 1:
            raise ValueError("--parallel: expected >= 1")
        if not args.workdir.strip():
            raise ValueError(f"--workdir: {args.workdir!r} is empty (it would be the current "
                             "folder); expected the sweep's directory")
        root = storage.normalize(args.workdir)
        runs = expand(args.sets, seeds, root, args.config, extra)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.print_only:
        import shlex

        for run in runs:
            print(shlex.join(run.command))
        return 0
    try:
        storage.makedirs(root)
    except OSError as err:
        print(f"error: --workdir: {root!r} cannot be created: {err.strerror or err}",
              file=sys.stderr)
        return 2
    if args.summarize:
        summarize(runs, root)
        return 0
    return _run_all(runs, args.parallel, root)


if __name__ == "__main__":
    sys.exit(main())
