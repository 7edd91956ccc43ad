"""A study's outputs: summary.json, table.md, the plots and README.md with its generated
design block (from the full tier's configs: `python -m grpo_jax.studies design NAME` writes
it without runs) and results block; `--publish` copies them into experiments/<study>/ and
regenerates experiments/README.md's index of verdicts."""

from __future__ import annotations

import json
import os
import shutil

from grpo_jax import storage
from grpo_jax.studies import summary as summary_lib
from grpo_jax.studies.configs import VOLATILE_FIELDS
from grpo_jax.studies.record import Analysis, Study


def experiments_dir() -> str:
    """The checkout's experiments/ directory (where --publish writes)."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "experiments")


def write_outputs(study: Study, result: dict, analysis: Analysis, out: str) -> None:
    """summary.json, table.md (the study's table, then the contrasts), the plots and
    README.md (experiments/<study>/README.md with the generated design and results blocks)
    into `out`."""
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
    text = replace_design(text, design_block(study))
    storage.write_text(storage.join(out, "README.md"), summary_lib.replace_marked(text, table))


def _hours(seconds: float) -> str:
    """1234 -> "21 min", 5400 -> "1.5 h"."""
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def generated_block(result: dict, analysis: Analysis) -> str:
    """The README's results block: provenance line, the study's table, the contrasts."""
    code = result["provenance"]
    commit = (code.get("commit") or "unknown")[:7] + (" (modified)" if code.get("dirty") else "")
    runs = ", ".join(c[:7] for c in code.get("run_commits", []) if c) or "unknown"
    rule = code.get("verdicts_commit")
    rule = f"; verdicts by the rule at {rule[:7]}" if rule and rule != code.get("commit") else ""
    protocol = result["protocol"]
    fixed = "fixed" if protocol["problems_fixed_across_seeds"] else "not fixed"
    times = f"{code['wall_time_s']:.0f} s"
    if code.get("runs_time_s") is not None:  # the compute, whichever sessions made the runs
        times = (f"its runs' stages {_hours(code['runs_time_s'])}, its bases' "
                 f"{_hours(code.get('bases_time_s') or 0.0)}, the analysing command {times}")
    lines = [(f"Generated from summary.json by `python -m grpo_jax.studies run "
              f"{result['study']} --tier={result['tier']}` (analysis at {commit}{rule}; runs at "
              f"{runs}; {times}). Held-out: {protocol['problems']} problems "
              f"x {protocol['samples_per_problem']} samples, eval seed {protocol['eval_seed']} "
              f"({fixed} across seeds); {len(protocol.get('bases', {})) or 'no'} base(s), "
              f"seeds {protocol['seeds']}."), ""]
    if result.get("verdicts"):
        lines += [("Verdicts (each claim's contrast, by the rule of "
                   "`grpo_jax.studies.summary.verdict_of`, fixed before the runs):"), "",
                  summary_lib.verdict_table(result).rstrip(), ""]
    lines += [TABLE_BEGIN]
    if analysis.table:
        lines += [analysis.table.rstrip()]
    lines += [TABLE_END, ""]
    lines += [("Contrasts (paired by seed; 95% t interval; p from the paired t test; Holm "
               f"over the study's {len(result['contrasts'])} contrasts):"), "",
              summary_lib.contrast_table(result, analysis.scales).rstrip()]
    return "\n".join(lines) + "\n"


TABLE_BEGIN, TABLE_END = "<!-- study-table:begin -->", "<!-- study-table:end -->"


def _study_table(block: str, readme: str) -> str:
    """The study's own table inside a published results block (between the table markers)."""
    if TABLE_BEGIN not in block or TABLE_END not in block:
        raise ValueError(f"{readme}: its results block has no {TABLE_BEGIN} ... {TABLE_END}; "
                         "write it with `python -m grpo_jax.studies run NAME --publish`")
    return block[block.index(TABLE_BEGIN) + len(TABLE_BEGIN):block.index(TABLE_END)].strip("\n")


def reapply_rule(study: Study, folder: str | None = None) -> tuple[list, list] | None:
    """Applies the current claims and verdict rule to experiments/<study>/summary.json's
    stored arms (contrasts and verdicts recomputed; the runs and their measurements as
    published), rewrites summary.json, table.md and the README's results block, and returns
    (verdicts before, verdicts after); None when the study has no full-tier summary."""
    from grpo_jax.runner.report import code_provenance

    folder = folder or os.path.join(experiments_dir(), study.name)
    path = os.path.join(folder, "summary.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        old = json.load(f)
    if old.get("tier") != "full":
        return None
    specs = [(c["a"], c["b"], c["metric"]) for c in old["contrasts"]]
    # a claim added to the design since the runs: its contrast joins the specs and, its arms
    # not run, is left out of the contrasts (its verdict: "its contrast was not run")
    specs += [tuple(claim.test) for claim in study.claims
              if claim.test is not None and tuple(claim.test) not in specs]
    code = code_provenance()
    provenance = {**old["provenance"], "verdicts_commit": code.get("commit")}
    result = summary_lib.build(study=study.name, tier=old["tier"], provenance=provenance,
                               protocol=old["protocol"], arms=old["arms"], specs=specs,
                               extra=old.get("extra"), claims=study.claims,
                               scales=old.get("scales"))
    readme = os.path.join(folder, "README.md")
    with open(readme, encoding="utf-8") as f:
        text = f.read()
    begin, end = text.find(summary_lib.MARK_BEGIN), text.find(summary_lib.MARK_END)
    block = text[begin + len(summary_lib.MARK_BEGIN):end] if 0 <= begin < end else ""
    analysis = Analysis(arms=result["arms"], specs=specs, table=_study_table(block, readme),
                        scales={k: tuple(v) for k, v in result.get("scales", {}).items()})
    with open(path, "w", encoding="utf-8") as f:
        f.write(summary_lib.to_json(result))
    block = generated_block(result, analysis)
    with open(readme, "w", encoding="utf-8") as f:
        f.write(summary_lib.replace_marked(text, block))
    with open(os.path.join(folder, "table.md"), "w", encoding="utf-8") as f:
        f.write(block)  # what write_outputs puts there: the same block as the README's
    return old.get("verdicts", []), result["verdicts"]


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
    print(f"[studies] published {write_index()} (its index of verdicts)", flush=True)


def write_index(folder: str | None = None) -> str:
    """Regenerates `folder`'s (experiments/) README.md index of verdicts; returns its path."""
    folder = folder or experiments_dir()
    index = os.path.join(folder, "README.md")
    with open(index, encoding="utf-8") as f:
        text = f.read()
    with open(index, "w", encoding="utf-8") as f:
        f.write(summary_lib.replace_marked(text, index_table(folder)))
    return index


def index_table(folder: str) -> str:
    """experiments/README.md's index, generated from the published summary.json files: a row
    per claim (the study, the commits its runs ran at, the claim, its verdict and the
    verdict's one-line reason; checks marked), then the tally of the claims whose test could
    have failed (`summary.tally`). A study whose summary.json predates the schema (or is a
    mini tier's) says it is not regenerated, one without any that it has not run yet."""
    from grpo_jax import studies

    lines = ["| study (runs at) | claim | verdict | why |", "|---|---|---|---|"]
    totals: dict[str, int] = {}
    for name in studies.NAMES:
        path = os.path.join(folder, name, "summary.json")
        summary = None
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                summary = json.load(f)
        link = f"[{name}]({name}/README.md)"
        if not summary:
            lines.append(f"| {link} | - | not run yet | - |")
            continue
        if (summary.get("schema", 0) < summary_lib.SCHEMA_VERSION
                or summary.get("tier") != "full"):
            lines.append(f"| {link} | - | not regenerated yet | its README |")
            continue
        runs = ", ".join(f"`{c[:7]}`" for c in summary["provenance"].get("run_commits", [])
                         if c) or "unknown"
        for index, v in enumerate(summary.get("verdicts", [])):
            study = f"{link} ({runs})" if index == 0 else ""
            verdict = f"**{v['verdict']}**"
            if v.get("kind") == "check":
                verdict = f"check: {v['verdict']}"
            why = v["why"].split("; ")[0]
            lines.append(f"| {study} | {short_text(v['claim'])} | {verdict} | "
                         f"{short_text(why, 24)} |")
        for key, count in summary_lib.tally(summary).items():
            totals[key] = totals.get(key, 0) + count
    if totals:
        checks = totals.pop("checks", 0)
        counted = sum(totals.values())
        parts = ", ".join(f"{count} {key}" for key, count in totals.items())
        lines += ["", (f"Claims whose test could have failed: {counted} ({parts}); not counted: "
                       f"{checks} checks (true by construction here) and the claims not "
                       "testable here.")]
    return "\n".join(lines) + "\n"


def short_text(text: str, words: int = 12) -> str:
    parts = text.replace("|", "\\|").split()
    return " ".join(parts[:words]) + (" ..." if len(parts) > words else "")


# The README's design block: what a study runs, generated from its full tier's configs.

DESIGN_BEGIN, DESIGN_END = "<!-- design:begin -->", "<!-- design:end -->"
_LEFT_OUT = ("model.init_from",)  # set per base by the study
_MAX_FIELDS = 8  # differing fields named per arm (the rest counted)


class _Roles(dict):
    """The {role: workdir} a base's role config is a function of, with placeholder paths."""

    def __missing__(self, key):
        return f"<{key}>"


def readme_path(study: Study) -> str:
    """experiments/<study>/README.md."""
    return os.path.join(experiments_dir(), study.name, "README.md")


def design_block(study: Study, tier: str = "full") -> str:
    """The README's design block: the tier's bases (their configs and seeds), its seeds, each
    arm's stages (kind, steps, prompts x completions, new tokens, lr, held-out problems x
    samples) and the fields in which the arms differ, all read from the configs."""
    import copy

    from grpo_jax.studies import configs as configs_lib

    spec = study.tiers[tier]
    every = study.arm_configs(tier)
    names = [a for a in study.arms if a in every and (spec.arms is None or a in spec.arms)]
    arms = {a: configs_lib.for_tier(every[a], tier) for a in names}
    runs = len(arms) * (len(spec.bases) if study.base_config else 1) * len(spec.seeds)
    lines = [f"Generated from the {tier} tier's configs by `python -m grpo_jax.studies design "
             f"{study.name}` (and by `run --publish`); edit the code, not this block.", ""]
    built = {}
    if study.base_config is not None:
        base = study.base_config(tier)
        roles = base if isinstance(base, dict) else {"base": base}
        for role, config in roles.items():
            if callable(config):
                config = config(_Roles())
                if config is None:
                    continue
            built[role] = configs_lib.for_tier_base(copy.deepcopy(config), tier)
        seeds = ", ".join(map(str, spec.bases))
        lines.append(f"- **Bases**: seeds {seeds}; each pretrained once and shared by every "
                     "study asking for the same config.")
        for role, config in built.items():
            label = "" if role == "base" and len(built) == 1 else f"`{role}`: "
            stages = "; ".join(_stage(config, s) for s in config.stages.split(","))
            lines.append(f"  - {label}{_model(config)}; {stages}.")
        differ = _differing(built)
        if differ:
            lines.append("  - the roles differ in " + "; ".join(
                f"`{key}` ({', '.join(f'{r}: {_value(v)}' for r, v in values.items())})"
                for key, values in differ.items()) + ".")
    else:
        lines.append("- **Bases**: none (each arm's config starts from its own model).")
    lines.append(f"- **Seeds** {', '.join(map(str, spec.seeds))} per base: "
                 f"{_count(len(arms), 'arm')} x "
                 f"{_count(len(spec.bases) if study.base_config else 1, 'base')} x "
                 f"{_count(len(spec.seeds), 'seed')} = {runs} runs.")
    groups = _task_groups(arms)
    if len(groups) == 1:
        first = next(iter(arms.values()))
        lines.append(f"- **Held-out set**: {first.task.eval_size} problems of "
                     f"`{first.task.name}`, eval seed {first.task.eval_seed}.")
    else:
        lines.append("- **Held-out sets**, one per task; each arm is compared within its "
                     "task:")
        for task, members in groups.items():
            first = arms[members[0]]
            lines.append(f"  - {task}: {first.task.eval_size} problems, eval seed "
                         f"{first.task.eval_seed}; {_count(len(members), 'arm')}.")
    summaries = {a: {s: _stage(c, s) for s in c.stages.split(",")} for a, c in arms.items()}
    stage_names = list(dict.fromkeys(s for per in summaries.values() for s in per))
    shared = [s for s in stage_names
              if len({per.get(s) for per in summaries.values()}) == 1]
    base_task = next(iter(built.values()), None)
    if base_task is not None:
        task = {k: v for k, v in _flat(base_task).items() if k.startswith("task.")}
        arm_tasks = [{k: v for k, v in _flat(c).items() if k.startswith("task.")}
                     for c in arms.values()]
        unset = _Unset()
        moved = [k for k in dict.fromkeys(k for t in arm_tasks for k in t)
                 if len({repr(t.get(k, unset)) for t in arm_tasks}) == 1
                 and repr(arm_tasks[0].get(k, unset)) != repr(task.get(k, unset))]
        if moved:
            lines.append("- **Task of every arm**, where it differs from the "
                         f"`{next(iter(built))}` base's: " + ", ".join(
                             f"`{k}` = {_value(arm_tasks[0].get(k, unset))} (base: "
                             f"{_value(task.get(k, unset))})" for k in moved) + ".")
    if shared and len(arms) > 1:
        lines.append("- **Stages alike in every arm**:")
        lines += [f"  - {summaries[names[0]][s]}" for s in shared]
    differ = {}  # within each task: the fields in which an arm differs from its task's arms
    for members in groups.values():
        for key, values in _differing({a: arms[a] for a in members}).items():
            differ.setdefault(key, {}).update(values)
    header = "differs from the other arms" + (" of its task" if len(groups) > 1 else "") + " in"
    lines += ["", f"| arm | stages | {header} |", "|---|---|---|"]
    for arm, config in arms.items():
        stages = "; ".join(f"`{s}`" if s in shared and len(arms) > 1 else summaries[arm][s]
                           for s in config.stages.split(","))
        fields = [f"`{key}` = {_value(values[arm])}" for key, values in differ.items()
                  if arm in values]
        if len(fields) > _MAX_FIELDS:
            fields = fields[:_MAX_FIELDS] + [f"{len(fields) - _MAX_FIELDS} more fields"]
        alone = next(len(m) == 1 for m in groups.values() if arm in m)
        cell = ", ".join(fields) or ("-" if len(arms) == 1 else
                                     "its task's only arm" if alone else "its stages")
        row = (arm, stages, cell)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
    keys = [f"{role} `{configs_lib.config_key(c)}`" for role, c in built.items()]
    keys += [f"{arm} `{configs_lib.config_key(c)}`" for arm, c in arms.items()]
    lines += ["", "Config keys (each config's hash before a base and seed are set: a change means "
              "the finished runs of that config are not reused): " + "; ".join(keys) + "."]
    return "\n".join(lines).rstrip() + "\n"


def _task_groups(arms: dict) -> dict[str, list[str]]:
    """{task label: arm names} in the arms' order; the label names the task and, for a task of
    several datasets (reasoning-gym), its datasets."""
    groups: dict[str, list[str]] = {}
    for arm, config in arms.items():
        datasets = config.task.get("kwargs", {}).get("datasets")
        label = f"`{config.task.name}`" + (f" (`{datasets}`)" if datasets else "")
        groups.setdefault(label, []).append(arm)
    return groups


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _model(config) -> str:
    return f"model `{config.model.name}`, task `{config.task.name}`"


# The fields a stage may have that `_stage` says as they are, in its order: (field, the
# words of a stage that has it).
_STAGE_FIELDS = (
    ("num_problems", lambda stage: f"sampling {stage.num_problems} problems x "
                                   f"{stage.num_samples}"),
    ("num_examples", lambda stage: f"{stage.num_examples} examples"),
    ("num_pairs", lambda stage: f"{stage.num_pairs} preference pairs"),
    ("max_new_tokens", lambda stage: f"≤ {stage.max_new_tokens} new tokens"),
    ("lr", lambda stage: f"lr {_value(stage.lr)}"),
    ("critic_lr", lambda stage: f"critic lr {_value(stage.critic_lr)}"),
    ("algorithm", lambda stage: f"{stage.algorithm}"),
)


def _stage(config, name: str) -> str:
    """One stage of a config in words: kind, steps, batch or prompts x completions, the data
    it samples or trains on, new tokens, learning rate, and the policy loss's knobs."""
    stage = config[name]
    kind = stage.get("kind", name)
    parts = []
    if kind == "eval":
        parts.append(f"{config.task.eval_size} held-out problems x {stage.num_samples} samples")
    if "steps" in stage:
        steps = f"{stage.steps} steps"
        if "num_prompts" in stage:
            steps += (f" of {stage.num_prompts} prompts x "
                      f"{_count(stage.group_size, 'completion')}")
        elif "batch_size" in stage:
            steps += f" of batch {stage.batch_size}"
        parts.append(steps)
    parts += [words(stage) for field, words in _STAGE_FIELDS if field in stage]
    if kind == "rl":  # the knobs left unset take the algorithm's defaults
        from grpo_jax.stages.rl import settings

        parts.append(f"β {_value(settings(stage)[1].beta)}")
    elif "beta" in stage:
        parts.append(f"β {_value(stage.beta)}")
    if "num_iterations" in stage and stage.num_iterations != 1:
        parts.append(f"{stage.num_iterations} updates per batch")
    if stage.get("tools"):
        parts.append(f"tools `{stage.tools}`")
    return f"`{name}` ({kind}: {', '.join(parts)})"


def _flat(config, prefix: str = "") -> dict:
    """A config's fields by dotted name, without those that do not change what it computes
    (where caches live, stage sections it does not run, its stage list: shown beside)."""
    out = {}
    run = set(config.stages.split(",")) if not prefix else set()
    for key in config.keys():
        value = config[key]
        if not prefix and (key in VOLATILE_FIELDS or key == "stages" or (
                hasattr(value, "keys") and "kind" in value and key not in run)):
            continue
        if f"{prefix}{key}" in _LEFT_OUT:
            continue
        if hasattr(value, "keys"):
            section = _flat(value, f"{prefix}{key}.")
            if value.get("kind") == "rl":  # unset knobs read as the algorithm's defaults
                from grpo_jax.stages.rl import settings

                resolved = settings(value)[1]
                section = {k: getattr(resolved, k.rsplit(".", 1)[1], v) if v is None else v
                           for k, v in section.items()}
            out.update(section)
        else:
            out[f"{prefix}{key}"] = value
    return out


def _differing(configs: dict) -> dict:
    """{field: {name: value}} for the fields not alike in every config (a field a config
    lacks reads "unset"); a field of a stage not every config runs is compared among the
    configs that run it, and named for those only."""
    flats = {name: _flat(c) for name, c in configs.items()}
    if len(flats) < 2:
        return {}
    runs = {name: set(c.stages.split(",")) for name, c in configs.items()}
    every = set.intersection(*runs.values())
    stages = set.union(*runs.values())
    order = list(dict.fromkeys(k for f in flats.values() for k in f))
    unset = _Unset()
    differ = {}
    for k in order:
        section = k.split(".")[0]
        among = ([n for n in flats if section in runs[n]] if section in stages - every
                 else list(flats))
        values = {n: flats[n].get(k, unset) for n in among}
        if len(values) > 1 and len({repr(v) for v in values.values()}) > 1:
            differ[k] = values
    return differ


class _Unset:
    def __repr__(self):
        return "unset"


def _value(value) -> str:
    if isinstance(value, _Unset):
        return "unset"
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_value(v) for v in value) + ")"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


def replace_design(text: str, block: str) -> str:
    """`text` with its design block replaced by `block`; without one, the block goes right
    under the "## Design" heading (or, without that, before the results block / at the end)."""
    marked = f"{DESIGN_BEGIN}\n{block.rstrip()}\n{DESIGN_END}"
    begin, end = text.find(DESIGN_BEGIN), text.find(DESIGN_END)
    if begin >= 0 and end > begin:
        return text[:begin] + marked + text[end + len(DESIGN_END):]
    heading = text.find("\n## Design")
    if heading >= 0:
        cut = text.index("\n", heading + 1) + 1
        return text[:cut] + "\n" + marked + "\n" + text[cut:]
    results = text.find(summary_lib.MARK_BEGIN)
    section = "## Design (generated)\n\n" + marked + "\n\n"
    if results >= 0:
        return text[:results] + section + text[results:]
    return text.rstrip() + "\n\n" + section


def committed_design(text: str) -> str | None:
    """The design block a README holds (None without one)."""
    begin, end = text.find(DESIGN_BEGIN), text.find(DESIGN_END)
    if begin < 0 or end < begin:
        return None
    return text[begin + len(DESIGN_BEGIN):end].strip("\n") + "\n"


def write_design(study: Study) -> bool:
    """Rewrites experiments/<study>/README.md's design block from the code; True if it
    changed."""
    path = readme_path(study)
    text = f"# {study.name}\n\n{study.question}\n"
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            text = f.read()
    new = replace_design(text, design_block(study))
    if new == text:
        return False
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(new)
    return True


# A README's hand-written words hold no figure of this project's: the study's own numbers
# (steps, sizes, seeds, margins, results) live in the generated blocks, which its code writes.
# What may carry digits there: the **Question** paragraph (the source's own claim and
# figures), quotations, links, citations in parentheses (with a year or an arXiv id), names
# with digits in them (pass@1, tiny-1m, R1, k3, also inside code spans) and list numbering.
_COUNT_WORDS = ("two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|sixteen|twenty|"
                "thirty|forty|fifty|sixty|eighty|hundred|thousand|dozen")
_COUNTED = ("bases?|seeds?|runs?|steps?|arms?|problems?|samples?|completions?|epochs?|"
            "tokens?|points?|rounds?|updates?|passes|prompts?|layers?|betas?|budgets?")


def written_numbers(text: str) -> list[tuple[int, str]]:
    """(line number, the line) for each line of a study README's hand-written text that holds
    a figure of the study's own: a digit outside the allowed places (above), or a count
    spelled out ("two bases", "three seeds")."""
    import re

    lines = text.split("\n")
    skip = set()
    for begin, end in ((DESIGN_BEGIN, DESIGN_END), (summary_lib.MARK_BEGIN, summary_lib.MARK_END)):
        inside = False
        for i, line in enumerate(lines):
            if line.strip() == begin:
                inside = True
            if inside:
                skip.add(i)
            if line.strip() == end:
                inside = False
    in_question = False
    for i, line in enumerate(lines):
        if line.startswith("**Question**"):
            in_question = True
        if in_question:
            skip.add(i)
            if not line.strip():
                in_question = False
        if line.startswith("#"):
            skip.add(i)
    # Quotations and parentheses can span lines: match over the paragraph's joined text.
    found = []
    allowed = re.compile(
        r"\"[^\"]*\"|“[^”]*”|\]\([^)]*\)|https?://\S+|"
        r"\((?=[^()]*(?:\b(?:19|20)\d\d\b|arXiv))[^()]*\)|"
        r"\b[A-Za-z][\w@.\-]*\d[\w.\-]*|^\s*\d+\.\s")
    spelled = re.compile(rf"\b(?:{_COUNT_WORDS})\b(?:[\s-]+[\w-]+)?[\s-]+(?:{_COUNTED})\b",
                         re.I)
    paragraph: list[int] = []

    def flush():
        if not paragraph:
            return
        joined = "\n".join(lines[j] for j in paragraph)
        cleaned = allowed.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), joined)
        cleaned = re.sub(r"(?m)^\s*\d+\.\s", "", cleaned)
        for j, kept in zip(paragraph, cleaned.split("\n")):
            if re.search(r"\d", kept) or spelled.search(kept):
                found.append((j + 1, lines[j]))
        paragraph.clear()

    for i, line in enumerate(lines):
        if i in skip or not line.strip():
            flush()
            continue
        paragraph.append(i)
    flush()
    return found
