"""Does a reward with no information about correctness still raise pass@1?

The main job (configs/default.py: arithmetic, the tiny-1m model) from the main base (1500
pretraining steps; the full tier's base seeds, `tiers.FULL_BASES`), four arms of the same GRPO
stage that differ only in the reward (`rl.rewards`):

* `ground truth`: accuracy + 0.2 x format (the main job's);
* `format`: the strict format reward alone (the tags in order), whatever the answer;
* `random`: a coin flip per (problem, completion) (`rewards.spurious.random_reward`);
* `incorrect`: 1 for a wrong or missing answer, 0 for a right one
  (`rewards.spurious.incorrect_reward`).

These four take one gradient step per batch, where the importance ratio is 1 and the clip
never binds. Two more arms let the mechanism Shao et al. name for the random reward (the
clipped objective's bias towards the base's likely outputs) act: the random reward with four
clipped passes over each batch (`rl.num_iterations = 4`, epsilon 0.2) at learning rate 1e-3
(five times the main job's, so each pass moves the ratios further and the clip binds on
more tokens), and the same without the clip (epsilon 1e6); and the incorrect reward with the
same four clipped passes, where the paper's account of the spurious rewards can act on it
too:

* `random, mu=4`: the random reward, four clipped passes per batch, lr 1e-3;
* `random, mu=4, no clip`: the same, the ratio unclipped;
* `incorrect, mu=4`: the incorrect reward, four clipped passes per batch, lr 1e-3.

Every arm samples and scores on the host (`rl.fused_steps = 0`: the random and incorrect
rewards are not device rewards) and evaluates before and after GRPO on the same held-out
problems. The base's pass@1 is the ground-truth runs' evaluation before GRPO. Each run's
training clip fraction (the share of the tokens of a step's updates where the clip binds,
averaged over the steps) is recorded.
"""

from __future__ import annotations

from grpo_jax.studies import common, jobs, tables, tiers
from grpo_jax.studies.arms import per_arm, training_means

TRUE, FORMAT, RANDOM, INCORRECT = "ground truth", "format", "random", "incorrect"
REWARDS = {TRUE: {"accuracy": 1.0, "format": 0.2}, FORMAT: {"format": 1.0},
           RANDOM: {"random": 1.0}, INCORRECT: {"incorrect": 1.0}}
# the arms with several clipped updates per batch: arm -> (reward arm, passes per batch,
# clip epsilon or None for the algorithm's 0.2, learning rate)
CLIPPED, UNCLIPPED = "random, mu=4", "random, mu=4, no clip"
INCORRECT_CLIPPED = "incorrect, mu=4"
UPDATES = {CLIPPED: (RANDOM, 4, None, 1e-3), UNCLIPPED: (RANDOM, 4, 1e6, 1e-3),
           INCORRECT_CLIPPED: (INCORRECT, 4, None, 1e-3)}
ARMS = (*REWARDS, *UPDATES)
# The mini tier's arms: the ground truth, a spurious reward scored on the host and the
# clipped passes. The format and incorrect rewards take the random reward's path (a host
# reward by name; their scorers: tests/test_spurious_rewards.py) and the unclipped passes
# the clipped one's with another epsilon (updates_per_batch's mini tier runs an unclipped
# arm); their contrasts are the same code.
MINI_ARMS = (TRUE, RANDOM, CLIPPED)
METRICS = ("pass@1", "format_rate", "mean_length")
PASS_MARGIN = 0.03

SPECS = [(RANDOM, "base", "pass@1"), (FORMAT, "base", "pass@1"),
         (INCORRECT, "base", "pass@1"), (TRUE, "base", "pass@1"), (TRUE, RANDOM, "pass@1"),
         (FORMAT, "base", "format_rate"), (CLIPPED, "base", "pass@1"),
         (CLIPPED, UNCLIPPED, "pass@1"), (INCORRECT_CLIPPED, "base", "pass@1")]


base_config = common.main_base


def arm_config(arm: str, tier: str = "full"):
    """One arm's run: the held-out evaluation, the main job's GRPO stage on the arm's reward
    (with the arm's passes per batch, clip and learning rate for the arms of `UPDATES`), the
    evaluation again, from the base in model.init_from."""
    if arm in UPDATES:
        reward, passes, epsilon, lr = UPDATES[arm]
        config = arm_config(reward, tier)
        config.rl.num_iterations, config.rl.epsilon, config.rl.lr = passes, epsilon, lr
        return config
    return jobs.host_rewards(common.main_arm(tier, "eval_base,rl,eval_final"), REWARDS[arm])


def arm_configs(tier: str) -> dict:
    return {arm: arm_config(arm, tier) for arm in ARMS}


def _values(record) -> dict:
    return {**common.eval_values(record, METRICS),
            **training_means(record, ("clip_frac", "kl_ref"))}


def analyze(runs: common.StudyRuns) -> common.Analysis:
    arms = per_arm(runs, _values, ARMS)
    common.add_base_arm(arms, TRUE, METRICS)
    curves = common.arm_curves(runs, ARMS)
    return common.Analysis(arms=arms, specs=SPECS, table=table(arms, runs.runs[0].config),
                           plots=lambda out: plot(curves, out))


def table(arms: dict, config) -> str:
    return tables.arm_table(
        arms, ("base", *ARMS),
        ("pass@1", "format rate", "mean length", "clip fraction (training mean)",
         "KL to the reference (training mean)"),
        tables.metric_row("pass@1", "format_rate", ("mean_length", 1.0, 1), "clip_frac",
                          ("kl_ref", 1.0, 4)),
        "pass@1, format rate and clip fraction in %, mean length in tokens, the KL in nats "
        "per token; mean ± 95% "
        f"half-width over (base, seed) runs, {tables.rl_caption(config)} on each reward (the "
        "base: before; the mu=4 arms: four passes per batch at lr 1e-3). The clip fraction "
        "is the share of the tokens of a step's updates where the clip binds, averaged over "
        "the steps: 0 with one pass per batch and without the clip, by construction.")


def plot(curves: dict, out: str) -> None:
    """curves.png: training accuracy and length over the GRPO steps per reward."""
    common.curve_panels(curves, (("reward/accuracy", "training accuracy (where logged)"),
                                 ("completion_length", "completion length")), out)


SOURCE = ("Shao et al. 2025, \"Spurious Rewards: Rethinking Training Signals in RLVR\", "
          "arXiv:2506.10947, abstract (close paraphrase)")
CLAIMS = (
    common.Claim("RLVR raises performance even with a random reward, one with no correlation "
                 "with the correct answer", SOURCE + "; shown for Qwen2.5-Math",
                 (RANDOM, "base", "pass@1"), ">", margin=PASS_MARGIN,
                 why="with one gradient step per batch the ratio is 1 and the clip never "
                     "binds, so the bias the paper credits cannot act: the coin's "
                     "group-normalised advantages carry nothing about correctness and "
                     "average zero, so the 80 steps are a random walk from the base (the KL "
                     "penalty pulling it back) that can lower pass@1 as readily as raise it",
                 note="the paper finds the effect model-dependent (absent in Llama3, OLMo2)"),
    common.Claim("... with a format-only reward", SOURCE, (FORMAT, "base", "pass@1"), ">",
                 margin=PASS_MARGIN,
                 why="the strict format reward pays the tags whatever the answer, and pass@1 "
                     "needs only a closed answer tag: it can add only the samples that lack "
                     "one (the pretraining traces are malformed 15% of the time) and, once "
                     "repaired, are right; groups that all keep the format carry no "
                     "advantage, and elsewhere a formatted wrong answer is paid as much as a "
                     "right one, so pass@1 can end within the margin of the base or below it"),
    common.Claim("... and with an incorrect-label reward, negatively correlated with the "
                 "correct answer", SOURCE, (INCORRECT, "base", "pass@1"), ">",
                 margin=PASS_MARGIN,
                 why="the reward pays wrong and missing answers, so its advantages push the "
                     "policy off the right answers and out of the format, against pass@1; "
                     "with one pass per batch the clip's bias towards the base's likely "
                     "outputs, which the paper credits, cannot offset that push"),
    common.Claim("... and with an incorrect-label reward, negatively correlated with the "
                 "correct answer", SOURCE + "; tested with four clipped updates per batch at "
                 "lr 1e-3, where the clip the paper credits can bind",
                 (INCORRECT_CLIPPED, "base", "pass@1"), ">", margin=PASS_MARGIN,
                 why="every pass follows the reward's advantages off the right answers and "
                     "out of the format, and four passes at five times the main job's "
                     "learning rate push further than one, while the clip's bias towards "
                     "the base's likely outputs acts only on the tokens where it binds: the "
                     "push can outweigh the bias and leave pass@1 below the base"),
    common.Claim("the spurious rewards' gains nearly match the ground-truth reward's",
                 SOURCE + "; tested on the random reward with a margin of 3 points",
                 (TRUE, RANDOM, "pass@1"), "=", margin=PASS_MARGIN,
                 why="the ground-truth reward pays the right answer directly, on a base "
                     "pretrained on noisy traces that samples the right answer more often "
                     "among 8 samples than in one (operator confusions that sharpening "
                     "removes), while the random arm's advantages carry no correctness and, "
                     "with one pass per batch, no clip bias: the ground truth can end more "
                     "than the margin above it, the more so where the random walk falls "
                     "below the base"),
    common.Claim("RLVR raises performance even with a random reward, one with no correlation "
                 "with the correct answer", SOURCE + "; tested with four clipped updates per "
                 "batch at lr 1e-3, where the clip the paper credits can bind",
                 (CLIPPED, "base", "pass@1"), ">", margin=PASS_MARGIN,
                 why="the clip acts only on the tokens whose ratio leaves 1 ± 0.2 in the "
                     "later passes, a share this design measures but cannot set, while "
                     "every pass at five times the main job's learning rate also moves the "
                     "policy along the coin's zero-mean advantages: the bias towards the "
                     "base's likely outputs (right more often than not on this task, whose "
                     "confusions are rarer than the right step) can be too weak to lift "
                     "pass@1 by the margin before the random steps pull it down"),
    common.Claim("the random reward's gain comes from the clipping bias of the objective, "
                 "which favours the base's likely outputs", SOURCE + " (their analysis of "
                 "the mechanism); tested as: with four updates per batch at lr 1e-3, the "
                 "random reward raises pass@1 more with the clip than without it",
                 (CLIPPED, UNCLIPPED, "pass@1"), ">", margin=PASS_MARGIN,
                 can_fail="fails unless random, mu=4 lies above random, mu=4, no clip in "
                          "pass@1 by at least 3.0 points (point estimate), Holm p < 0.05 "
                          "that way, and no base goes the other way; the clip can only "
                          "bias the updates on the tokens where it binds, so the test means "
                          "something only where random, mu=4's clip fraction (the table) is "
                          "a share of tokens that can move pass@1, which this design "
                          "measures but cannot fix before the runs"),
)

STUDY = common.Study(
    name="spurious_rewards",
    question="does GRPO with a random, a format-only or an incorrect-answer reward still "
             "raise held-out pass@1 over the base, and how close to the ground-truth "
             "reward; and with several clipped updates per batch, does the random reward "
             "gain more with the clip than without it, paired by seed?",
    tiers=tiers.standard(
        full="about 3.3 hours on 2 cores (estimated: 2 main bases of 1500 "
             "steps, shared with the other studies of the main base; 24 "
             "runs of the main job's GRPO stage on host rewards with two "
             "evaluations, 40 min; 18 runs of four passes per batch, "
             "about 8 min each as updates_per_batch's mu = 4, 2.4 hours)",
        mini="about 20 s of CPU on 2 cores, measured (18-19 s for its test alone, which "
             "compiles every program itself): one toy base, one seed of the ground truth, "
             "random and random mu=4 arms",
        mini_arms=MINI_ARMS),
    arms=ARMS, base_config=base_config, arm_configs=arm_configs, analyze=analyze, claims=CLAIMS,
)
