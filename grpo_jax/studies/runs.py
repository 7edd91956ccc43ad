"""A study's runs: its bases built once and shared (keyed by their config), every (arm,
base, seed) planned into a directory keyed by its config, run in process (finished runs
skipped, runs another process holds said and skipped), then measured, analysed and written
(`execute`)."""

from __future__ import annotations

import copy
import hashlib
import os
import sys
import time
from collections.abc import Sequence

from grpo_jax import storage
from grpo_jax.machine import machine_words
from grpo_jax.results import FinishedRun
from grpo_jax.studies import summary as summary_lib
from grpo_jax.studies.configs import config_hash, for_tier, for_tier_base
from grpo_jax.studies.publish import publish_outputs, write_outputs
from grpo_jax.studies.record import RunRecord, Study, StudyRuns


class _Tee:
    """Writes to the console and to a run's log file."""

    def __init__(self, console, log):
        self.console, self.log = console, log

    def write(self, text):
        self.log.write(text)
        return self.console.write(text)

    def flush(self):
        self.log.flush()
        self.console.flush()

    def __getattr__(self, name):
        return getattr(self.console, name)


class RunHeld(RuntimeError):
    """Another process holds a run's workdir (its run lock: a run in progress there)."""

    def __init__(self, workdir: str, holder: str):
        super().__init__(f"{workdir} is in use by process {holder}")
        self.workdir, self.holder = workdir, holder


def holder_of(workdir: str) -> str | None:
    """The process id holding the run lock of `workdir` (a run in progress in another
    process), or None when no process does (or on an object store: no lock there)."""
    from grpo_jax.runner.guards import WorkdirBusyError, WorkdirLock

    if not storage.isdir(workdir):
        return None
    lock = WorkdirLock(workdir)
    try:
        lock.acquire()
    except WorkdirBusyError as err:
        return err.holder
    lock.release()
    return None


def _train(config, workdir: str) -> None:
    """One run in process (`pipeline.train_and_evaluate`), its output also appended to
    `<workdir>/study.log` (each stage's "done in" line: what the cost tables read). RunHeld,
    with nothing written, when another process is running it."""
    import contextlib

    from grpo_jax import pipeline  # jax only when a run is made
    from grpo_jax.runner.guards import WorkdirBusyError

    storage.makedirs(workdir)
    holder = holder_of(workdir)
    if holder is not None:
        raise RunHeld(workdir, holder)
    local = storage.local_path(storage.join(workdir, "study.log"))
    try:
        if local is None:
            pipeline.train_and_evaluate(config, workdir)
            return
        with open(local, "a", encoding="utf-8") as log, \
                contextlib.redirect_stdout(_Tee(sys.stdout, log)):
            pipeline.train_and_evaluate(config, workdir)
    except WorkdirBusyError as err:  # taken since holder_of looked
        raise RunHeld(workdir, err.holder) from None


def build_base(config, root: str, seed: int) -> tuple[str, dict]:
    """The base run of `config` with `seed` under `<root>/bases/`, built unless finished;
    returns (key, {"seed", "config_hash", "workdir"})."""
    config = copy.deepcopy(config)
    config.seed = seed
    digest = config_hash(config)
    key = f"s{seed}-{digest[:10]}"
    workdir = storage.join(root, "bases", key)
    marker = storage.join(workdir, "base_config_hash")
    if storage.isfile(marker) and storage.read_text(marker).strip() != digest:
        raise RuntimeError(f"{workdir}: built for another config (hash "
                           f"{storage.read_text(marker).strip()[:10]}, asked {digest[:10]})")
    if not storage.isfile(storage.join(workdir, "report.json")):
        holder = holder_of(workdir)
        if holder is not None:
            raise RunHeld(workdir, holder)
        print(f"[studies] base {key}: building ({config.stages})", flush=True)
        storage.makedirs(workdir)
        storage.write_text(marker, digest + "\n")
        _train(config, workdir)
    else:
        print(f"[studies] base {key}: finished, reused", flush=True)
    return key, {"seed": seed, "config_hash": digest, "workdir": workdir}


def build_bases(configs, root: str, seed: int, tier: str = "full") -> tuple[str, dict]:
    """One base (a config) or one set of role runs ({role: config or function of the roles
    built before it, returning a config or None: the role is not built}) with `seed`;
    returns (key, {"seed", "config_hash", "workdir", "roles": {role: workdir}}). A set's
    key hashes its built roles' hashes."""
    if not isinstance(configs, dict):
        key, info = build_base(for_tier_base(configs, tier), root, seed)
        return key, {**info, "roles": {"base": info["workdir"]}}
    roles, hashes = {}, []
    for role, config in configs.items():
        if callable(config):
            config = config(dict(roles))
            if config is None:
                continue
        _, info = build_base(for_tier_base(config, tier), root, seed)
        roles[role] = info["workdir"]
        hashes.append(f"{role}={info['config_hash']}")
    digest = hashlib.sha256("\n".join(hashes).encode()).hexdigest()
    first = next(iter(roles.values()))
    return f"s{seed}-{digest[:10]}", {"seed": seed, "config_hash": digest, "workdir": first,
                                      "roles": roles}


def plan(study: Study, tier: str, workdir: str, bases: dict[str, dict]) -> list[RunRecord]:
    """Every run of the tier, arm by arm, then base, then seed."""
    chosen = study.tiers[tier]
    arms = study.arm_configs(tier)
    names = [a for a in study.arms if chosen.arms is None or a in chosen.arms]
    records = []
    for arm in names:
        for key, base in (bases.items() if bases else [("", None)]):
            for seed in chosen.seeds:
                config = for_tier(copy.deepcopy(arms[arm]), tier)
                config.seed = seed
                if base is not None and study.attach is not None:
                    study.attach(config, base)
                elif base is not None:
                    config.model.init_from = base["workdir"]
                name = f"{key},seed={seed}" if key else f"seed={seed}"
                records.append(RunRecord(
                    arm, key, seed, storage.join(workdir, "runs", config_hash(config)[:16]),
                    config, storage.join(workdir, study.name, "runs", _safe(arm), name)))
    return records


def link_run(record: RunRecord) -> None:
    """Makes the study's readable path of a run (`record.link`) a symbolic link to the run's
    directory, keyed by its config (local workdirs only), and marks the directory with the
    hash it was made for: a directory made for another config is never reused. A link left by
    an earlier config of the arm is pointed at the current run."""
    digest = config_hash(record.config)
    storage.makedirs(record.workdir)
    marker = storage.join(record.workdir, "run_config_hash")
    if storage.isfile(marker) and storage.read_text(marker).strip() != digest:
        raise RuntimeError(f"{record.workdir}: made for another config (hash "
                           f"{storage.read_text(marker).strip()[:10]}, asked {digest[:10]})")
    storage.write_text(marker, digest + "\n")
    link, target = storage.local_path(record.link), storage.local_path(record.workdir)
    if link is None or target is None:
        return
    if os.path.islink(link):
        if os.path.realpath(link) == os.path.realpath(target):
            return
        os.remove(link)
    os.makedirs(os.path.dirname(link), exist_ok=True)
    os.symlink(os.path.relpath(target, os.path.dirname(link)), link)


def _safe(name: str) -> str:
    for bad in ("/", "\\", "\0"):
        name = name.replace(bad, "_")
    return name if name not in (".", "..") else f"_{name}"


def execute(study: Study, tier: str, workdir: str, *, publish: bool = False,
            argv: Sequence[str] | None = None) -> dict | None:
    """Builds the bases, runs the arms (skipping finished runs), measures, analyses and writes
    `<workdir>/<study>/out/`: summary.json, table.md, the plots, README.md (the study's
    README with its results block generated). `publish` copies them into
    experiments/<study>/. Returns the summary; None, after saying so, when another process
    runs some of its runs (they are skipped, as sweeps skip theirs)."""
    if tier not in study.tiers:
        raise ValueError(f"{study.name}: no tier {tier!r}; expected one of {sorted(study.tiers)}")
    start = time.time()
    workdir = storage.normalize(workdir)
    chosen = study.tiers[tier]
    bases: dict[str, dict] = {}
    if study.base_config is not None:
        for seed in chosen.bases:
            try:
                key, info = build_bases(study.base_config(tier), workdir, seed, tier)
            except RunHeld as held:
                print(f"[studies] {study.name}: not run: process {held.holder} is building "
                      f"its base in {held.workdir}; the same command continues once it "
                      "ends", flush=True)
                return None
            bases[key] = info
    records = plan(study, tier, workdir, bases)
    for record in records:
        link_run(record)
    todo = [r for r in records if not r.finished]
    print(f"[studies] {study.name} ({tier}): {len(records)} runs, "
          f"{len(records) - len(todo)} finished, {len(todo)} to run", flush=True)
    for index, record in enumerate(todo):
        t0 = time.time()
        what = f"{index + 1}/{len(todo)}: {record.arm} {record.base} seed={record.seed}"
        try:
            holder = holder_of(record.workdir)
            if holder is not None:
                raise RunHeld(record.workdir, holder)
            print(f"[studies] run {what}", flush=True)
            _train(record.config, record.workdir)
        except RunHeld as held:
            print(f"[studies] skip run {what}: process {held.holder} is running it in "
                  f"{record.workdir}", flush=True)
            continue
        print(f"[studies] done in {time.time() - t0:.0f}s: {record.workdir}", flush=True)
    running = [r for r in records if not r.finished]
    if running:
        print(f"[studies] {study.name}: not analysed: {len(running)} of {len(records)} runs "
              "are in progress in another process; the same command analyses the study once "
              "they finish", flush=True)
        return None
    runs = StudyRuns(study, tier, storage.join(workdir, study.name), records, bases)
    if study.measure is not None:
        study.measure(runs)
    analysis = study.analyze(runs)
    run_reports = _reports(r.workdir for r in records)  # each report.json read once
    base_reports = _reports(path for info in bases.values()
                            for path in info.get("roles", {}).values())
    provenance = {**_provenance(argv), "wall_time_s": round(time.time() - start, 1),
                  "run_commits": _commits(run_reports), "runs_time_s": _seconds(run_reports),
                  "bases_time_s": _seconds(base_reports),
                  "run_machines": _machines(run_reports + base_reports)}
    protocol = {**protocol_of(records),
                "bases": {k: {"seed": v["seed"], "config_hash": v["config_hash"],
                              "roles": {role: os.path.basename(path.rstrip("/"))
                                        for role, path in v.get("roles", {}).items()},
                              "last_loss": {role: last_loss(path)
                                            for role, path in v.get("roles", {}).items()}}
                          for k, v in bases.items()},
                "seeds": list(chosen.seeds), **analysis.protocol}
    result = summary_lib.build(study=study.name, tier=tier, provenance=provenance,
                               protocol=protocol, arms=analysis.arms, specs=analysis.specs,
                               extra=analysis.extra, claims=study.claims,
                               scales=analysis.scales)
    out = storage.join(workdir, study.name, "out")
    write_outputs(study, result, analysis, out)
    if publish:
        publish_outputs(study, out)
    return result


def _provenance(argv) -> dict:
    from grpo_jax.runner.report import code_provenance

    code = code_provenance()
    return {"commit": code.get("commit"), "dirty": code.get("modified"),
            "python": code.get("python"), "jax": code.get("jax"), "flax": code.get("flax"),
            "argv": list(sys.argv if argv is None else argv)}


def last_loss(workdir: str) -> float | None:
    """A base run's last training loss (the last row of its metrics.jsonl that has one;
    None without one): a fingerprint of its weights. A base's key is its config's hash, and
    one config built on two machines need not give the same weights (floating-point results
    can differ between CPUs); studies whose bases share a key and this value ran on the same
    weights."""
    rows = [row for row in FinishedRun(workdir).metrics() if "loss" in row]
    return float(rows[-1]["loss"]) if rows else None


def _reports(workdirs) -> list[dict]:
    """The report.json of each finished run in `workdirs`, each run once."""
    runs = (FinishedRun(workdir) for workdir in dict.fromkeys(workdirs))
    return [run.report() for run in runs if run.finished]


def _seconds(reports) -> float:
    return round(sum(float(stage.get("wall_s") or 0.0) for report in reports
                     for stage in (report.get("timing") or {}).values()), 1)


def _commits(reports) -> list:
    return sorted({(report.get("provenance") or {}).get("commit") for report in reports},
                  key=str)


def _machines(reports) -> list:
    return sorted({machine_words((report.get("provenance") or {}).get("machine"))
                   for report in reports})


def stage_time(workdirs) -> float:
    """The seconds the stages of the finished runs in `workdirs` took (each run once, from
    its report.json's timing: the stage's wall time as its run recorded it), whichever
    process or session ran them: a study's compute, where `wall_time_s` is only the command
    that analysed it."""
    return _seconds(_reports(workdirs))


def run_commits(workdirs) -> list:
    """The commits the finished runs in `workdirs` ran at (their report.json's provenance)."""
    return _commits(_reports(workdirs))


def run_machines(workdirs) -> list:
    """The machines the finished runs in `workdirs` ran on, from their report.json's
    provenance, each in `machine_words`."""
    return _machines(_reports(workdirs))


def protocol_of(records: Sequence[RunRecord]) -> dict:
    """The held-out protocol the arms' configs say: the problems' seed, count, samples per
    problem (the last eval stage's) and whether the problems are fixed across seeds."""
    if not records:
        return {"eval_seed": None, "problems": None, "samples_per_problem": None,
                "problems_fixed_across_seeds": None}
    seeds, sizes, samples = set(), set(), set()
    for record in records:
        config = record.config
        seeds.add(config.task.get("eval_seed", None))
        sizes.add(config.task.get("eval_size", None))
        evals = [n.strip() for n in config.stages.split(",")
                 if n.strip() and config[n.strip()].kind == "eval"]
        if evals:
            samples.add(config[evals[-1]].get("num_samples", None))
    fixed = None not in seeds and len(seeds) == 1
    return {"eval_seed": seeds.pop() if len(seeds) == 1 else sorted(seeds, key=str),
            "problems": sizes.pop() if len(sizes) == 1 else sorted(sizes, key=str),
            "samples_per_problem": samples.pop() if len(samples) == 1
            else sorted(samples, key=str),
            "problems_fixed_across_seeds": fixed}
