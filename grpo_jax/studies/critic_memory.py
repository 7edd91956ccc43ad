"""PPO's critic as a memory and compute burden: the device memory and the seconds of one PPO
update step (policy + critic + frozen reference) against one GRPO update step (policy +
frozen reference) at equal batches, at two model sizes.

A measurement, no training to speak of. Arms are (algorithm, size) pairs:

* `PPO small`, `PPO large`: the PPO stage as ppo_vs_grpo runs it (`config_presets.with_ppo`:
  a critic initialised from the policy plus a scalar head, its own AdamW, GAE, a per-token
  KL reward against the reference), on the same prompts x completions as the GRPO arm;
* `GRPO small`, `GRPO large`: the main job's GRPO stage (group-normalised advantages, a KL
  term against the reference) on PPO's update schedule (its epochs x minibatches), so that
  both update the same rows in the same optimizer steps and differ in the critic alone;
* sizes, from the base's roles (`base_config`): `small` starts from the main base (the main
  job's pretraining, shared with the other studies); `large` from the main job's pretraining
  at tiny-10m's width and tiny-1m's depth (`LARGE_MODEL`: about four times the parameters)
  for a few steps (`LARGE_PRETRAIN_STEPS`: a checkpoint of that shape; memory and time
  depend on the shapes, not on the weights). Both sizes see the same batch. The mini tier builds and
  runs the small size only.

Each arm's run is its RL stage alone for `STEPS` steps from its size's base, on the host
loop. After the runs, `measure` takes per (base, seed, size), each in a fresh Python process
at the full tier (in the study's own process at the mini tier, where the figures mean
nothing):

* per arm, alone in its process: the compiled update step (the RL loop's jitted iteration,
  `Learner.step`: the rollout batch's preparation, then every epoch x minibatch update, state
  donated) on a synthetic batch of the stage's shape (every token valid: the longest
  completions), XLA's memory analysis of it (`compiled.memory_analysis()`: argument, output,
  aliased and temporary bytes; `device_bytes` = argument + output - aliased + temporary), the
  bytes of the learner's state counted from its pytrees (`state_bytes`: everything it holds;
  `trainable_bytes`: the trained models' parameters and optimizer states), and the process's
  resident memory after the run's setup (before the learner is built) and at its peak while
  the compiled step runs `CALLS` times (the high-water mark reset after compiling);
* per (base, seed, size), both learners in one process: the wall seconds of one step, alternated
  PPO, GRPO (then GRPO, PPO, and so on: `schedule`) over `TIMING` rounds (warm-up rounds left
  out; an even number timed, so that each arm goes first, right after its own previous step,
  in half of them); `step_time_s` is the median.

The analysis adds, per size, the pseudo-arm `PPO / GRPO, <size>`: each seed's ratios of
PPO's figure to GRPO's (`memory_ratio` of device_bytes, `temp_ratio`, `trainable_ratio`,
`rss_ratio` of the resident memory the learner added, `time_ratio` of step_time_s), tested
against the constant pseudo-arms `no gap` (1) and `two models` (2).
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import sys

from grpo_jax.studies import common, tiers

FILE = "critic_memory.json"
ALGORITHMS = ("PPO", "GRPO")
SIZES = ("small", "large")
ARMS = tuple(f"{algorithm} {size}" for size in SIZES for algorithm in ALGORITHMS)
LARGE_MODEL = {"name": "tiny-10m", "num_layers": 4}  # the large size's model fields
LARGE_PRETRAIN_STEPS = 20  # its base: a checkpoint of the shape
PROMPTS = {"full": 8}  # prompts per batch (x the main job's completions); mini: the smoke's
STEPS = 2  # the runs' RL steps (the first compiles)
CALLS = 2  # calls of the compiled step in the memory process
TIMING = {"full": (1, 8), "mini": (1, 2)}  # (warm-up, timed) rounds of the alternated steps
FRESH = {"full": True, "mini": False}  # measure in fresh processes
RATIO = "PPO / GRPO, {}"
NO_GAP, TWO_MODELS = "no gap", "two models"
RATIOS = {"memory_ratio": "device_bytes", "temp_ratio": "temp_bytes",
          "trainable_ratio": "trainable_bytes", "rss_ratio": "rss_added_bytes",
          "time_ratio": "step_time_s"}
MEMORY_MARGIN = 0.2  # PPO at least 1.2x GRPO's device memory
GROWTH_MARGIN = 0.1  # the ratio at the larger size at least 0.1 above the smaller's
TIME_MARGIN = 0.2  # PPO's step at least 1.2x GRPO's
CHECK_MARGIN = 0.01  # the trained state's ratio within 0.01 of two


# ---- configs ---------------------------------------------------------------------------------

def large_base(tier: str):
    """The large size's base: the main job's pretraining at `LARGE_MODEL`'s shape for
    `LARGE_PRETRAIN_STEPS` steps."""
    config = common.main_base(tier)
    for field, value in LARGE_MODEL.items():
        config.model[field] = value
    config.pretrain.steps = LARGE_PRETRAIN_STEPS
    return config


def base_config(tier: str) -> dict:
    """The base's roles, one per size the tier runs: `small`, the main base (shared with the
    other studies); `large` (the full tier only), `large_base`."""
    roles = {"small": common.main_base(tier)}
    if tier == "full":
        roles["large"] = large_base(tier)
    return roles


def attach(config, base: dict) -> None:
    """The run starts from its size's role (`model.init_from` names the role until here)."""
    config.model.init_from = base["roles"][config.model.init_from]


def arm_config(arm: str, tier: str = "full"):
    """One arm's run: its RL stage alone (`STEPS` steps, host loop, no evaluation) from its
    size's base (model.init_from: the role, its workdir set by `attach`); PPO by
    `config_presets.with_ppo` on the GRPO stage's prompts x completions, GRPO on PPO's
    epochs x minibatches."""
    from grpo_jax import config_presets

    algorithm, size = arm.split()
    config = common.main_arm(tier, "rl")
    del config.eval_base, config.eval_final
    config.model.init_from = size
    config.rl.steps = STEPS
    config.rl.fused_steps = 0  # the host loop, as PPO runs
    if tier in PROMPTS:
        config.rl.num_prompts = PROMPTS[tier]
    ppo = config_presets.with_ppo(copy.deepcopy(config), num_prompts=config.rl.num_prompts,
                                  group_size=config.rl.group_size)
    if algorithm == "PPO":
        return ppo
    config.rl.num_iterations = ppo.ppo.num_iterations
    config.rl.num_minibatches = ppo.ppo.num_minibatches
    return config


def arm_configs(tier: str) -> dict:
    return {arm: arm_config(arm, tier) for arm in ARMS}


def run_config(arm: str, tier: str, seed: int, init_from: str):
    """The config a run of `arm` with `seed` from the base role in `init_from` holds (as
    `common.plan` makes it)."""
    config = common.for_tier(arm_config(arm, tier), tier)
    config.seed = seed
    config.model.init_from = init_from
    return config


# ---- the measurement ---------------------------------------------------------------------------

def tree_bytes(tree) -> int:
    """The bytes of a pytree's array leaves."""
    import jax

    return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))


def device_bytes(argument: int, output: int, alias: int, temp: int) -> int:
    """The buffers a compiled program holds at once at most: its arguments, its outputs that
    do not reuse a donated argument, and its temporaries."""
    return argument + output - alias + temp


def _resident() -> dict:
    """{"rss": resident bytes now, "peak": the high-water mark} of this process (Linux)."""
    out = {}
    with open("/proc/self/status", encoding="utf-8") as f:
        for line in f:
            for key, name in (("VmRSS:", "rss"), ("VmHWM:", "peak")):
                if line.startswith(key):
                    out[name] = int(line.split()[1]) * 1024
    return out


def _reset_peak() -> bool:
    """Resets the process's resident high-water mark (Linux clear_refs); False if refused."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="utf-8") as f:
            f.write("5")
        return True
    except OSError:
        return False


def synthetic_batch(run, section, seed: int):
    """A rollout batch of the stage's shape (num_prompts x group_size rows, the prompt
    bucket, max_new_tokens) with random tokens and rewards, every token valid."""
    import numpy as np

    from grpo_jax.rl.batch import RolloutBatch

    rows = section.num_prompts * section.group_size
    prompt, new = run.config.task.prompt_len, section.max_new_tokens
    vocab = run.model_config.vocab_size
    rng = np.random.default_rng(seed)
    rewards = rng.choice(np.asarray([0.0, 0.2, 1.2], np.float32), rows)
    return RolloutBatch(
        tokens=rng.integers(0, vocab, (rows, prompt + new), dtype=np.int32),
        attention_mask=np.ones((rows, prompt + new), bool),
        loss_mask=np.ones((rows, new), bool),
        behaviour_logp=np.full((rows, new), -np.log(vocab), np.float32),
        rewards=rewards, version=np.zeros(rows, np.int32), correct=rewards >= 1.0,
        truncated=np.zeros(rows, bool))


class _Step:
    """One arm's learner and its compiled update step on a synthetic batch."""

    def __init__(self, config, workdir: str):
        import jax
        import jax.numpy as jnp

        from grpo_jax.runner import Run, StageSpec
        from grpo_jax.runner.toolkit import device_batch
        from grpo_jax.stages import KINDS
        from grpo_jax.stages.ppo import PPOLearner
        from grpo_jax.stages.rl import GRPOLearner

        name = config.stages
        self.run = Run(config, workdir, KINDS)
        self.rss_setup = _resident()["rss"]
        section = self.run.config[name]
        learner = {"ppo": PPOLearner, "rl": GRPOLearner}[section.kind](
            self.run, StageSpec(0, name, section, None))
        state = learner.state
        trained = [k for k in ("params", "opt_state", "critic_params", "critic_opt_state")
                   if k in state]
        self.pytrees = {"state_bytes": tree_bytes(state),
                        "trainable_bytes": sum(tree_bytes(state[k]) for k in trained),
                        "params_bytes": tree_bytes(state["params"]),
                        "parameters": int(sum(x.size for x in jax.tree.leaves(state["params"]))),
                        "held": {k: tree_bytes(v) for k, v in state.items()}}
        self.batch = device_batch(self.run, learner.host_batch(
            synthetic_batch(self.run, section, config.seed), 0))
        self.state = {**state, "version": jnp.zeros((), jnp.int32)}
        if section.kind == "ppo":  # PPOLearner.iterate hands the KL coefficient in
            self.state["kl_coef"] = jnp.float32(learner.beta)
        self.compiled = jax.jit(learner.step, donate_argnums=(0,)).lower(
            self.state, self.batch).compile()
        analysis = self.compiled.memory_analysis()
        sizes = {"argument_bytes": analysis.argument_size_in_bytes,
                 "output_bytes": analysis.output_size_in_bytes,
                 "alias_bytes": analysis.alias_size_in_bytes,
                 "temp_bytes": analysis.temp_size_in_bytes}
        self.memory = {**{k: int(v) for k, v in sizes.items()},
                       "device_bytes": device_bytes(*(int(v) for v in sizes.values()))}

    def call(self) -> float:
        """Runs the step once (its state donated and replaced); its wall seconds."""
        import time

        import jax

        start = time.perf_counter()
        self.state, metrics = self.compiled(self.state, self.batch)
        jax.block_until_ready((self.state, metrics))
        return time.perf_counter() - start

    def close(self) -> None:
        self.run.close()


def _prepare_process(config, *, reuse_host_memory: bool) -> None:
    """What the pipeline sets up before a run: the compilation cache and, when
    `reuse_host_memory` (and the config asks for it), the host allocator that keeps freed
    memory for the next step."""
    from grpo_jax import compilation, host_memory

    if reuse_host_memory and config.get("reuse_host_memory", True):
        host_memory.reuse_freed_memory()
    compilation.use_cache(config.get("compilation_cache_dir", compilation.DEFAULT_CACHE_DIR))


def measure_alone(config, calls: int = CALLS) -> dict:
    """One arm alone in this process: its step's memory analysis, its pytrees' bytes and the
    process's resident memory: after the setup, the whole process's peak, and the peak while
    the step runs (the high-water mark reset after compiling) less the setup's. The system's
    allocator (no `host_memory.reuse_freed_memory`), so that memory the compiler freed is not
    counted as the step's."""
    import tempfile

    _prepare_process(config, reuse_host_memory=False)
    with tempfile.TemporaryDirectory(prefix="critic_memory_") as workdir:
        step = _Step(config, workdir)
        try:
            compiled = _resident()
            reset = _reset_peak()
            times = [step.call() for _ in range(calls)]
            calls_peak = _resident()["peak"]
        finally:
            step.close()
    return {**step.memory, **step.pytrees, "rss_setup_bytes": step.rss_setup,
            "rss_compiled_bytes": compiled["rss"],
            "rss_peak_bytes": max(compiled["peak"], calls_peak),
            "rss_added_bytes": calls_peak - step.rss_setup if reset else None,
            "alone_call_s": times}


def schedule(arms: list, warmup: int, timed: int) -> list[list]:
    """The order of the arms' steps in each of `warmup` + `timed` rounds: `arms`' order, then
    the reverse, and so on (ABBA). A round's first arm follows its own step of the round
    before (P G | G P | P G ...), so with an even number of timed rounds each arm goes first,
    and runs right after itself, in half of the timed rounds; an odd number is refused."""
    if timed % 2:
        raise ValueError(f"critic_memory: {timed} timed rounds; an even number keeps the "
                         "alternation balanced")
    return [list(arms) if index % 2 == 0 else list(arms)[::-1]
            for index in range(warmup + timed)]


def measure_pair(configs: dict, warmup: int, timed: int) -> dict:
    """{arm: {"step_times_s", "step_time_s"}}: both arms' steps in this process, alternated
    for `warmup` + `timed` rounds (`schedule`); the median of the timed rounds."""
    import tempfile

    _prepare_process(next(iter(configs.values())), reuse_host_memory=True)
    with tempfile.TemporaryDirectory(prefix="critic_memory_") as root:
        steps = {arm: _Step(config, os.path.join(root, str(i)))
                 for i, (arm, config) in enumerate(configs.items())}
        times = {arm: [] for arm in configs}
        try:
            for order in schedule(list(steps), warmup, timed):
                for arm in order:
                    times[arm].append(steps[arm].call())
        finally:
            for step in steps.values():
                step.close()
    return {arm: {"step_times_s": t[warmup:], "warmup_s": t[:warmup],
                  "step_time_s": statistics.median(t[warmup:])} for arm, t in times.items()}


def _fresh(args: list[str]) -> dict:
    """This module's command line run in a fresh Python process; its JSON answer."""
    import subprocess
    import tempfile

    # this checkout's code first, whichever the interpreter would find otherwise
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}
    with tempfile.TemporaryDirectory(prefix="critic_memory_") as folder:
        out = os.path.join(folder, "out.json")
        subprocess.run([sys.executable, "-m", "grpo_jax.studies.critic_memory", out, *args],
                       check=True, env=env)
        with open(out, encoding="utf-8") as f:
            return json.load(f)


def measure_size(tier: str, size: str, seed: int, init_from: str) -> dict:
    """{arm: figures} of the size's two arms with `seed` from the base role in `init_from`:
    the pair's alternated timing first (it compiles both steps, so the memory processes load
    them from the compilation cache), then each arm alone."""
    arms = [f"{algorithm} {size}" for algorithm in ALGORITHMS]
    warmup, timed = TIMING[tier]
    if FRESH[tier]:
        pair = _fresh(["pair", tier, str(seed), init_from, str(warmup), str(timed), *arms])
        alone = {arm: _fresh(["alone", tier, str(seed), init_from, arm]) for arm in arms}
    else:
        pair = measure_pair({arm: run_config(arm, tier, seed, init_from) for arm in arms},
                            warmup, timed)
        alone = {arm: measure_alone(run_config(arm, tier, seed, init_from)) for arm in arms}
    return {arm: {**alone[arm], **pair[arm], "fresh_process": FRESH[tier]} for arm in arms}


def measure(runs: common.StudyRuns) -> None:
    """FILE beside each finished run, per (base, seed, size) whose two runs have finished and
    lack it (resumable)."""
    for size in SIZES:
        arms = [f"{algorithm} {size}" for algorithm in ALGORITHMS]
        by_seed: dict[tuple, dict] = {}
        for record in runs.runs:
            if record.arm in arms and record.finished:
                by_seed.setdefault((record.base, record.seed), {})[record.arm] = record
        for (_, seed), records in sorted(by_seed.items(), key=lambda kv: str(kv[0])):
            if len(records) < len(arms) or all(
                    os.path.exists(os.path.join(r.workdir, FILE)) for r in records.values()):
                continue
            init_from = next(iter(records.values())).config.model.init_from
            for arm, record in records.items():  # the fresh processes rebuild the config
                if common.config_hash(run_config(arm, runs.tier, seed, init_from)) != \
                        common.config_hash(record.config):
                    raise RuntimeError(f"critic_memory: {arm} seed {seed}: the measured "
                                       "config is not the run's")
            for arm, figures in measure_size(runs.tier, size, seed, init_from).items():
                with open(os.path.join(records[arm].workdir, FILE), "w", encoding="utf-8") as f:
                    json.dump(figures, f, indent=1)


# ---- the analysis ------------------------------------------------------------------------------

def ratio(a, b):
    """a / b, or None without both (or with b not above 0)."""
    return a / b if a is not None and b is not None and b > 0 else None


def _values(record) -> dict:
    path = os.path.join(record.workdir, FILE)
    if not os.path.exists(path):  # its size's other run has not finished
        return {}
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    values = {k: data[k] for k in ("device_bytes", "temp_bytes", "argument_bytes",
                                   "state_bytes", "trainable_bytes", "parameters",
                                   "rss_added_bytes", "rss_peak_bytes", "step_time_s")}
    values["loop_update_time_s"] = common.training_mean(common.training_rows(record),
                                                        "update_time_s", skip=1)
    return values


def _keyed(arm: dict) -> dict:
    """{(base, seed): {metric: value}} of an arm."""
    keys = list(zip(arm["bases"], arm["seeds"]))
    return {key: {metric: values[i] for metric, values in arm["metrics"].items()}
            for i, key in enumerate(keys)}


def ratio_arms(arms: dict) -> dict:
    """{RATIO of size: arm}: per size, each seed's PPO figure over GRPO's (`RATIOS`), paired
    by (base, seed)."""
    out = {}
    for size in SIZES:
        ppo, grpo = arms.get(f"PPO {size}"), arms.get(f"GRPO {size}")
        if ppo is None or grpo is None:
            continue
        a, b = _keyed(ppo), _keyed(grpo)
        keys = [k for k in zip(ppo["bases"], ppo["seeds"]) if k in b]
        metrics = {name: [ratio(a[k].get(field), b[k].get(field)) for k in keys]
                   for name, field in RATIOS.items()}
        metrics["memory_gap_bytes"] = [
            a[k]["device_bytes"] - b[k]["device_bytes"]
            if a[k].get("device_bytes") is not None and b[k].get("device_bytes") is not None
            else None for k in keys]
        out[RATIO.format(size)] = {"bases": [k[0] for k in keys], "seeds": [k[1] for k in keys],
                                   "metrics": metrics}
    return out


def analyze(runs: common.StudyRuns) -> common.Analysis:
    arms = common.per_seed(runs, _values, ARMS)
    arms = {name: arms[name] for name in ARMS if name in arms}
    arms.update(ratio_arms(arms))
    like = next((RATIO.format(s) for s in SIZES if RATIO.format(s) in arms), None)
    if like is not None:
        for metric in ("memory_ratio", "time_ratio", "rss_ratio"):
            common.constant_arm(arms, like, NO_GAP, metric, 1.0)
        common.constant_arm(arms, like, TWO_MODELS, "trainable_ratio", 2.0)
    protocol = {"problems": 0, "samples_per_problem": 0,
                "notes": ("no held-out evaluation: each run measures its update step on a "
                          "synthetic batch of the stage's shape; the bases and seeds repeat "
                          "the measurement")}
    return common.Analysis(arms=arms, specs=SPECS, table=table(arms, runs.tier),
                           protocol=protocol, plots=lambda out: plot(arms, out))


def _mib(values) -> str:
    values = [v for v in values if v is not None]
    return common.cell(values, 2.0 ** -20, 1) if values else "-"


def _seconds(values) -> str:
    values = [v for v in values if v is not None]
    return common.cell(values, 1.0, 3) if values else "-"


def table(arms: dict, tier: str) -> str:
    warmup, timed = TIMING[tier]
    lines = [("| arm | runs | parameters | state held, MiB | params + optimizer, MiB | "
              "compiled step: arguments, MiB | temporaries, MiB | device total, MiB | "
              "resident added, MiB | step s (alternated) | the loop's update s |"),
             "|" + "---|" * 11]
    for arm in ARMS:
        if arm not in arms:
            continue
        m = arms[arm]["metrics"]
        params = [v for v in m.get("parameters", []) if v is not None]
        cells = [f"{params[0]:,}" if params else "-"]
        cells += [_mib(m.get(k, [])) for k in ("state_bytes", "trainable_bytes",
                                              "argument_bytes", "temp_bytes", "device_bytes",
                                              "rss_added_bytes")]
        cells += [_seconds(m.get(k, [])) for k in ("step_time_s", "loop_update_time_s")]
        lines.append(f"| {arm} | {len(arms[arm]['seeds'])} | " + " | ".join(cells) + " |")
    lines += ["", ("| PPO / GRPO | runs | device total | temporaries | params + optimizer | "
                   "resident added | step time | device gap, MiB |"), "|" + "---|" * 8]
    for size in SIZES:
        name = RATIO.format(size)
        if name not in arms:
            continue
        m = arms[name]["metrics"]
        cells = [_seconds(m[k]) for k in ("memory_ratio", "temp_ratio", "trainable_ratio",
                                          "rss_ratio", "time_ratio")]
        lines.append(f"| {size} | {len(arms[name]['seeds'])} | " + " | ".join(cells)
                     + f" | {_mib(m['memory_gap_bytes'])} |")
    lines += ["", ("Parameters: the policy's. State held: every pytree of "
                   "the learner (policy, optimizer state, reference; PPO's critic and its "
                   "optimizer state too); params + optimizer: those of the trained models. "
                   "Compiled step: XLA's memory analysis of the update step (the batch's "
                   "preparation and every epoch x minibatch update), device total = arguments "
                   "+ outputs - aliased + temporaries. Resident added: the measuring process's "
                   "peak resident memory while the step runs, less its resident memory before "
                   "the learner was built. Step s: the median wall seconds of one step over "
                   f"{timed} rounds in one process alternated PPO, GRPO then GRPO, PPO "
                   f"({warmup} warm-up round left out); the loop's update s: the runs' own RL "
                   "loop, after its compiling step. Mean ± 95% half-width over (base, seed) "
                   "runs.")]
    return "\n".join(lines) + "\n"


def plot(arms: dict, out: str) -> None:
    """memory.png: each arm's device total split into arguments and temporaries, and the
    ratios per size."""
    present = [arm for arm in ARMS if arm in arms]
    if not present:
        return
    import numpy as np

    plt = common.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    ax = axes[0]
    mean = lambda arm, k: float(np.mean(arms[arm]["metrics"][k])) / 2 ** 20
    x = np.arange(len(present))
    args = [mean(a, "argument_bytes") for a in present]
    temps = [mean(a, "temp_bytes") for a in present]
    ax.bar(x, args, label="arguments (state, batch)")
    ax.bar(x, temps, bottom=args, label="temporaries")
    ax.set_xticks(x)
    ax.set_xticklabels(present, fontsize=8)
    ax.set_ylabel("MiB")
    ax.set_title("compiled update step, device memory", fontsize=10)
    ax.legend(fontsize=8)
    ax = axes[1]
    sizes = [s for s in SIZES if RATIO.format(s) in arms]
    width = 0.25
    for k, metric in enumerate(("memory_ratio", "trainable_ratio", "time_ratio")):
        values = [float(np.mean([v for v in arms[RATIO.format(s)]["metrics"][metric]
                                 if v is not None] or [np.nan])) for s in sizes]
        ax.bar(np.arange(len(sizes)) + (k - 1) * width, values, width, label=metric)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xticks(np.arange(len(sizes)))
    ax.set_xticklabels(sizes)
    ax.set_ylabel("PPO / GRPO")
    ax.set_title("PPO over GRPO, per size", fontsize=10)
    ax.legend(fontsize=8, loc="lower center")
    common.save_figure(fig, out, "memory.png")


# ---- the claims --------------------------------------------------------------------------------

SMALL, LARGE = RATIO.format("small"), RATIO.format("large")
SPECS = [(SMALL, NO_GAP, "memory_ratio"), (LARGE, NO_GAP, "memory_ratio"),
         (LARGE, SMALL, "memory_ratio"), (LARGE, NO_GAP, "time_ratio"),
         (SMALL, TWO_MODELS, "trainable_ratio"), (SMALL, NO_GAP, "time_ratio"),
         (SMALL, NO_GAP, "rss_ratio"), (LARGE, NO_GAP, "rss_ratio")]
DEEPSEEKMATH = ("Shao et al. 2024, \"DeepSeekMath: Pushing the Limits of Mathematical Reasoning "
                "in Open Language Models\", arXiv:2402.03300, sec. 4.1.1 (quotation)")
TUTORIAL = ("the tutorial on policy gradient to R1 (a seed document; close paraphrase); "
            "DeepSeekMath motivates GRPO the same way (Shao et al. 2024, arXiv:2402.03300, "
            "sec. 4.1.1)")
TUTORIAL_WORDS = "the tutorial on policy gradient to R1 (a seed document; close paraphrase)"
CEILING = 2.0  # PPO / GRPO at most: the critic is a copy of the policy (the growth's headroom)
BURDEN = ("As the value function employed in PPO is typically another model of comparable size "
          "as the policy model, it brings a substantial memory and computational burden")
CLAIMS = (
    common.Claim(BURDEN, DEEPSEEKMATH + "; tested on its memory at the main job's model size: "
                 "the device memory of PPO's compiled update step over GRPO's at equal "
                 "batches, at least 1.2", (SMALL, NO_GAP, "memory_ratio"), ">",
                 margin=MEMORY_MARGIN,
                 can_fail="fails unless PPO's step needs at least 1.2 times GRPO's device "
                          "memory: the critic adds parameter-sized buffers (its weights and "
                          "two Adam moments), but the activations of a minibatch can dominate "
                          "both steps, and XLA may reuse the policy's temporaries for the "
                          "critic's (they update one after the other), leaving the ratio near 1"),
    common.Claim(BURDEN, DEEPSEEKMATH + "; tested on its memory at the larger size, as the "
                 "claim at the main job's size", (LARGE, NO_GAP, "memory_ratio"), ">",
                 margin=MEMORY_MARGIN,
                 can_fail="fails unless PPO's step needs at least 1.2 times GRPO's device "
                          "memory at the larger size, for the reasons of the claim at the "
                          "smaller size"),
    common.Claim("the value model is a major memory burden", TUTORIAL_WORDS + "; read here, "
                 "with DeepSeekMath's critic \"of comparable size as the policy model\" (Shao "
                 "et al. 2024, arXiv:2402.03300, sec. 4.1.1), as a burden that grows with the "
                 "model: this study's reading, tested as PPO's device memory over GRPO's at the "
                 "larger size against at the smaller, at the same batch",
                 (LARGE, SMALL, "memory_ratio"), ">", margin=GROWTH_MARGIN,
                 headroom=(SMALL, "memory_ratio", CEILING),
                 can_fail="fails unless the ratio at the larger size exceeds the smaller's by "
                          "0.1: in bytes the gap grows by construction (the critic grows with "
                          "the policy), but as a share it grows only if the critic's buffers "
                          "grow faster than the rest; PPO holds seven parameter-sized buffers "
                          "to GRPO's four (a ratio of 1.75 where parameters dominate), so a "
                          "ratio set by the activations at the smaller size may stay or fall. "
                          "Not testable here (the headroom) when the smaller size's ratio lies "
                          "within the margin of two, about the most a copy of the policy can "
                          "add (the critic is the policy's network with a scalar head, its "
                          "passes the policy's)"),
    common.Claim(BURDEN, DEEPSEEKMATH + "; tested on its computation at the larger size: the "
                 "median seconds of PPO's update step over GRPO's, alternated in one process, "
                 "at least 1.2", (LARGE, NO_GAP, "time_ratio"), ">", margin=TIME_MARGIN,
                 can_fail="fails unless PPO's step takes at least 1.2 times GRPO's: both run "
                          "the same epochs x minibatches of the policy, and the critic's "
                          "forward and backward passes on a model this small may cost less "
                          "than the shared work (the batch's log-prob passes, the optimizer's "
                          "fixed costs)"),
    common.Claim("the parameters and optimizer state of policy + critic are about twice the "
                 "policy's", "this study's own check; the critic is the policy "
                 "plus a scalar head (grpo_jax/rl/ppo.py), each trained with its own AdamW",
                 (SMALL, TWO_MODELS, "trainable_ratio"), "=", margin=CHECK_MARGIN, kind="check",
                 can_fail="no: the critic copies the policy's parameters and adds a scalar "
                          "head, so PPO's trained state is two of GRPO's up to the head's "
                          "few parameters; the test checks the byte count"),
    common.Claim("GRPO's main advantage is memory: dropping the value model", TUTORIAL,
                 None, untestable="which of GRPO's advantages is the main one weighs memory "
                 "against what this study does not measure (the critic's own training, its "
                 "bias on the last-token reward, tuning); the memory and time it saves are the "
                 "claims above"),
)

TIERS = tiers.standard(
    full="about 45 min on 2 cores, estimated from one (base, seed) of the large size run end "
         "to end under a load of 7 (its base 37 s; its two runs 37 s and 18 s; its three "
         "measuring processes about 90 s from the compilation cache, 233 s when compiling "
         "first) and the small size's measuring processes (125 s when compiling first), over "
         "8 (base, seed) pairs x 2 sizes; plus the four main bases when not built yet (about "
         "9 min each, shared with the other studies)",
    mini="about 30 s on 2 cores (measured under a load of 7: the toy base, the small "
         "size's two runs of 2 steps, the measurement in the study's process)",
    mini_arms=("PPO small", "GRPO small"), full_sized=True)

STUDY = common.Study(
    name="critic_memory",
    question="how much more device memory and time does PPO's update step (policy + critic) "
             "take than GRPO's (policy + frozen reference) at equal batches, at two model "
             "sizes, measured from the compiled step and the process?",
    tiers=TIERS,
    arms=ARMS, base_config=base_config, attach=attach, arm_configs=arm_configs,
    analyze=analyze, measure=measure, claims=CLAIMS,
)


def main(argv: list[str]) -> int:
    """`python -m grpo_jax.studies.critic_memory OUT alone TIER SEED INIT_FROM ARM` or `...
    OUT pair TIER SEED INIT_FROM WARMUP TIMED ARM ARM`: one measurement in this (fresh)
    process, its JSON into OUT."""
    out, mode, tier, seed, init_from, *rest = argv
    if mode == "alone":
        (arm,) = rest
        result = measure_alone(run_config(arm, tier, int(seed), init_from))
    elif mode == "pair":
        warmup, timed, *arms = rest
        result = measure_pair({arm: run_config(arm, tier, int(seed), init_from)
                               for arm in arms}, int(warmup), int(timed))
    else:
        print(f"critic_memory: unknown mode {mode!r}; expected alone or pair", file=sys.stderr)
        return 2
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
