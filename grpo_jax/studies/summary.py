"""A study's summary.json: one schema for every study, and the tables generated from it.

Top-level keys (`check` enforces them; `SCHEMA_VERSION` is written as `schema`):

    {
      "schema": 1,
      "study": "off_policy",
      "tier": "full" | "mini",
      "provenance": {"commit": "<sha>" | null, "dirty": bool | null, "python": "3.x",
                     "jax": "...", "flax": "...", "argv": [...], "wall_time_s": float,
                     "run_commits": ["<sha>", ...],         # every commit a run was made at
                     "runs_time_s": float,                   # its runs' stages (report.json)
                     "bases_time_s": float,                  # its bases' stages
                     "run_machines": ["<cpu> (<isa>[, capped at <set>])", ...]},  # runs, bases
      "protocol": {"eval_seed": int | null,                 # the held-out problems' seed
                   "problems": int,                         # held-out problems per eval
                   "samples_per_problem": int,
                   "problems_fixed_across_seeds": bool,
                   "bases": {"<base key>": {"seed": int, "config_hash": "...",
                                            "roles": {"<role>": "<base dir>"},
                                            "last_loss": {"<role>": float | null}}},
                                                            # last_loss: each role's last
                                                            # training loss, its weights'
                                                            # fingerprint (runs.last_loss)
                   "seeds": [int, ...],                     # the arms' seeds, per base
                   "unit": "seed" | "base",                 # the contrasts' unit of replication
                   "notes": "..."},
      "arms": {"<arm>": {"seeds": [int, ...],               # seed order
                         "bases": ["<base key>", ...],      # the base each seed ran on
                         "metrics": {"<metric>": [float | null, ...]}}},   # one per seed
      "contrasts": [{"a": "<arm>", "b": "<arm>", "metric": "<metric>",
                     "n": int,                              # (base, seed) pairs
                     "unit": "seed" | "seed in base",       # one base | bases as blocks
                     "df": int,                             # n - number of bases
                     "diff": float,                         # mean of a - b, paired
                     "ci95": [lo, hi],                      # paired t, df degrees of freedom
                     "p": float,                            # two-sided paired t test
                     "p_holm": float,                       # Holm over the study's contrasts
                     "per_base": {"<base key>": {"n", "diff", "ci95", "p"}},
                     "across_bases": {"n", "diff", "ci95", "p"},  # one value per base
                     "between_base_sd": float | NaN,
                     "interaction": {"F", "df1", "df2", "p"}}],  # base x arm
                                                            # (stats.interaction)
      "verdicts": [{"claim", "source", "a", "b", "metric",   # the study's claims, each
                    "expect": ">" | "<" | "=" | "<=" | ">=",  # tested by one contrast by
                    "margin": float | null,                # a rule fixed before the runs
                    "kind": "claim" | "check",             # a check: true by construction
                    "can_fail": "...",                     # how the test could fail here
                    "headroom": float | null,              # largest effect the base allows
                    "verdict": "reproduced" | "below the margin" | "not reproduced"
                               | "not resolved" | "not testable here" | "not run",
                    "result": "...", "why": "..."}],       # result: both readings
      "extra": {...},                                       # the study's own figures
      "scales": {"<metric>": [factor, digits]}              # optional: tables' display
    }

A verdict follows from its contrast by `verdict_of` (see there), so the README's verdict table,
generated from summary.json, cannot say more than the numbers. `tally` counts only the claims
whose test could have failed: checks and claims not testable here stand apart.

Non-finite numbers are written as null. Values are in the metric's own units (a pass rate
is a fraction in [0, 1]); tables scale them.
"""

from __future__ import annotations

import json
import math
import re
import dataclasses
import functools
from collections.abc import Sequence

from grpo_jax import stats

__all__ = ["Claim", "KINDS", "MIN_BASES", "MARK_BEGIN", "MARK_END", "SCHEMA_VERSION", "VERDICTS", "build", "check",
           "contrast_table", "contrasts", "headroom_of", "replace_marked", "tally", "to_json", "verdict_of",
           "verdict_table"]

SCHEMA_VERSION = 3
MARK_BEGIN = "<!-- results:begin -->"
MARK_END = "<!-- results:end -->"
TOP_LEVEL = ("schema", "study", "tier", "provenance", "protocol", "arms", "contrasts")
PROVENANCE = ("commit", "dirty", "python", "jax", "flax", "argv", "wall_time_s")
PROTOCOL = ("eval_seed", "problems", "samples_per_problem", "problems_fixed_across_seeds")
CONTRAST = ("a", "b", "metric", "n", "diff", "ci95", "p", "p_holm")
VERDICTS = ("reproduced", "below the margin", "not reproduced", "not resolved",
            "not testable here", "not run")
ALPHA = 0.05


EXPECTS = (">", "<", "=", "<=", ">=", "!=")
KINDS = ("claim", "check")
MIN_BASES = 4  # bases a verdict needs when its bases disagree by more than the margin


@dataclasses.dataclass(frozen=True)
class Claim:
    """A claim a study tests, fixed before its runs.

    `text`: the claim as its source states it (a quotation or a close paraphrase, said
    which in `source`); `source`: paper, section. `test`: the contrast (a, b, metric) that
    tests it, one of the study's contrasts. `expect`: what the claim predicts of a - b:
    ">" (a above b), "<" (a below b), "=" (no difference), "<=" (a not above b by the
    margin or more: "bounded by"), ">=" (a not below b by the margin or more) or "!=" (a
    differs from b, either way: a claim of a difference whose sign the source does not
    give).
    `margin`: the smallest difference that would matter, in the metric's units (every
    testable claim has one): a directional claim is reproduced only when its effect reaches
    it; an interval inside (-margin, margin) reproduces "=" and refutes ">" / "<".
    `kind`: "claim" (its test could have failed) or "check" (true by construction here: a
    penalty lowers what it penalises, a cap caps; shown apart and never counted as a
    reproduction). `can_fail`: how the test could fail here, stated before the runs; for a
    check, why it cannot (required); for a claim, generated from the rule when empty.
    `why`: for a claim, how this design could give the other answer (what in the task, the
    base or the arms could make the effect miss its margin or turn), stated before the
    runs; `failure()` puts it before the rule's statement (set `why` or `can_fail`, not
    both).
    `headroom`: (arm, metric, bound) for a claim near a ceiling: the largest effect the base
    allows is |bound - the arm's mean|, computed from the base arm; below the margin the
    verdict is "not testable here". `untestable`: why this miniature cannot test it (the
    verdict is then "not testable here", `test` may be None). `note`: a caveat fixed with
    the claim (e.g. "the base already does this")."""
    text: str
    source: str
    test: tuple[str, str, str] | None
    expect: str = ">"
    margin: float | None = None
    untestable: str = ""
    note: str = ""
    kind: str = "claim"
    can_fail: str = ""
    headroom: tuple[str, str, float] | None = None
    why: str = ""

    def __post_init__(self):
        if self.expect not in EXPECTS:
            raise ValueError(f"Claim.expect: one of {', '.join(EXPECTS)}, got {self.expect!r}")
        if self.kind not in KINDS:
            raise ValueError(f"Claim.kind: one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.test is None and not self.untestable:
            raise ValueError(f"Claim {self.text[:40]!r}: no test and no reason it is "
                             "untestable")
        if not self.untestable and (self.margin is None or not self.margin > 0):
            raise ValueError(f"Claim {self.text[:40]!r}: a testable claim needs a margin > 0 "
                             "(the smallest difference that would matter)")
        if self.kind == "check" and not self.can_fail:
            raise ValueError(f"Claim {self.text[:40]!r}: a check says in can_fail why its "
                             "test cannot fail")
        if self.why and (self.can_fail or self.kind == "check" or self.untestable):
            raise ValueError(f"Claim {self.text[:40]!r}: `why` goes with the rule's statement "
                             "of a testable claim; a check, an untestable claim or a "
                             "can_fail of its own takes can_fail alone")
        if self.headroom is not None and len(self.headroom) != 3:
            raise ValueError(f"Claim {self.text[:40]!r}: headroom is (arm, metric, bound)")

    def failure(self, scales: dict | None = None) -> str:
        """`can_fail`, or the rule's own statement of how this claim's test could fail,
        after `why` ("why; rule") when the claim has one; the margin shown at the study's
        display scale (`scales`: metric -> (factor, digits))."""
        if self.can_fail or self.untestable:
            return self.can_fail or "not tested here"
        rule = self._rule(scales)
        return f"{self.why}; {rule}" if self.why else rule

    def _rule(self, scales: dict | None) -> str:
        a, b, metric = self.test
        m = _number(self.margin, *_scale(metric, scales))
        if self.expect in (">", "<"):
            word = "above" if self.expect == ">" else "below"
            return (f"fails unless {a} lies {word} {b} in {metric} by at least {m} (point "
                    f"estimate), Holm p < {ALPHA} that way, and no base goes the other way")
        if self.expect == "=":
            return f"fails if the 95% interval of {a} - {b} in {metric} reaches past ±{m}"
        if self.expect == "!=":
            return (f"fails unless {a} - {b} in {metric} lies at least {m} from zero either "
                    f"way (point estimate), Holm p < {ALPHA}, and no base goes the other way")
        side = "+" if self.expect == "<=" else "-"
        return f"fails if the 95% interval of {a} - {b} in {metric} reaches {side}{m}"


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
        across = {k: result["across_bases"][k] for k in ("n", "ci95", "p")}
        across["diff"] = result["across_bases"]["mean"]
        out.append({"a": a, "b": b, "metric": metric, "n": result["n"],
                    "unit": result["unit"], "df": result["df"], "diff": result["diff"],
                    "ci95": result["ci95"], "p": result["p"], "per_base": per_base,
                    "across_bases": across, "between_base_sd": result["between_base_sd"],
                    "interaction": result["interaction"]})
    for entry, adjusted in zip(out, stats.holm([c["p"] for c in out])):
        entry["p_holm"] = adjusted
    return out


def build(*, study: str, tier: str, provenance: dict, protocol: dict, arms: dict,
          specs: Sequence[tuple[str, str, str]], extra: dict | None = None,
          claims: Sequence[Claim] = (), scales: dict | None = None) -> dict:
    """The summary dict (see the module docstring), contrasts computed from `arms`, the
    claims' verdicts from the contrasts; `scales` (metric -> (factor, digits), the tables'
    display) is kept so the tables can be written again from summary.json alone."""
    for claim in claims:
        if claim.test is not None and tuple(claim.test) not in {tuple(x) for x in specs}:
            raise ValueError(f"{study}: the claim {claim.text[:50]!r} is tested by "
                             f"{claim.test}, which is not one of the study's contrasts")
    found = contrasts(arms, specs)
    units = {c["unit"] for c in found}
    protocol = {**protocol, "unit": units.pop() if len(units) == 1 else "seed"}
    summary = {"schema": SCHEMA_VERSION, "study": study, "tier": tier,
               "provenance": provenance, "protocol": protocol, "arms": arms,
               "contrasts": found}
    if scales:
        summary["scales"] = {k: list(v) for k, v in scales.items()}
    summary["verdicts"] = verdicts(summary, claims)
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
    for index, entry in enumerate(summary.get("verdicts", [])):
        if entry.get("verdict") not in VERDICTS:
            raise ValueError(f"summary.json: verdicts[{index}].verdict = "
                             f"{entry.get('verdict')!r}; expected one of {VERDICTS}")
        if entry.get("kind") not in KINDS:
            raise ValueError(f"summary.json: verdicts[{index}].kind = {entry.get('kind')!r}; "
                             f"expected one of {KINDS}")
        if not isinstance(entry.get("can_fail"), str) or not entry["can_fail"]:
            raise ValueError(f"summary.json: verdicts[{index}] has no can_fail statement")


def verdict_of(claim: Claim, contrast: dict | None, headroom: float | None = None,
               scales: dict | None = None) -> tuple[str, str]:
    """(verdict, why) of `claim` from its contrast (a summary.json contrast entry); figures in
    `why` at the study's display scale (`scales`: metric -> (factor, digits)).

    The rule, in order. "not run" without a contrast (its arms have not run; not counted).
    "not testable here" when the claim says so, or when `headroom` (the
    largest effect the base allows) is below the margin. "not resolved" when two or three
    bases disagree: their own mean differences spread by more than the margin and lie on
    both sides of it (one base alone would reproduce, another not; such a verdict needs
    `MIN_BASES` bases). For expect ">" (mirrored for "<"): "reproduced" when Holm's p <
    0.05, the difference is positive, reaches the margin (the point estimate; `why` says
    whether the interval's near end clears it too) and no base's own mean difference is
    negative; "below the margin" when all that holds but the difference falls short of the
    margin; "not reproduced" when Holm's p < 0.05 the other way, or the interval's far end
    lies short of the margin (no effect that matters fits the data); otherwise "not
    resolved". For "=": reproduced when the interval lies inside (-margin, margin); not
    reproduced when Holm's p < 0.05 and the difference lies beyond the margin (the point
    estimate, the standard ">" reproduces by); otherwise not resolved (a significant
    difference inside the margin included). For "<=" (mirrored for ">="):
    reproduced when the interval's upper end is below +margin, not reproduced when its lower
    end is above +margin, otherwise not resolved. For "!=": as ">" or "<" in the direction
    the difference took, except that "not reproduced" is the interval inside (-margin,
    margin) without Holm p < 0.05 (no difference that matters either way)."""
    if claim.untestable:
        return "not testable here", claim.untestable
    if contrast is None:
        return "not run", "its contrast was not run"
    scale, digits = _scale(contrast["metric"], scales)

    def show(value, signed=True):
        return _number(value, scale, digits, signed)

    margin = claim.margin
    if headroom is not None and math.isfinite(headroom) and headroom < margin:
        where = (f"{claim.headroom[0]}'s {claim.headroom[1]}" if claim.headroom
                 else "the base")  # the arm the room is computed from
        return "not testable here", (f"a ceiling: {where} leaves room for at most "
                                     f"{show(headroom, False)}, below the margin "
                                     f"{show(margin, False)}")
    diff, (lo, hi), p_holm = contrast["diff"], contrast["ci95"], contrast.get("p_holm")
    finite = all(v is not None and math.isfinite(v) for v in (diff, lo, hi, p_holm))
    if not finite:
        return "not resolved", "no spread to test (fewer than two pairs)"
    bases = [v["diff"] for v in contrast.get("per_base", {}).values()
             if v.get("diff") is not None and math.isfinite(v["diff"])]
    spread = max(bases) - min(bases) if len(bases) > 1 else 0.0
    if 1 < len(bases) < MIN_BASES and spread > margin and len(
            {_side(claim, d) for d in bases}) > 1:
        return "not resolved", (f"the bases disagree: their effects differ by "
                                f"{show(spread, False)}, more than the margin "
                                f"{show(margin, False)}, on both sides of it; a verdict needs at "
                                f"least {MIN_BASES} bases (has {len(bases)})")
    significant = p_holm < ALPHA
    inside = -margin < lo and hi < margin
    plus_minus = f"±{show(margin, False)}"
    if claim.expect == "=":
        if inside:
            return "reproduced", f"the 95% interval lies inside {plus_minus}"
        if significant and not _side(claim, diff):  # beyond the margin
            return "not reproduced", (f"Holm p {_p(p_holm)} < {ALPHA}: a difference, "
                                      f"{show(diff)}, beyond {plus_minus}")
        if significant:
            return "not resolved", (f"Holm p {_p(p_holm)} < {ALPHA}, but the difference "
                                    f"{show(diff)} lies inside {plus_minus} and the interval "
                                    "reaches past it")
        return "not resolved", f"the interval reaches past {plus_minus}"
    if claim.expect in ("<=", ">="):
        sign = 1.0 if claim.expect == "<=" else -1.0
        near, far = (hi, lo) if sign > 0 else (-lo, -hi)
        bound = f"{'+' if sign > 0 else '-'}{show(margin, False)}"
        if near < margin:
            side = "below" if sign > 0 else "above"
            return "reproduced", f"the 95% interval lies {side} {bound}"
        if far > margin:
            side = "above" if sign > 0 else "below"
            return "not reproduced", f"the 95% interval lies {side} {bound}"
        return "not resolved", f"the 95% interval reaches past {bound}"
    if claim.expect == "!=" and inside and not significant:
        return "not reproduced", (f"the 95% interval lies inside {plus_minus}: no difference "
                                  "that matters either way")
    if claim.expect == "!=":
        sign = 1.0 if diff >= 0 else -1.0  # the direction the difference took
    else:
        sign = 1.0 if claim.expect == ">" else -1.0
    bound = f"{'+' if sign > 0 else '-'}{show(margin, False)}"
    effect, near, far = diff * sign, min(lo * sign, hi * sign), max(lo * sign, hi * sign)
    against = [d for d in bases if d * sign < 0]
    if significant and effect > 0:
        if against:
            return "not resolved", (f"Holm p {_p(p_holm)}, but {len(against)} of "
                                    f"{len(bases)} bases go the other way")
        agree = f"; the same sign on all {len(bases)} bases" if len(bases) > 1 else ""
        if effect < margin:
            return "below the margin", (f"Holm p {_p(p_holm)} < {ALPHA}{agree}, but "
                                        f"{show(diff)} falls short of the margin {bound}")
        clears = "clears it" if near >= margin else "does not clear it"
        return "reproduced", (f"Holm p {_p(p_holm)} < {ALPHA}{agree}; {show(diff)} reaches "
                              f"the margin {bound} (the interval's near end {clears})")
    if significant:
        return "not reproduced", f"Holm p {_p(p_holm)} < {ALPHA}, in the other direction"
    if far < margin and claim.expect != "!=":  # "!=": the other way may still reach it
        return "not reproduced", (f"the 95% interval stops short of {bound}: "
                                  "no effect that matters")
    return "not resolved", f"Holm p {_p(p_holm)} ≥ {ALPHA} (raw p {_p(contrast['p'])})"


def _side(claim: Claim, effect: float) -> bool:
    """Whether one base's mean difference alone lies on the claim's side of its margin: at or
    beyond it in the claimed direction (">", "<") or either way ("!="), inside it ("="),
    short of it ("<=", ">=")."""
    if claim.expect == ">":
        return effect >= claim.margin
    if claim.expect == "<":
        return -effect >= claim.margin
    if claim.expect == "=":
        return abs(effect) < claim.margin
    if claim.expect == "!=":
        return abs(effect) >= claim.margin
    return effect < claim.margin if claim.expect == "<=" else -effect < claim.margin


def headroom_of(claim: Claim, arms: dict) -> float | None:
    """The largest effect `claim`'s base allows, |bound - the mean of arm's metric| (None
    without `claim.headroom` or without finite values)."""
    if claim.headroom is None:
        return None
    arm, metric, bound = claim.headroom
    values = [v for v in arms.get(arm, {}).get("metrics", {}).get(metric, [])
              if v is not None and math.isfinite(v)]
    return abs(bound - sum(values) / len(values)) if values else None


def verdicts(summary: dict, claims: Sequence[Claim]) -> list[dict]:
    """Each claim with its contrast's result in both readings (bases as blocks; bases as the
    unit, with the base x arm interaction) and `verdict_of`'s verdict."""
    out = []
    scales = summary.get("scales")
    for claim in claims:
        found = None
        if claim.test is not None:
            a, b, metric = claim.test
            found = next((c for c in summary["contrasts"]
                          if (c["a"], c["b"], c["metric"]) == (a, b, metric)), None)
        headroom = headroom_of(claim, summary["arms"])
        verdict, why = verdict_of(claim, found, headroom, scales)
        if claim.note:
            why = f"{why}; {claim.note}"
        a, b, metric = claim.test if claim.test is not None else (None, None, None)
        result = "-"
        if found is not None:
            show = functools.partial(_show, metric=metric, scales=scales)
            lo, hi = found["ci95"]
            result = (f"{a} - {b}, {metric}: {show(found['diff'])} [{show(lo)}, {show(hi)}]"
                      f" (n = {found['n']})")
            across = found.get("across_bases") or {}
            if across.get("n", 0) > 1:
                alo, ahi = across["ci95"]
                result += (f"; bases as the unit: {show(across['diff'])} [{show(alo)}, "
                           f"{show(ahi)}] (n = {across['n']}), base x arm p "
                           f"{_p((found.get('interaction') or {}).get('p'))}")
        out.append({"claim": claim.text, "source": claim.source, "a": a, "b": b,
                    "metric": metric, "expect": claim.expect, "margin": claim.margin,
                    "kind": claim.kind, "can_fail": claim.failure(scales),
                    "headroom": headroom,
                    "verdict": verdict, "result": result, "why": why})
    return out


def tally(summary: dict) -> dict:
    """{verdict: count} over the claims whose test could have failed (kind "claim", neither
    "not testable here" nor "not run"); checks apart under "checks"."""
    counts = {v: 0 for v in VERDICTS if v not in ("not testable here", "not run")}
    checks = 0
    for v in summary.get("verdicts", []):
        if v.get("kind", "claim") == "check":
            checks += 1
        elif v["verdict"] in counts:
            counts[v["verdict"]] += 1
    counts["checks"] = checks
    return counts


def verdict_table(summary: dict) -> str:
    """The verdicts as the table "claim (source) | our result | verdict, and why"; checks
    (true by construction here) in a table of their own below the claims."""
    head = ["| claim (source) | our result | verdict, and why |", "|---|---|---|"]
    claims = [v for v in summary.get("verdicts", []) if v.get("kind", "claim") == "claim"]
    checks = [v for v in summary.get("verdicts", []) if v.get("kind") == "check"]

    def row(v):
        return (f"| \"{v['claim']}\" ({v['source']}) | {v['result']} | "
                f"**{v['verdict']}**: {v['why']} |")

    lines = head + [row(v) for v in claims]
    if checks:
        lines += ["", "Checks (true by construction here, so not counted as reproductions):",
                  "", "| check (source) | our result | outcome, and why it could not fail |",
                  "|---|---|---|"]
        lines += [row(v)[:-2] + f"; {v['can_fail']} |" for v in checks]
    return "\n".join(lines) + "\n"


def _show(value, metric: str, scales: dict | None = None) -> str:
    return _number(value, *_scale(metric, scales), True)


def _scale(metric: str, scales: dict | None = None) -> tuple[float, int]:
    """(factor, digits) to show `metric` with: the study's own (`scales`), else 100 and one
    digit for a rate (pass@k, maj@k, *_rate, accuracy), else 1 and four."""
    if scales and metric in scales:
        factor, digits = scales[metric]
        return float(factor), int(digits)
    return (100.0, 1) if re.match(r"(pass|maj)@|.*_rate$|.*accuracy", metric or "") \
        else (1.0, 4)


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
    lines = [("| a - b | metric | n | difference [95% interval] | p | p (Holm) | holds after "
              "Holm |"), "|---|---|---|---|---|---|---|"]
    for c in summary["contrasts"]:
        scale, digits = _scale(c["metric"], scales)
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
