"""Each study README's design block is what its code generates: the full tier's configs
(bases, seeds, stages, steps, prompts x completions, held-out problems x samples, the fields
that differ between arms). Regenerated in memory, no runs; a config change without
`python -m grpo_jax.studies design NAME` fails here. And every claim says how its test
could fail here."""

import dataclasses
import os

import pytest

from grpo_jax import studies
from grpo_jax.studies import publish


@pytest.mark.parametrize("name", studies.NAMES)
def test_readme_design_block_is_generated_from_the_configs(name):
    study = studies.get(name)
    with open(publish.readme_path(study), encoding="utf-8") as f:
        text = f.read()
    committed = publish.committed_design(text)
    assert committed is not None, f"experiments/{name}/README.md has no design block"
    assert publish.written_numbers(text) == [], (
        f"experiments/{name}/README.md: hand-written lines with the study's own figures (say "
        "them in the generated blocks, or point to them)")
    assert committed == publish.design_block(study), (
        f"experiments/{name}/README.md's design block differs from its code: run "
        f"`python -m grpo_jax.studies design {name}` (if its config keys changed, the "
        "finished full-tier runs of those configs are not reused: a new field whose default "
        "keeps runs as they were belongs in grpo_jax/studies/configs.NEUTRAL_DEFAULTS)")


def test_replace_design_is_idempotent_and_keeps_the_prose():
    text = "# x\n\n## Design\n\nprose 1.\n\n<!-- results:begin -->\nr\n<!-- results:end -->\n"
    once = publish.replace_design(text, "block 1\n")
    assert once.index("block 1") < once.index("prose 1.") < once.index("results:begin")
    twice = publish.replace_design(once, "block 2\n")
    assert "block 1" not in twice and twice.count(publish.DESIGN_BEGIN) == 1
    assert publish.replace_design(twice, "block 2\n") == twice
    assert publish.committed_design(twice) == "block 2\n"


def test_differing_fields_are_compared_among_the_configs_that_run_their_stage():
    """A field of a stage only some arms run differs among those arms (here `rl.steps`
    between the two RL arms); the distillation arm, which runs no `rl`, is left out of it."""
    import ml_collections

    def arm(stages, **sections):
        return ml_collections.ConfigDict({"stages": stages, "seed": 0, **sections})

    arms = {"short": arm("rl", rl={"steps": 60, "lr": 1.0}),
            "long": arm("rl", rl={"steps": 180, "lr": 1.0}),
            "distill": arm("distill", distill={"steps": 5})}
    assert publish._differing(arms) == {"rl.steps": {"short": 60, "long": 180}}
    assert publish._differing({"a": arms["short"], "b": arms["short"]}) == {}


def test_arms_are_grouped_by_task_and_its_datasets():
    import ml_collections

    def arm(name, datasets=None):
        task = {"name": name, **({"kwargs": {"datasets": datasets}} if datasets else {})}
        return ml_collections.ConfigDict({"task": task})

    groups = publish._task_groups({"a": arm("arithmetic"), "b": arm("reasoning_gym", "x"),
                                   "c": arm("arithmetic"), "d": arm("reasoning_gym", "y")})
    assert groups == {"`arithmetic`": ["a", "c"], "`reasoning_gym` (`x`)": ["b"],
                      "`reasoning_gym` (`y`)": ["d"]}


def test_design_command_check(capsys):
    from grpo_jax.studies.__main__ import main

    assert main(["design", "--check", "all"]) == 0
    assert main(["design", "--check", "no_such_study"]) == 2
    assert os.path.exists(publish.readme_path(studies.get(studies.NAMES[0])))


def test_written_numbers_flags_the_studys_own_figures_only():
    text = "\n".join([
        "# t",
        "",
        "**Question** (Someone et al. 2025). The paper trains on 1.2k problems.",
        "",
        "## Design",
        "",
        publish.DESIGN_BEGIN, "- **Seeds** 0, 1 per base", publish.DESIGN_END,
        "",
        "- Arms from the main base, 80 steps each.",                       # line 11: flagged
        "- `rl.steps` and `configs/r1.py`, pass@1 and tiny-1m, as \"a 3x gain\" says.",
        "- the paper's pool (1.2k problems; Wang et al.",                  # citation across lines
        "  2025, arXiv:2504.20571) is larger.",
        "1. **first** item",
        "- with two bases and three seeds the test is weak.",              # line 16: flagged
        "- two task families; `--config.rl.steps=80`.",                 # line 17: flagged
        "",
        "<!-- results:begin -->", "| a | +3.1 |", "<!-- results:end -->",
    ])
    assert [n for n, _ in publish.written_numbers(text)] == [11, 16, 17]


@pytest.mark.parametrize("name", studies.NAMES)
def test_every_claim_says_how_its_test_could_fail_here(name):
    """Every testable claim says, before its runs, how this design could give the other
    answer: its `why` (written before the rule's statement) or a whole can_fail statement of
    its own, never the rule's generic sentence alone; a check says why it cannot fail."""
    for claim in studies.get(name).claims:
        if claim.untestable:
            continue
        if claim.kind == "check":
            assert claim.can_fail, claim.text[:60]
            continue
        assert claim.why or claim.can_fail, f"{name}: {claim.text[:60]!r} has no why"
        assert claim.failure() != dataclasses.replace(claim, why="", can_fail="").failure()
