"""tool_use's base rule at the full tier's configs (no training): each later round is the
round before continued on its own stage's draws and nothing else, every round is validated
with the tool as the arms' held-out evaluation samples but on other problems, and a base
whose first round passes is built, chosen and tabled as one round (the path the mini tier,
where no toy round reaches the bar, never takes)."""

import json
import os

from grpo_jax.runner.inputs import build_task
from grpo_jax.studies import tool_use

FIRST, SECOND, THIRD = tool_use.ROUND_ROLES


def _finished(path, **validation):
    """A finished round's directory whose eval_valid row has `validation`'s figures."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "report.json"), "w", encoding="utf-8") as f:
        f.write("{}")
    rows = [{"stage": "pretrain", "step": 1, "loss": 1.0},
            {"stage": tool_use.VALIDATION_STAGE, "step": 2, **validation}]
    with open(os.path.join(path, "metrics.jsonl"), "w", encoding="utf-8") as f:
        f.write("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_full_tier_rounds_continue_the_round_before_and_validate_off_the_held_out_set(tmp_path):
    configs = tool_use.base_config("full")
    assert list(configs) == [FIRST, SECOND, THIRD, "former"]
    first = configs[FIRST]
    assert first.stages == f"pretrain,{tool_use.VALIDATION_STAGE}"
    assert first.pretrain.steps == 2500 and not first.model.init_from
    low = _finished(tmp_path / "r1", **{"pass@1": tool_use.VALIDATION_BAR / 2})
    second = configs[SECOND]({FIRST: low})
    assert second.stages == f"pretrain_2,{tool_use.VALIDATION_STAGE}"
    assert second.model.init_from == low and "pretrain" not in second
    # the round before, continued: the same pretraining section under its own stage name,
    # the same validation, nothing else changed
    a, b = first.to_dict(), second.to_dict()
    assert b.pop("pretrain_2") == a.pop("pretrain")
    assert b["model"].pop("init_from") == low and a["model"].pop("init_from") == ""
    a.pop("stages"), b.pop("stages")
    assert a == b
    third = configs[THIRD]({FIRST: low, SECOND: _finished(tmp_path / "r2", **{"pass@1": 0.0})})
    assert third.stages == f"pretrain_3,{tool_use.VALIDATION_STAGE}"
    # the validation samples as the arm's held-out evaluation with the tool does ...
    arm = tool_use.arm_configs("full")[tool_use.RUN]
    valid = first[tool_use.VALIDATION_STAGE]
    assert valid.to_dict() == arm.eval_base.to_dict() and valid.tools == "calc"
    # ... on test-split problems none of which is held out
    assert first.task.eval_seed == tool_use.VALIDATION_SEED != arm.task.eval_seed
    task = build_task(arm)
    held = {ex.id for ex in task.examples("test", arm.task.eval_size, seed=arm.task.eval_seed)}
    shown = {ex.id for ex in task.examples("test", first.task.eval_size,
                                           seed=first.task.eval_seed)}
    assert len(shown) == first.task.eval_size and not held & shown


def test_a_base_whose_first_round_passes_is_that_round_alone(tmp_path):
    configs = tool_use.base_config("full")
    high = _finished(tmp_path / "r1", **{"pass@1": tool_use.VALIDATION_BAR,
                                          "correct_call_rate": 0.4})
    assert configs[SECOND]({FIRST: high}) is None
    assert configs[THIRD]({FIRST: high}) is None  # round 2 was not built
    roles = {FIRST: high, "former": str(tmp_path / "former")}
    arm = tool_use.arm_configs("full")[tool_use.RUN]
    tool_use.attach(arm, {"roles": roles})
    assert arm.model.init_from == high
    former = tool_use.arm_configs("full")[tool_use.FORMER]
    tool_use.attach(former, {"roles": roles})
    assert former.model.init_from == roles["former"]
    selection = tool_use.base_selection({"s0-x": {"roles": roles}})
    assert selection == {"s0-x": {"rounds": {FIRST: {
        name: {"pass@1": tool_use.VALIDATION_BAR, "correct_call_rate": 0.4}.get(name)
        for name in tool_use.FIGURES}}, "chosen": FIRST, "passed": True}}
    table = tool_use.selection_table(selection)
    assert f"| s0-x | {FIRST} | 10.0% | 40.0% | - | yes |" in table


def test_the_first_claims_note_covers_a_base_that_missed_the_bar():
    claim = tool_use.CLAIMS[0]
    assert "the last round where none did" in claim.note
    assert claim.headroom == (tool_use.BEFORE, "correct_call_rate", 1.0)
