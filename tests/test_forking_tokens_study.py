"""The forking_tokens study's claims: each says how its test could fail in this design."""

import dataclasses

from grpo_jax.studies import forking_tokens


def test_every_claim_says_how_its_test_could_fail_here():
    """Each testable claim has a `why`, which summary.json's failure text puts before the
    rule's statement."""
    claims = [c for c in forking_tokens.CLAIMS if c.kind == "claim" and not c.untestable]
    assert claims
    for claim in claims:
        rule = dataclasses.replace(claim, why="").failure()
        assert claim.why and claim.failure() == f"{claim.why}; {rule}", claim.test
