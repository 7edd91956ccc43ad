"""expert_iteration's claims as the rule decides them, on hand-made arms at the full tier's
shape (four bases x two seeds): the first ("comparably to (or better than)") is a ">=" claim,
so a lead of expert iteration over GRPO reproduces it and only a shortfall of the margin
refutes it; the second quotes the abstract."""

import pytest

from grpo_jax.studies import expert_iteration as ei
from grpo_jax.studies import summary as summary_lib

ABSTRACT = (
    "Overall, we find all algorithms perform comparably, with Expert Iteration performing best "
    "in most cases. Surprisingly, we find the sample complexity of Expert Iteration is similar "
    "to that of PPO, requiring at most on the order of 10^6 samples to converge from a "
    "pretrained checkpoint. We investigate why this is the case, concluding that during RL "
    "training models fail to explore significantly beyond solutions already produced by SFT "
    "models. Additionally, we discuss a trade off between maj@1 and pass@96 metric performance "
    "during SFT training and how conversely RL training improves both simultaneously.")
KEYS = [(f"b{b}", s) for b in range(4) for s in (0, 1)]


def _arm(values, metric="pass@1"):
    return {"seeds": [s for _, s in KEYS], "bases": [b for b, _ in KEYS],
            "metrics": {metric: list(values)}}


def _verdict(claim, arms):
    result = summary_lib.build(
        study="expert_iteration", tier="full",
        provenance={k: None for k in summary_lib.PROVENANCE},
        protocol={k: None for k in summary_lib.PROTOCOL}, arms=arms, specs=[claim.test],
        claims=(claim,))
    return result["verdicts"][0]["verdict"]


@pytest.mark.parametrize("shift, spread, expected", [
    (+0.06, 0.004, "reproduced"),  # expert iteration ahead: "or better than"
    (+0.00, 0.004, "reproduced"),  # level, a narrow interval
    (-0.06, 0.004, "not reproduced"),  # short of GRPO by twice the margin
    (+0.00, 0.05, "not resolved"),  # level, an interval wider than the margin
])
def test_the_first_claim_is_expert_iteration_not_below_grpo(shift, spread, expected):
    claim = ei.CLAIMS[0]
    assert claim.test == (ei.EI, ei.GRPO, "pass@1") and claim.expect == ">="
    grpo = [0.55 + 0.01 * (i % 3) for i in range(len(KEYS))]
    noise = [spread if i % 2 else -spread for i in range(len(KEYS))]
    expert = [g + shift + n for g, n in zip(grpo, noise)]
    assert _verdict(claim, {ei.EI: _arm(expert), ei.GRPO: _arm(grpo)}) == expected
    assert claim.failure().startswith(claim.why)


def test_the_second_claim_quotes_the_abstract_and_is_tested_on_rl_after_sft():
    claim = ei.CLAIMS[1]
    assert claim.text in ABSTRACT
    assert claim.test == (ei.SFT_GRPO, ei.SFT, "pass@8") and claim.expect == "<="
    assert "(quoted)" in claim.source and "improves maj@1 and pass@96" in claim.source
