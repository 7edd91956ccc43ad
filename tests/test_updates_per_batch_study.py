"""updates_per_batch's claims: Schulman et al.'s sentences as they stand, and the claims at the
higher learning rates not testable where the clipped arm itself collapsed (the room for the
unclipped arm to end below it is its own pass@1). Constructed arms, no runs (the mini tier
runs in tests/test_studies.py)."""

from __future__ import annotations

import pytest
from test_study_mechanisms import PPO_ABSTRACT

from grpo_jax.studies import summary as summary_lib
from grpo_jax.studies import updates_per_batch as study

# Schulman et al. 2017, arXiv:1707.06347, sec. 3, as published (L^CPI written out).
SECTION_3 = ("Without a constraint, maximization of L^CPI would lead to an excessively large "
             "policy update; hence, we now consider how to modify the objective, to penalize "
             "changes to the policy that move r_t(θ) away from 1.")


def test_claims_quote_the_paper():
    first, *no_clip = study.CLAIMS
    assert first.text in PPO_ABSTRACT and "abstract (quotation)" in first.source
    assert len(no_clip) == 1 + len(study.HIGH_LRS)
    for claim in no_clip:
        assert claim.text in SECTION_3 and "sec. 3 (quotation" in claim.source
        assert claim.expect == "<" and claim.margin == study.PASS_MARGIN
        assert claim.test in study.SPECS


def _verdicts(clipped, unclipped):
    """The verdicts with every arm at 0.6 pass@1 but the 4e-3 pair (four bases x 2 seeds)."""
    def arm(values):
        return {"seeds": [0, 1] * 4, "bases": [b for b in "abcd" for _ in (0, 1)],
                "metrics": {"pass@1": list(values), "clip_frac": [0.01] * 8}}

    arms = {name: arm([0.6 + 0.002 * i for i in range(8)]) for name in study.ARMS}
    arms["base"] = arm([0.3] * 8)
    arms["mu=4, lr=4e-3"], arms["mu=4, lr=4e-3, no clip"] = arm(clipped), arm(unclipped)
    summary = {"arms": arms, "contrasts": summary_lib.contrasts(arms, study.SPECS)}
    return {v["a"]: v for v in summary_lib.verdicts(summary, study.CLAIMS)}


def test_a_collapsed_clipped_arm_leaves_the_claim_not_testable():
    verdicts = _verdicts([0.01, 0.02, 0.0, 0.01, 0.02, 0.01, 0.0, 0.01],
                         [0.0, 0.01, 0.0, 0.0, 0.01, 0.0, 0.0, 0.0])
    found = verdicts["mu=4, lr=4e-3, no clip"]
    assert found["verdict"] == "not testable here"
    assert found["headroom"] == pytest.approx(0.01)
    # the same claim at 1e-3, where the clipped arm kept its pass@1, is decided by the rule
    assert verdicts["mu=4, lr=1e-3, no clip"]["verdict"] != "not testable here"


def test_a_clipped_arm_above_the_margin_is_decided_by_the_rule():
    verdicts = _verdicts([0.40, 0.42, 0.41, 0.43, 0.39, 0.41, 0.42, 0.40],
                         [0.20, 0.21, 0.19, 0.22, 0.18, 0.20, 0.21, 0.19])
    found = verdicts["mu=4, lr=4e-3, no clip"]
    assert found["verdict"] == "reproduced" and found["headroom"] == pytest.approx(0.41)
