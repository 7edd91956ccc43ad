"""tool_use's base rule on hand-made finished runs (no training): rounds of pretraining until
validation pass@1 with the tool reaches the bar, a later round built only while none before
it passed, the first passing round chosen (the last built when none passes); and a base
role whose function returns None is not built. At the full tier's configs: each later round
is the round before continued on its own stage's draws and nothing else, every round is
validated with the tool as the arms' held-out evaluation samples but on other problems, and
a base whose first round passes is built, chosen and tabled as one round (the path the mini
tier, where no toy round reaches the bar, never takes)."""

import copy
import json
import os

from grpo_jax.runner.inputs import build_task
from grpo_jax.studies import common, tool_use
from grpo_jax.studies.runs import build_bases

FIRST, SECOND, THIRD = tool_use.ROUND_ROLES


def _finished(path, **validation):
    """A finished run's directory whose eval_valid row has `validation`'s figures."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "report.json"), "w", encoding="utf-8") as f:
        f.write("{}")
    rows = [{"stage": "pretrain", "step": 1, "loss": 1.0},
            {"stage": tool_use.VALIDATION_STAGE, "step": 1, **validation}]
    with open(os.path.join(path, "metrics.jsonl"), "w", encoding="utf-8") as f:
        f.write("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_the_first_round_at_the_bar_is_chosen_and_later_rounds_are_not_built(tmp_path):
    bar = tool_use.VALIDATION_BAR
    low = _finished(tmp_path / "r1", **{"pass@1": bar - 0.01, "correct_call_rate": 0.7})
    high = _finished(tmp_path / "r2", **{"pass@1": bar, "correct_call_rate": 0.8})
    first, second, third = tool_use.ROUND_ROLES
    later = tool_use.base_config("mini")
    # round 2 follows a round below the bar: built from it, on its own stage's draws
    config = later[second]({first: low})
    assert config.model.init_from == low
    assert config.stages == f"pretrain_2,{tool_use.VALIDATION_STAGE}"
    assert config.task.eval_seed == tool_use.VALIDATION_SEED != common.tool_job(
        "smoke").task.eval_seed
    # round 3 after a round at the bar, or after a round that was not built: not built
    assert later[third]({first: low, second: high}) is None
    assert later[third]({first: high}) is None
    assert later[second]({first: high}) is None
    assert tool_use.chosen_round({first: low, second: high}) == second
    assert tool_use.chosen_round({first: high, second: low}) == first
    assert tool_use.chosen_round({first: low}) == first  # none passed: the last built
    selection = tool_use.base_selection({"s0-x": {"roles": {first: low, second: high,
                                                            "former": low}}})
    assert selection["s0-x"]["chosen"] == second and selection["s0-x"]["passed"] is True
    assert selection["s0-x"]["rounds"][first]["correct_call_rate"] == 0.7
    assert set(selection["s0-x"]["rounds"]) == {first, second}
    # the arm starts from the chosen round
    arm = tool_use.arm_configs("mini")[tool_use.RUN]
    tool_use.attach(arm, {"roles": {first: low, second: high, "former": low}})
    assert arm.model.init_from == high


def test_a_role_whose_function_returns_none_is_not_built(tmp_path):
    config = common.tool_job("smoke")
    config.stages = "pretrain"
    made = common.for_tier_base(copy.deepcopy(config), "mini")
    made.seed = 0
    digest = common.config_hash(made)
    workdir = tmp_path / "bases" / f"s0-{digest[:10]}"
    os.makedirs(workdir)
    (workdir / "base_config_hash").write_text(digest + "\n")
    (workdir / "report.json").write_text("{}")  # finished: reused, nothing trained
    asked = []
    key, info = build_bases({"a": config, "b": lambda roles: asked.append(dict(roles))},
                            str(tmp_path), 0, "mini")
    assert asked == [{"a": str(workdir)}]
    assert info["roles"] == {"a": str(workdir)}
    alone, _ = build_bases({"a": config}, str(tmp_path), 0, "mini")
    assert key == alone  # the key hashes the built roles only


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
