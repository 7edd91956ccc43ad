"""pass@k and maj@k against hand values and every k-subset, evaluate_samples, report files and
their columns, and the eval stage's fields (ks, budget forcing) in runs."""

import collections
import fractions
import itertools
import json
import math
import os
import re
import time

import ml_collections
import numpy as np
import pytest

from grpo_jax import evals


def _closed_form(n, c, k):
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


# ------------------------------------------------------------------------- pass@k


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (5, 2, 1, 0.4),  # pass@1 = c/n
        (10, 0, 5, 0.0),
        (10, 10, 1, 1.0),
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (6, 3, 4, 1.0),  # n - c < k: every k-subset holds a correct sample
        (3, 1, 3, 1.0),
    ],
)
def test_pass_at_k_hand_values(n, c, k, expected):
    assert evals.pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_closed_form_on_a_grid():
    for n in range(1, 13):
        for c, k in itertools.product(range(n + 1), range(1, n + 1)):
            assert evals.pass_at_k(n, c, k) == pytest.approx(_closed_form(n, c, k), abs=1e-12)


def test_pass_at_k_matches_enumeration():
    """pass@k is the fraction of k-subsets of the n samples that contain a correct one."""
    samples = [True, False, False, True, False, False, False]
    subsets = list(itertools.combinations(samples, 3))
    by_enumeration = sum(any(s) for s in subsets) / len(subsets)
    assert evals.pass_at_k(7, 2, 3) == pytest.approx(by_enumeration, abs=1e-12)


def test_pass_at_k_matches_enumeration_over_every_subset():
    for n in range(1, 9):
        for c in range(n + 1):
            samples = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(samples, k))
                expected = sum(any(s) for s in subsets) / len(subsets)
                assert evals.pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_stable_for_large_n():
    # C(1000, 500) overflows a float; the product form does not.
    value = evals.pass_at_k(1000, 3, 500)
    assert value == pytest.approx(1 - (500 * 499 * 498) / (1000 * 999 * 998), abs=1e-12)
    assert evals.pass_at_k(1000, 1, 1) == pytest.approx(1e-3, rel=1e-12)


@pytest.mark.parametrize("n, c, k", [(5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6), (0, 0, 1)])
def test_pass_at_k_rejects_bad_counts(n, c, k):
    with pytest.raises(ValueError, match="pass_at_k"):
        evals.pass_at_k(n, c, k)


# ------------------------------------------------------------------------- maj@k


def _maj_by_enumeration(answers, correct, k):
    """maj@k as the mean over every k-subset of a majority vote whose ties are split evenly
    (an answer is graded by its first sample)."""
    graded = {}
    for answer, ok in zip(answers, correct):
        if answer is not None:
            graded.setdefault(answer, ok)
    total = fractions.Fraction(0)
    subsets = list(itertools.combinations(range(len(answers)), k))
    for subset in subsets:
        votes = collections.Counter(answers[i] for i in subset if answers[i] is not None)
        if votes:
            top = max(votes.values())
            tied = [a for a, v in votes.items() if v == top]
            total += fractions.Fraction(sum(graded[a] for a in tied), len(tied))
    return float(total / len(subsets))


def test_maj_at_k_hand_cases():
    answers = ["3", "5", "5", None, "3", "3"]
    correct = [True, False, False, False, True, True]
    assert evals.maj_at_k(answers, correct, 1) == pytest.approx(3 / 6)  # a "3" drawn alone
    # k = 2 (15 pairs): {3,3} 3 pairs win, {3,None} 3 win, {3,5} 6 ties score 1/2 each.
    assert evals.maj_at_k(answers, correct, 2) == pytest.approx((3 + 3 + 6 / 2) / 15)
    assert evals.maj_at_k(answers, correct, 6) == 1.0  # "3" three times against two "5"
    # k = 5 leaves one sample out: out goes a "3" (3 ways, a 2-2 tie: 1/2) or another (3
    # ways, "3" wins).
    assert evals.maj_at_k(answers, correct, 5) == pytest.approx((3 / 2 + 3) / 6)
    assert evals.majority_vote(answers[:3]) == ("5", 1)


def test_maj_at_k_none_answers_do_not_vote():
    answers = [None, None, "7", None]
    correct = [False, False, True, False]
    assert evals.maj_at_k(answers, correct, 4) == 1.0
    assert evals.maj_at_k(answers, correct, 2) == pytest.approx(3 / 6)  # pairs holding "7"
    assert evals.maj_at_k([None, None], [False, False], 2) == 0.0  # no vote at all
    assert evals.majority_vote([None, None]) == (None, -1)


def test_maj_at_k_ties_split_evenly():
    assert evals.maj_at_k(["b", "a", "a", "b"], [False, True, True, False], 4) == 0.5
    assert evals.maj_at_k(["a", "b", "c"], [True, False, False], 3) == pytest.approx(1 / 3)
    # Two distinct answers that are both correct ("4", "4.0") share the tie's credit.
    assert evals.maj_at_k(["4", "4.0", "5"], [True, True, False], 3) == pytest.approx(2 / 3)


def test_maj_at_k_matches_enumeration_over_every_subset():
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 10))
        pool = ["1", "2", "3", "4", None][: int(rng.integers(1, 6))]
        right = {a: bool(rng.random() < 0.4) for a in pool if a is not None}
        answers = [pool[i] for i in rng.integers(0, len(pool), n)]
        correct = [a is not None and right[a] for a in answers]
        for k in range(1, n + 1):
            assert evals.maj_at_k(answers, correct, k) == pytest.approx(
                _maj_by_enumeration(answers, correct, k), abs=1e-12), (answers, correct, k)


def test_maj_at_k_is_fast_for_many_samples():
    rng = np.random.default_rng(1)
    answers = [str(a) for a in rng.integers(0, 12, 64)]
    correct = [a == "0" for a in answers]
    start = time.perf_counter()
    values = [evals.maj_at_k(answers, correct, k) for k in (1, 2, 4, 8, 16, 32, 64)]
    assert time.perf_counter() - start < 5.0
    assert values[0] == pytest.approx(answers.count("0") / 64)
    assert all(0.0 <= v <= 1.0 for v in values)


def test_maj_at_k_bad_input():
    with pytest.raises(ValueError, match="differ in length"):
        evals.maj_at_k(["1"], [True, False], 1)
    with pytest.raises(ValueError, match="k"):
        evals.maj_at_k(["1", "2"], [True, False], 3)


# ------------------------------------------------------------------------- evaluate_samples


def _sample(answer, correct, formatted=True, length=10):
    return {"answer": answer, "correct": correct, "formatted": formatted, "length": length}


PROBLEMS = [
    {  # 2 of 4 correct; majority "4" (x2) correct
        "difficulty": 1,
        "samples": [
            _sample("4", True, length=10),
            _sample("5", False, formatted=False, length=20),
            _sample("4", True, length=30),
            _sample(None, False, formatted=False, length=40),
        ],
    },
    {  # 1 of 4 correct; majority "9" (x2) wrong
        "difficulty": 2,
        "samples": [
            _sample("9", False, length=5),
            _sample("8", True, length=5),
            _sample("9", False, length=5),
            _sample("7", False, length=5),
        ],
    },
    {  # 0 of 4 correct
        "difficulty": 2,
        "samples": [_sample("1", False, length=1)] * 4,
    },
]


def test_evaluate_samples_hand_values():
    m = evals.evaluate_samples(PROBLEMS)
    assert m["num_problems"] == 3 and m["num_samples"] == 4 and m["num_completions"] == 12
    assert set(k for k in m if "@" in k) == {"pass@1", "pass@2", "pass@4", "maj@2", "maj@4"}
    assert m["pass@1"] == pytest.approx((2 / 4 + 1 / 4 + 0) / 3)
    assert m["pass@2"] == pytest.approx((_closed_form(4, 2, 2) + _closed_form(4, 1, 2)) / 3)
    assert m["pass@4"] == pytest.approx(2 / 3)
    assert m["maj@4"] == pytest.approx(1 / 3)
    # maj@2 over the 6 pairs of each problem, ties split evenly. Problem 0 ("4" "5" "4"
    # None): {4,4} 1, {4,None} x2 1, {4,5} x2 1/2, {5,None} 0 -> 4/6. Problem 1 ("9" "8" "9"
    # "7", "8" correct): the three pairs holding "8" tie -> 1/2 each -> 1.5/6.
    assert m["maj@2"] == pytest.approx((4 / 6 + 1.5 / 6 + 0) / 3)
    assert m["format_rate"] == pytest.approx(10 / 12)
    assert m["mean_length"] == pytest.approx((100 + 20 + 4) / 12)
    hard = m["by_difficulty"][2]
    assert list(m["by_difficulty"]) == [1, 2]
    assert hard["num_problems"] == 2
    assert hard["pass@1"] == pytest.approx((1 / 4 + 0) / 2)
    assert hard["pass@4"] == pytest.approx(0.5)
    assert hard["mean_length"] == pytest.approx(24 / 8)
    assert m["by_difficulty"][1]["format_rate"] == pytest.approx(0.5)


def test_evaluate_samples_custom_ks_and_numpy_values():
    problems = [
        {"samples": [_sample("1", np.bool_(True), np.bool_(True), np.int32(3))] * 3},
    ]
    m = evals.evaluate_samples(problems, ks=[1, 3], maj_ks=[3])
    assert (m["pass@1"], m["pass@3"], m["maj@3"], m["mean_length"]) == (1.0, 1.0, 1.0, 3.0)
    assert list(m["by_difficulty"]) == [0]


def test_evaluate_samples_bad_input_names_the_sample():
    bad = [
        {
            "samples": [
                _sample("1", True),
                {"answer": "1", "correct": 1, "formatted": True, "length": 3},
            ]
        }
    ]
    with pytest.raises(ValueError, match=r"problem 0 sample 1: field 'correct' must be bool"):
        evals.evaluate_samples(bad)
    with pytest.raises(ValueError, match=r"problem 0 sample 0: missing field 'length'"):
        evals.evaluate_samples(
            [{"samples": [{"answer": None, "correct": True, "formatted": True}]}]
        )
    with pytest.raises(ValueError, match=r"ks: each k must be an int in \[1, 4\]"):
        evals.evaluate_samples(PROBLEMS, ks=[8])
    with pytest.raises(ValueError, match="problem 1: 'samples'"):
        evals.evaluate_samples([PROBLEMS[0], {"samples": []}])


# ------------------------------------------------------------------------- report


def _parse_table(markdown):
    rows = {}
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(header[1:], cells[1:]))
    return header[1:], rows


def test_write_report_files_and_same_numbers(tmp_path):
    before = evals.evaluate_samples(PROBLEMS)
    after = dict(before, **{"pass@1": 0.6251234, "format_rate": 1.0})
    history = [
        {"step": 0, "reward_mean": 0.1, "pass@1": 0.25},
        {"step": 10, "reward_mean": 0.4},
        {"step": 20, "reward_mean": 0.7, "pass@1": 0.6},
    ]
    paths = evals.write_report(
        tmp_path / "report",
        title="GRPO on countdown",
        summary={"before": before, "after": after},
        history=history,
        plots=("reward_mean", "pass@1", "kl"),  # "kl" absent: skipped
    )
    # evaluate_samples reports pass@k / maj@k for several k: their curve is drawn too.
    assert set(paths) == {"markdown", "json", "plot:reward_mean", "plot:pass@1", "plot:at_k"}
    for key in ("plot:reward_mean", "plot:pass@1"):
        with open(paths[key], "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert not list((tmp_path / "report").glob("*kl*"))

    markdown = (tmp_path / "report" / "report.md").read_text()
    assert markdown.startswith("# GRPO on countdown\n")
    assert "![reward_mean](plot_reward_mean.png)" in markdown
    columns, table = _parse_table(markdown)
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert columns == report["columns"] == ["before", "after"]
    assert set(table) == set(report["metrics"])
    assert "by_difficulty/2/pass@1" in table
    for name, values in report["metrics"].items():
        for column in columns:
            assert table[name][column] == evals.format_value(values[column])
            assert float(table[name][column]) == pytest.approx(values[column], rel=1e-3)
    assert table["pass@1"]["after"] == "0.6251"
    assert report["metrics"]["pass@1"]["after"] == 0.6251234
    assert report["metrics"]["num_samples"]["before"] == 4  # per problem
    assert report["metrics"]["num_completions"]["before"] == 12
    assert report["summary"]["before"]["by_difficulty"]["2"]["num_problems"] == 2


def test_a_report_without_drawing_has_the_same_tables_and_no_image(tmp_path):
    """draw=False (a run's report_plots): report.md and report.json as with the plots, less
    the PNGs and the lines that show them."""
    summary = {"before": evals.evaluate_samples(PROBLEMS)}
    history = [{"step": 0, "reward_mean": 0.1}, {"step": 10, "reward_mean": 0.4}]
    drawn = evals.write_report(tmp_path / "drawn", title="t", summary=summary, history=history)
    bare = evals.write_report(tmp_path / "bare", title="t", summary=summary, history=history,
                              draw=False)
    assert {"plot:reward_mean", "plot:at_k"} <= set(drawn)
    assert set(bare) == {"markdown", "json"}
    assert not list((tmp_path / "bare").glob("*.png"))
    markdown = (tmp_path / "drawn" / "report.md").read_text()
    assert "![reward_mean](plot_reward_mean.png)" in markdown
    assert (tmp_path / "bare" / "report.md").read_text() == re.sub(r"\n\n!\[[^\n]*", "",
                                                                   markdown)
    drawn_json, bare_json = (json.loads((tmp_path / d / "report.json").read_text())
                             for d in ("drawn", "bare"))
    assert drawn_json["plots"] and bare_json["plots"] == {} and bare_json["plot_steps"] == {}
    for key in ("metrics", "summary", "columns", "num_history_steps"):
        assert bare_json[key] == drawn_json[key]


def test_write_report_without_history_and_bad_summary(tmp_path):
    paths = evals.write_report(tmp_path, title="t", summary={"eval": {"pass@1": 0.5}})
    assert set(paths) == {"markdown", "json"}
    assert re.search(r"\| pass@1 \| 0\.5 \|", (tmp_path / "report.md").read_text())
    with pytest.raises(ValueError, match=r"summary\['eval'\]: expected a metrics dict"):
        evals.write_report(tmp_path, title="t", summary={"eval": 0.5})


def test_write_report_draws_one_line_per_group_and_records_its_steps(tmp_path):
    history = ([{"step": s, "stage": "first", "reward_mean": 0.1 * s} for s in (1, 2, 3)]
               + [{"step": s, "stage": "second", "reward_mean": 0.2} for s in (6, 7)]
               + [{"step": 8, "stage": "second", "reward_mean": float("nan")}])
    assert evals.series_points(history, "reward_mean", group_key="stage") == {
        "first": ([1, 2, 3], [0.1, 0.2, pytest.approx(0.3)]), "second": ([6, 7], [0.2, 0.2])}
    evals.write_report(tmp_path, title="t", summary={"eval": {"pass@1": 0.5}},
                       history=history, plots=("reward_mean",), group_key="stage")
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["plot_steps"] == {"reward_mean": {"first": [1, 3], "second": [6, 7]}}
    evals.write_report(tmp_path, title="t", summary={"eval": {"pass@1": 0.5}},
                       history=history, plots=("reward_mean",))
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["plot_steps"] == {"reward_mean": {"all": [1, 7]}}


def test_write_report_labels_columns_and_adds_notes(tmp_path):
    evals.write_report(tmp_path, title="t", summary={"before": {"pass@1": 0.25},
                                                     "after": {"pass@1": 0.5}},
                       labels={"before": "pretrain", "after": "rl"}, notes=["Columns: x."])
    markdown = (tmp_path / "report.md").read_text()
    columns, table = _parse_table(markdown)
    assert columns == ["pretrain", "rl"] and table["pass@1"] == {"pretrain": "0.25", "rl": "0.5"}
    assert "\nColumns: x.\n" in markdown
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["columns"] == ["before", "after"]  # the keys sweeps read stay the roles
    assert report["labels"] == {"before": "pretrain", "after": "rl"}


# ------------------------------------------------------------------------- run report columns

KINDS_OF = {"pretrain": "pretrain", "rl": "rl", "rm": "reward_model", "eval_base": "eval",
            "eval_mid": "eval", "eval_final": "eval"}


@pytest.mark.parametrize("stages, expected", [
    ("pretrain,eval_base,rl,eval_final",
     [("before", "eval_base", "pretrain", "pretrain"), ("after", "eval_final", "rl", "rl")]),
    ("eval_final", [("after", "eval_final", None, "model")]),  # eval-only
    ("eval_base,rl", [("before", "eval_base", None, "model")]),
    ("pretrain,eval_final", [("after", "eval_final", "pretrain", "pretrain")]),
    ("pretrain,eval_base,rm,eval_final",  # a reward model leaves the policy as it is
     [("before", "eval_base", "pretrain", "pretrain (eval_base)"),
      ("after", "eval_final", "pretrain", "pretrain (eval_final)")]),
    ("eval_base,pretrain,eval_mid,rl,eval_final",
     [("before", "eval_base", None, "model"), ("eval_mid", "eval_mid", "pretrain", "pretrain"),
      ("after", "eval_final", "rl", "rl")]),
])
def test_eval_columns_label_the_stage_each_eval_evaluates(stages, expected):
    from grpo_jax.runner.report import eval_columns

    names = stages.split(",")
    evals_done = {n: {} for n in names if KINDS_OF[n] == "eval"}
    assert eval_columns(names, KINDS_OF, evals_done) == expected


# ------------------------------------------------------------------------- eval stage fields


def _eval_config(**fields):
    from configs import default as default_config

    config = default_config.get_config("smoke")
    config.mesh.num_devices = 1
    config.model.num_layers = 1
    for name, value in fields.items():
        config.eval_final[name] = value
    return config


def test_resolved_ks_default_and_explicit():
    from grpo_jax.stages.evaluate import resolved_ks

    config = _eval_config()
    for n, expected in ((1, [1]), (2, [1, 2]), (8, [1, 2, 4, 8]), (12, [1, 2, 4, 8, 12])):
        config.eval_final.num_samples = n
        assert resolved_ks(config.eval_final) == expected
    config.eval_final.ks = (8, 1, 4, 4)
    assert resolved_ks(config.eval_final) == [1, 4, 8]


@pytest.mark.parametrize("fields, message", [
    ({"ks": (1, 4)}, r"^eval_final\.ks: expected a tuple of ints in \[1, num_samples = 2\]"),
    ({"ks": (0,)}, r"^eval_final\.ks: expected a tuple of ints"),
    ({"ks": (1.0,)}, r"^eval_final\.ks: expected a tuple of ints"),
    ({"min_thinking_tokens": -1}, r"^eval_final\.min_thinking_tokens: expected >= 0"),
    ({"max_thinking_tokens": 24},
     r"^eval_final\.max_thinking_tokens: 24 leaves no room .* within max_new_tokens 24$"),
    ({"min_thinking_tokens": 25},
     r"^eval_final\.min_thinking_tokens: 25 exceeds max_new_tokens 24$"),
    ({"min_thinking_tokens": 5, "max_thinking_tokens": 3},
     r"^eval_final\.min_thinking_tokens: 5 exceeds max_thinking_tokens 3"),
    ({"max_thinking_tokens": 3, "end_thinking": ""}, r"^eval_final\.end_thinking: budget"),
    ({"min_thinking_tokens": 3, "continuation": "\u00e9"},
     r"^eval_final\.continuation: the run's tokenizer cannot encode"),
])
def test_eval_fields_are_validated_in_one_line(fields, message):
    from grpo_jax.runner import ConfigError, validate
    from grpo_jax.stages import KINDS

    with pytest.raises(ConfigError, match=message) as err:
        validate(_eval_config(**fields), KINDS)
    assert "\n" not in str(err.value)
    validate(_eval_config(ks=(2,), min_thinking_tokens=3, max_thinking_tokens=9), KINDS)


def test_eval_sampling_carries_budget_forcing_in_the_run_tokenizer():
    import types

    from grpo_jax.stages.evaluate import eval_sampling
    from grpo_jax.text import CharTokenizer

    tokenizer = CharTokenizer()
    run = types.SimpleNamespace(tokenizer=tokenizer)
    section = _eval_config().eval_final
    assert not eval_sampling(run, section).budget_forcing
    section.min_thinking_tokens, section.max_thinking_tokens = 4, 12
    sampling = eval_sampling(run, section)
    assert sampling.budget_forcing
    assert (sampling.min_thinking_tokens, sampling.max_thinking_tokens) == (4, 12)
    assert sampling.end_thinking_ids == (tokenizer.token_to_id("</think>"),)
    assert sampling.continuation_ids == tuple(tokenizer.encode("Wait"))


@pytest.mark.slow
def test_eval_runs_ks_budget_forcing_and_eval_only_report(tmp_path):
    """One run: pretrain, then evals of the same policy without and with budget forcing;
    then an eval-only run of that run's policy, whose column is "model"."""
    from grpo_jax.pipeline import train_and_evaluate

    config = _eval_config()
    config.eval_final.num_samples = 4
    config.eval_final.ks = (1, 2, 4)
    config.eval_forced = ml_collections.ConfigDict(config.eval_final.to_dict())
    # No end of thinking (nor EOS) before max_new_tokens: every completion is that long.
    config.eval_forced.min_thinking_tokens = config.eval_final.max_new_tokens
    config.eval_forced.continuation = ""
    config.eval_wait = ml_collections.ConfigDict(config.eval_final.to_dict())
    config.eval_wait.min_thinking_tokens = 20  # an early end becomes "Wait"
    config.stages = "pretrain,eval_final,eval_forced,eval_wait"
    first = tmp_path / "first"
    summary = train_and_evaluate(config, str(first))
    plain, forced, wait = summary["before"], summary["eval_forced"], summary["after"]
    new = config.eval_final.max_new_tokens
    for figures in (plain, forced, wait):
        assert {"pass@1", "pass@2", "pass@4", "maj@2", "maj@4"} <= set(figures)
        assert "maj@1" not in figures and "pass@8" not in figures
    assert plain["mean_length"] < new  # the model ends some completions early ...
    assert forced["mean_length"] == new  # ... but not under budget forcing
    assert wait["mean_length"] >= 20
    samples = [json.loads(line) for line in (first / "samples.jsonl").read_text().splitlines()]
    assert all("</think>" not in s["completion"] for s in samples if s["stage"] == "eval_forced")
    report = json.loads((first / "report.json").read_text())
    assert report["labels"] == {"before": "pretrain (eval_final)",
                                "eval_forced": "pretrain (eval_forced)",
                                "after": "pretrain (eval_wait)"}
    logged = [json.loads(line) for line in (first / "metrics.jsonl").read_text().splitlines()]
    assert {"pass@4", "maj@4"} <= set(next(r for r in logged if r["stage"] == "eval_forced"))

    again = _eval_config()
    again.model.num_layers = None  # the shape comes from the run it starts from
    again.model.init_from = str(first)
    again.stages = "eval_final"
    summary = train_and_evaluate(again, str(tmp_path / "eval_only"))
    assert list(summary) == ["after"]
    columns, _ = _parse_table((tmp_path / "eval_only" / "report.md").read_text())
    assert columns == ["model"]


def test_runs_with_different_seeds_evaluate_the_same_problems(tmp_path):
    """task.eval_seed, not the run's seed, draws the held-out problems: two seeds of a sweep
    are paired problem by problem (their models, and so their completions, differ)."""
    from configs import default as default_config
    from grpo_jax.metrics import read_metrics
    from grpo_jax.pipeline import run_stage
    from grpo_jax.runner import ConfigError, validate
    from grpo_jax.stages import KINDS

    prompts = {}
    for seed in (0, 1):
        config = default_config.get_config("smoke")
        config.seed = seed
        config.model.num_layers = 1
        config.eval_final.samples_logged = 4 if seed == 0 else -1  # seed 1: every completion
        run_stage(config, "eval_final", str(tmp_path / str(seed)))
        rows = [json.loads(line) for line in open(tmp_path / str(seed) / "samples.jsonl")]
        prompts[seed] = [r["prompt"] for r in rows]
    # 4: the first completion of each of the first 4 problems
    k = config.eval_final.num_samples
    assert len(prompts[0]) == 4 and prompts[0] == prompts[1][::k][:4]
    # samples_logged -1: all eval_size x num_samples completions, whose accuracies average
    # to the stage's pass@1.
    section = config.eval_final
    assert len(rows) == config.task.eval_size * section.num_samples
    figures = [r for r in read_metrics(tmp_path / "1") if r.get("stage") == "eval_final"][-1]
    assert np.mean([r["accuracy"] for r in rows]) == pytest.approx(figures["pass@1"])
    config.eval_final.samples_logged = 0
    with pytest.raises(ConfigError, match=r"eval_final\.samples_logged"):
        validate(config, KINDS)
    config = default_config.get_config("smoke")
    from grpo_jax.runner.inputs import build_task, eval_seed

    task = build_task(config)
    config.seed, config.task.eval_seed = 1, 5
    assert eval_seed(config) == 5
    assert [e.id for e in task.examples("test", 8, seed=5)] != \
        [e.id for e in task.examples("test", 8, seed=0)]  # the seed does choose the problems


def test_write_report_plots_pass_and_maj_at_k_against_k(tmp_path):
    summary = {"before": {"pass@1": 0.2, "pass@4": 0.5, "pass@2": 0.35, "maj@2": 0.2,
                          "maj@4": 0.25, "format_rate": 1.0},
               "after": {"pass@1": 0.6}}  # one k: no curve for this column
    flat = {c: evals.flatten_metrics(m) for c, m in summary.items()}
    assert evals.report.at_k_curves(flat) == {
        "before": {"pass": [(1, 0.2), (2, 0.35), (4, 0.5)], "maj": [(2, 0.2), (4, 0.25)]}}
    paths = evals.write_report(tmp_path, title="t", summary=summary,
                               labels={"before": "pretrain"})
    assert os.path.getsize(paths["plot:at_k"]) > 1000
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["plots"]["pass@k, maj@k"] == "plot_at_k.png"
    assert "![pass@k, maj@k](plot_at_k.png)" in (tmp_path / "report.md").read_text()


def test_solved_is_pass_at_1s_rule():
    """One rule for a solved completion: its accuracy reward reaches SOLVED_AT (1), for
    floats and arrays alike (the RL rollouts' rows, the evaluation's samples)."""
    assert evals.SOLVED_AT == 1.0
    assert evals.solved(1.0) and not evals.solved(0.999) and evals.solved(1.5)
    np.testing.assert_array_equal(evals.solved(np.array([0.0, 1.0, 0.5, 2.0])),
                                  [False, True, False, True])
