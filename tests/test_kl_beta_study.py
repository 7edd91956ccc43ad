"""kl_beta's DAPO claim, tested as "<=": the KL term at GRPO's β not ahead of β = 0 by the
margin. β = 0 ending ahead agrees with "this restriction is not necessary"; only the term
ending ahead by the margin refutes it. Constructed arms, no runs (the mini tier runs in
tests/test_studies.py)."""

from __future__ import annotations

from grpo_jax.studies import kl_beta
from grpo_jax.studies import summary as summary_lib

DAPO = kl_beta.CLAIMS[1]


def _verdict(beta_004):
    def arm(values):
        return {"seeds": [0, 1] * 4, "bases": [b for b in "abcd" for _ in (0, 1)],
                "metrics": {"pass@1": list(values)}}

    reference = [0.60, 0.61, 0.59, 0.62, 0.60, 0.58, 0.61, 0.60]
    arms = {kl_beta.REFERENCE: arm(reference),
            kl_beta.arm_name(0.04): arm([r + d for r, d in zip(reference, beta_004)])}
    summary = {"arms": arms, "contrasts": summary_lib.contrasts(arms, [DAPO.test])}
    return summary_lib.verdicts(summary, [DAPO])[0]["verdict"]


def test_dapo_claim_is_not_refuted_when_dropping_the_term_helps():
    assert DAPO.test == (kl_beta.arm_name(0.04), kl_beta.REFERENCE, "pass@1")
    assert DAPO.expect == "<=" and DAPO.margin == 0.02
    # β = 0 five points ahead: the restriction was not necessary
    assert _verdict([-0.05, -0.06, -0.04, -0.05, -0.05, -0.06, -0.04, -0.05]) == "reproduced"
    assert _verdict([0.0, 0.005, -0.005, 0.0, 0.005, 0.0, -0.005, 0.0]) == "reproduced"
    # the term five points ahead: it was
    assert _verdict([0.05, 0.06, 0.04, 0.05, 0.05, 0.06, 0.04, 0.05]) == "not reproduced"


def test_the_kl_figures_carry_the_sampler_gap():
    assert "logp_gap" in kl_beta.KL  # the k3 check rests on the draw's distribution
