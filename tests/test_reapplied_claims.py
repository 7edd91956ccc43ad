"""The verdicts command on a published summary whose study has since gained claims on arms
that have not run (spurious_rewards' arms with four clipped passes per batch): the new
claims are "not run" (not counted in the tally), and every other verdict,
contrast and Holm p is the one the stored arms give without them."""

import json
import shutil

from grpo_jax import studies
from grpo_jax.studies import publish
from grpo_jax.studies import spurious_rewards as study_module


def test_claims_on_arms_not_run_are_unresolved_and_change_nothing_else(tmp_path):
    folder = tmp_path / "spurious_rewards"
    shutil.copytree(publish.experiments_dir() + "/spurious_rewards", folder)
    with open(folder / "summary.json", encoding="utf-8") as f:
        published = json.load(f)
    _, after = publish.reapply_rule(studies.get("spurious_rewards"), folder=str(folder))
    with open(folder / "summary.json", encoding="utf-8") as f:
        rewritten = json.load(f)
    assert rewritten["contrasts"] == published["contrasts"]  # the same family, the same Holm
    new = {study_module.CLIPPED, study_module.INCORRECT_CLIPPED}
    for claim, verdict in zip(study_module.CLAIMS, after):
        assert verdict["claim"] == claim.text
        if claim.test is not None and new & set(claim.test[:2]):
            assert verdict["verdict"] == "not run"
            assert verdict["why"].startswith("its contrast was not run")
    # again: the same README (the study's own table is carried over as it stands)
    once = (folder / "README.md").read_text(encoding="utf-8")
    table = (folder / "table.md").read_text(encoding="utf-8")
    assert table.strip() and table.strip() in once  # table.md is the README's results block
    publish.reapply_rule(studies.get("spurious_rewards"), folder=str(folder))
    assert (folder / "README.md").read_text(encoding="utf-8") == once
    def on_run_arms(verdicts):
        return [v["verdict"] for v in verdicts
                if v["a"] is not None and not new & {v["a"], v["b"]}]

    assert on_run_arms(after) == on_run_arms(published["verdicts"])
