"""Seconds per GRPO iteration of Tunix's GRPOLearner + RLCluster (peer benchmark).

Run with the Tunix venv (this file must not import grpo_jax):

    JAX_PLATFORMS=cpu /work/peers/tunix/bin/python benchmarks/peers/tunix_grpo.py --hidden 128

Workload: a random Qwen2 (tunix.models.qwen2), 8 prompts x 8 generations of up to 64 tokens,
temperature 1, beta 0.04, AdamW, one optimizer step per iteration on the whole batch. Everything
is built offline. The last line printed is `RESULT {json}`.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import importlib.metadata
import json
import time

import flax
import jax
import numpy as np
import optax
from flax import nnx
from tunix.models.qwen2 import model as qwen2
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.grpo import grpo_learner
from tunix.rl.rollout import base_rollout

PAD, EOS = 0, 1  # prompts use ids >= 2; the near-uniform random model samples EOS ~1/V per token


class WordTokenizer:
    """Offline tokenizer over the words "t0".."t{V-1}" split on whitespace.

    Implements the duck-typed interface tunix.generate.tokenizer_adapter.TokenizerAdapter accepts
    (encode/decode/bos_id/eos_id/pad_id). bos_id() is 0, which Tunix's sampler treats as "no BOS"
    (`if tokenizer.bos_id()`), so prompts are exactly their words.
    """

    def __init__(self, vocab):
        self.vocab = vocab

    def encode(self, text, **_):
        return [int(w[1:]) for w in text.split()]

    def decode(self, ids, **_):
        return " ".join(f"t{int(i)}" for i in ids)

    def bos_id(self):
        return 0

    def eos_id(self):
        return EOS

    def pad_id(self):
        return PAD


def even_fraction_reward(prompts, completions, **_):
    """Fraction of completion tokens whose id is even (varies within a group)."""
    out = []
    for text in completions:
        ids = [int(w[1:]) for w in text.split()]
        out.append(sum(i % 2 == 0 for i in ids) / max(len(ids), 1))
    return out


def build_model(args):
    h = args.hidden
    config = qwen2.ModelConfig(
        num_layers=4, vocab_size=args.vocab, embed_dim=h, hidden_dim=int(2.6875 * h),
        num_heads=4, head_dim=h // 4, num_kv_heads=2, rope_theta=10_000, norm_eps=1e-6,
        use_tied_embedding=True, dtype=np.float32, param_dtype=np.float32,
    )
    model = qwen2.Qwen2(config, rngs=nnx.Rngs(params=args.seed))
    # Tunix's own init draws the tied embedding from N(0, 1) (logits with std ~sqrt(H): nearly
    # greedy sampling, identical generations within a group) and zeros the MLP kernels. Re-draw
    # every matrix from N(0, 0.02) as HF/grpo_jax do; q/k/v biases stay 0 and norm scales 1.
    state = nnx.state(model, nnx.Param)
    leaves, treedef = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(args.seed), len(leaves))
    leaves = [0.02 * jax.random.normal(k, x.shape, x.dtype) if x.ndim >= 2 else x
              for k, x in zip(keys, leaves)]
    nnx.update(model, jax.tree.unflatten(treedef, leaves))
    return model


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--prompt_len", type=int, default=16)
    p.add_argument("--new_tokens", type=int, default=64)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--beta", type=float, default=0.04)
    args = p.parse_args()
    total = args.warmup + args.iterations

    actor = build_model(args)
    reference = build_model(args)  # separate copy with identical weights (needed for beta > 0)
    n_params = sum(x.size for x in jax.tree.leaves(nnx.state(actor, nnx.Param)))

    # One mesh over all local devices (one CPU device here) with the axis names Tunix's
    # sharding specs use; actor, rollout and reference are colocated, so the rollout shares the
    # actor's weights (no weight sync) and the reference is a separate model on the same mesh.
    devices = jax.devices()
    mesh = jax.make_mesh((len(devices), 1), ("fsdp", "tp"), devices=devices,
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)  # as tunix.utils.mesh
    rollout_config = base_rollout.RolloutConfig(
        max_tokens_to_generate=args.new_tokens,
        temperature=1.0,
        top_p=1.0,  # top_p=None would select greedy decoding; 1.0 + no top_k = plain categorical
        top_k=None,
        max_prompt_length=args.prompt_len,
        kv_cache_size=args.prompt_len + args.new_tokens,  # cache no longer than needed
    )
    training_config = rl_cluster_lib.RLTrainingConfig(
        actor_optimizer=optax.adamw(args.lr),
        eval_every_n_steps=10**9,
        max_steps=total,
        metrics_logging_options=None,  # in-memory metrics only (no TensorBoard/W&B backends)
        checkpoint_root_directory=None,
        mini_batch_size=None,  # -> the whole batch: one optimizer step per iteration
        train_micro_batch_size=None,  # no gradient accumulation
    )
    cluster_config = rl_cluster_lib.ClusterConfig(
        role_to_mesh={r: mesh for r in (rl_cluster_lib.Role.ACTOR,
                                         rl_cluster_lib.Role.REFERENCE,
                                         rl_cluster_lib.Role.ROLLOUT)},
        rollout_engine="vanilla",
        offload_to_cpu=False,
        training_config=training_config,
        rollout_config=rollout_config,
    )
    cluster = rl_cluster_lib.RLCluster(actor=actor, reference=reference,
                                       tokenizer=WordTokenizer(args.vocab),
                                       cluster_config=cluster_config)
    algo_config = grpo_learner.GRPOConfig(num_generations=args.group, num_iterations=1,
                                          beta=args.beta, epsilon=0.2)
    learner = grpo_learner.GRPOLearner(rl_cluster=cluster, algo_config=algo_config,
                                       reward_fns=[even_fraction_reward])

    # --- timing hooks: one learner._run_global_step call = one GRPO iteration (rollout, reward,
    # reference log-probs, one train step). The sampler returns host arrays, so generate() is
    # synchronous; after the step we block on the actor params (Tunix dispatches the train step
    # asynchronously).
    iter_s, gen_s, gen_now, n_tokens, rewards, ref_calls = [], [], [], [], [], [0]
    rollout, worker = cluster.rollout, cluster.inference_worker
    orig_generate, orig_ref = rollout.generate, worker.get_ref_per_token_logps
    orig_step, orig_reward = learner._run_global_step, learner.reward_manager

    def timed_generate(prompts, config, **kw):
        t = time.perf_counter()
        out = orig_generate(prompts, config, **kw)
        gen_now.append(time.perf_counter() - t)
        n_tokens.extend(len(x) for x in out.tokens)
        return out

    def counted_ref(*a, **kw):
        ref_calls[0] += 1
        return orig_ref(*a, **kw)

    def recorded_reward(**kw):
        info = orig_reward(**kw)
        rewards.append(np.asarray(info["rewards"]))
        return info

    def timed_step(*a, **kw):
        gen_now.clear()
        t = time.perf_counter()
        orig_step(*a, **kw)
        jax.block_until_ready(nnx.state(cluster.actor_trainer.model, nnx.Param))
        iter_s.append(time.perf_counter() - t)
        gen_s.append(sum(gen_now))
        print(f"iteration {len(iter_s)}: {iter_s[-1]:.3f} s (generate {gen_s[-1]:.3f} s)",
              flush=True)

    rollout.generate, worker.get_ref_per_token_logps = timed_generate, counted_ref
    learner._run_global_step, learner.reward_manager = timed_step, recorded_reward

    # In-memory dataset: exactly `total` batches of `prompts` prompts of `prompt_len` words. The
    # prompts must be a numpy array (Tunix tree-maps np.repeat over the batch; a list would be
    # mapped element by element).
    rng = np.random.default_rng(args.seed)
    prompt = lambda: " ".join(f"t{i}" for i in rng.integers(2, args.vocab, args.prompt_len))
    dataset = [{"prompts": np.array([prompt() for _ in range(args.prompts)])}
               for _ in range(total)]

    def params():
        return [np.array(x)
                for x in jax.tree.leaves(nnx.state(cluster.actor_trainer.model, nnx.Param))]

    before = params()
    learner.train(dataset)
    after = params()

    # Sanity checks: one optimizer step per iteration, rewards vary within groups, the
    # reference model ran once per iteration when beta > 0, and the weights moved.
    group_std = float(np.mean([r.reshape(-1, args.group).std(axis=1).mean() for r in rewards]))
    checks = {
        "optimizer_steps": int(cluster.actor_trainer.train_steps),
        "iterations_timed": len(iter_s),
        "reference_logps_calls": ref_calls[0],
        "weights_changed": bool(any(not np.array_equal(a, b) for a, b in zip(before, after))),
        "weight_sync": bool(learner.should_sync_weights),
        "mean_within_group_reward_std": group_std,
        "mean_completion_tokens": float(np.mean(n_tokens)),
    }
    assert checks["optimizer_steps"] == total == len(iter_s), checks
    assert args.beta == 0 or ref_calls[0] == total, checks
    result = {
        "peer": "tunix",
        "version": importlib.metadata.version("google-tunix"),
        "jax": jax.__version__,
        "flax": flax.__version__,
        "hidden": args.hidden,
        "params": int(n_params),
        "tied": True,
        "iteration_s": iter_s[args.warmup:],
        "first_iteration_s": iter_s[0],
        "generate_s": gen_s[args.warmup:],
        "config": {
            **vars(args),
            "layers": 4, "heads": 4, "kv_heads": 2, "head_dim": args.hidden // 4,
            "mlp_hidden": int(2.6875 * args.hidden), "rope_theta": 10_000, "dtype": "float32",
            "temperature": 1.0, "top_p": 1.0, "top_k": None, "epsilon": 0.2,
            "optimizer": "optax.adamw", "num_iterations": 1, "mini_batch": "full batch",
            "loss_agg_mode": algo_config.loss_agg_mode, "kl_loss_mode": algo_config.kl_loss_mode,
            "rollout_engine": "vanilla", "kv_cache_size": rollout_config.kv_cache_size,
            "mesh": f"{len(devices)} {devices[0].platform} device(s) on axis fsdp (tp=1)",
            "init": "N(0, 0.02) matrices, zero biases, unit norms",
        },
        "checks": checks,
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
