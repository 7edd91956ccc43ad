"""budget_forcing: each claim says how its test could fail here (the design's reason, `why`, before
the rule's statement); a check says in can_fail why it cannot."""

import dataclasses

from grpo_jax.studies import budget_forcing


def test_every_claim_says_how_its_test_could_fail_here():
    for claim in budget_forcing.CLAIMS:
        if claim.untestable:
            continue
        if claim.kind == "claim":
            rule = dataclasses.replace(claim, why="").failure()
            assert claim.why and claim.failure() == f"{claim.why}; {rule}", claim.test
        else:
            assert claim.failure().startswith("no: "), claim.test
