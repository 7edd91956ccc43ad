"""KL(final policy || base model) of every finished run of the sweep, measured the same way
for every beta (the training log has no KL to the reference when beta = 0, because that run
never computes the reference's log-probs).

For each run: the final policy samples 8 completions for each of the 128 held-out problems
(temperature 1, the same key for every run), and the per-token KL is estimated on those
tokens from the policy's and the base model's log-probabilities: k1 = mean(log pi - log
pi_base) and k3 = mean(exp(log pi_base - log pi) - (log pi_base - log pi) - 1). Writes
kl.json next to summary.json and prints one row per arm (mean +- 95% CI over seeds).

    python experiments/kl_beta/measure_kl.py --sweep=runs/experiments/kl_beta/sweep \
        --base=runs/experiments/kl_beta/base
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", required=True)
    parser.add_argument("--base", required=True)
    parser.add_argument("--samples", type=int, default=8)
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np

    from grpo_jax import tasks as tasks_lib
    from grpo_jax.models import logprobs
    from grpo_jax.rl.rollout import encode_prompts, sample_completions
    from grpo_jax.runner.build import build_tokenizer, load_run_policy, run_directory_config
    from grpo_jax.sampling import SamplingConfig
    from grpo_jax.sweep import interval
    from grpo_jax.training import Policy

    config = run_directory_config(args.base)
    task = tasks_lib.get_task(config.task.name, **config.task.kwargs.to_dict())
    tokenizer = build_tokenizer(config, task, args.base)
    examples = task.examples("test", config.task.eval_size, seed=config.seed)
    prompts = [tasks_lib.apply_template(ex, template=config.task.template, tokenizer=tokenizer)
               for ex in examples for _ in range(args.samples)]
    prompt_len = config.task.prompt_len
    tokens, mask = encode_prompts(tokenizer, prompts, prompt_len=prompt_len)
    sampling = SamplingConfig(max_new_tokens=config.rl.max_new_tokens, temperature=1.0,
                              eos_ids=tuple(tokenizer.eos_ids), pad_id=tokenizer.pad_id)
    _, base_model, _, _ = load_run_policy(args.base, tokenizer=tokenizer)
    key = jax.random.key(12345)
    results = {}
    for name in sorted(os.listdir(args.sweep)):
        run_dir = os.path.join(args.sweep, name)
        if not os.path.isfile(os.path.join(run_dir, "report.json")):
            continue
        _, model, _, _ = load_run_policy(run_dir, tokenizer=tokenizer)
        policy, params = Policy.from_model(model)
        out = sample_completions(policy, params, tokens, mask, key, sampling)
        full = jnp.concatenate([jnp.asarray(tokens), jnp.asarray(out.tokens)], axis=1)
        attention = jnp.concatenate([jnp.asarray(mask), jnp.asarray(out.mask)], axis=1)
        completion = np.asarray(out.mask, bool)
        logp = np.asarray(logprobs(model, full, attention)["logp"])[:, prompt_len:]
        logp_base = np.asarray(logprobs(base_model, full, attention)["logp"])[:, prompt_len:]
        ratio = (logp_base - logp)[completion]
        k1, k3 = float(np.mean(-ratio)), float(np.mean(np.exp(ratio) - ratio - 1.0))
        arm = name.rsplit(",seed=", 1)[0]
        results.setdefault(arm, []).append({"run": name, "k1": k1, "k3": k3,
                                            "tokens": int(completion.sum())})
        print(f"{name}: k1 {k1:.4f}, k3 {k3:.4f} over {int(completion.sum())} tokens",
              flush=True)
    summary = {arm: {"k1": interval([r["k1"] for r in rows]),
                     "k3": interval([r["k3"] for r in rows]), "runs": rows}
               for arm, rows in results.items()}
    with open(os.path.join(args.sweep, "kl.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print("| arm | KL k1 per token | KL k3 per token |")
    print("|---|---|---|")
    for arm, entry in summary.items():
        cells = []
        for k in ("k1", "k3"):
            st = entry[k]
            cells.append(f"{st['mean']:.4f} ± {(st['ci95'][1] - st['ci95'][0]) / 2:.4f}")
        print(f"| {arm} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
