"""The kl_beta study's claims: each says how its test could fail in this design."""

import dataclasses

from grpo_jax.studies import kl_beta

# k3's mean equals the exact KL in expectation at every sampled position (the measurement
# samples the untempered policy over its whole vocabulary: E_pi[k3] = KL(pi || base)), so
# only sampling noise can move its test: no design reason to state.
UNBIASED = (kl_beta.estimator_arm("k3"), kl_beta.estimator_arm("exact"), "kl")


def test_every_claim_says_how_its_test_could_fail_here():
    """Each testable claim has a `why`, which summary.json's failure text puts before the
    rule's statement."""
    claims = [c for c in kl_beta.CLAIMS
              if c.kind == "claim" and not c.untestable and c.test != UNBIASED]
    assert claims
    for claim in claims:
        rule = dataclasses.replace(claim, why="").failure()
        assert claim.why and claim.failure() == f"{claim.why}; {rule}", claim.test
