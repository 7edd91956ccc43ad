"""Does a distilled student carry its teacher's systematic error and style, where GRPO on the
student carries neither?

The bases, per base seed (shared by config hash): distill_vs_rl's three roles (the student,
tiny-300k after the main job's pretraining; the main job's tiny-1m base; the clean teacher,
that base after off_policy's K = 0 GRPO run) and two more, the *planted* ones: the main
job's pretraining on a corpus whose noisy worked solutions always compute subtraction as
addition ("7-3=10", task keyword `systematic_error` = `SYSTEMATIC`) and open their thinking
with a fixed word that carries no correctness (`style_marker` = `MARKER`), then the same
GRPO stage (the planted teacher). Every arm starts from the student:

  distill_clean:    distill_vs_rl's distillation from the clean teacher, without the answer
                    check (`distill.min_accuracy` 0: every well-formed sample is a row)
  distill_planted:  the same from the planted teacher
  verified_clean:   distill_vs_rl's distillation (verified rows only): its run
  verified_planted: the same from the planted teacher
  rl:               distill_vs_rl's GRPO on the student: its run

Measured after training (`measure`): every arm's final policy, the student before training
(each seed's key) and both teachers (the first seed's key, one draw per base) sample
`SAMPLES` completions of `PROBLEMS` held-out problems (the eval seed's; one key per seed,
shared by the arms). Per run: held-out pass@1 over all problems and over the *affected*
ones (those with a subtraction, where the plant applies), `planted_rate` (the share of the
affected problems' completions whose answer is the plant's exact wrong answer,
`arithmetic.systematic_answer`) and `marker_rate` (the share of all completions that write
the marker word).
"""

from __future__ import annotations

import json
import re

from grpo_jax import storage
from grpo_jax.studies import common, tiers

SYSTEMATIC = "-+"  # every subtraction step computed as an addition
MARKER = "so"  # the word that opens the planted traces' thinking
PLANT = {"systematic_error": SYSTEMATIC, "style_marker": MARKER}
ARMS = ("distill_clean", "distill_planted", "verified_clean", "verified_planted", "rl")
STUDENT = "student"  # the student before training, measured with each seed's key
TEACHERS = ("teacher", "planted_teacher")  # base roles, measured once per base
LABELS = {"student": "student (tiny-300k), pretrained",
          "distill_clean": "distilled from the clean teacher",
          "distill_planted": "distilled from the planted teacher",
          "verified_clean": "distilled from the clean teacher, verified rows",
          "verified_planted": "distilled from the planted teacher, verified rows",
          "rl": "GRPO on the student",
          "teacher": "clean teacher (tiny-1m after GRPO)",
          "planted_teacher": "planted teacher (tiny-1m after GRPO)"}
METRICS = ("pass@1", "pass@1_affected", "planted_rate", "marker_rate")
FILE = "distillation_bias.json"
PROBLEMS, SAMPLES = {"full": 256, "mini": 8}, {"full": 8, "mini": 2}
BATCH_ROWS = {"full": 256, "mini": 16}
SPECS = [("distill_planted", "distill_clean", "planted_rate"),
         ("distill_planted", "distill_clean", "marker_rate"),
         ("distill_planted", "distill_clean", "pass@1_affected"),
         ("distill_planted", "distill_clean", "pass@1"),
         ("distill_planted", "rl", "planted_rate"),
         ("distill_planted", "rl", "marker_rate"),
         ("verified_planted", "verified_clean", "planted_rate"),
         ("verified_planted", "verified_clean", "marker_rate"),
         ("rl", STUDENT, "planted_rate")]
ERROR_MARGIN = 0.10  # a tenth of the affected completions on the teacher's exact wrong answer
MARKER_MARGIN = 0.5  # half of the completions writing the marker


def planted(config):
    """`config` with the plant in its task (the noisy worked solutions only: the problems,
    their answers and the rewards are the clean task's)."""
    for key, value in PLANT.items():
        config.task.kwargs[key] = value
    return config


def _planted_teacher(tier: str, roles: dict):
    from grpo_jax.studies import off_policy

    config = planted(off_policy.arm_config(tier, 0))  # distill_vs_rl's teacher's GRPO
    config.model.init_from = roles["planted_main"]
    return config


def base_config(tier: str) -> dict:
    """distill_vs_rl's roles (student, main, teacher: the same runs), then the planted main
    base (the main job's pretraining on the planted corpus) and the planted teacher."""
    from grpo_jax.studies import distill_vs_rl

    roles = distill_vs_rl.base_config(tier)
    roles["planted_main"] = planted(common.main_base(tier))
    roles["planted_teacher"] = lambda built: _planted_teacher(tier, built)
    return roles


def arm_config(arm: str, tier: str = "full"):
    """One arm's run from the student: distill_vs_rl's `rl` or `distill` run, the latter
    without the answer check (`distill_*`) and from the planted teacher (`*_planted`);
    `distill.teacher` names the teacher's role until `attach` sets its workdir."""
    from grpo_jax.studies import distill_vs_rl

    if arm not in ARMS:
        raise ValueError(f"distillation_bias: arm one of {', '.join(ARMS)}, got {arm!r}")
    if arm == "rl":
        return distill_vs_rl.arm_config(tier, "rl")
    config = distill_vs_rl.arm_config(tier, "distill")
    if arm.startswith("distill_"):
        config.distill.min_accuracy = 0.0  # every well-formed sample, right or wrong
    if arm.endswith("_planted"):
        config.distill.teacher = "planted_teacher"
    return config


def arm_configs(tier: str) -> dict:
    return {arm: arm_config(arm, tier) for arm in ARMS}


def attach(config, base: dict) -> None:
    """The student's parameters for every arm; for distillation the workdir of the teacher
    role that `distill.teacher` names ("" : the clean teacher, as distill_vs_rl)."""
    roles = base["roles"]
    config.model.init_from = roles["student"]
    if "distill" in config:
        config.distill.student_init_from = roles["student"]
        config.distill.teacher = roles[config.distill.teacher or "teacher"]


# ---- the measurement --------------------------------------------------------------------------

def affected(operators) -> bool:
    """Whether the plant applies to a problem: it has a step of the confused operator."""
    return SYSTEMATIC[0] in operators


def marked(text: str) -> bool:
    """Whether a completion writes the marker as a word of its own."""
    return MARKER in re.findall(r"[A-Za-z]+", text)


def problem_counts(examples, answers, texts, correct, samples: int) -> list[dict]:
    """Per problem (rows in problem order, `samples` each; `answers`: each row's extracted
    answer or None; `correct`: each row's accuracy reward solved or not): its samples, the
    correct ones, those ending on the plant's exact wrong answer (a numeric match; 0 where
    the plant does not apply) and those writing the marker, and whether the plant applies."""
    from grpo_jax.rewards.accuracy import answers_match
    from grpo_jax.tasks.arithmetic import systematic_answer

    out = []
    for i, ex in enumerate(examples):
        rows = range(i * samples, (i + 1) * samples)
        wrong = str(systematic_answer(ex.meta["operands"], ex.meta["operators"], SYSTEMATIC))
        hit = affected(ex.meta["operators"])  # elsewhere the plant's answer is the true one
        out.append({"question": ex.prompt, "answer": ex.answer, "planted_answer": wrong,
                    "affected": hit, "samples": samples,
                    "correct": sum(bool(correct[r]) for r in rows),
                    "planted": sum(hit and answers_match(answers[r], wrong, symbolic=False)
                                   for r in rows),
                    "marked": sum(marked(texts[r]) for r in rows)})
    return out


def figures(problems: list[dict] | None) -> dict:
    """pass@1 over all problems and over the affected ones, `planted_rate` (the affected
    problems' completions on the plant's wrong answer) and `marker_rate` (all completions);
    None where a figure has no completion to count."""
    if not problems:
        return {m: None for m in METRICS}

    def share(count: str, rows: list[dict]):
        total = sum(p["samples"] for p in rows)
        return sum(p[count] for p in rows) / total if total else None

    hit = [p for p in problems if p["affected"]]
    return {"pass@1": share("correct", problems), "pass@1_affected": share("correct", hit),
            "planted_rate": share("planted", hit), "marker_rate": share("marked", problems)}


def sample_counts(workdir: str, seed: int, tier: str) -> list[dict]:
    """The final policy of the finished run in `workdir` on
    PROBLEMS held-out problems x SAMPLES at temperature 1, with `seed`'s key (shared by every
    policy sampled with that seed): `problem_counts`."""
    import jax

    from grpo_jax.evals import metrics
    from grpo_jax.studies import measure as measure_lib

    setup = measure_lib.held_out(workdir, PROBLEMS[tier])
    run, samples = setup.run, SAMPLES[tier]
    sampling = measure_lib.sampling_config(run, int(run.config.eval_final.max_new_tokens),
                                           group=samples)
    rows = [ex for ex in setup.examples for _ in range(samples)]
    key = jax.random.fold_in(jax.random.key(measure_lib.KEY), seed)
    ro = measure_lib.sample(run, run.params, rows, key,
                            sampling=sampling, weights=measure_lib.WEIGHTS,
                            batch_rows=BATCH_ROWS[tier])
    answers = [run.task.extract_answer(text) for text in ro.texts]
    correct = [bool(v) for v in metrics.solved(ro.components["accuracy"])]
    return problem_counts(setup.examples, answers, ro.texts, correct, samples)


def role_path(runs: common.StudyRuns, role: str, key: str, seed: int) -> str:
    """Where the study keeps a base role's draw with `seed`'s key."""
    return storage.join(runs.root, "base_model", f"{role},{key},seed={seed}.json")


def _write(path: str, problems: list[dict], model: str, seed: int) -> None:
    storage.write_text(path, json.dumps({"model": model, "seed": seed, "problems": problems},
                                        indent=1))


def _load(path: str) -> list[dict] | None:
    return json.loads(storage.read_text(path))["problems"] if storage.isfile(path) else None


def measure(runs: common.StudyRuns) -> None:
    """FILE in every finished run without one; the student's draw with each seed's key and
    each teacher's with the first seed's (`role_path`); a finished draw is not made again."""
    import time

    seeds = sorted({r.seed for r in runs.runs})
    storage.makedirs(storage.join(runs.root, "base_model"))

    def draw(path, workdir, seed):
        t0 = time.time()
        _write(path, sample_counts(workdir, seed, runs.tier), workdir, seed)
        print(f"[studies] distillation_bias: {path} sampled in {time.time() - t0:.0f}s",
              flush=True)

    for key, base in runs.bases.items():
        roles = base["roles"]
        for role, role_seeds in ((STUDENT, seeds), *((t, seeds[:1]) for t in TEACHERS)):
            for seed in role_seeds:
                path = role_path(runs, role, key, seed)
                if not storage.isfile(path):
                    draw(path, roles[role], seed)
    for record in runs.runs:
        path = storage.join(record.workdir, FILE)
        if record.finished and not storage.isfile(path):
            draw(path, record.workdir, record.seed)


# ---- the analysis -----------------------------------------------------------------------------

def analyze(runs: common.StudyRuns) -> common.Analysis:
    arms: dict = {}

    def add(name, base, seed, values):
        entry = arms.setdefault(name, {"seeds": [], "bases": [], "metrics": {
            m: [] for m in METRICS}})
        entry["seeds"].append(seed)
        entry["bases"].append(base)
        for m in METRICS:
            entry["metrics"][m].append(values[m])

    done = set()
    for record in runs.runs:
        path = storage.join(record.workdir, FILE)
        if not (record.finished and storage.isfile(path)):
            continue
        add(record.arm, record.base, record.seed, figures(_load(path)))
        if (record.base, record.seed) not in done:  # the student before training, once
            done.add((record.base, record.seed))
            add(STUDENT, record.base, record.seed,
                figures(_load(role_path(runs, STUDENT, record.base, record.seed))))
    first = min((r.seed for r in runs.runs), default=0)
    teachers = {role: {key: figures(_load(role_path(runs, role, key, first)))
                       for key in runs.bases} for role in TEACHERS}
    arms = {name: arms[name] for name in (STUDENT, *ARMS) if name in arms}
    tier = runs.tier
    return common.Analysis(
        arms=arms, specs=SPECS, table=table(arms, teachers, tier),
        extra={"teachers": teachers, "systematic_error": SYSTEMATIC, "style_marker": MARKER,
               "problems": PROBLEMS[tier], "samples": SAMPLES[tier]},
        protocol={"notes": (
            f"measured after training: {PROBLEMS[tier]} held-out problems x {SAMPLES[tier]} "
            "samples at temperature 1, one key per seed shared by the arms and the student "
            "before training (the teachers: the first seed's key, one draw per base); "
            "affected problems: those with a subtraction")},
        plots=lambda out: plot(arms, out))


def table(arms: dict, teachers: dict, tier: str) -> str:
    from grpo_jax.studies import tables

    lines = ["| policy | runs | pass@1 | pass@1, affected | planted error rate | marker rate |",
             "|---|---|---|---|---|---|"]
    for name in (STUDENT, *ARMS):
        if name in arms:
            cells = tables.metric_row(*METRICS)(arms[name]["metrics"])
            lines.append(f"| {LABELS[name]} | {len(arms[name]['seeds'])} | "
                         + " | ".join(cells) + " |")
    for role in TEACHERS:
        values = teachers.get(role, {})
        cells = [" / ".join("-" if v.get(m) is None else f"{100 * v[m]:.1f}"
                            for v in values.values()) for m in METRICS]
        lines.append(f"| {LABELS[role]}, per base | {len(values)} | " + " | ".join(cells)
                     + " |")
    note = (f"In %: mean ± 95% half-width over (base, seed) runs; the teachers one draw "
            f"per base, base by base. Measured on {PROBLEMS[tier]} held-out problems x "
            f"{SAMPLES[tier]} samples at temperature 1; affected: the problems with a "
            f"subtraction; planted error rate: the affected completions whose answer is "
            f"the plant's exact wrong answer (every subtraction computed as an addition); "
            f"marker rate: the completions that write the word {MARKER!r}.")
    return "\n".join([*lines, "", note]) + "\n"


def plot(arms: dict, out: str) -> None:
    """arms.png: each arm's pass@1 on the affected problems, planted error and marker rate."""
    shown = {LABELS[name]: entry for name, entry in arms.items()}
    common.bar_plot(shown, (("pass@1_affected", "pass@1, affected problems, %", 100.0),
                            ("planted_rate", "planted error rate, %", 100.0),
                            ("marker_rate", "marker rate, %", 100.0)), out)


TUTORIAL = ("the tutorial on policy gradient to R1 (paraphrase: distilling a stronger "
            "teacher's reasoning into a small model is efficient, with the caveat that the "
            "student inherits the teacher's errors and style; DeepSeek-R1, arXiv:2501.12948, "
            "sec. 2.4, the distillation it follows)")
LUKASIK = ("Lukasik et al. 2022, \"Teacher's pet: understanding and mitigating biases in "
           "distillation\", TMLR, arXiv:2106.10494, abstract: \"errors made by the teacher "
           "distribution being transferred to and amplified by the student model\"")
CLAIMS = (
    common.Claim("the distilled student inherits the teacher's errors", TUTORIAL + "; " + LUKASIK
                 + "; tested as the planted error rate of the student distilled (every "
                 "well-formed sample) from the planted teacher against the clean teacher",
                 ("distill_planted", "distill_clean", "planted_rate"), ">",
                 margin=ERROR_MARGIN,
                 can_fail="fails unless the planted-teacher student gives the plant's exact "
                          "wrong answer on at least a tenth more of the affected completions "
                          "(Holm p < 0.05, no base the other way): the student's own "
                          "pretraining computes subtraction right, the teacher's subtraction "
                          "traces are a minority of the rows (the problems with a "
                          "subtraction), and a short SFT may leave the student's arithmetic "
                          "in place"),
    common.Claim("the distilled student inherits the teacher's style", TUTORIAL + "; tested "
                 "as the marker rate of the planted-teacher student against the "
                 "clean-teacher student", ("distill_planted", "distill_clean", "marker_rate"),
                 ">", margin=MARKER_MARGIN, kind="check",
                 can_fail="hardly: the marker opens nearly every sample of the planted teacher "
                          "and so nearly every SFT row, and the clean teacher never writes a "
                          "letter; it shows how much of a pattern on every row SFT copies, not "
                          "whether subtler style transfers"),
    common.Claim("the distilled student inherits the teacher's errors", TUTORIAL + "; tested "
                 "against the other road from the same student, GRPO on it at the same budget "
                 "of samples, which sees no teacher: the planted error rate of the "
                 "planted-teacher student above GRPO's (GRPO cannot carry the teacher's "
                 "errors, it never sees them; its rate is the student's own operator "
                 "confusion after training)", ("distill_planted", "rl", "planted_rate"), ">",
                 margin=ERROR_MARGIN,
                 can_fail="fails if distillation does not carry the error (the first claim's "
                          "failure) or if GRPO on the student sharpens its own operator "
                          "confusion toward the same answer: the student's noisy pretraining "
                          "traces write some subtractions as sums, so the plant's answer is "
                          "in its own distribution"),
    common.Claim("GRPO on the student does not carry the teacher's style", TUTORIAL + "; "
                 "tested as the marker rate of the planted-teacher student against GRPO on "
                 "the student", ("distill_planted", "rl", "marker_rate"), ">",
                 margin=MARKER_MARGIN, kind="check",
                 can_fail="hardly: the GRPO student never saw the marker (no letters in its "
                          "pretraining traces), so its rate is near zero by construction; "
                          "the contrast rests on the distilled student copying the marker"),
)

STUDY = common.Study(
    name="distillation_bias",
    question="does a tiny-300k student distilled from a teacher with a planted systematic "
             "error (subtraction computed as addition) and a style marker carry both, "
             "against the same distillation from a clean teacher and against GRPO on the "
             "student, paired by seed?",
    tiers=tiers.standard(
        full="estimated 1.7 hours on 2 cores, not yet run, when distill_vs_rl's full tier "
             "has run (its student, main base, teacher and its distill and rl runs are "
             "reused): 4 planted bases of 1500 steps (about 9 min each, the main base's "
             "figure), 4 planted teachers (60 GRPO steps, about 2 min), 24 distillation runs "
             "(57-96 s each with their evaluations, distill_vs_rl's figure) and 56 draws of "
             "2,048 completions (about 25 s each, measured on a toy student with the full "
             "sizes, compile included); about 1.5 hours more otherwise",
        mini="about 1 min on 2 cores (measured 51-68 s: a toy student, main base and "
             "teacher, a toy planted base and teacher, 3 toy runs and their draws)",
        mini_arms=("distill_clean", "distill_planted", "rl"), full_sized=True),
    arms=ARMS, base_config=base_config, arm_configs=arm_configs, analyze=analyze,
    attach=attach, measure=measure, claims=CLAIMS,
)
