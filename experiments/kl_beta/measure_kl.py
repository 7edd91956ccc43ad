"""KL(final policy || base model) of every finished run of the kl_beta sweep, measured the
same way for every beta, and the gradient weights of the KL penalty and the policy gradient.

For the base model and each run's final policy: 8 completions for each of the 128 held-out
problems (the fixed eval set, `task.eval_seed`; temperature 1, the same key for every
policy), scored with the main job's reward (accuracy + 0.2 x format). On the completion
tokens of those samples (positions t of completions y ~ pi, context c_t = prompt + y_<t):

* exact KL: KL_t = sum_v pi(v|c_t) (log pi(v|c_t) - log pi_base(v|c_t)) over the
  char tokenizer's vocabulary (103 symbols; `grpo_jax.losses.full_kl`), averaged over the
  positions. Its mean
  is an unbiased estimate of the per-token KL(pi || pi_base) along pi's own completions,
  with only the variance of the contexts (the sampled token's own noise is summed out);
* k1 = log pi(y_t) - log pi_base(y_t) and k3 = pi_base/pi - log(pi_base/pi) - 1 at the
  sampled token (`grpo_jax.losses.kl_penalty`), the sampled estimates of the same mean;
* the gradient weights. In GRPO's loss (`grpo_jax/rl/update.py`) the per-token term is
  -ratio * A_i + beta * k3_t, aggregated seq-mean-token-mean, so both parts carry the same
  factor 1 / (|o_i| N_seq). Differentiated through log pi (ratio = 1 on-policy), token t
  of completion i gets the weight -A_i on grad log pi(y_t) from the policy gradient and
  beta * (1 - pi_ref(y_t)/pi(y_t)) from the k3 penalty (`grpo_jax/losses/kl.py`). We
  compare their sizes on the same tokens: E_t |A_i| (token-weighted, A the group-normalised
  advantage of the sample's group of 8, 0 on groups with equal rewards) against
  beta * E_t |1 - pi_base(y_t)/pi(y_t)|, the reference being the base model (the RL
  stage's initial parameters). `kl_weight_ratio` is the second over the first.

Standard errors (`*_se`) of the three per-token means are by a bootstrap over problems (a
problem's 8 completions together). --keep reuses the runs already in kl.json.

The log-probs are recomputed teacher-forced; `logp_gap` (largest |teacher-forced - sampler
log pi| on a completion token) checks that they are the sampled distribution's.

Writes kl.json next to this file (or --out): the base model's and each run's figures, with
their last-10-steps training metrics (`kl_ref`, `zero_std_groups`, reward). The paired
analysis over seeds is analyze.py's.

    python experiments/kl_beta/measure_kl.py --sweep=runs/experiments/kl_beta/sweep \
        --base=runs/experiments/off_policy/base
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

WEIGHTS = {"accuracy": 1.0, "format": 0.2}  # the main job's rl.rewards
TRAINING = ("kl_ref", "zero_std_groups", "reward_mean", "reward_std", "pass@1",
            "completion_length", "entropy")


def setup(base: str, samples: int):
    """The base run's task, tokenizer, policy and the fixed held-out prompts."""
    from grpo_jax import tasks as tasks_lib
    from grpo_jax.runner.build import eval_seed, load_finished_run

    try:
        config, task, tokenizer, policy, params = load_finished_run(base)
    except FileNotFoundError as err:
        raise SystemExit(str(err)) from None
    examples = task.examples("test", int(config.task.eval_size), seed=eval_seed(config))
    rows = [ex for ex in examples for _ in range(samples)]
    prompts = [tasks_lib.apply_template(ex, template=config.task.template,
                                        tokenizer=tokenizer) for ex in rows]
    return {"config": config, "task": task, "tokenizer": tokenizer, "policy": policy,
            "base_params": params, "rows": rows, "prompts": prompts,
            "eval_seed": eval_seed(config), "prompt_len": int(config.task.prompt_len)}


def token_fn(policy, prompt_len: int):
    """jit(params, base_params, tokens, attention) -> per completion position [B, N]: the
    exact KL, log pi and log pi_base of the token in that slot."""
    import jax
    import jax.numpy as jnp

    from grpo_jax import losses

    @jax.jit
    def fn(params, base_params, tokens, attention):
        logits = policy.bind(params)(tokens, attention_mask=attention)
        base_logits = policy.bind(base_params)(tokens, attention_mask=attention)
        # the logits at position j predict token j + 1
        logits = logits[:, prompt_len - 1:-1]
        base_logits = base_logits[:, prompt_len - 1:-1]
        target = tokens[:, prompt_len:, None]
        logp = jnp.take_along_axis(jax.nn.log_softmax(logits, -1), target, -1)[..., 0]
        base_logp = jnp.take_along_axis(jax.nn.log_softmax(base_logits, -1), target, -1)[..., 0]
        return losses.full_kl(logits, base_logits), logp, base_logp

    return fn


def training_metrics(run_dir: str) -> dict:
    from grpo_jax.metrics import read_metrics

    rows = [r for r in read_metrics(run_dir) if r.get("stage") == "rl"]
    out = {}
    for name in TRAINING:
        values = [r[name] for r in rows[-10:] if name in r]
        out[name] = sum(values) / len(values) if values else None
    return out


def measure(s, params, key, samples: int, chunk: int) -> dict:
    """Samples from the policy with `params` and returns its KL and weight figures."""
    import jax.numpy as jnp
    import numpy as np

    from grpo_jax import losses
    from grpo_jax.rl.rollout import rollout
    from grpo_jax.sampling import SamplingConfig

    config, tokenizer, policy = s["config"], s["tokenizer"], s["policy"]
    sampling = SamplingConfig(max_new_tokens=int(config.rl.max_new_tokens), temperature=1.0,
                              eos_ids=tuple(tokenizer.eos_ids), pad_id=tokenizer.pad_id,
                              prompt_group=samples)
    ro = rollout(policy, params, tokenizer, s["rows"], s["prompts"], key, sampling=sampling,
                 prompt_len=s["prompt_len"], reward_fns=s["task"].reward_fns(),
                 weights=WEIGHTS)
    full = np.concatenate([ro.prompt_tokens, ro.tokens], 1)
    attention = np.concatenate([ro.prompt_mask, ro.mask], 1)
    fn = s.setdefault("token_fn", token_fn(policy, s["prompt_len"]))
    parts = [fn(params, s["base_params"], jnp.asarray(full[i:i + chunk]),
                jnp.asarray(attention[i:i + chunk])) for i in range(0, len(full), chunk)]
    exact, logp, base_logp = (np.concatenate([np.asarray(p[k]) for p in parts])
                              for k in range(3))
    mask = np.asarray(ro.loss_mask, bool)
    d = (base_logp - logp)[mask]  # log pi_base/pi at the sampled tokens
    k1 = -d
    k3 = np.asarray(losses.kl_penalty(jnp.asarray(logp[mask]), jnp.asarray(base_logp[mask]),
                                      kind="k3"))
    exact_t = exact[mask]
    weight = np.abs(1.0 - np.exp(d))  # |1 - pi_base/pi|, the k3 gradient's weight / beta
    adv = np.asarray(losses.group_advantages(jnp.asarray(ro.rewards), group_size=samples))
    lengths = mask.sum(1)
    adv_t = np.repeat(np.abs(adv), lengths)  # |A_i| at each of completion i's tokens
    rewards = ro.rewards.reshape(-1, samples)
    mixed = rewards.max(1) > rewards.min(1)
    mixed_t = np.repeat(np.repeat(mixed, samples), lengths)
    acc = ro.components["accuracy"].reshape(-1, samples)
    # standard errors of the three per-token means over the sampling, by a bootstrap over
    # problems (a problem's 8 completions resampled together; 1000 draws, fixed rng)
    per_problem = {name: np.where(mask, values, 0.0).sum(1).reshape(-1, samples).sum(1)
                   for name, values in (("exact_kl", exact), ("k1", base_logp - logp),
                                        ("k3", np.asarray(losses.kl_penalty(
                                            jnp.asarray(logp), jnp.asarray(base_logp),
                                            kind="k3"))))}
    per_problem["k1"] = -per_problem["k1"]
    count = lengths.reshape(-1, samples).sum(1)
    draws = np.random.default_rng(0).integers(0, len(count), (1000, len(count)))
    se = {f"{name}_se": float(np.std(v[draws].sum(1) / count[draws].sum(1)))
          for name, v in per_problem.items()}
    return {
        **se,
        "tokens": int(mask.sum()),
        "exact_kl": float(exact_t.mean()), "k1": float(k1.mean()), "k3": float(k3.mean()),
        # per-token standard deviations: the spread that each estimator averages down
        "exact_kl_token_std": float(exact_t.std()), "k1_token_std": float(k1.std()),
        "k3_token_std": float(k3.std()),
        "exact_kl_per_completion": float(exact_t.sum() / len(full)),
        "mean_abs_1_minus_ratio": float(weight.mean()),
        "mean_abs_advantage": float(adv_t.mean()),
        "mean_abs_advantage_mixed_groups": float(adv_t[mixed_t].mean()) if mixed_t.any()
        else 0.0,
        "mixed_group_frac": float(mixed.mean()),
        "pass@1": float(acc.mean()), "pass@8": float((acc.max(1) > 0).mean()),
        "mean_length": float(lengths.mean()),
        "logp_gap": float(np.max(np.abs(logp - ro.sample_logp)[mask])),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", required=True, help="the sweep directory")
    parser.add_argument("--base", required=True, help="the base run (the reference)")
    parser.add_argument("--samples", type=int, default=8, help="completions per problem")
    parser.add_argument("--key", type=int, default=12345, help="the sampling key, every run")
    parser.add_argument("--chunk", type=int, default=256, help="rows per teacher-forced pass")
    parser.add_argument("--out", default=HERE)
    parser.add_argument("--keep", action="store_true",
                        help="keep the runs already in --out's kl.json (same key and samples)")
    args = parser.parse_args()

    import jax

    from flax import nnx

    from grpo_jax.runner.build import load_run_policy, run_directory_config
    from grpo_jax.stages.rl import settings as rl_settings

    s = setup(args.base, args.samples)
    key = jax.random.key(args.key)
    result = {"base": args.base, "eval_seed": s["eval_seed"], "samples": args.samples,
              "key": args.key, "problems": len(s["rows"]) // args.samples, "runs": {}}
    path = os.path.join(args.out, "kl.json")
    kept = {}
    if args.keep and os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
        if (old.get("key"), old.get("samples")) == (args.key, args.samples):
            kept = old.get("runs", {})
    start = time.time()
    result["base_model"] = measure(s, s["base_params"], key, args.samples, args.chunk)
    print(f"base: pass@1 {result['base_model']['pass@1']:.3f}, E|A| "
          f"{result['base_model']['mean_abs_advantage']:.3f}", flush=True)
    for name in sorted(os.listdir(args.sweep)):
        run_dir = os.path.join(args.sweep, name)
        if not os.path.isfile(os.path.join(run_dir, "report.json")):
            continue
        if name in kept:
            result["runs"][name] = kept[name]
            continue
        config = run_directory_config(run_dir)
        beta = float(rl_settings(config.rl)[1].beta)  # None in the config: the default
        _, model, _, _ = load_run_policy(run_dir, tokenizer=s["tokenizer"])
        params = nnx.to_pure_dict(nnx.state(model))
        row = measure(s, params, key, args.samples, args.chunk)
        row.update({"beta": beta, "seed": int(config.seed),
                    "kl_grad_weight": beta * row["mean_abs_1_minus_ratio"],
                    "kl_weight_ratio": beta * row["mean_abs_1_minus_ratio"]
                    / row["mean_abs_advantage"] if row["mean_abs_advantage"] else math.nan,
                    "training_last_10": training_metrics(run_dir)})
        result["runs"][name] = row
        print(f"{name}: exact KL {row['exact_kl']:.4f} (k1 {row['k1']:.4f}, k3 "
              f"{row['k3']:.4f}) over {row['tokens']} tokens; beta E|1-ref/pi| "
              f"{row['kl_grad_weight']:.4f} vs E|A| {row['mean_abs_advantage']:.3f}; "
              f"logp gap {row['logp_gap']:.1e}", flush=True)
    result["wall_s"] = time.time() - start
    with open(path, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
