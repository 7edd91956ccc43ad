"""pretrain.solution_fraction (the pretraining_vs_rl study's option): a share of the pretraining
corpus's rows kept as worked solutions, the others filler made of their own pieces; and the
study's configs, roles and gain, against hand-computed values."""

from __future__ import annotations

import types

import numpy as np
import pytest

from grpo_jax.config_presets import main_job
from grpo_jax.runner import ConfigError, validate
from grpo_jax.stages import KINDS
from grpo_jax.stages import supervised
from grpo_jax.stages.supervised import shuffled_text, with_filler
from grpo_jax.text import TAG_TOKENS, CharTokenizer

ROW = ("Q: 7+5*3\nA: ", "<think>5*3=15 7+15=22</think><answer>22</answer>")


def _corpus(n: int) -> tuple[list[str], list[str]]:
    return [f"Q: {i}+1\nA: " for i in range(n)], [
        f"<think>{i}+1={i + 1}</think><answer>{i + 1}</answer>" for i in range(n)]


@pytest.mark.parametrize("n, fraction, kept", [
    (8, 0.25, 2),  # 2 of 8
    (10, 0.3, 3),  # 0.3 x 10 = 2.9999999999999996 in floats: rounded, not truncated
    (5, 0.5, 2),  # 2.5: Python's round, half to even
    (7, 0.5, 4),  # 3.5: half to even
    (4, 0.0, 0),
    (4, 1.0, 4),
    (0, 0.25, 0),
])
def test_kept_rows_by_hand(n, fraction, kept):
    prompts, completions = _corpus(n)
    out_prompts, out_completions = with_filler(prompts, completions, fraction, seed=3,
                                               units=TAG_TOKENS)
    assert out_prompts[:kept] == prompts[:kept]
    assert out_completions[:kept] == completions[:kept]
    assert out_prompts[kept:] == [""] * (n - kept)  # filler has no prompt
    assert all(a != b for a, b in zip(out_completions[kept:], completions[kept:]))


def test_one_keeps_the_corpus_and_draws_nothing():
    prompts, completions = _corpus(6)
    out = with_filler(prompts, completions, 1.0, seed=0, units=TAG_TOKENS)
    assert out == (prompts, completions)
    # Nothing drawn: the same whatever the seed.
    assert with_filler(prompts, completions, 1.0, seed=123) == out


def test_a_filler_row_has_the_rows_pieces_and_tokens():
    tokenizer = CharTokenizer.for_task()
    prompts, completions = with_filler([ROW[0]] * 3, [ROW[1]] * 3, 0.0, seed=7,
                                       units=TAG_TOKENS)
    source = tokenizer.encode(ROW[0] + ROW[1])
    # By hand: "Q: 7+5*3\nA: " is 12 characters; the completion 4 tags, the 14 characters
    # of "5*3=15 7+15=22" and the answer's 2.
    assert len(source) == 12 + 4 + 14 + 2
    for prompt, filler in zip(prompts, completions):
        assert prompt == ""
        ids = tokenizer.encode(filler)
        assert len(ids) == 32 and sorted(ids) == sorted(source)
        for tag in TAG_TOKENS:
            assert filler.count(tag) == 1
    # One generator, drawn row by row: the rows differ; the same seed gives the same rows.
    assert len(set(completions)) == 3
    assert with_filler([ROW[0]] * 3, [ROW[1]] * 3, 0.0, seed=7, units=TAG_TOKENS) == \
        (prompts, completions)


def test_shuffled_text_pieces_by_hand():
    rng = np.random.default_rng(0)
    text = shuffled_text("<think>12</think>", rng, TAG_TOKENS)
    # 4 pieces: "<think>", "1", "2", "</think>" (the tags whole, never split).
    pieces = [p for p in ("<think>", "</think>") if p in text]
    assert len(pieces) == 2 and len(text) == len("<think>12</think>")
    assert sorted(text.replace("</think>", "").replace("<think>", "")) == ["1", "2"]
    # Without units, every character is a piece.
    assert sorted(shuffled_text("abc", np.random.default_rng(1))) == ["a", "b", "c"]


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan")])
def test_a_value_outside_0_1_is_one_line(value):
    prompts, completions = _corpus(2)
    with pytest.raises(ValueError, match=r"^solution_fraction: expected a value in \[0, 1\]"):
        with_filler(prompts, completions, value, seed=0)
    config = main_job("smoke")
    config.pretrain.solution_fraction = value
    with pytest.raises(ConfigError) as info:
        validate(config, KINDS)
    message = str(info.value)
    assert len(message.splitlines()) == 1 and message.startswith("pretrain.solution_fraction:")


def test_default_is_one_and_validates():
    config = main_job("smoke")
    assert config.pretrain.solution_fraction == 1.0
    config.pretrain.solution_fraction = 0.25
    validate(config, KINDS)


def _stage_corpus(config) -> tuple[list[str], list[str]]:
    """The (prompts, completions) the pretrain stage of `config` trains on (train_supervised
    replaced by a recorder; the run's task, tokenizer and seeds as the Run builds them)."""
    from grpo_jax.runner.inputs import build_task
    from grpo_jax.runner.run import derive_seed

    task = build_task(config)
    run = types.SimpleNamespace(config=config, task=task,
                                tokenizer=CharTokenizer.for_task(task),
                                stage_seed=lambda stage, purpose: derive_seed(config.seed,
                                                                              stage, purpose))
    stage = types.SimpleNamespace(name="pretrain", section=config.pretrain)
    seen = {}
    original = supervised.train_supervised
    supervised.train_supervised = lambda run, stage, p, c, **kw: seen.update(p=p, c=c)
    try:
        supervised.run_pretrain(run, stage)
    finally:
        supervised.train_supervised = original
    return seen["p"], seen["c"]


def test_the_default_corpus_is_byte_identical():
    """The stage's corpus at the default is the noisy-solution corpus as it was built before
    the option existed (`pretraining_corpus` with the stage's seed)."""
    config = main_job("smoke")
    prompts, completions = _stage_corpus(config)
    run = types.SimpleNamespace(config=config)
    from grpo_jax.runner.inputs import build_task
    from grpo_jax.runner.toolkit import prompt_text
    from grpo_jax.runner.run import derive_seed

    task = build_task(config)
    rows = config.pretrain.steps * config.pretrain.batch_size
    examples = task.examples("train", rows, seed=derive_seed(config.seed, "pretrain", "corpus"))
    rng = np.random.default_rng(derive_seed(config.seed, "pretrain", "corpus"))
    run.task = task
    expected = [task.solution(ex, rng=rng, error_rate=config.task.solution_error_rate,
                              format_error_rate=config.task.format_error_rate)[0]
                for ex in examples]
    assert completions == expected
    assert prompts == [prompt_text(types.SimpleNamespace(config=config, task=task,
                                                         tokenizer=None), ex)
                       for ex in examples]
    # A quarter: the first 6 of the 24 rows (3 steps x 8) the same, the other 18 filler.
    config.pretrain.solution_fraction = 0.25
    quarter_prompts, quarter_completions = _stage_corpus(config)
    assert quarter_prompts[:6] == prompts[:6] and quarter_completions[:6] == completions[:6]
    assert quarter_prompts[6:] == [""] * 18
    tokenizer = CharTokenizer.for_task(task)
    for i in range(6, 24):
        assert sorted(tokenizer.encode(quarter_completions[i])) == \
            sorted(tokenizer.encode(prompts[i] + completions[i]))


def test_one_keeps_every_base_hash():
    from grpo_jax.studies import common, configs

    for tier in ("mini", "full"):
        base = common.main_base(tier)
        without = base.copy_and_resolve_references()
        del without.pretrain.solution_fraction
        assert configs.config_hash(base) == configs.config_hash(without)
        base.pretrain.solution_fraction = 0.25
        assert configs.config_hash(base) != configs.config_hash(without)
    # The main base's key as the published design blocks list it.
    assert configs.config_key(common.main_base("full")) == "70090ef410"


# ---- the study ----------------------------------------------------------------------------

def test_roles_arms_and_attach():
    from grpo_jax.studies import common, configs
    from grpo_jax.studies import pretraining_vs_rl as study

    for tier in ("mini", "full"):
        bases = study.base_config(tier)
        assert list(bases) == ["solutions_100", "solutions_25", "solutions_0"]
        assert configs.config_hash(bases["solutions_100"]) == \
            configs.config_hash(common.main_base(tier))
        assert [bases[r].pretrain.solution_fraction for r in bases] == [1.0, 0.25, 0.0]
        for role in ("solutions_25", "solutions_0"):  # the same pretraining otherwise
            other = bases[role].copy_and_resolve_references()
            other.pretrain.solution_fraction = 1.0
            assert configs.config_hash(other) == configs.config_hash(bases["solutions_100"])
        arms = study.arm_configs(tier)
        assert tuple(arms) == study.ARMS
        # The arm from the main base is the main job's GRPO run (shared by config hash).
        assert configs.config_hash(arms[study.FULL]) == configs.config_hash(
            common.main_arm(tier, "eval_base,rl,eval_final"))
        roles = {"solutions_100": "/b/100", "solutions_25": "/b/25", "solutions_0": "/b/0"}
        for arm, path in zip(study.ARMS, ("/b/100", "/b/25", "/b/0")):
            config = arms[arm].copy_and_resolve_references()
            study.attach(config, {"roles": roles})
            assert config.model.init_from == path
            config.model.init_from = ""
            assert configs.config_hash(config) == configs.config_hash(arms[study.FULL])


def test_gain_by_hand():
    from grpo_jax.studies.pretraining_vs_rl import GAIN, gains

    out = gains({"pass@1": 0.375, "base_pass@1": 0.25, "pass@8": 0.5})
    assert out[GAIN] == pytest.approx(0.125) and out["pass@8"] == 0.5
    assert gains({"pass@1": 0.375, "base_pass@1": None})[GAIN] is None
    assert gains({})[GAIN] is None


def test_claims_test_contrasts_of_the_family():
    from grpo_jax.studies import pretraining_vs_rl as study

    specs = {tuple(s) for s in study.SPECS}
    assert all(tuple(c.test) in specs for c in study.CLAIMS)
    assert all(c.margin == study.PASS_MARGIN and c.failure() for c in study.CLAIMS)


def test_the_gap_arm_pairs_by_base_and_seed_and_sets_the_last_claims_headroom():
    from grpo_jax.studies import summary
    from grpo_jax.studies import pretraining_vs_rl as study

    arms = {study.BASE_FULL: {"bases": ["a", "a", "b"], "seeds": [0, 1, 0],
                              "metrics": {"pass@1": [0.30, 0.32, 0.28]}},
            study.BASE_QUARTER: {"bases": ["b", "a", "a"], "seeds": [0, 1, 0],
                                 "metrics": {"pass@1": [0.27, 0.31, None]}}}
    gap = study.gap_arm(arms)
    assert list(zip(gap["bases"], gap["seeds"])) == [("a", 0), ("a", 1), ("b", 0)]
    assert gap["metrics"][study.GAP_METRIC] == pytest.approx([None, 0.01, 0.01])
    assert study.gap_arm({study.BASE_FULL: arms[study.BASE_FULL]}) is None
    (claim,) = [c for c in study.CLAIMS if c.test == (study.QUARTER, study.BASE_FULL, "pass@1")]
    headroom = summary.headroom_of(claim, {study.GAP: gap})
    assert headroom == pytest.approx(0.01)  # the bases 1 point apart: below the 3-point margin
    contrast = {"metric": "pass@1", "diff": 0.02, "ci95": [0.01, 0.03], "p": 0.01,
                "p_holm": 0.01, "per_base": {}}
    assert summary.verdict_of(claim, contrast, headroom)[0] == "not testable here"


def test_the_zero_share_contrast_is_a_check():
    from grpo_jax.studies import pretraining_vs_rl as study

    kinds = {c.test: c.kind for c in study.CLAIMS}
    assert kinds[(study.BASE_QUARTER, study.BASE_NONE, "pass@1")] == "check"
    assert sum(kind == "claim" for kind in kinds.values()) == 3
