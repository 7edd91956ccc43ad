"""How much of the network does RL change, against supervised fine-tuning of the same budget?

From the main base (configs/default.py's pretraining, 1500 steps; the full tier's base seeds,
`tiers.FULL_BASES`), two arms of the same budget: 80 optimizer steps of 256 sequences at the
same learning rate, Adam, float32 parameters:

* `rl`: the main job's GRPO stage (32 prompts x 8 completions per step);
* `sft`: supervised fine-tuning on the task's clean worked solutions (256 per step).

After training (`measure`, `evals.token_analysis`): the fraction of parameter entries the
run changed (`changed_bf16`: whose bfloat16 value differs from the base's, the precision
Mukherjee et al. store in; `changed_1e-5`: |delta| > 1e-5), and for each weight matrix the
effective rank of its update over its full rank (`relative_rank`, averaged over the
matrices; a 3-D attention kernel is flattened to [in, out]). The pseudo-arm `80% rank` holds
0.8 for every (base, seed): the bar a "nearly full-rank" update clears here; `30% of
entries` holds 0.3, the top of the paper's range (a test added after the runs).
"""

from __future__ import annotations

import json

from grpo_jax import storage
from grpo_jax.studies import common, tables, tiers
from grpo_jax.studies.arms import per_arm

RL, SFT, RANK_BAR, SMALL = "rl", "sft", "80% rank", "30% of entries"
MEASURED = ("changed_bf16", "changed_1e-5", "relative_rank")
SPECS = [(RL, SFT, "changed_bf16"), (RL, SFT, "changed_1e-5"), (RL, RANK_BAR, "relative_rank"),
         (RL, SFT, "relative_rank"), (RL, SFT, "pass@1"), (RL, SMALL, "changed_bf16")]


base_config = common.main_base


def arm_config(arm: str, tier: str = "full"):
    """One arm's run from the base in model.init_from: the held-out evaluation, GRPO (rl) or
    SFT of the same steps, sequences per step and learning rate, the evaluation again."""
    config = common.main_arm(tier, "")  # its stages below
    if arm == RL:
        config.stages = "eval_base,rl,eval_final"
        return config
    return sft_of(config)


def sft_of(config):
    """A GRPO arm's config (`config.rl`) turned into its SFT arm, in place: supervised
    fine-tuning on the task's clean worked solutions with the same steps, sequences per step
    (prompts x group) and learning rate, between the same evaluations."""
    from grpo_jax.stages import default_section

    sequences = config.rl.num_prompts * config.rl.group_size
    config.sft = default_section("sft")
    config.sft.update(steps=config.rl.steps, batch_size=sequences, lr=config.rl.lr,
                      num_examples=config.rl.steps * sequences, error_rate=0.0)
    config.stages = "eval_base,sft,eval_final"
    del config.rl
    return config


def arm_configs(tier: str) -> dict:
    return {arm: arm_config(arm, tier) for arm in (RL, SFT)}


def _measure_run(record, base: str) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from grpo_jax.evals.token_analysis import effective_rank, update_sparsity

    _, _, tokenizer, _, base_params = common.load_finished(base)
    params = common.load_run_params(record.workdir, tokenizer)
    bf16 = lambda tree: jax.tree.map(  # noqa: E731
        lambda x: np.asarray(jnp.asarray(x).astype(jnp.bfloat16).astype(jnp.float32)), tree)
    ranks = []
    for (path, before), after in zip(jax.tree_util.tree_flatten_with_path(base_params)[0],
                                     jax.tree.leaves(params)):
        if np.ndim(before) < 2 or "embed" in jax.tree_util.keystr(path):
            continue
        delta = np.asarray(after, np.float64) - np.asarray(before, np.float64)
        delta = delta.reshape(delta.shape[0], -1)
        ranks.append(effective_rank(delta) / min(delta.shape))
    return {"changed_bf16": update_sparsity(bf16(base_params), bf16(params), tol=0.0)["changed"],
            "changed_1e-5": update_sparsity(base_params, params, tol=1e-5)["changed"],
            "relative_rank": float(np.mean(ranks)), "matrices": len(ranks)}


def measure(runs: common.StudyRuns) -> None:
    """update.json in every finished run without one."""
    for record in runs.runs:
        path = storage.join(record.workdir, "update.json")
        if not record.finished or storage.isfile(path):
            continue
        row = _measure_run(record, runs.bases[record.base]["workdir"])
        storage.write_text(path, json.dumps(row, indent=2))
        print(f"[studies] update_sparsity {record.arm} seed={record.seed}: changed "
              f"{row['changed_bf16']:.3f} (bf16), relative rank {row['relative_rank']:.3f}",
              flush=True)


def _values(record) -> dict:
    values = {"pass@1": common.last_stage_rows(record).get("eval_final", {}).get("pass@1")}
    path = storage.join(record.workdir, "update.json")
    if storage.isfile(path):
        measured = json.loads(storage.read_text(path))
        values.update({name: measured.get(name) for name in MEASURED})
    return values


def analyze(runs: common.StudyRuns) -> common.Analysis:
    arms = per_arm(runs, _values, (RL, SFT))
    common.constant_arm(arms, RL, RANK_BAR, "relative_rank", 0.8)
    common.constant_arm(arms, RL, SMALL, "changed_bf16", 0.3)
    return common.Analysis(arms=arms, specs=SPECS, table=table(arms),
                           plots=tables.bar_plots(arms, (
                               ("changed_bf16", "entries changed (bf16), %", 100.0),
                               ("relative_rank", "update's effective rank / full, %", 100.0))))


def table(arms: dict) -> str:
    return tables.arm_table(
        arms, (RL, SFT),
        ("entries changed (bf16)", "entries changed (> 1e-5)",
         "update's effective rank / full rank", "pass@1"),
        tables.metric_row("changed_bf16", "changed_1e-5", "relative_rank", "pass@1"),
        "All in %, mean ± 95% half-width over (base, seed) runs: the final parameters against "
        "the base's, every entry of every leaf (embeddings included in the fractions; the ranks "
        "over the weight matrices, embeddings left out).", first="arm")


SOURCE = ("Mukherjee et al. 2025, \"Reinforcement Learning Finetunes Small Subnetworks in "
          "Large Language Models\", arXiv:2505.11711, abstract (close paraphrase)")
CLAIMS = (
    common.Claim("RL updates only a small subnetwork of the parameters, where SFT updates "
                 "densely", SOURCE + "; tested on the entries whose bfloat16 value changed",
                 (RL, SFT, "changed_bf16"), "<", margin=0.05,
                 why="float32 Adam scales each entry's step to about the learning rate "
                     "whatever its gradient's size, so over 80 steps both arms can move "
                     "nearly every entry with a nonzero gradient past bfloat16's "
                     "resolution; RL's gradient is zero only on groups that all score alike, "
                     "so its count can sit within the margin of SFT's dense one",
                 note="their models train in bfloat16, where updates below its resolution "
                      "are lost; here float32 parameters are rounded only for the count"),
    common.Claim("RL updates a small subnetwork: 5% to 30% of the parameters", SOURCE +
                 "; ADDED AFTER THE FIRST RUNS: the pre-registered test above compares RL "
                 "with SFT only, not the size the paper reports; this one tests that size, "
                 "against 30%",
                 (RL, SMALL, "changed_bf16"), "<", margin=0.05,
                 why="the parameters train in float32, where no step is lost to rounding, "
                     "and Adam moves each entry with a nonzero gradient by about the "
                     "learning rate per step whatever its size: 80 such steps can carry most "
                     "entries of a small model's matrices past bfloat16's resolution, well "
                     "above 30%, sparsity or not in the gradient's signal"),
    common.Claim("despite its sparsity, the RL update is nearly full-rank", SOURCE +
                 "; tested as the mean effective rank of the matrices' updates above 80% "
                 "of their full rank", (RL, RANK_BAR, "relative_rank"), ">", margin=0.05,
                 why="the effective rank counts how evenly the update spreads over its "
                     "singular directions: if GRPO's 80 steps push the same few directions "
                     "(the few step tokens where the base confuses an operator), each "
                     "matrix's spectrum decays fast and the mean falls below 80% of full "
                     "rank even where most entries changed",
                 note=common.POST_HOC_MARGIN),
)

STUDY = common.Study(
    name="update_sparsity",
    question="what fraction of the parameters does GRPO change, and with what rank, against "
             "SFT of the same steps, sequences and learning rate from the same base, paired "
             "by seed?",
    tiers=tiers.standard(
        full="about 20 min on 2 cores (estimated: 2 main bases, shared "
             "with the other studies of the main base; 12 runs)"),
    arms=(RL, SFT), base_config=base_config, arm_configs=arm_configs, analyze=analyze,
    measure=measure, claims=CLAIMS,
)
