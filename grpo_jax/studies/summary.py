"""A study's summary.json: one schema for every study, and the tables generated from it.

Top-level keys (`check` enforces them; `SCHEMA_VERSION` is written as `schema`):

    {
      "schema": 1,
      "study": "off_policy",
      "tier": "full" | "mini",
      "provenance": {"commit": "<sha>" | null, "dirty": bool | null, "python": "3.x",
                     "jax": "...", "flax": "...", "argv": [...], "wall_time_s": float,
                     "run_commits": ["<sha>", ...]},        # every commit a run was made at
      "protocol": {"eval_seed": int | null,                 # the held-out problems' seed
                   "problems": int,                         # held-out problems per eval
                   "samples_per_problem": int,
                   "problems_fixed_across_seeds": bool,
                   "bases": {"<base key>": {"seed": int, "config_hash": "..."}},
                   "seeds": [int, ...],                     # the arms' seeds, per base
                   "unit": "seed" | "base",                 # the contrasts' unit of replication
                   "notes": "..."},
      "arms": {"<arm>": {"seeds": [int, ...],               # seed order
                         "bases": ["<base key>", ...],      # the base each seed ran on
                         "metrics": {"<metric>": [float | null, ...]}}},   # one per seed
      "contrasts": [{"a": "<arm>", "b": "<arm>", "metric": "<metric>",
                     "n": int, "unit": "seed" | "base",
                     "diff": float,                         # mean of a - b, paired
                     "ci95": [lo, hi],                      # paired t, n - 1 df
                     "p": float,                            # two-sided paired t test
                     "p_holm": float,                       # Holm over the study's contrasts
                     "per_base": {"<base key>": {"n", "diff", "ci95", "p"}},
                     "between_base_sd": float | NaN}],
      "extra": {...}                                        # the study's own figures
    }

Non-finite numbers are written as null. Values are in the metric's own units (a pass rate
is a fraction in [0, 1]); tables scale them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence

from grpo_jax.studies import stats

__all__ = ["MARK_BEGIN", "MARK_END", "SCHEMA_VERSION", "build", "check", "contrast_table",
           "contrasts", "replace_marked", "to_json"]

SCHEMA_VERSION = 1
MARK_BEGIN = "<!-- results:begin -->"
MARK_END = "<!-- results:end -->"
TOP_LEVEL = ("schema", "study", "tier", "provenance", "protocol", "arms", "contrasts")
PROVENANCE = ("commit", "dirty", "python", "jax", "flax", "argv", "wall_time_s")
PROTOCOL = ("eval_seed", "problems", "samples_per_problem", "problems_fixed_across_seeds")
CONTRAST = ("a", "b", "metric", "n", "diff", "ci95", "p", "p_holm")


def _pairs(arms: dict, a: str, b: str, metric: str) -> dict[str, tuple[list, list]]:
    """{base: (a's values, b's values)} over the (base, seed) pairs both arms have."""
    def keyed(arm):
        entry = arms[arm]
        values = entry["metrics"].get(metric, [None] * len(entry["seeds"]))
        return {(base, seed): v for base, seed, v in zip(entry["bases"], entry["seeds"], values)}

    left, right = keyed(a), keyed(b)
    out: dict[str, tuple[list, list]] = {}
    for key in sorted(set(left) & set(right), key=lambda k: (str(k[0]), k[1])):
        base = str(key[0])
        out.setdefault(base, ([], []))
        out[base][0].append(left[key])
        out[base][1].append(right[key])
    return out


def contrasts(arms: dict, specs: Sequence[tuple[str, str, str]]) -> list[dict]:
    """Each (a, b, metric) as a paired contrast (`stats.nested`: seeds nested in bases), with
    `p_holm` adjusted over all of `specs` (the study's family)."""
    out = []
    for a, b, metric in specs:
        if a not in arms or b not in arms:
            continue
        result = stats.nested(_pairs(arms, a, b, metric))
        per_base = {base: {k: v[k] for k in ("n", "diff", "ci95", "p")}
                    for base, v in result["per_base"].items()}
        out.append({"a": a, "b": b, "metric": metric, "n": result["n"],
                    "unit": result["unit"], "diff": result["diff"], "ci95": result["ci95"],
                    "p": result["p"], "per_base": per_base,
                    "between_base_sd": result["between_base_sd"]})
    for entry, adjusted in zip(out, stats.holm([c["p"] for c in out])):
        entry["p_holm"] = adjusted
    return out


def build(*, study: str, tier: str, provenance: dict, protocol: dict, arms: dict,
          specs: Sequence[tuple[str, str, str]], extra: dict | None = None) -> dict:
    """The summary dict (see the module docstring), contrasts computed from `arms`."""
    found = contrasts(arms, specs)
    units = {c["unit"] for c in found}
    protocol = {**protocol, "unit": units.pop() if len(units) == 1 else "seed"}
    summary = {"schema": SCHEMA_VERSION, "study": study, "tier": tier,
               "provenance": provenance, "protocol": protocol, "arms": arms,
               "contrasts": found}
    if extra:
        summary["extra"] = extra
    check(summary)
    return summary


def check(summary: dict) -> None:
    """Raises ValueError naming the first field that does not follow the schema."""
    for key in TOP_LEVEL:
        if key not in summary:
            raise ValueError(f"summary.json: no {key!r}")
    for key in PROVENANCE:
        if key not in summary["provenance"]:
            raise ValueError(f"summary.json: provenance has no {key!r}")
    for key in PROTOCOL:
        if key not in summary["protocol"]:
            raise ValueError(f"summary.json: protocol has no {key!r}")
    for arm, entry in summary["arms"].items():
        for key in ("seeds", "bases", "metrics"):
            if key not in entry:
                raise ValueError(f"summary.json: arms.{arm} has no {key!r}")
        if len(entry["bases"]) != len(entry["seeds"]):
            raise ValueError(f"summary.json: arms.{arm}: {len(entry['bases'])} bases for "
                             f"{len(entry['seeds'])} seeds")
        for metric, values in entry["metrics"].items():
            if not isinstance(values, list) or len(values) != len(entry["seeds"]):
                raise ValueError(f"summary.json: arms.{arm}.metrics.{metric}: expected one "
                                 f"value per seed ({len(entry['seeds'])})")
    for index, entry in enumerate(summary["contrasts"]):
        for key in CONTRAST:
            if key not in entry:
                raise ValueError(f"summary.json: contrasts[{index}] has no {key!r}")
        for key in ("a", "b"):
            if entry[key] not in summary["arms"]:
                raise ValueError(f"summary.json: contrasts[{index}].{key} = {entry[key]!r} "
                                 "is not an arm")


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalars
        return _clean(value.item())
    return value


def to_json(summary: dict) -> str:
    """summary.json's text: non-finite numbers as null, indented by 2."""
    return json.dumps(_clean(summary), indent=2, allow_nan=False) + "\n"


def _number(value, scale: float, digits: int, signed: bool = False) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value * scale:+.{digits}f}" if signed else f"{value * scale:.{digits}f}"


def _p(value) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.2g}" if value >= 0.001 else "<0.001"


def contrast_table(summary: dict, scales: dict[str, tuple[float, int]] | None = None) -> str:
    """The contrasts as a markdown table: a - b, metric, n (unit), paired difference with its
    95% interval, p and Holm's p, and whether the interval excludes 0 after the adjustment
    (p_holm < 0.05). `scales`: metric -> (factor, digits) for display (default 100, 1 for
    rates named pass@ / maj@ / *_rate, else 1, 4)."""
    scales = scales or {}
    lines = [("| a - b | metric | n | difference [95% interval] | p | p (Holm) | holds after "
              "Holm |"), "|---|---|---|---|---|---|---|"]
    for c in summary["contrasts"]:
        default = (100.0, 1) if re.match(r"(pass|maj)@|.*_rate$|.*accuracy", c["metric"]) \
            else (1.0, 4)
        scale, digits = scales.get(c["metric"], default)
        lo, hi = c["ci95"] if c["ci95"] else (None, None)
        interval = (f"{_number(c['diff'], scale, digits, True)} "
                    f"[{_number(lo, scale, digits, True)}, {_number(hi, scale, digits, True)}]")
        holds = "-" if c.get("p_holm") is None or not math.isfinite(c["p_holm"]) \
            else ("yes" if c["p_holm"] < 0.05 else "no")
        lines.append(f"| {c['a']} - {c['b']} | {c['metric']} | {c['n']} ({c['unit']}) | "
                     f"{interval} | {_p(c['p'])} | {_p(c.get('p_holm'))} | {holds} |")
    return "\n".join(lines) + "\n"


def replace_marked(text: str, generated: str) -> str:
    """`text` with what lies between MARK_BEGIN and MARK_END replaced by `generated`; without
    the markers, a "## Results (generated)" section holding them is appended."""
    block = f"{MARK_BEGIN}\n{generated.rstrip()}\n{MARK_END}"
    begin, end = text.find(MARK_BEGIN), text.find(MARK_END)
    if begin >= 0 and end > begin:
        return text[:begin] + block + text[end + len(MARK_END):]
    return text.rstrip() + "\n\n## Results (generated)\n\n" + block + "\n"
