"""The jobs: the config builders that `configs/*.py`, the API and `experiments/*` start from.

Every job is reachable by name from any folder: `python -m grpo_jax.main --config=ppo:smoke`,
`api.config("ppo:smoke")`, `job_config("ppo", "smoke")`; `JOBS` lists them with their presets.
A config file (`--config=FILE[:preset]`) calls one of the builders and changes what its job
changes, so it imports nothing but the library and works from any folder:

- `main_job(preset)`: the CPU main job, R1-Zero in miniature (configs/default.py): build a
  synthetic arithmetic task and a character tokenizer, pretrain a tiny base model on noisy
  worked solutions (low pass@1, high pass@8), evaluate it, run GRPO with accuracy and format
  rewards, evaluate again. Every field has its comment here.
- `tool_job(preset)`: the same job on multi-turn calculator episodes (configs/tools.py).
- `ppo_job(preset)`, `trpo_job(preset)`: the main job with the PPO or TRPO stage in place of
  GRPO (configs/ppo.py, configs/trpo.py); `with_ppo(config)` and `with_trpo(config)` make
  that swap on any main-job config (the studies' PPO and TRPO arms).
- `code_job`, `agents_preset` (`agents_job`), `r1_pipeline_job`, `gsm8k_job`: the code,
  agents, R1 pipeline and GSM8K jobs (configs/code.py, agents.py, r1_pipeline.py, gsm8k.py).
- `reasoning_gym_job(preset)`: the main job on reasoning-gym generators, a preset per task
  family (configs/reasoning_gym_tasks.py).

This file is itself a config file whose preset is a job's name: `--config=NAME[:preset]` on
the command line is read as `--config=<this file>:NAME[:preset]` (`get_config`).
"""

import dataclasses
from typing import Callable

import ml_collections
from ml_collections import config_dict

from grpo_jax.stages import default_section

__all__ = ["EVALS", "JOBS", "Job", "REASONING_GYM_PRESETS", "agents_job", "agents_preset",
           "code_job", "get_config", "gsm8k_job", "job_config", "main_job", "ppo_job",
           "r1_pipeline_job", "reasoning_gym_job", "tool_job", "trpo_job", "with_ppo",
           "with_trpo"]


def main_job(preset: str | None = None, *, task: str | None = None
             ) -> ml_collections.ConfigDict:
    """The main job (configs/default.py): pretrain -> eval_base -> rl -> eval_final; presets
    "smoke" (tiny sizes for tests) and "cpu" (the default). `task`: the same job on that
    registered task (task.name) at its own constructor defaults (task.kwargs empty, so no
    arithmetic setting reaches it); None: the arithmetic task below."""
    config = ml_collections.ConfigDict()
    config.seed = 0  # one seed for data, initialisation and sampling
    # A step whose loss, gradient or update is not finite is skipped (never applied); this
    # many skipped steps in a row stop the run with one line.
    config.max_consecutive_skips = 3
    # Compiled XLA programs are kept here and reused by a rerun or resume (and by a second
    # stage building the same program): "" turns the cache off.
    config.compilation_cache_dir = "~/.cache/grpo_jax/xla"
    # Host malloc keeps freed memory for reuse, so XLA:CPU's per-call buffers are not faulted
    # in again at every step (grpo_jax/host_memory.py); False leaves the system's allocator.
    config.reuse_host_memory = True
    # Experiment trackers beside metrics.jsonl, comma-separated: tensorboard, wandb (offline
    # unless WANDB_MODE says otherwise), mlflow (a SQLite store in the workdir unless
    # MLFLOW_TRACKING_URI is set); "" for metrics.jsonl only (grpo_jax/trackers.py).
    config.loggers = "tensorboard"
    # The run report's PNGs (one per logged series, the pass@k curves) beside report.md and
    # report.json; False writes the two without them (a sweep of short runs, the studies'
    # mini tier), as drawing them takes most of a short run's report.
    config.report_plots = True
    # Symbolic answers (LaTeX, expressions) are compared by math-verify in worker processes:
    # each comparison gets at most deadline_seconds (then it scores 0 and is counted as
    # reward_undecided); a stuck worker is replaced without blocking the others.
    config.math_verify = ml_collections.ConfigDict({"deadline_seconds": 2.0, "workers": 2})
    # Policy code (the code task's tests, the python tool) runs in grpo_jax/tools/sandbox.py:
    # "bwrap" (bubblewrap namespaces and a seccomp filter; a job that runs code refuses to
    # start without it) or "audit_hook" (the audit hook and limits only: weaker, logged).
    config.sandbox = ml_collections.ConfigDict({"isolation": "bwrap"})
    # A Python reward ("module:function") whose call takes longer than budget_seconds per
    # completion it scores is counted per step as reward_slow and named once in the log; it
    # is not stopped (grpo_jax/rewards/python.py).
    config.python_rewards = ml_collections.ConfigDict({"budget_seconds": 1.0})
    # Stages run in order and share one workdir. Each name is a section of this config
    # whose `kind` says what it does: pretrain | sft | eval | rl | ppo | trpo | reward_model |
    # rejection_sft | distill. Every field of a kind, with its comment, is in
    # grpo_jax/stages/<module>.py (`default_section(kind)`); validation rejects unknown ones.
    config.stages = "pretrain,eval_base,rl,eval_final"

    # ---- task and tokenizer ---------------------------------------------------------------
    config.task = ml_collections.ConfigDict()
    config.task.name = "arithmetic"  # registered task name (grpo_jax.tasks.available_tasks())
    # Task constructor args: difficulty 1 with one or two operators (operands 1-9); a noisy
    # step confuses the operator ("9*6=15"), see grpo_jax/tasks/arithmetic.py. redo_rate > 0:
    # noisy solutions check steps by redoing them (longer traces are more often right);
    # mixed_script_rate > 0: step words, some in Greek (the language reward can act).
    config.task.kwargs = ml_collections.ConfigDict(
        {"difficulty": 1, "max_operators": 2, "error_mode": "operator", "redo_rate": 0.0,
         "mixed_script_rate": 0.0})
    config.task.template = "plain"  # prompt template: plain | r1_zero | chat (checkpoint's)
    # With template "chat": the chat template, when the tokenizer's own is not wanted (or it
    # has none, as char and sentencepiece): "miniature" (grpo_jax.text.chat.MINIATURE: tools
    # and tool turns in the Qwen2.5 convention, at a tiny model's length) or a .jinja file.
    config.task.chat_template = ""
    config.task.solution_error_rate = 0.3  # chance that a worked-solution step is wrong
    config.task.format_error_rate = 0.15  # chance that a worked solution is malformed
    config.task.train_size = 20000  # distinct training problems for RL prompts
    config.task.eval_size = 128  # held-out problems for evaluation
    # The held-out problems' own seed, not the run's: runs with different seeds evaluate the
    # same problems, so arms of a sweep are paired by problem as well as by seed.
    config.task.eval_seed = 0
    # Prompt bucket (tokens, incl. BOS); a longer prompt is an error at start-up. 0 = auto:
    # the longest training / held-out prompt, rounded up to a multiple of 8.
    config.task.prompt_len = 16
    # auto (checkpoint with model.init_from, else char) | char | sentencepiece (trained on
    # the task, kept in the workdir) | checkpoint (model.init_from's tokenizer.json)
    config.tokenizer = "auto"
    config.tokenizer_vocab_size = 128  # sentencepiece vocabulary size

    # ---- model ----------------------------------------------------------------------------
    config.model = ml_collections.ConfigDict()
    config.model.name = "tiny-1m"  # grpo_jax.models.named_config name
    config.model.dtype = "float32"  # compute dtype
    config.model.param_dtype = "float32"
    config.model.max_seq_len = 64  # context length (prompt bucket + max new tokens fits)
    config.model.init_from = ""  # local Hugging Face checkpoint dir; "" = random init
    # Output-head chunk (positions) for teacher-forced log-probs; 0 = whole sequence at once.
    # Use e.g. 256 with 150k-token vocabularies so full [B, T, V] logits never materialise.
    config.model.logprob_chunk_size = 0
    # Rows per tile of that head (0 = all rows of a micro-batch): the logits then exist
    # [logprob_chunk_rows, logprob_chunk_size, V] at a time.
    config.model.logprob_chunk_rows = 0
    # Row groups per update computed side by side in one program (training.accumulate_gradients);
    # 0 = training.default_batch_streams(): 2 on a single-device CPU, else 1.
    config.model.batch_streams = 0
    # LoRA (arXiv 2106.09685): rank r > 0 freezes the model (kept in model.dtype, so
    # param_dtype is unused) and trains float32 adapters A [in, r], B [r, out] (B = 0 at the
    # start) on the kernels named in lora_targets: W + (lora_alpha / r) A B. The optimizer
    # state covers the adapters only, checkpoints hold the adapters only, an RL reference
    # shares the base, and export writes the merged weights. Stage kinds with LoRA: pretrain,
    # sft, rl, rejection_sft, eval. 0 = full fine-tuning.
    config.model.lora_rank = 0
    config.model.lora_alpha = 16.0
    # Kernels with adapters (--config.model.lora_targets=q_kernel,v_kernel on the command
    # line); attention kernels [D, N, H] / [N, H, D] count their N x H axes as one.
    config.model.lora_targets = ("q_kernel", "k_kernel", "v_kernel", "o_kernel",
                                 "gate_kernel", "up_kernel", "down_kernel")
    # Shape overrides on top of the named size (None = the size's own value), e.g.
    # --config.model.hidden_size=192 --config.model.num_layers=6; and how it is executed
    # (also with init_from): remat, scan_layers, attention ("auto" | "einsum" | "xla" |
    # "cudnn"; see grpo_jax.models.ModelConfig).
    for field, kind in (("hidden_size", int), ("num_layers", int), ("num_heads", int),
                        ("num_kv_heads", int), ("head_dim", int), ("mlp_size", int),
                        ("rope_theta", float), ("qkv_bias", bool), ("tie_embeddings", bool),
                        ("rms_norm_eps", float), ("remat", bool), ("scan_layers", bool),
                        ("attention", str)):
        config.model[field] = config_dict.placeholder(kind)

    # ---- mesh -----------------------------------------------------------------------------
    config.mesh = ml_collections.ConfigDict()
    config.mesh.num_devices = 0  # use the first N devices; 0 = all
    # The last R of those devices sample the RL rollouts, the others train (the mesh shape
    # is the trainer's); new parameters move to them with jax.device_put. 0 = the same
    # devices do both. Pairs with rl.max_staleness (the sampler a few versions behind).
    config.mesh.rollout_devices = 0
    config.mesh.shape = ml_collections.ConfigDict({
        "data": -1,  # batch parallelism; -1: all remaining devices
        "fsdp": 1,  # parameters split along the model dimension, batch too
        "tensor": 1,  # heads / MLP / vocabulary split (tensor parallelism)
    })
    # Logical parameter axis -> mesh axes ("a,b" for several, "" for replicated).
    config.mesh.rules = (
        ("batch", "data,fsdp"), ("length", ""), ("vocab", "tensor"), ("embed", "fsdp"),
        ("heads", "tensor"), ("kv_heads", "tensor"), ("head_dim", ""), ("mlp", "tensor"),
        ("layers", ""), ("norm", ""),
    )

    # ---- optimiser defaults (each training stage may override lr / steps) ----------------
    config.optim = ml_collections.ConfigDict()
    config.optim.weight_decay = 0.0  # AdamW decoupled weight decay (not on norms/biases)
    config.optim.b1 = 0.9
    config.optim.b2 = 0.99
    config.optim.clip_norm = 1.0  # global-norm gradient clipping
    config.optim.warmup_frac = 0.05  # linear warmup as a fraction of the stage's steps
    config.optim.final_lr_frac = 0.1  # cosine decay to this fraction of the peak lr

    # ---- stage: next-token pretraining on noisy worked solutions --------------------------
    config.pretrain = default_section("pretrain")
    config.pretrain.steps = 1500
    config.pretrain.batch_size = 64
    config.pretrain.lr = 3e-3
    config.pretrain.pack_len = 64  # two examples per row on average: 32 rows of 64 tokens

    # ---- stages: evaluation before and after RL ---------------------------------------------
    config.eval_base = default_section("eval")
    config.eval_base.num_samples = 8  # samples per held-out problem
    # pass@k and maj@k at these k (each <= num_samples); () = 1, 2, 4, ... and num_samples.
    config.eval_base.ks = ()
    config.eval_base.temperature = 1.0  # the distribution RL trains
    config.eval_base.max_new_tokens = 40
    # Budget forcing (s1) is off; e.g. --config.eval_final.min_thinking_tokens=16 writes
    # "Wait" where the model would end its thinking earlier (grpo_jax/stages/evaluate.py).
    config.eval_final = ml_collections.ConfigDict(config.eval_base.to_dict())

    # ---- stage: reinforcement learning (GRPO family) ------------------------------------------
    config.rl = default_section("rl")
    # A name in grpo_jax/rl/algorithms.py's table (grpo, dr_grpo, dapo, gspo, cispo, ...).
    # beta, epsilon, loss_agg, ... left unset take the algorithm's defaults (GRPO's: beta
    # 0.01, epsilon 0.2, seq-mean-token-mean); --print_config shows them resolved.
    config.rl.algorithm = "grpo"
    config.rl.steps = 80  # RL iterations (sample -> score -> update)
    config.rl.num_prompts = 32  # N prompts per iteration
    config.rl.group_size = 8  # G completions per prompt
    config.rl.lr = 2e-4
    config.rl.max_new_tokens = 40
    # Reward name -> weight. Names: the task's (accuracy, format, format_soft, ...), built-ins
    # (language, overlong) and stage-kind sources (reward_model, with rl.reward_model set).
    config.rl.rewards = ml_collections.ConfigDict({"accuracy": 1.0, "format": 0.2})
    config.rl.checkpoint_every = 20  # steps between checkpoints (and one at stage end)
    # Accuracy and format are read off the char tokenizer's ids on device, so each of the 8
    # programs runs 10 whole iterations (sample, score, update); 0 = decode and score on the
    # host (any Python reward).
    config.rl.fused_steps = 10

    config.checkpoint = ml_collections.ConfigDict()
    config.checkpoint.max_to_keep = 2

    if preset in (None, "", "cpu"):
        pass
    elif preset == "smoke":
        config.task.train_size = 256
        config.task.eval_size = 8
        config.model.name = "tiny-1m"
        config.model.max_seq_len = 64
        config.pretrain.steps = 3
        config.pretrain.batch_size = 8
        config.rl.steps = 2
        config.rl.num_prompts = 4
        config.rl.group_size = 4
        config.rl.max_new_tokens = 24
        config.rl.checkpoint_every = 1
        config.rl.fused_steps = 0  # the general host path (tests/test_device_rewards.py: fused)
        # The untrained model earns no task reward; the soft overlong punishment on its
        # completion lengths differs within groups, so the smoke steps have real gradients.
        config.rl.overlong_cache = 8
        for section in (config.eval_base, config.eval_final):
            section.num_samples = 2
            section.batch_size = 16
            section.max_new_tokens = 24
    else:
        raise ValueError(f"unknown preset {preset!r} for configs/default.py;"
                         " expected smoke or cpu")
    if task is not None:
        config.task.name = task
        config.task.kwargs = ml_collections.ConfigDict()
    return config


# The four evaluations of the tool-use job: with and without the calculator, before and
# after RL.
EVALS = ("eval_base", "eval_base_no_tool", "eval_final", "eval_final_no_tool")


def _cpu_or_smoke(preset: str | None, path: str) -> str | None:
    """`preset` of a job whose presets are "cpu" (the default) and "smoke"."""
    if preset not in (None, "", "cpu", "smoke"):
        raise ValueError(f"unknown preset {preset!r} for {path}; expected smoke or cpu")
    return preset


def _replace_rl(config: ml_collections.ConfigDict, kind: str) -> None:
    """Runs stage `kind` where config.stages runs rl."""
    stages = config.stages.split(",")
    if "rl" not in stages:
        raise ValueError(f"with_{kind}: config.stages {config.stages!r} runs no rl stage")
    config.stages = ",".join(kind if name == "rl" else name for name in stages)


def with_ppo(config: ml_collections.ConfigDict, **fields) -> ml_collections.ConfigDict:
    """`config` (a main-job config) with the PPO stage (a critic, GAE, per-token KL reward;
    grpo_jax/stages/ppo.py) in place of its rl stage, at the GRPO stage's steps, samples per
    step, completion length and rewards; `fields` then change the ppo section."""
    rl = config.rl
    _replace_rl(config, "ppo")
    config.ppo = default_section("ppo")
    config.ppo.steps = rl.steps  # rollout batches, as the GRPO stage
    # One completion per prompt (the critic is the baseline), as many prompts as the GRPO
    # stage samples completions: the same samples per step.
    config.ppo.num_prompts = rl.num_prompts * rl.group_size
    config.ppo.group_size = 1
    config.ppo.num_iterations = 2  # PPO epochs over each rollout batch
    config.ppo.num_minibatches = 2  # optimizer steps per epoch
    config.ppo.lr = 2e-4  # the policy's peak learning rate
    config.ppo.critic_lr = 1e-3  # the critic's (initialised from the policy)
    config.ppo.beta = 0.01  # per-token KL reward coefficient
    config.ppo.max_new_tokens = rl.max_new_tokens  # completion length, as the GRPO stage
    config.ppo.rewards = rl.rewards  # reward name -> weight, as the GRPO stage
    del config.rl
    config.ppo.update(fields)
    return config


def with_trpo(config: ml_collections.ConfigDict, **fields) -> ml_collections.ConfigDict:
    """`config` (a main-job config) with the TRPO stage (natural-gradient steps in a KL trust
    region on group-normalised advantages; grpo_jax/stages/trpo.py) in place of its rl stage,
    on the GRPO stage's rollout batch (steps, prompts x completions, completion length,
    rewards); `fields` then change the trpo section."""
    rl = config.rl
    _replace_rl(config, "trpo")
    config.trpo = default_section("trpo")
    config.trpo.steps = rl.steps  # rollout batches (one TRPO step each), as the GRPO stage
    config.trpo.num_prompts = rl.num_prompts  # N prompts per step, as the GRPO stage
    config.trpo.group_size = rl.group_size  # G completions per prompt, as the GRPO stage
    config.trpo.max_kl = 0.01  # trust-region radius (mean KL per completion token)
    config.trpo.max_new_tokens = rl.max_new_tokens  # completion length, as the GRPO stage
    config.trpo.rewards = rl.rewards  # reward name -> weight, as the GRPO stage
    del config.rl
    config.trpo.update(fields)
    return config


def ppo_job(preset: str | None = None) -> ml_collections.ConfigDict:
    """The PPO job (configs/ppo.py): pretrain -> eval_base -> ppo -> eval_final, the main job
    with `with_ppo`'s stage; presets "smoke" and "cpu"."""
    config = with_ppo(main_job(_cpu_or_smoke(preset, "configs/ppo.py")))
    if preset == "smoke":
        # overlong_cache: rewards that differ between completions (real gradients).
        config.ppo.update(checkpoint_every=1, overlong_cache=8)
    else:
        # 64 prompts x 1 completion: a quarter of the GRPO stage's samples per step (the
        # studies' PPO arms sample as many as GRPO).
        config.ppo.num_prompts = 64
    return config


def trpo_job(preset: str | None = None) -> ml_collections.ConfigDict:
    """The TRPO job (configs/trpo.py): pretrain -> eval_base -> trpo -> eval_final, the main
    job with `with_trpo`'s stage; presets "smoke" and "cpu"."""
    config = with_trpo(main_job(_cpu_or_smoke(preset, "configs/trpo.py")))
    if preset == "smoke":
        # cg_iters: fewer conjugate-gradient iterations; overlong_cache: rewards that differ
        # within groups (real gradients).
        config.trpo.update(cg_iters=4, checkpoint_every=1, overlong_cache=8)
    else:
        # A TRPO step costs ~40 forward passes (10 conjugate-gradient Fisher-vector products
        # and up to 10 line-search candidates), so this stage takes fewer, smaller steps than
        # GRPO: 30 steps of 16 prompts x 8 completions.
        config.trpo.update(steps=30, num_prompts=16)
    return config


def code_job(preset: str | None = None) -> ml_collections.ConfigDict:
    """The code job (configs/code.py): the main job on code_expression, its answers run on
    hidden tests in the sandbox; presets "smoke" and "cpu"."""
    config = main_job(_cpu_or_smoke(preset, "configs/code.py"))
    config.task.name = "code_expression"
    # The five function shapes, added constants 0-49: 86 distinct held-out functions (at
    # difficulty (1, 2) and constants 0-9 only 12, too few for a held-out pass@1).
    config.task.kwargs = ml_collections.ConfigDict({"difficulty": (1, 2, 3),
                                                    "max_constant": 49})
    config.task.prompt_len = 36  # "Q: f(1)=250 f(2)=255 f(4)=265\nA: " and BOS: 34
    config.task.eval_size = 64  # of the 86 held-out functions
    # <think>quadratic</think><answer>5*x*x+49</answer> and EOS: 22; within the model's 64
    config.rl.max_new_tokens = 28
    config.rl.fused_steps = 0  # the rewards run programs on the host
    # tests: the fraction of the six hidden tests passed (in the sandbox); accuracy (weight
    # 0: pass@1) is all six, from the same runs.
    config.rl.rewards = ml_collections.ConfigDict({"tests": 1.0, "format": 0.2,
                                                   "accuracy": 0.0})
    for name in ("eval_base", "eval_final"):
        config[name].max_new_tokens = config.rl.max_new_tokens
    if preset == "smoke":
        config.pretrain.steps = 150  # enough for answers in the format: the tests run
        config.rl.steps = 2
        config.rl.num_prompts = 4
        config.rl.group_size = 4
    return config


def _episodes_as_rl(config: ml_collections.ConfigDict, evals, *, tools: str | None = None
                    ) -> None:
    """The eval sections `evals` play episodes as the rl stage does: its tools (or `tools`),
    turns, observation and completion lengths."""
    for name in evals:
        config[name].update(tools=config.rl.tools if tools is None else tools,
                            max_turns=config.rl.max_turns,
                            max_observation_tokens=config.rl.max_observation_tokens,
                            max_new_tokens=config.rl.max_new_tokens)


def _episodes_smoke(config: ml_collections.ConfigDict, evals, *, pack_len: int) -> None:
    """The "smoke" sizes of a job of multi-turn episodes (agents, tools): 60 pretraining
    steps of 16 rows of `pack_len` tokens, 2 RL steps of 4 prompts x 4, and 2 samples of
    each held-out problem in the eval sections `evals`."""
    config.pretrain.steps = 60
    config.pretrain.batch_size = 16
    config.pretrain.pack_len = pack_len
    config.rl.steps = 2
    config.rl.num_prompts = 4
    config.rl.group_size = 4
    for name in evals:
        config[name].update(num_samples=2, batch_size=16)


def agents_job(preset: str | None = None, calls: str = "tags") -> ml_collections.ConfigDict:
    """The agents job (configs/agents.py): the main job on guess_number, played in
    multi-turn episodes against the stateful guessing environment; presets "smoke" and
    "cpu". `calls="json"`: the guesses (and python calls for the middle of the range) are
    JSON function calls in the miniature chat template (`agents_json`)."""
    if calls == "json":
        return agents_json(agents_job(preset))
    if calls != "tags":
        raise ValueError(f"calls: expected 'tags' or 'json', got {calls!r}")
    config = main_job(_cpu_or_smoke(preset, "configs/agents.py"))
    config.stages = "pretrain,eval_base,rl,eval_final"
    config.task.name = "guess_number"
    # Ranges of 8 and 16 numbers; half the noisy worked solutions bisect, half guess at
    # random; a bisection step misses the middle by one with probability 0.2.
    config.task.kwargs = ml_collections.ConfigDict({"difficulty": (1, 2), "search_rate": 0.5})
    config.task.solution_error_rate = 0.2
    config.task.format_error_rate = 0.0
    config.task.prompt_len = 16
    config.model.max_seq_len = 80  # prompt bucket + the whole episode
    config.pretrain.steps = 1500
    config.pretrain.pack_len = 80

    config.rl.tools = "guess"
    config.rl.max_turns = 5  # feedback answers; bisection of 16 needs at most 4
    config.rl.max_observation_tokens = 8  # <result>, "higher" / "lower", </result>
    config.rl.max_new_tokens = 64  # 6 guesses of 4 tokens and 5 answers of 8
    config.rl.fused_steps = 0  # the turns need the host (the environment runs there)
    config.rl.steps = 60
    config.rl.num_prompts = 16
    config.rl.group_size = 8
    # environment: 1 when a guess finds the number (the environment's own reward); turns:
    # minus the guesses beyond bisection's, over the range; accuracy (weight 0: pass@1)
    # reads the same success from the text.
    config.rl.rewards = ml_collections.ConfigDict({"environment": 1.0, "turns": 0.5,
                                                   "format": 0.1, "accuracy": 0.0})
    _episodes_as_rl(config, ("eval_base", "eval_final"))
    if preset == "smoke":
        _episodes_smoke(config, ("eval_base", "eval_final"), pack_len=80)
    return config


def agents_json(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The agents job with tool calls in the checkpoint convention: the environment is
    `json:guess,python` (the game's guesses and a sandboxed python tool, both called as JSON
    between <tool_call> tags), the tools described by the miniature chat template
    (task.chat_template), answers in its <tool_response> turns; half the bisecting worked
    solutions compute their first middle with python."""
    config.task.kwargs.calls = "json"
    config.task.kwargs.python_rate = 0.5
    config.task.template = "chat"
    config.task.chat_template = "miniature"
    # A SentencePiece vocabulary (BPE) learned on the traces, the tags one piece each, as a
    # checkpoint's tokenizer has its <tool_call> tags as added tokens: a guess's call is
    # about 16 tokens, a worked solution 92 (median) to 134.
    config.tokenizer = "sentencepiece"
    config.tokenizer_vocab_size = 384
    config.task.prompt_len = 24  # "<tools>guess(number) python(code)</tools>\n20-35\n": 19
    config.rl.max_new_tokens = 160
    config.model.max_seq_len = 184
    config.pretrain.pack_len = 184
    config.rl.max_turns = 8  # the guesses' answers and the python calls'
    config.rl.max_observation_tokens = 16  # python's output, cut inside its closing tag
    config.rl.tools = "json:guess,python"
    _episodes_as_rl(config, ("eval_base", "eval_final"))
    return config


def tool_job(preset: str | None = None) -> ml_collections.ConfigDict:
    """The tool-use job (configs/tools.py): the main job on tool_arithmetic with multi-turn
    calculator episodes; presets "smoke" and "cpu"."""
    config = main_job(_cpu_or_smoke(preset, "configs/tools.py"))
    config.stages = "pretrain,eval_base,eval_base_no_tool,rl,eval_final,eval_final_no_tool"
    config.task.name = "tool_arithmetic"
    # Operands of 3 or 4 digits; most noisy worked solutions call the calculator.
    config.task.kwargs = ml_collections.ConfigDict({"difficulty": (1, 2), "tool_rate": 0.8})
    config.task.solution_error_rate = 0.2  # a miscopied operand or result (or a wrong guess)
    config.task.format_error_rate = 0.1
    config.task.prompt_len = 24
    config.model.max_seq_len = 80  # prompt bucket + the whole episode
    # Copying the operands into the call and the result into the answer (induction over
    # repeated digits) takes the tiny model a few thousand steps.
    config.pretrain.steps = 2500
    config.pretrain.pack_len = 80

    config.rl.tools = "calc"
    config.rl.max_turns = 2
    config.rl.max_observation_tokens = 16  # <result>, up to 11 characters, </result>
    config.rl.max_new_tokens = 48  # the episode: calls, observations and the answer
    config.rl.fused_steps = 0  # the turns need the host (the calculator runs there)
    config.rl.steps = 60
    config.rl.num_prompts = 16
    config.rl.group_size = 8
    # correct_call (weight 0): the completion called the calculator on an expression worth
    # the reference answer; logged as reward/correct_call (the rate of correct tool use).
    config.rl.rewards = ml_collections.ConfigDict({"accuracy": 1.0, "format": 0.2,
                                                   "correct_call": 0.0})
    for name in EVALS:
        config[name] = ml_collections.ConfigDict(config.eval_base.to_dict())
        _episodes_as_rl(config, (name,), tools="" if name.endswith("no_tool") else None)

    if preset == "smoke":
        # Enough pretraining on calls only (tool_rate 1) for the policy to close calls, so
        # the episodes have turns; the overlong ramp's rewards differ within groups.
        config.task.kwargs.tool_rate = 1.0
        _episodes_smoke(config, EVALS, pack_len=64)
    return config


# agents preset -> (the job's size, how the calls are written)
AGENTS_PRESETS = {None: (None, "tags"), "": (None, "tags"), "cpu": ("cpu", "tags"),
                  "json": (None, "json"), "smoke": ("smoke", "json"),
                  "tags_smoke": ("smoke", "tags")}


def agents_preset(preset: str | None = None) -> ml_collections.ConfigDict:
    """The agents job (configs/agents.py) by preset: "cpu" (the default) in tags, "json"
    (JSON calls with the python tool), "smoke" (the json job at test size), "tags_smoke"."""
    if preset not in AGENTS_PRESETS:
        raise ValueError(f"unknown preset {preset!r} for configs/agents.py; expected one of "
                         f"{sorted(p for p in AGENTS_PRESETS if p)}")
    return agents_job(*AGENTS_PRESETS[preset])


def r1_pipeline_job(preset: str | None = None) -> ml_collections.ConfigDict:
    """The DeepSeek-R1 recipe in miniature (configs/r1_pipeline.py): cold-start SFT -> eval
    -> reasoning RL -> rejection-sampling SFT -> final RL -> eval; presets "smoke" and "cpu"."""
    config = main_job(None)
    # An eval after every training stage: the report has one column per eval stage.
    config.stages = ("cold_start,eval_base,reasoning_rl,eval_reasoning_rl,rejection_sft,"
                     "eval_rejection_sft,final_rl,eval_final")
    config.eval_reasoning_rl = ml_collections.ConfigDict(config.eval_base.to_dict())
    config.eval_rejection_sft = ml_collections.ConfigDict(config.eval_base.to_dict())
    # Arithmetic plus the language-consistency reward of R1 (sec. 2.3.2).
    config.task.name = "arithmetic"
    config.task.template = "plain"
    # > 0: every step of a worked solution is introduced by a word, written in Greek with this
    # probability in the cold-start data, so the language reward differs between completions
    # and can act (at 0 the traces have no words and it is 1.0 for every output).
    config.task.kwargs.mixed_script_rate = 0.0

    # ---- cold start: SFT on clean worked solutions (completion-only loss) ------------------
    config.cold_start = default_section("sft")
    config.cold_start.num_examples = 2048  # clean worked solutions
    config.cold_start.error_rate = 0.3  # a few wrong steps keep pass@1 low for RL to raise
    # As many steps as the main job's pretraining: with 400 the cold-start model reached only
    # ~8% held-out pass@1 and neither GRPO stage measurably raised it (three seeds).
    config.cold_start.steps = 1500
    config.cold_start.batch_size = 64
    config.cold_start.lr = 3e-3
    del config.pretrain

    # ---- reasoning RL: GRPO with accuracy + format + language consistency ----------------
    config.rl.fused_steps = 0  # the language reward is scored on the host
    config.reasoning_rl = ml_collections.ConfigDict(config.rl.to_dict())
    config.reasoning_rl.rewards = ml_collections.ConfigDict(
        {"accuracy": 1.0, "format": 0.2, "language": 0.1})
    config.reasoning_rl.steps = 80

    # ---- rejection-sampling SFT on verified samples of the RL policy ---------------------
    config.rejection_sft = default_section("rejection_sft")
    config.rejection_sft.num_problems = 512
    config.rejection_sft.num_samples = 4
    config.rejection_sft.sample_batch_size = 256
    config.rejection_sft.max_new_tokens = config.rl.max_new_tokens
    config.rejection_sft.mix_sft_examples = 256  # clean solutions mixed in (R1's non-reasoning data)
    config.rejection_sft.steps = 100
    config.rejection_sft.batch_size = 64
    config.rejection_sft.lr = 1e-3

    # ---- final RL: accuracy + format --------------------------------------------------------
    config.final_rl = ml_collections.ConfigDict(config.rl.to_dict())
    config.final_rl.steps = 40
    del config.rl  # the two RL stages above are copies of the main job's rl section

    if preset in (None, "", "cpu"):
        pass
    elif preset == "smoke":
        config.task.train_size = 128
        config.task.eval_size = 8
        config.cold_start.num_examples = 64
        config.cold_start.steps = 3
        config.cold_start.batch_size = 16
        for name in ("reasoning_rl", "final_rl"):
            config[name].steps = 1
            config[name].num_prompts = 4
            config[name].group_size = 4
            config[name].max_new_tokens = 24
            config[name].checkpoint_every = 0
            config[name].overlong_cache = 8  # rewards that differ within groups
        config.rejection_sft.num_problems = 8
        config.rejection_sft.num_samples = 2
        config.rejection_sft.sample_batch_size = 16
        config.rejection_sft.max_new_tokens = 24
        config.rejection_sft.mix_sft_examples = 16
        config.rejection_sft.steps = 2
        config.rejection_sft.batch_size = 16
        for section in (config.eval_base, config.eval_reasoning_rl, config.eval_rejection_sft,
                        config.eval_final):
            section.num_samples = 2
            section.batch_size = 16
            section.max_new_tokens = 24
    else:
        raise ValueError(f"unknown preset {preset!r} for configs/r1_pipeline.py; expected smoke "
                         "or cpu")
    return config


def gsm8k_job(preset: str | None = None) -> ml_collections.ConfigDict:
    """GRPO from a local Hugging Face checkpoint on GSM8K (configs/gsm8k.py): eval_base -> rl
    -> eval_final; presets "gpu" (the default), "tpu" and "smoke"; model.init_from and
    task.kwargs.data_dir are given on the command line."""
    config = main_job("cpu")
    config.stages = "eval_base,rl,eval_final"
    del config.pretrain

    config.task.name = "gsm8k"
    # data_dir: train.jsonl + test.jsonl (GSM8K release format) or a prepared TFDS dir.
    config.task.kwargs = ml_collections.ConfigDict({"data_dir": ""})
    config.task.template = "chat"  # the checkpoint's chat template + the R1-Zero layout
    config.task.prompt_len = 0  # measured at start-up: the longest prompt, rounded up to 8
    config.task.train_size = 7473  # the whole GSM8K training split
    config.task.eval_size = 1319  # the whole test split
    config.tokenizer = "checkpoint"  # the checkpoint's tokenizer.json and special tokens

    config.model.init_from = ""  # required: --config.model.init_from=<checkpoint dir>
    config.model.dtype = "bfloat16"  # compute
    config.model.param_dtype = "float32"  # master weights (and so the optimizer state)
    config.model.max_seq_len = 1024  # context: the prompt bucket + max_new_tokens fit
    config.model.logprob_chunk_size = 256  # no [B, T, 152k] logits at once
    config.model.logprob_chunk_rows = 16  # tiles of 16 x 256 x 152k float32 logits: 2.3 GiB
    config.model.remat = True  # recompute each block in the backward pass
    config.model.scan_layers = True  # one compiled block for all layers (see ModelConfig)

    config.optim.weight_decay = 0.0
    config.optim.clip_norm = 1.0
    config.optim.warmup_frac = 0.03
    config.optim.final_lr_frac = 1.0  # constant after warm-up

    config.eval_base = default_section("eval")
    config.eval_base.num_samples = 4  # pass@1 as the mean over 4 samples; pass@2, 4, maj@2, 4
    config.eval_base.temperature = 1.0
    config.eval_base.max_new_tokens = 512
    config.eval_base.batch_size = 512
    config.eval_final = ml_collections.ConfigDict(config.eval_base.to_dict())

    config.rl = default_section("rl")
    config.rl.algorithm = "grpo"
    config.rl.steps = 200
    config.rl.num_prompts = 64
    config.rl.group_size = 8
    config.rl.micro_batches = 4  # 128 sequences of up to 1024 tokens per backward pass
    config.rl.lr = 1e-6
    config.rl.beta = 0.04
    config.rl.max_new_tokens = 512
    config.rl.rewards = ml_collections.ConfigDict({"accuracy": 1.0, "format": 0.2})
    config.rl.checkpoint_every = 25

    if preset in (None, "", "gpu"):
        config.mesh.num_devices = 1
    elif preset == "tpu":
        # 8 chips; the batch is split over data x fsdp = 8 either way, the parameters and
        # optimizer state over fsdp.
        config.mesh.shape = ml_collections.ConfigDict({"data": 1, "fsdp": -1, "tensor": 1})
        config.rl.micro_batches = 2
    elif preset == "smoke":
        config.model.dtype = "float32"
        config.model.max_seq_len = 256
        config.model.logprob_chunk_size = 0
        config.model.logprob_chunk_rows = 0
        config.model.remat = False
        config.model.scan_layers = False
        config.mesh.num_devices = 1
        config.task.train_size = 8
        config.task.eval_size = 4
        config.rl.steps = 2
        config.rl.num_prompts = 2
        config.rl.group_size = 4
        config.rl.micro_batches = 1
        config.rl.max_new_tokens = 16
        config.rl.lr = 1e-3  # a tiny random model: a visible change in two steps
        config.rl.checkpoint_every = 1
        config.rl.overlong_cache = 8  # rewards that differ within groups: real gradients
        for section in (config.eval_base, config.eval_final):
            section.num_samples = 2
            section.batch_size = 8
            section.max_new_tokens = 16
    else:
        raise ValueError(f"unknown preset {preset!r} for configs/gsm8k.py; expected smoke, "
                         "gpu or tpu")
    return config


@dataclasses.dataclass(frozen=True)
class Job:
    """A job reachable by name: its builder (preset -> config), its presets (the first is
    the default's size) and its config file under configs/."""

    build: Callable[[str | None], ml_collections.ConfigDict]
    presets: tuple[str, ...]
    config_file: str


JOBS = {
    "main": Job(main_job, ("cpu", "smoke"), "configs/default.py"),
    "ppo": Job(ppo_job, ("cpu", "smoke"), "configs/ppo.py"),
    "trpo": Job(trpo_job, ("cpu", "smoke"), "configs/trpo.py"),
    "r1_pipeline": Job(r1_pipeline_job, ("cpu", "smoke"), "configs/r1_pipeline.py"),
    "tools": Job(tool_job, ("cpu", "smoke"), "configs/tools.py"),
    "agents": Job(agents_preset, ("cpu", "json", "smoke", "tags_smoke"), "configs/agents.py"),
    "code": Job(code_job, ("cpu", "smoke"), "configs/code.py"),
    "gsm8k": Job(gsm8k_job, ("gpu", "tpu", "smoke"), "configs/gsm8k.py"),
}


# Generator settings of each preset's family (the fields of reasoning-gym's config
# dataclasses); a mix named on the command line uses these for the datasets it shares.
REASONING_GYM_DATASET_KWARGS = {
    "chain_sum": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1},
    "letter_counting": {"min_words": 2, "max_words": 2},
    "spell_backward": {"min_word_len": 3, "max_word_len": 5},
}
REASONING_GYM_PRESETS = ("chain_sum", "letter_counting", "spell_backward", "smoke")


def reasoning_gym_job(preset: str | None = None) -> ml_collections.ConfigDict:
    """The main job on reasoning-gym generators (configs/reasoning_gym_tasks.py): a preset
    per task family (chain_sum, the default; letter_counting; spell_backward) and "smoke"."""
    preset = preset or "chain_sum"
    if preset not in REASONING_GYM_PRESETS:
        raise ValueError(f"unknown preset {preset!r} for configs/reasoning_gym_tasks.py; expected "
                         f"one of {', '.join(REASONING_GYM_PRESETS)}")
    config = main_job("smoke" if preset == "smoke" else "cpu")
    config.task.name = "reasoning_gym"
    # datasets: "name[:weight],..."; dataset_kwargs: each generator's settings;
    # test_fraction: the share of each dataset's questions held out.
    config.task.kwargs = ml_collections.ConfigDict({
        "datasets": "chain_sum" if preset == "smoke" else preset,
        "dataset_kwargs": REASONING_GYM_DATASET_KWARGS,
        "test_fraction": 0.1,
    })
    config.task.prompt_len = 0  # measured at start-up (the generators' questions are long)
    config.task.train_size = 4000
    config.task.solution_error_rate = 0.3  # chance that a worked-solution step is wrong
    config.task.format_error_rate = 0.1
    config.model.max_seq_len = 128  # prompt bucket (<= 96) + 32 new tokens
    # An example is 60-100 tokens (most of it the generator's question): 32 a step, unpacked.
    config.pretrain.pack_len = 128
    config.pretrain.batch_size = 32
    config.pretrain.steps = 800
    config.rl.max_new_tokens = 32
    config.rl.fused_steps = 0  # the dataset's scorer runs on the host
    config.rl.steps = 40
    config.rl.checkpoint_every = 20
    for section in (config.eval_base, config.eval_final):
        section.max_new_tokens = 32
    if preset == "chain_sum":
        # 800 pretraining steps left a base of pass@1 0.15 / pass@8 0.66 that 40 or 80 GRPO
        # steps raised by 0.07-0.09 only (docs/reasoning_gym.md, Results).
        config.pretrain.steps = 2000
        config.rl.steps = 80
    if preset == "letter_counting":  # prompts up to 95 tokens, worked solutions up to 39
        config.model.max_seq_len = config.pretrain.pack_len = 136
        config.rl.max_new_tokens = 40
        for section in (config.eval_base, config.eval_final):
            section.max_new_tokens = 40
    if preset == "smoke":
        config.task.train_size = 64
        config.task.eval_size = 8
        config.rl.max_new_tokens = 24
        config.rl.steps = 2
        config.rl.checkpoint_every = 1
        config.pretrain.steps = 3
        for section in (config.eval_base, config.eval_final):
            section.max_new_tokens = 24
    return config


def unknown_job(name: str) -> str:
    """The one line for a job name that is not in `JOBS`."""
    return f"unknown job {name!r}; expected one of {', '.join(JOBS)}"


def job_config(name: str, preset: str | None = None) -> ml_collections.ConfigDict:
    """Job `name`'s config (`JOBS`) at `preset` (None: the job's own sizes)."""
    if name not in JOBS:
        raise ValueError(unknown_job(name))
    return JOBS[name].build(preset)


def get_config(spec: str | None = None) -> ml_collections.ConfigDict:
    """This file as a config file: `spec` is "NAME[:preset]" of a job in `JOBS`."""
    name, _, preset = (spec or "main").partition(":")
    if name not in JOBS:
        raise ValueError(f"{unknown_job(name)}, or a config file such as "
                         "configs/default.py[:preset]")
    return job_config(name, preset or None)
