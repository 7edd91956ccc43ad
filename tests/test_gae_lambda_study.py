"""gae_lambda: each claim says how its test could fail here (the design's reason, `why`,
before the rule's statement; or a can_fail of its own); a check says in can_fail why it
cannot."""

import dataclasses

from grpo_jax.studies import gae_lambda


def test_every_claim_says_how_its_test_could_fail_here():
    for claim in gae_lambda.CLAIMS:
        if claim.untestable:
            continue
        if claim.kind == "check":
            assert claim.failure().startswith("no: "), claim.test
        elif not claim.can_fail:
            rule = dataclasses.replace(claim, why="").failure()
            assert claim.why and claim.failure() == f"{claim.why}; {rule}", claim.test
