"""Rewards from running code: GRPO on the code task with the sandboxed test reward, partial
credit against all-or-nothing, and a format-only control.

The code job (configs/code.py, `config_presets.code_job`): the task `code_expression`
(grpo_jax/tasks/code_expression.py) shows three values of a hidden function of x and asks
for a Python expression in x; the answer runs on six hidden inputs in the sandbox
(grpo_jax/tools/sandbox.py: bubblewrap namespaces, a seccomp filter, rlimits), never in the
trainer. Here the task draws all three difficulty levels (five shapes, among them x%a+b,
where an answer of the wrong shape can pass some of the tests) with the additive constant
up to `TASK["max_constant"]`, so that the held-out split holds enough distinct functions
(the job's own draw has a dozen); the prompts' longer numbers take `PROMPT_LEN`.

The base: the code job's pretraining alone (`base_config`: its worked solutions, noisy at
the job's error rates; the full tier's base seeds, `tiers.FULL_BASES`). From each base,
arms of the code job's GRPO stage that differ only in the reward (`rl.rewards`, `REWARDS`;
each lists every correctness reward, weighted 0 where it is not trained on, so both are
logged in every arm):

* `partial` (partial credit, the job's own reward): 1.0 x tests (the fraction of the six
  hidden tests passed) + 0.2 x format;
* `all_or_nothing`: 1.0 x accuracy (1 when all six pass) + 0.2 x format;
* `format_only` (the control, no correctness in the reward): 0.2 x format (GRPO's
  group-normalised advantage does not depend on the scale, so 0.2 is 1.0 here).

Every arm evaluates before and after the GRPO stage on the same held-out problems
(`eval_base`, `eval_final`): pass@1 (all six hidden tests, from the accuracy reward) and
the tests-passed fraction (the mean of the tests reward over the samples), and the format
rate. A malformed answer (the closing answer tag missing: the pretraining corpus's one
malformation) is never run, so it fails every test: the format gates pass@1, and a reward
that only teaches the format raises pass@1 wherever a repaired answer holds a right
expression. So beside pass@1, `pass@1_formatted` = pass@1 / format rate: the pass rate of
the well-formed answers, as long as every passing answer is well formed (a passing answer
has its closing tag; one with text after it would pass and not be well formed). The base's figures are the partial-credit runs' evaluations before GRPO. From the
training rows: the share of groups whose rewards are all equal (`zero_std_groups`: no
gradient from them) and the training tests fraction, averaged over the steps.
"""

from __future__ import annotations

from grpo_jax.studies import common, tables, tiers
from grpo_jax.studies.arms import per_arm, training_means

PARTIAL, BINARY, FORMAT = "partial", "all_or_nothing", "format_only"
# rl.rewards of each arm: {reward: weight}; tests and accuracy run on the same sandbox run
REWARDS = {PARTIAL: {"tests": 1.0, "format": 0.2, "accuracy": 0.0},
           BINARY: {"tests": 0.0, "format": 0.2, "accuracy": 1.0},
           FORMAT: {"tests": 0.0, "format": 0.2, "accuracy": 0.0}}
ARMS = tuple(REWARDS)
# task.kwargs: the five shapes and constants b in 0..49 (86 distinct held-out functions)
TASK = {"difficulty": (1, 2, 3), "max_constant": 49}
# "Q: f(1)=250 f(2)=255 f(4)=265\nA: " and BOS: 34 tokens; the longest worked solution,
# "<think>quadratic</think><answer>5*x*x+49</answer>" and EOS, 22: the completion budget
# gives up 4 of the job's 32 tokens to the prompt, within the model's 64
PROMPT_LEN, MAX_NEW_TOKENS = 36, 28
# the full tier's sizes: held-out problems (of the 86) and samples each; the GRPO stage
EVAL_SIZE, EVAL_SAMPLES = 64, 16
RL_STEPS, RL_PROMPTS = 60, 16
EVAL_METRICS = ("pass@1", "reward/tests", "format_rate")
# pass@1 over the well-formed answers (pass@1 / format_rate), the format gate taken out
FORMATTED = "pass@1_formatted"
TRAIN_METRICS = ("zero_std_groups", "reward/tests", "reward/accuracy")
PASS_MARGIN = 0.03  # held-out pass@1, as the other studies
# the mini tier: the base's pretraining steps (a third of the smoke preset's 150, still
# enough for answers in the format, so the sandbox runs the tests) and held-out problems
MINI_STEPS, MINI_EVAL_SIZE = 50, 16
# the mini tier's arm: partial credit against the base (all_or_nothing and format_only take
# its path with other reward weights; their contrasts are the same code)
MINI_ARMS = (PARTIAL,)
SPECS = [(PARTIAL, FORMAT, "pass@1"), (PARTIAL, BINARY, "pass@1"), (FORMAT, "base", FORMATTED),
         (PARTIAL, "base", "pass@1"), (BINARY, "base", "pass@1"), (FORMAT, "base", "pass@1")]


def _task(config, tier: str):
    """The study's task settings on a code-job config (the mini tier's held-out size
    `MINI_EVAL_SIZE`)."""
    config.task.kwargs.update(TASK)
    config.task.prompt_len = PROMPT_LEN
    for name in ("rl", "eval_base", "eval_final"):
        if name in config:
            config[name].max_new_tokens = MAX_NEW_TOKENS
    config.task.eval_size = EVAL_SIZE if tier == "full" else MINI_EVAL_SIZE
    return config


def code_job(tier: str):
    """`config_presets.code_job` at the tier's preset, imported when a config is built."""
    from grpo_jax import config_presets

    return config_presets.code_job(common.preset(tier))


def base_config(tier: str):
    """The code job's pretraining as a base (the analogue of `common.main_base`)."""
    config = _task(code_job(tier), tier)
    config.stages = "pretrain"
    if tier != "full":
        config.pretrain.steps = MINI_STEPS
    return config


def arm_config(arm: str, tier: str = "full"):
    """One arm's run from the base in model.init_from: the held-out evaluation, the code
    job's GRPO stage on the arm's reward, the evaluation again."""
    config = _task(code_job(tier), tier)
    del config.pretrain
    config.model.init_from = ""  # the base's workdir, set by the study per base
    config.stages = "eval_base,rl,eval_final"
    config.rl.rewards.update(REWARDS[arm])
    if tier == "full":
        config.rl.steps, config.rl.num_prompts = RL_STEPS, RL_PROMPTS
        for name in ("eval_base", "eval_final"):
            config[name].num_samples = EVAL_SAMPLES
    return config


def arm_configs(tier: str) -> dict:
    return {arm: arm_config(arm, tier) for arm in ARMS}


def _values(record) -> dict:
    values = common.eval_values(record, EVAL_METRICS)
    for prefix in ("", "base_"):
        values[prefix + FORMATTED] = formatted_pass(values[prefix + "pass@1"],
                                                    values[prefix + "format_rate"])
    values.update({f"train_{k}": v for k, v in
                   training_means(record, TRAIN_METRICS, skip=0).items()})
    return {_short(k): v for k, v in values.items()}


def formatted_pass(pass_at_1: float | None, format_rate: float | None) -> float | None:
    """pass@1 over the well-formed answers: pass@1 / format rate (a passing answer has its
    closing answer tag, which the strict format also asks for; the ratio counts a passing
    answer outside the strict layout too); None without a well-formed answer or without
    either figure."""
    if pass_at_1 is None or format_rate is None or not format_rate > 0:
        return None
    return pass_at_1 / format_rate


def _short(name: str) -> str:
    """"reward/tests" -> "tests" (and its base_ and train_ forms)."""
    return name.replace("reward/", "")


def analyze(runs: common.StudyRuns) -> common.Analysis:
    arms = per_arm(runs, _values, ARMS)
    common.add_base_arm(arms, PARTIAL, [_short(m) for m in EVAL_METRICS] + [FORMATTED])
    curves = common.arm_curves(runs, ARMS)
    return common.Analysis(arms=arms, specs=SPECS, table=table(arms, runs.runs[0].config),
                           plots=lambda out: plot(arms, curves, out))


def table(arms: dict, config) -> str:
    return tables.arm_table(
        arms, ("base", *ARMS),
        ("pass@1", "pass@1 of well-formed", "tests passed", "format rate",
         "zero-std groups (training)", "tests passed (training)", "accuracy (training)"),
        tables.metric_row("pass@1", FORMATTED, "tests", "format_rate", "train_zero_std_groups",
                          "train_tests", "train_accuracy"),
        "Held-out pass@1 (all six hidden tests pass), pass@1 of the well-formed answers "
        "(pass@1 / format rate), the tests-passed fraction (the mean "
        "share of the six hidden tests a sample passes) and the format rate, in %, over "
        f"{tables.rl_caption(config)} on each reward (the base: before); from the training "
        "rows, averaged over the GRPO steps: the share of groups whose rewards were all "
        "equal (no gradient from them), and the tests-passed fraction and accuracy of the "
        "sampled completions; mean ± 95% half-width over (base, seed) runs.")


def plot(arms: dict, curves: dict, out: str) -> None:
    """arms.png: held-out pass@1 and tests passed per arm; curves.png: the training tests
    fraction, accuracy and zero-std share over the GRPO steps."""
    common.bar_plot(arms, (tables.PASS_AT_1, ("tests", "held-out tests passed, %", 100.0)),
                    out)
    common.curve_panels(curves, (("reward/tests", "training tests passed"),
                                 ("reward/accuracy", "training accuracy"),
                                 ("zero_std_groups", "groups with equal rewards")), out)


TUTORIAL = ("the tutorial on policy gradient to R1 (paraphrase): rewards computed by running "
            "the policy's code (a compiler, unit tests) are verifiable rewards for RL")
VERPO = ("Wang et al. 2026, \"VeRPO: Verifiable Dense Reward Policy Optimization for Code "
         "Generation\", arXiv:2601.03525, abstract of v1 and v2 (quoted)")
PASS_RATE = ("Li et al. 2026, \"Exploring Pass-Rate Reward in Reinforcement Learning for "
             "Code Generation\", arXiv:2605.02944, abstract (quoted)")
SPURIOUS = ("Shao et al. 2025, \"Spurious Rewards: Rethinking Training Signals in RLVR\", "
            "arXiv:2506.10947")
CLAIMS = (
    common.Claim("a reward computed by running the policy's code on tests trains the "
                 "policy to write correct code", TUTORIAL + "; tested as held-out pass@1 "
                 "after GRPO on the tests reward (partial credit, the code job's) against "
                 "GRPO on the format term alone, which both rewards carry: a malformed "
                 "answer fails every test, so against the base the gain would hold what the "
                 "format term alone gives", (PARTIAL, FORMAT, "pass@1"), ">",
                 margin=PASS_MARGIN,
                 can_fail="fails unless partial lies above format_only in held-out pass@1 by "
                          "at least 3.0 points (point estimate), Holm p < 0.05 that way, and "
                          "no base goes the other way; held-out functions are ones the "
                          "base never saw, so GRPO on the training problems may sharpen "
                          "what the base memorised without moving held-out pass@1 beyond "
                          "what repairing the format gives"),
    common.Claim("Mainstream pass/fail outcome rewards enforce functional correctness via "
                 "executing unit tests, but the resulting sparsity limits potential "
                 "performance gains", VERPO + "; tested as held-out pass@1 after GRPO at "
                 "equal steps on the fraction of tests passed (partial credit) against the "
                 "all-or-nothing reward (VeRPO's own dense reward weights the tests and "
                 "adds the outcome; the plain fraction is the usual dense baseline)",
                 (PARTIAL, BINARY, "pass@1"), ">", margin=PASS_MARGIN,
                 can_fail="fails unless partial lies above all_or_nothing in held-out "
                          "pass@1 by at least 3.0 points (point estimate), Holm p < 0.05 "
                          "that way, and no base goes the other way; it fails the other "
                          "way too (all_or_nothing ahead) when partial credit pays for "
                          "answers that agree with the hidden function on some inputs "
                          "only, as Li et al. 2026 argue"),
    common.Claim("despite alleviating reward sparsity, pass-rate rewards do not reliably "
                 "improve final performance over binary rewards", PASS_RATE + "; tested "
                 "as: partial credit and all-or-nothing within the margin of each other in "
                 "held-out pass@1 at equal steps", (PARTIAL, BINARY, "pass@1"), "=",
                 margin=PASS_MARGIN,
                 why="the two rewards differ wherever a group's answers pass some hidden "
                     "tests but not all: on problems the base rarely solves in full, "
                     "all-or-nothing gives groups of equal zeros (no gradient) where partial "
                     "credit still ranks them, and on the x%a+b shape partial credit pays "
                     "answers of another shape that agree on some inputs; either can put "
                     "the arms more than the margin apart in 60 steps"),
    common.Claim("a reward that carries no information about correctness does not raise "
                 "held-out pass@1", "this study's control (the premise of the tutorial's "
                 "verifiable rewards: the reward must check the answer); " + SPURIOUS
                 + ", abstract, report the opposite for a format-only reward on "
                 "Qwen2.5-Math; tested as GRPO on the format reward alone against the base "
                 "in pass@1 of the well-formed answers (pass@1 / format rate), bounded by "
                 "the margin: a malformed answer fails every test, so the format reward "
                 "carries correctness through that gate alone, and plain pass@1 rises with "
                 "the format rate whatever the well-formed answers do (that contrast is "
                 "reported beside it)", (FORMAT, "base", FORMATTED), "<=",
                 margin=PASS_MARGIN, headroom=("base", "format_rate", 1.0),
                 can_fail="fails if the 95% interval of format_only - base in held-out "
                          "pass@1 of the well-formed answers reaches +3.0 points: GRPO on "
                          "the format alone still moves the policy (by the KL and sampling "
                          "drift, and by what the well-formed samples it reinforces have "
                          "in common), which can sharpen the base's likely answers, as "
                          "Shao et al. report; the test is one-sided, so a drop does not "
                          "refute it; not testable here when the base misses the format on "
                          "fewer than 3% of its answers (the reward is then nearly constant "
                          "and leaves the policy where it was by construction)"),
)

STUDY = common.Study(
    name="code_rewards",
    question="does GRPO on a reward from running the policy's code on hidden tests raise "
             "held-out pass@1 over GRPO on the format term alone; does partial credit (the "
             "fraction of tests passed) beat all-or-nothing at equal steps; and does a "
             "format-only reward, which carries no correctness, leave the pass rate of the "
             "well-formed answers where the base has it, paired by seed?",
    tiers=tiers.standard(
        full="about 1.5-2 hours on 2 cores, estimated, not yet run: 4 code-job bases of "
             "1500 pretraining steps, the main base's model and batch, so its 6-9 min each "
             "(0.75 s per step measured here beside other jobs at a load of 8: 19 min); 24 "
             "runs of 60 GRPO steps with two evaluations of 1,024 samples, about 2.5 min "
             "each (an 8-step probe measured beside other jobs at a load of 6-7: 33 s of "
             "compilation, 3.2 s per step, of which the step's 128 sandboxed test runs "
             "take about 2.4 s (timed alone at that load), 20-30 s per "
             "evaluation: 4.6 min for 60 steps, about half of it alone); about 3 hours at "
             "that load",
        mini="about 15 s of CPU on 2 cores, measured (15 s for its test alone, which "
             "compiles every program itself; 13 s wall): a toy base of 50 steps, one seed of "
             "partial credit on 16 held-out problems",
        mini_arms=MINI_ARMS, full_sized=True),
    arms=ARMS, base_config=base_config, arm_configs=arm_configs, analyze=analyze,
    claims=CLAIMS,
)
