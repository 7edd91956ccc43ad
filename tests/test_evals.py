"""pass@k against its closed form, maj@k hand cases, evaluate_samples, report files."""

import itertools
import json
import math
import re

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


def test_maj_at_k_hand_cases():
    answers = ["3", "5", "5", None, "3", "3"]
    correct = [True, False, False, False, True, True]
    assert evals.maj_at_k(answers, correct, 1) == 1.0  # "3" alone
    assert evals.maj_at_k(answers, correct, 3) == 0.0  # "5" twice beats "3" once
    assert evals.maj_at_k(answers, correct, 5) == 1.0  # 2-2 tie: "3" was seen first
    assert evals.maj_at_k(answers, correct, 6) == 1.0  # "3" three times
    assert evals.majority_vote(answers[:3]) == ("5", 1)


def test_maj_at_k_none_answers_do_not_vote():
    answers = [None, None, "7", None]
    assert evals.maj_at_k(answers, [False, False, True, False], 4) == 1.0
    assert evals.maj_at_k(answers, [False, False, True, False], 2) == 0.0  # no vote at all
    assert evals.majority_vote([None, None]) == (None, -1)


def test_maj_at_k_tie_broken_by_first_appearance():
    assert evals.maj_at_k(["b", "a", "a", "b"], [False, True, True, False], 4) == 0.0
    assert evals.maj_at_k(["a", "b", "b", "a"], [True, False, False, True], 4) == 1.0


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
    assert m["num_problems"] == 3 and m["num_samples"] == 12
    assert set(k for k in m if "@" in k) == {"pass@1", "pass@2", "pass@4", "maj@2", "maj@4"}
    assert m["pass@1"] == pytest.approx((2 / 4 + 1 / 4 + 0) / 3)
    assert m["pass@2"] == pytest.approx((_closed_form(4, 2, 2) + _closed_form(4, 1, 2)) / 3)
    assert m["pass@4"] == pytest.approx(2 / 3)
    assert m["maj@4"] == pytest.approx(1 / 3)
    # maj@2: problem 0 tie "4","5" -> "4" correct; problem 1 tie "9","8" -> "9" wrong.
    assert m["maj@2"] == pytest.approx(1 / 3)
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
    assert set(paths) == {"markdown", "json", "plot:reward_mean", "plot:pass@1"}
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
    assert report["metrics"]["num_samples"]["before"] == 12
    assert report["summary"]["before"]["by_difficulty"]["2"]["num_problems"] == 2


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
