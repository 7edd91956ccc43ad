"""A study's outputs: summary.json, table.md, the plots and README.md with its generated
results block; `--publish` copies them into experiments/<study>/ and regenerates
experiments/README.md's index of verdicts."""

from __future__ import annotations

import json
import os
import shutil

from grpo_jax import storage
from grpo_jax.studies import summary as summary_lib
from grpo_jax.studies.record import Analysis, Study


def experiments_dir() -> str:
    """The checkout's experiments/ directory (where --publish writes)."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "experiments")


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
