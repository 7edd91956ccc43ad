"""What every study shares: its record, the runs (shared bases keyed by their config, arms x
bases x seeds, resumable), the analysis' output (summary.json, table.md, plots, README
tables) and the helpers the analyses use (per-seed rows, band plots, finished-run loading).

A study module defines `STUDY = Study(...)`:

- `base_config(tier)`: the config of one pretrained base (its seed is set per base), or None
  for a study without one; or {role: config, or a function of the {role: workdir} built
  before it} for a study whose arms start from several runs (a student and a teacher). A
  base is a run in `<workdir>/bases/<key>/`, keyed by the hash of its resolved config (seed
  included): every study asking for the same config reuses it, a different config never
  does.
- `arm_configs(tier)`: {arm name: config}; each runs once per (base, seed) in
  `<workdir>/runs/<hash of its resolved config>/` (linked from
  `<workdir>/<study>/runs/<arm>/<base key>,seed=<s>`: two studies asking for the same run
  share it) with `config.seed = s` and, with a base,
  `config.model.init_from` set to the base's directory (or `attach(config, base)` wiring the
  roles' directories, `base["roles"]`, into it). Arms of one (base, seed) share the
  prompt order, sampling keys and held-out problems: they are paired.
- `analyze(runs) -> Analysis`: per-seed metrics per arm, the contrasts (a, b, metric), the
  study's own table and plots. The summary, contrast table and README block are generated
  from it (`grpo_jax.studies.summary`).
- `claims`: what the study tests (`summary.Claim`: the claim as its source states it, the
  contrast that tests it and what it predicts), fixed before the runs; each verdict follows
  from its contrast by one rule (`summary.verdict_of`).
- `measure(runs)` (optional): post-hoc measurements on the finished runs, written into each
  run's directory (resumable: a finished measurement is skipped).

A run whose report.json exists is finished and skipped, so the same command resumes.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from grpo_jax import storage, sweep
from grpo_jax.results import FinishedRun
from grpo_jax.stats import interval
from grpo_jax.studies import summary as summary_lib

Claim = summary_lib.Claim

__all__ = ["Analysis", "Claim", "RunRecord", "index_table", "link_run", "paired_cell",
           "Study", "StudyRuns", "Tier", "band", "config_hash",
           "execute", "experiments_dir", "figures", "last_stage_rows", "load_finished",
           "per_seed", "protocol_of", "training_rows"]

VOLATILE_FIELDS = ("compilation_cache_dir", "loggers", "sandbox")  # do not change what a run computes


@dataclasses.dataclass(frozen=True)
class Tier:
    """One size of a study. `cost`: the wall time it takes on the 2-core CPU (measured or
    estimated, said which). `arms`: the arms this tier runs (None: all)."""
    bases: tuple[int, ...]
    seeds: tuple[int, ...]
    cost: str
    arms: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """One finished (or planned) run of an arm: its labels, its planned config and its
    directory's contents (`results`, a `grpo_jax.results.FinishedRun`)."""
    arm: str
    base: str  # the base's key ("" without a base)
    seed: int
    workdir: str  # <workdir>/runs/<config hash>: shared by every study asking for the run
    config: Any  # the run's ConfigDict
    link: str = ""  # <workdir>/<study>/runs/<arm>/<base>,seed=<s>: a link to `workdir`
    results: FinishedRun = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "results", FinishedRun(self.workdir))

    @property
    def finished(self) -> bool:
        return self.results.finished


@dataclasses.dataclass
class StudyRuns:
    """A study's runs in one workdir: `runs` in arm order, then base, then seed."""
    study: Study
    tier: str
    root: str  # <workdir>/<study>
    runs: list[RunRecord]
    bases: dict[str, dict]  # key -> {"seed", "config_hash", "workdir"}

    def arm(self, name: str) -> list[RunRecord]:
        return [r for r in self.runs if r.arm == name]


@dataclasses.dataclass
class Analysis:
    """What a study's analysis returns. `arms`: {arm: {"seeds", "bases", "metrics": {metric:
    per-seed values}}} (`per_seed` builds it); `specs`: the contrasts (a, b, metric), one
    family for Holm's adjustment; `table`: the study's own markdown table(s); `plots`:
    writes the study's figures into a directory; `protocol`: fields that differ from what
    the configs say (`protocol_of`)."""
    arms: dict
    specs: list[tuple[str, str, str]]
    table: str = ""
    extra: dict = dataclasses.field(default_factory=dict)
    protocol: dict = dataclasses.field(default_factory=dict)
    plots: Callable[[str], None] | None = None
    scales: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Study:
    """A study as data. `arms`: every arm's name (`arm_configs(tier)` builds their configs;
    a tier may run a subset)."""
    name: str
    question: str
    tiers: Mapping[str, Tier]
    arms: tuple[str, ...]
    arm_configs: Callable[[str], dict]
    analyze: Callable[[StudyRuns], Analysis]
    base_config: Callable[[str], Any] | None = None
    measure: Callable[[StudyRuns], None] | None = None
    attach: Callable[[Any, dict], None] | None = None
    claims: tuple[summary_lib.Claim, ...] = ()


# ---- configs and bases ---------------------------------------------------------------------

def main_job(preset: str | None = None):
    """`config_presets.main_job`, imported when a config is built (so `list` stays light)."""
    from grpo_jax import config_presets

    return config_presets.main_job(preset)


def agents_job(preset: str | None = None):
    """`config_presets.agents_job`, imported when a config is built."""
    from grpo_jax import config_presets

    return config_presets.agents_job(preset)


def tool_job(preset: str | None = None):
    """`config_presets.tool_job`, imported when a config is built."""
    from grpo_jax import config_presets

    return config_presets.tool_job(preset)


def main_base(tier: str):
    """The main job's pretraining as a base (1500 steps; the smoke preset's 3 at the mini
    tier): the base most studies share."""
    config = main_job(preset(tier))
    config.stages = "pretrain"
    return config


def main_arm(tier: str, stages: str):
    """The main job as an arm from a base: no pretraining, `stages`, and model.init_from
    left for the study to set per base."""
    config = main_job(preset(tier))
    del config.pretrain
    config.model.init_from = ""  # the base's workdir, set by the study per base
    config.stages = stages
    return config


def preset(tier: str) -> str | None:
    """The config preset of a tier: the smoke sizes at the mini tier, the job's own at full."""
    return "smoke" if tier == "mini" else None


def config_hash(config) -> str:
    """The sha256 of a resolved config's canonical JSON (fields that only say where caches
    live left out): equal for configs that compute the same run, and only for those."""
    data = json.loads(config.to_json_best_effort(sort_keys=True))
    for field in VOLATILE_FIELDS:
        data.pop(field, None)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


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


def for_tier(config, tier: str):
    """A study's config as its tier runs it: the mini tier on one device, as the CPU job runs
    (the test suite's 8 virtual CPU devices would otherwise shard the toy runs)."""
    if tier == "mini" and "mesh" in config:
        config.mesh.num_devices = 1
    return config


def for_tier_base(config, tier: str):
    """A base's config as its tier builds it: `for_tier`, and at the mini tier the jobs'
    tiny-1m model with one block (the arms take the base's shape), at a fraction of the
    compile (a base of another named size, e.g. a distillation student that a stage names,
    keeps its shape)."""
    config = for_tier(config, tier)
    if tier == "mini" and "model" in config and not config.model.get("init_from") \
            and config.model.name == "tiny-1m":
        config.model.num_layers = 1
    return config


def build_bases(configs, root: str, seed: int, tier: str = "full") -> tuple[str, dict]:
    """One base (a config) or one set of role runs ({role: config or function of the roles
    built before it}) with `seed`; returns (key, {"seed", "config_hash", "workdir",
    "roles": {role: workdir}}). A set's key hashes its roles' hashes."""
    if not isinstance(configs, dict):
        key, info = build_base(for_tier_base(configs, tier), root, seed)
        return key, {**info, "roles": {"base": info["workdir"]}}
    roles, hashes = {}, []
    for role, config in configs.items():
        if callable(config):
            config = config(dict(roles))
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


# ---- running a study ---------------------------------------------------------------------

def experiments_dir() -> str:
    """The checkout's experiments/ directory (where --publish writes)."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "experiments")


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
    provenance = {**_provenance(argv), "wall_time_s": round(time.time() - start, 1),
                  "run_commits": _run_commits(records)}
    protocol = {**protocol_of(records),
                "bases": {k: {"seed": v["seed"], "config_hash": v["config_hash"],
                              "roles": {role: os.path.basename(path.rstrip("/"))
                                        for role, path in v.get("roles", {}).items()}}
                          for k, v in bases.items()},
                "seeds": list(chosen.seeds), **analysis.protocol}
    result = summary_lib.build(study=study.name, tier=tier, provenance=provenance,
                               protocol=protocol, arms=analysis.arms, specs=analysis.specs,
                               extra=analysis.extra, claims=study.claims)
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


def _run_commits(records: Sequence[RunRecord]) -> list:
    commits = set()
    for record in records:
        if record.finished:
            code = record.results.report().get("provenance") or {}
            commits.add(code.get("commit"))
    return sorted(commits, key=str)


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


def write_outputs(study: Study, result: dict, analysis: Analysis, out: str) -> None:
    """summary.json, table.md (the study's table, then the contrasts), the plots and
    README.md (experiments/<study>/README.md with the generated block) into `out`."""
    storage.makedirs(out)
    storage.write_text(storage.join(out, "summary.json"), summary_lib.to_json(result))
    table = generated_block(result, analysis)
    storage.write_text(storage.join(out, "table.md"), table)
    if analysis.plots is not None:
        analysis.plots(out)
    readme = os.path.join(experiments_dir(), study.name, "README.md")
    text = f"# {study.name}\n\n{study.question}\n"
    if os.path.exists(readme):
        with open(readme, encoding="utf-8") as f:
            text = f.read()
    storage.write_text(storage.join(out, "README.md"), summary_lib.replace_marked(text, table))


def generated_block(result: dict, analysis: Analysis) -> str:
    """The README's results block: provenance line, the study's table, the contrasts."""
    code = result["provenance"]
    commit = (code.get("commit") or "unknown")[:7] + (" (modified)" if code.get("dirty") else "")
    runs = ", ".join(c[:7] for c in code.get("run_commits", []) if c) or "unknown"
    protocol = result["protocol"]
    fixed = "fixed" if protocol["problems_fixed_across_seeds"] else "not fixed"
    lines = [(f"Generated from summary.json by `python -m grpo_jax.studies run "
              f"{result['study']} --tier={result['tier']}` (analysis at {commit}; runs at "
              f"{runs}; {code['wall_time_s']:.0f} s). Held-out: {protocol['problems']} problems "
              f"x {protocol['samples_per_problem']} samples, eval seed {protocol['eval_seed']} "
              f"({fixed} across seeds); {len(protocol.get('bases', {})) or 'no'} base(s), "
              f"seeds {protocol['seeds']}."), ""]
    if result.get("verdicts"):
        lines += [("Verdicts (each claim's contrast, by the rule of "
                   "`grpo_jax.studies.summary.verdict_of`, fixed before the runs):"), "",
                  summary_lib.verdict_table(result).rstrip(), ""]
    if analysis.table:
        lines += [analysis.table.rstrip(), ""]
    lines += [("Contrasts (paired by seed; 95% t interval; p from the paired t test; Holm "
               f"over the study's {len(result['contrasts'])} contrasts):"), "",
              summary_lib.contrast_table(result, analysis.scales).rstrip()]
    return "\n".join(lines) + "\n"


def publish_outputs(study: Study, out: str) -> None:
    """Copies `out`'s files into experiments/<study>/."""
    target = os.path.join(experiments_dir(), study.name)
    local = storage.local_path(out)
    if local is None:
        raise ValueError("--publish needs a local workdir")
    os.makedirs(target, exist_ok=True)
    for name in sorted(os.listdir(local)):
        shutil.copyfile(os.path.join(local, name), os.path.join(target, name))
        print(f"[studies] published {os.path.join(target, name)}", flush=True)
    index = os.path.join(experiments_dir(), "README.md")
    with open(index, encoding="utf-8") as f:
        text = f.read()
    with open(index, "w", encoding="utf-8") as f:
        f.write(summary_lib.replace_marked(text, index_table(experiments_dir())))
    print(f"[studies] published {index} (its index of verdicts)", flush=True)


def index_table(folder: str) -> str:
    """experiments/README.md's index, generated from the published summary.json files: per
    study its question, the commit its analysis ran at, and its verdicts; a study whose
    summary.json predates the schema (or is a mini tier's) says it is not regenerated, one
    without any that it has not run yet."""
    from grpo_jax import studies

    lines = ["| study | question | published at | verdicts (claim: verdict) |",
             "|---|---|---|---|"]
    for name in studies.NAMES:
        path = os.path.join(folder, name, "summary.json")
        summary = None
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                summary = json.load(f)
        link = f"[{name}]({name}/README.md)"
        question = (studies.get(name).question
                    ).replace("|", "\\|")
        if not summary:
            lines.append(f"| {link} | {question} | not run yet | - |")
            continue
        if summary.get("schema", 0) < 2 or summary.get("tier") != "full":
            lines.append(f"| {link} | {question} | not regenerated yet | the former results: "
                         "its README |")
            continue
        code = summary["provenance"]
        commit = (code.get("commit") or "unknown")[:7] + (" (modified)" if code.get("dirty")
                                                          else "")
        verdicts = "; ".join(f"{_short(v['claim'])}: **{v['verdict']}**"
                             for v in summary.get("verdicts", [])) or "-"
        lines.append(f"| {link} | {question} | `{commit}` | {verdicts} |")
    return "\n".join(lines) + "\n"


def _short(text: str, words: int = 12) -> str:
    parts = text.replace("|", "\\|").split()
    return " ".join(parts[:words]) + (" ..." if len(parts) > words else "")


# ---- helpers for the analyses ----------------------------------------------------------------

def arm_curves(runs: StudyRuns, arms: Sequence[str]) -> dict[str, list[list[dict]]]:
    """{arm: the training rows of each of its finished runs} (`curve_panels`' input)."""
    return {name: [training_rows(r) for r in runs.arm(name) if r.finished] for name in arms}


def training_mean(rows: Sequence[dict], name: str, skip: int = 0) -> float | None:
    """The mean of the finite values of `name` over the training rows after the first
    `skip` (e.g. 1: the step that compiled), or None without any."""
    values = [r[name] for r in rows[skip:] if r.get(name) is not None
              and math.isfinite(r[name])]
    return sum(values) / len(values) if values else None


def figures(record: RunRecord) -> dict:
    """A finished run's final evaluation figures and its last RL step's train/ values
    (`FinishedRun.final_figures`)."""
    return record.results.final_figures()


def training_rows(record: RunRecord) -> list[dict]:
    """The RL steps of a run's metrics.jsonl, in run order (`FinishedRun.training_rows`)."""
    return record.results.training_rows()


def last_stage_rows(record: RunRecord) -> dict[str, dict]:
    """{stage name: its last metrics row} (an eval stage's held-out figures;
    `FinishedRun.stage_rows`)."""
    return record.results.stage_rows()


def per_seed(runs: StudyRuns, values: Callable[[RunRecord], Mapping[str, float]],
             arms: Sequence[str] | None = None, rename: Callable[[str], str] | None = None
             ) -> dict:
    """{arm: {"seeds", "bases", "metrics": {metric: per-seed values}}} over the finished runs,
    `values(run)` giving a run's metrics; `rename` maps an arm's run name to its summary
    name."""
    out: dict[str, dict] = {}
    for record in runs.runs:
        if not record.finished or (arms is not None and record.arm not in arms):
            continue
        name = rename(record.arm) if rename else record.arm
        entry = out.setdefault(name, {"seeds": [], "bases": [], "rows": []})
        entry["seeds"].append(record.seed)
        entry["bases"].append(record.base)
        entry["rows"].append(dict(values(record)))
    for entry in out.values():
        rows = entry.pop("rows")
        names = sorted({k for row in rows for k in row})
        entry["metrics"] = {k: [row.get(k) for row in rows] for k in names}
    return out


def eval_values(record: RunRecord, metrics: Sequence[str], final: str = "eval_final",
                before: str = "eval_base") -> dict:
    """A run's held-out figures: `metrics` of its last `final` evaluation, and of its
    `before` evaluation as "base_<metric>" (`FinishedRun.eval_values`)."""
    return record.results.eval_values(metrics, final, before)


def add_base_arm(arms: dict, source: str, metrics: Sequence[str], name: str = "base") -> None:
    """Adds the arm `name`: the base model, from `source`'s "base_<metric>" values (each run's
    evaluation before training: every arm of a (base, seed) starts from the same
    parameters, so one arm's runs give the base's figures paired by (base, seed))."""
    if source not in arms:
        return
    entry = arms[source]
    arms[name] = {"seeds": list(entry["seeds"]), "bases": list(entry["bases"]),
                  "metrics": {m: list(entry["metrics"].get(f"base_{m}",
                                                          [None] * len(entry["seeds"])))
                              for m in metrics}}


def constant_arm(arms: dict, like: str, name: str, metric: str, value: float) -> None:
    """Adds to the pseudo-arm `name` (made if new) `value` of `metric` for each (base, seed)
    of `like`: a contrast against it tests a run's value against a fixed bar."""
    if like in arms:
        n = len(arms[like]["seeds"])
        entry = arms.setdefault(name, {"seeds": list(arms[like]["seeds"]),
                                       "bases": list(arms[like]["bases"]), "metrics": {}})
        entry["metrics"][metric] = [value] * n


def cell(values: Sequence[float], scale: float = 100.0, digits: int = 1) -> str:
    """Mean ± the half-width of the 95% t interval over seeds, as a table cell."""
    return sweep.format_interval(interval([v for v in values if v is not None]),
                                 scale, digits)


def paired_cell(stats: dict, scale: float = 100.0, digits: int = 1) -> str:
    """A paired difference (a contrast's diff, ci95, n) as "+d [lo, hi]" (scaled), "+d (n=1)"
    without an interval, "-" without pairs."""
    if not stats.get("n") or not math.isfinite(stats["diff"]):
        return "-"
    lo, hi = stats["ci95"]
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return f"{stats['diff'] * scale:+.{digits}f} (n={stats['n']})"
    return (f"{stats['diff'] * scale:+.{digits}f} [{lo * scale:+.{digits}f}, "
            f"{hi * scale:+.{digits}f}]")


def band(ax, series: Sequence[Sequence[float]], *, label: str, color: str,
         x: Sequence[float] | None = None) -> None:
    """One arm's curve on `ax`: the mean over seeds with a band of ±1 standard deviation
    (series cut to the shortest)."""
    import numpy as np

    series = [s for s in series if len(s)]
    if not series:
        return
    length = min(len(s) for s in series)
    values = np.asarray([list(s)[:length] for s in series], float)
    if np.isnan(values).all():
        return
    steps = np.arange(1, length + 1) if x is None else np.asarray(x)[:length]
    mean = np.nanmean(values, axis=0)
    ax.plot(steps, mean, label=label, color=color)
    if len(values) > 1:
        std = np.nanstd(values, axis=0, ddof=1)
        ax.fill_between(steps, mean - std, mean + std, alpha=0.15, color=color)


def curve_panels(curves: Mapping[str, Sequence[Sequence[dict]]],
                 panels: Sequence[tuple[str, str]], out: str, name: str = "curves.png"
                 ) -> None:
    """`out/name`: one panel per (metric, title) of the training rows over the GRPO steps,
    one band per arm (`curves`: {arm: each finished run's training rows}), mean ± 1 std."""
    import numpy as np

    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.2), squeeze=False)
    for index, (arm, series) in enumerate(curves.items()):
        for ax, (metric, _) in zip(axes[0], panels):
            band(ax, [[r.get(metric, np.nan) for r in rows] for rows in series], label=arm,
                 color=f"C{index}")
    for ax, (_, title) in zip(axes[0], panels):
        ax.set_xlabel("GRPO step")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    save_figure(fig, out, name)


def bar_plot(arms: Mapping[str, dict], metrics: Sequence[tuple[str, str, float]], out: str,
             name: str = "arms.png") -> None:
    """`out/name`: one panel per (metric, title, scale) with each arm's mean over its runs
    and the 95% t interval as an error bar."""
    import numpy as np

    plt = pyplot()
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.6 * len(metrics), 3.4), squeeze=False)
    for ax, (metric, title, scale) in zip(axes[0], metrics):
        labels = [label for label, entry in arms.items() if metric in entry["metrics"]]
        means, halves = [], []
        for label in labels:
            stats = interval([v for v in arms[label]["metrics"][metric] if v is not None])
            means.append(stats["mean"] * scale if stats["n"] else np.nan)
            halves.append((stats["ci95"][1] - stats["ci95"][0]) / 2 * scale
                          if stats["n"] > 1 else 0.0)
        ax.bar(range(len(labels)), np.nan_to_num(means), yerr=np.nan_to_num(halves),
               capsize=4, color=[f"C{i}" for i in range(len(labels))])
        ax.set_xticks(range(len(labels)), [label.replace(" ", "\n", 1) for label in labels],
                      fontsize=7)
        ax.set_title(f"{title}, 95% interval over runs", fontsize=9)
    save_figure(fig, out, name)


def save_figure(fig, out: str, name: str) -> None:
    """Lays `fig` out, writes it to `out/name` (PNG, 120 dpi) and closes it."""
    fig.tight_layout()
    fig.savefig(os.path.join(out, name), dpi=120)
    pyplot().close(fig)


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def load_finished(workdir: str):
    """A finished run's config, task, tokenizer, policy and final parameters
    (`FinishedRun.policy`), for the studies that measure a trained model after the fact."""
    return FinishedRun(workdir).policy


def load_run_params(workdir: str, tokenizer):
    """A run's final parameters as a plain dict (its latest checkpoint), built with
    `tokenizer` (`FinishedRun.params_with`)."""
    return FinishedRun(workdir).params_with(tokenizer)


def eval_seed(config) -> int:
    """The held-out problems' seed of a run's config (`runner.inputs.eval_seed`)."""
    from grpo_jax.runner.inputs import eval_seed as seed_of
    return seed_of(config)
