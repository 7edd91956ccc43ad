"""one_shot's selection at the full tier's shape (no training): the prior run's prompts, drawn
as its RL stage draws them, show every pool problem once an epoch, and `select` reads a prior
run's samples.jsonl back to the problem whose training accuracy varied most over the epochs
(the mini tier's toy prior scores every problem 0, so it always takes the first); `attach`
sets that problem on the 1-problem arm only."""

import json

from grpo_jax.runner.inputs import build_task, train_examples
from grpo_jax.runner.prompts import prompt_of
from grpo_jax.runner.run import derive_seed
from grpo_jax.studies import one_shot
from grpo_jax.tasks.data import prompt_iterator


def _prior(tmp_path, seed=2):
    """A finished prior run of the full tier (its config.json, report.json) from base `seed`."""
    config = one_shot.prior_config("full", {"base": str(tmp_path / "base")})
    config.seed = seed
    workdir = tmp_path / "prior"
    workdir.mkdir()
    (workdir / "config.json").write_text(config.to_json_best_effort())
    (workdir / "report.json").write_text("{}")
    return config, str(workdir)


def test_the_full_tier_prior_run_is_twenty_epochs_of_each_pool_problem_once(tmp_path):
    config, _ = _prior(tmp_path)
    pool_size, epochs = one_shot.prior_sizes("full")
    task = build_task(config)
    pool = train_examples(config, task)
    assert len(pool) == pool_size and config.rl.steps * config.rl.num_prompts == (
        pool_size * epochs)
    batches = prompt_iterator(pool, batch_size=config.rl.num_prompts,
                              seed=derive_seed(config.seed, one_shot.PRIOR_STAGE, "prompts"),
                              shard_index=0, shard_count=1)
    per_epoch = pool_size // config.rl.num_prompts
    steps = [next(batches) for _ in range(config.rl.steps)]
    for epoch in range(epochs):
        seen = [ex.id for batch in steps[epoch * per_epoch:(epoch + 1) * per_epoch]
                for ex in batch]
        assert sorted(seen) == sorted(ex.id for ex in pool)


def test_select_reads_the_full_tier_prior_back_to_the_most_variable_problem(tmp_path):
    config, workdir = _prior(tmp_path)
    task = build_task(config)
    pool = train_examples(config, task)
    batches = prompt_iterator(pool, batch_size=config.rl.num_prompts,
                              seed=derive_seed(config.seed, one_shot.PRIOR_STAGE, "prompts"),
                              shard_index=0, shard_count=1)
    per_epoch = len(pool) // config.rl.num_prompts
    # learned: 0 in the first ten epochs, 1 after; noisy: 3 or 5 of 8 right (neither repeated
    # in the pool: the training split may repeat a problem, whose completions then add up)
    learned, noisy = 36, 5
    assert [ex.id for ex in pool].count(pool[learned].id) == 1
    rows = []
    for step in range(config.rl.steps):
        epoch = step // per_epoch
        for ex in next(batches):
            for k in range(config.rl.group_size):
                if ex.id == pool[learned].id:
                    right = epoch >= 10
                elif ex.id == pool[noisy].id:
                    right = k < (3 if epoch % 2 else 5)
                else:
                    right = k < 4
                rows.append({"step": step + 1, "stage": one_shot.PRIOR_STAGE,
                             "prompt": prompt_of(config, task, None, ex), "completion": "",
                             "reward": float(right), "accuracy": float(right)})
    with open(f"{workdir}/samples.jsonl", "w", encoding="utf-8") as f:
        f.write("".join(json.dumps(row) + "\n" for row in rows))
    chosen = one_shot.select(workdir)
    assert chosen["index"] == learned and chosen["score"] == 0.25
    assert chosen["epochs"] == one_shot.prior_sizes("full")[1] == len(chosen["accuracy_by_epoch"])
    assert chosen["scored"] == 2
    arms = one_shot.arm_configs("full")
    for name, arm in arms.items():
        one_shot.attach(arm, {"roles": {"base": "BASE", "prior": workdir}})
        assert arm.model.init_from == "BASE"
        assert arm.task.get("train_pick") == ((learned,) if name == one_shot.ONE else None)
    one = arms[one_shot.ONE]
    one.seed = 0
    assert [ex.id for ex in train_examples(one, task)] == [pool[learned].id]
