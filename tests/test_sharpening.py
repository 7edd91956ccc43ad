"""The sharpening study's per-problem figures, by hand on three small problems."""

import pytest

from grpo_jax.studies import measure, sharpening


def _problem(answers, flags):
    return {"answers": answers, "correct_flags": flags}


# reference draw (the base model) and the policy measured against it, problem by problem
REFERENCE = [_problem(["5", "5", "3", None], "1100"),   # modal answer "5", correct
             _problem(["2", "2", "9", "4"], "0010"),    # modal "2" wrong; "9" correct, rank 2
             _problem(["1", "1", "1", "1"], "0000")]    # never correct
MINE = [_problem(["5", "5", "5", "7"], "1110"),
        _problem(["9", "9", "2", "8"], "1100"),
        _problem(["6", "1", "1", "1"], "1000")]          # "6" is correct, never in the reference


def test_figures_against_the_reference_draw_by_hand():
    got = sharpening.figures(MINE, REFERENCE, k=4)
    expected = {
        "pass@1": (3 / 4 + 2 / 4 + 1 / 4) / 3,
        "pass@4": 1.0,                       # every problem has a correct sample
        "maj@4": 2 / 3,                      # the full vote: "5" yes, "9" yes, "1" no
        "distinct_answers": (2 + 3 + 2) / 3,
        "only_solves_rate": 1 / 3,           # problem 3: solved here, never by the reference
        "likelier_rate": 2 / 3,              # problems 1 (3/4 > 2/4) and 2 (2/4 > 1/4)
        "new_answer_rate": 3 / 12,           # "7", "8", "6" of 12 answers
        "mode_mass_right_rate": 3 / 4,       # problem 1: share on "5"
        "correct_mass_wrong_rate": (2 / 4 + 1 / 4) / 2,  # problems 2 and 3
        "topk_promoted_rate": 1.0,           # problem 2: the vote "9" is correct
        "outside_promoted_rate": 0.0,        # problem 3: the vote "1" is wrong
        "topk_problems": 1, "outside_problems": 1,
    }
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert got[name] == pytest.approx(value), name
    alone = sharpening.figures(MINE, None, k=4)
    assert set(alone) == {"pass@1", "pass@4", "maj@4", "distinct_answers"}


def test_a_draw_against_itself_has_nothing_new_and_ranks_by_count_then_first_seen():
    same = sharpening.figures(REFERENCE, REFERENCE, k=2)
    assert same["new_answer_rate"] == 0.0 and same["only_solves_rate"] == 0.0
    assert same["likelier_rate"] == 0.0
    assert sharpening.ranked_answers(_problem(["b", "a", None, "a", "b", "c"], "000000")) \
        == ["b", "a", "c"]
    assert sharpening.correct_rank(REFERENCE[1], {"9"}) == 2
    assert sharpening.correct_rank(REFERENCE[2], {"6"}) is None


def test_the_redraw_is_the_next_seed_cyclically():
    assert [measure.redraw_seed(s, (2, 0, 1)) for s in (0, 1, 2)] == [1, 2, 0]
    with pytest.raises(ValueError, match="two seeds"):
        measure.redraw_seed(0, (0,))
