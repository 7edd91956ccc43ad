"""Per-device temporaries and collective volumes of the RL programs on a virtual device mesh.

For a config preset (default ``configs/gsm8k.py:tpu``) and a model shape (a named size of
`grpo_jax.models.named_config`, default qwen2.5-0.5b, with field overrides such as
``--num_layers=4``; no checkpoint is read), this builds the run's mesh on N virtual CPU
devices and lowers and compiles, never runs, three programs from abstract parameters
(`jax.ShapeDtypeStruct`s carrying the shardings the run's logical axis rules give):

* ``update``: the GRPO train step (`rl.update.make_train_step`: loss, gradients, AdamW)
  of one micro-batch, rl.num_prompts * rl.group_size / rl.micro_batches rows;
* ``reference``: the batch preparation the RL stage runs before its updates
  (`rl.update.make_prepare_fn`: the reference log-probs over the whole rollout batch when
  beta != 0, in chunks of the update's micro-batch size, and the advantages);
* ``decode``: one step of the sampler's decode loop (the body of the `lax.while_loop` in
  `sampling.decode`: the cached forward pass of one token per row, the logits and the
  sampling decision) for the rollout batch, with the KV cache at its final size. With
  ``--decode_layout=rollout`` (the default: what `sampling.generate` runs) the parameters
  are its rollout copy (`parallel.rollout_rules`: whole over data x fsdp, matrices in the
  compute dtype) and the loop state is split by rows over the batch axes; ``data`` keeps the
  training layout of the parameters with rows split, ``replicated`` replicates the state
  too (the sampler's layout before it had one of its own).

Batches are split over the batch axes (``data`` x ``fsdp``) as the run places them.
Per program one line:

    PROGRAM: temp_per_device_gib=... all_reduce_gib=... all_gather_gib=... reduce_scatter_gib=...

* temp_per_device_gib: ``compiled.memory_analysis().temp_size_in_bytes``, the temporaries
  of the partitioned (per-device) program, so per device (XLA:CPU's buffer assignment: an
  upper bound of what a GPU / TPU compile would need, the partitioning being the same);
* the collective volumes, parsed from the optimized HLO (``compiled.as_text()``): per
  device, the sum over every all-reduce / all-gather / reduce-scatter instruction of the
  bytes of its result shape (all elements of a tuple result; for an asynchronous
  ``*-start`` op the largest element of its tuple, the output buffer). That is the full
  reduced array for an all-reduce, the gathered array for an all-gather and one device's
  shard for a reduce-scatter, not the bytes a given algorithm puts on the wire. An
  instruction inside a while loop counts once per iteration where XLA recorded the trip
  count (``known_trip_count`` in the loop's backend config, e.g. the `lax.map` over the
  log-prob head's chunks), otherwise once (the line then ends with ``loops_unknown=K``,
  the number of such loops holding collectives); ``--loops_once`` counts every instruction
  once. Conditionals count their largest branch.

    JAX_PLATFORMS=cpu python benchmarks/sharding_report.py --num_layers=4
    python benchmarks/sharding_report.py --config=configs/gsm8k.py:tpu --model=tiny-1m \
        --num_layers=2 --prompt_len=16 --set rl.max_new_tokens=32   # seconds

XLA's LLVM passes are skipped (``--xla_backend_optimization_level=0``): they change neither
the partitioning nor the buffer assignment, and take most of a CPU compile.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import importlib.util
import json
import math
import os
import re
import time
from typing import Any


GIB = 2**30
PROGRAMS = ("update", "reference", "decode")
DECODE_LAYOUTS = ("rollout", "data", "replicated")
SHAPE_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                "head_dim", "mlp_size", "max_seq_len")
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter")


# ---------------------------------------------------------------------- HLO text parsing
_BYTES = {"pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "s32": 4,
          "u32": 4, "s64": 8, "u64": 8, "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "c64": 8,
          "c128": 16}
_ARRAY = re.compile(r"\b([a-z]+[0-9a-z]*)\[([0-9,]*)\]")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*(\(|\{)")
_NAME = r"%?([\w.\-]+)"
_TRIP = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)')


def _array_bytes(shape: str) -> list[int]:
    """Bytes of each array in an HLO shape string (one entry per tuple element)."""
    out = []
    for dtype, dims in _ARRAY.findall(shape):
        if dtype.startswith("f8"):
            size = 1
        elif dtype in _BYTES:
            size = _BYTES[dtype]
        else:
            continue
        out.append(size * math.prod(int(d) for d in dims.split(",") if d))
    return out


def _split_instruction(line: str):
    """(result shape text, opcode, rest) of one HLO instruction line, or None."""
    if "=" not in line:
        return None
    rhs = line.split("=", 1)[1].strip()
    if rhs.startswith("("):  # tuple shape: up to the matching parenthesis
        depth = 0
        for i, ch in enumerate(rhs):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                break
        shape, rest = rhs[:i + 1], rhs[i + 1:].strip()
    else:
        shape, _, rest = rhs.partition(" ")
    match = re.match(r"([a-z][\w\-]*)\(", rest)
    if not match:
        return None
    return shape, match.group(1), rest


@dataclasses.dataclass
class Collective:
    """One collective instruction of the optimized HLO."""

    kind: str  # all-reduce | all-gather | reduce-scatter
    shape: str  # the result shape text
    nbytes: int  # bytes counted (see the module docstring)
    computation: str  # the HLO computation holding it
    count: int = 1  # times it runs per program execution (known loop trip counts)


def parse_collectives(hlo: str) -> tuple[list[Collective], int]:
    """The collectives of an optimized HLO module and how often each runs.

    Returns:
      (collectives with their repeat counts, number of while loops with collectives inside
      whose trip count is unknown, counted once).
    """
    computations: dict[str, list[str]] = {}
    entry, current = None, None
    for line in hlo.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            match = _HEADER.match(line)
            if match and line.rstrip().endswith("{"):
                current = match.group(2)
                computations[current] = []
                if match.group(1):
                    entry = current
                continue
            if line.strip() == "}":
                current = None
            continue
        if current is not None:
            computations[current].append(line)
    if entry is None:
        raise ValueError("parse_collectives: no ENTRY computation in the HLO text")

    memo: dict[str, tuple[list[Collective], int]] = {}

    def walk(name: str) -> tuple[list[Collective], int]:
        if name in memo:
            return memo[name]
        memo[name] = ([], 0)  # guards against cycles
        found, unknown = [], 0
        for line in computations.get(name, []):
            parts = _split_instruction(line)
            if parts is None:
                continue
            shape, opcode, rest = parts
            base = opcode.removesuffix("-start")
            if base in COLLECTIVES:
                sizes = _array_bytes(shape)
                nbytes = max(sizes) if opcode.endswith("-start") else sum(sizes)
                found.append(Collective(base, shape, nbytes, name))
                continue
            if opcode == "while":
                body = re.search(r"body=" + _NAME, rest)
                cond = re.search(r"condition=" + _NAME, rest)
                trip = _TRIP.search(rest)
                inner, inner_unknown = [], 0
                for sub in (body, cond):
                    if sub:
                        ops, k = walk(sub.group(1))
                        inner += ops
                        inner_unknown += k
                times = int(trip.group(1)) if trip else 1
                if inner and not trip:
                    inner_unknown += 1
                found += [dataclasses.replace(c, count=c.count * times) for c in inner]
                unknown += inner_unknown
                continue
            if opcode == "conditional":
                branches = re.findall(r"(?:true_computation|false_computation)=" + _NAME, rest)
                listed = re.search(r"branch_computations=\{([^}]*)\}", rest)
                if listed:
                    branches += [b.strip().lstrip("%") for b in listed.group(1).split(",")]
                walked = [walk(b) for b in branches]
                if walked:
                    ops, k = max(walked, key=lambda w: sum(c.nbytes * c.count for c in w[0]))
                    found += ops
                    unknown += k
                continue
            for callee in re.findall(r"(?:calls|to_apply)=" + _NAME, rest):
                ops, k = walk(callee)
                found += ops
                unknown += k
        memo[name] = (found, unknown)
        return memo[name]

    return walk(entry)


def summarize(compiled, *, loops_once: bool = False) -> dict[str, Any]:
    """temp bytes and collective bytes per kind of a compiled (partitioned) program
    (`loops_once`: every collective counted once, known trip counts or not)."""
    collectives, unknown = parse_collectives(compiled.as_text())
    totals = collections.Counter()
    for c in collectives:
        totals[c.kind] += c.nbytes * (1 if loops_once else c.count)
    analysis = compiled.memory_analysis()
    return {"temp": analysis.temp_size_in_bytes,
            "argument": analysis.argument_size_in_bytes,
            "all_reduce": totals["all-reduce"], "all_gather": totals["all-gather"],
            "reduce_scatter": totals["reduce-scatter"], "loops_unknown": unknown,
            "collectives": collectives}


def format_line(name: str, summary: dict[str, Any]) -> str:
    line = (f"{name}: temp_per_device_gib={summary['temp'] / GIB:.2f} "
            f"all_reduce_gib={summary['all_reduce'] / GIB:.2f} "
            f"all_gather_gib={summary['all_gather'] / GIB:.2f} "
            f"reduce_scatter_gib={summary['reduce_scatter'] / GIB:.2f}")
    if summary["loops_unknown"]:
        line += f" loops_unknown={summary['loops_unknown']}"
    return line


# ---------------------------------------------------------------------- the run's pieces
def load_config(spec: str, overrides: list[str] = ()):
    """The ConfigDict of "path/to/config.py[:preset]" with "a.b=value" overrides."""
    path, _, preset = spec.partition(":")
    module_spec = importlib.util.spec_from_file_location("sharding_report_config", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    config = module.get_config(preset or None)
    for item in overrides:
        key, value = item.split("=", 1)
        node = config
        *parents, leaf = key.split(".")
        for part in parents:
            node = node[part]
        old = node[leaf]
        node[leaf] = value if isinstance(old, str) else type(old)(json.loads(value))
    return config


@dataclasses.dataclass
class Setup:
    """Everything the three programs are lowered from (all abstract)."""

    config: Any  # the ConfigDict
    model_config: Any
    mesh: Any
    rules: tuple
    policy: Any
    params: Any  # pure dict of ShapeDtypeStructs with shardings
    prompt_len: int


def build_setup(config, model_config, *, num_devices: int | None = None,
                prompt_len: int | None = None) -> Setup:
    """The run's mesh, rules and abstract sharded parameters for `model_config`."""
    import jax
    from flax import nnx

    from grpo_jax import parallel
    from grpo_jax.models import Transformer
    from grpo_jax.runner.checks import mesh_rules
    from grpo_jax.training import Policy, default_batch_streams

    devices = jax.devices()
    count = num_devices or config.mesh.num_devices or len(devices)
    mesh = parallel.make_mesh(config.mesh.shape.to_dict(), devices=devices[:count])
    rules = mesh_rules(config)
    graphdef, state = parallel.abstract_sharded_state(
        lambda: Transformer(model_config, rngs=nnx.Rngs(0)), mesh, rules)
    streams = config.model.get("batch_streams") or default_batch_streams()
    policy = Policy(graphdef, state, config.model.logprob_chunk_size or None, streams,
                    config.model.get("logprob_chunk_rows") or None)
    prompt_len = prompt_len or config.task.prompt_len
    if not prompt_len:
        raise ValueError("the config measures its prompt bucket at start-up (prompt_len 0): "
                         "give --prompt_len")
    return Setup(config, model_config, mesh, rules, policy, nnx.to_pure_dict(state),
                 prompt_len)


def _spec(shape, dtype, sharding):
    import jax

    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def _opt_state(optimizer, params, mesh):
    """Abstract optimizer state placed as `training.init_opt_state` places it: leaves that
    mirror a parameter (optax's mu / nu keep the parameter tree) take its sharding, scalars
    are replicated."""
    import jax

    from grpo_jax import parallel

    replicated = parallel.replicated_sharding(mesh)
    by_path = {path: leaf for path, leaf in jax.tree_util.tree_leaves_with_path(params)}
    abstract = jax.eval_shape(optimizer.init, params)

    def place(path, leaf):
        for n in range(len(path)):
            param = by_path.get(tuple(path[n:]))
            if param is not None and param.shape == leaf.shape:
                return _spec(leaf.shape, leaf.dtype, param.sharding)
        return _spec(leaf.shape, leaf.dtype, replicated)

    return jax.tree_util.tree_map_with_path(place, abstract)


def _batch(setup: Setup, rows: int, *, prepared: bool):
    """An abstract RolloutBatch of `rows` rows, split over the batch axes."""
    import jax.numpy as jnp

    from grpo_jax import parallel
    from grpo_jax.rl.batch import RolloutBatch

    data = parallel.data_sharding(setup.mesh)
    p, n = setup.prompt_len, setup.config.rl.max_new_tokens
    spec = lambda shape, dtype: _spec(shape, dtype, data)
    batch = RolloutBatch(
        tokens=spec((rows, p + n), jnp.int32), attention_mask=spec((rows, p + n), jnp.bool_),
        loss_mask=spec((rows, n), jnp.bool_), behaviour_logp=spec((rows, n), jnp.float32),
        rewards=spec((rows,), jnp.float32), version=spec((rows,), jnp.int32))
    if prepared:
        batch = batch.replace(advantages=spec((rows, n), jnp.float32))
    return batch


def _rl_pieces(setup: Setup):
    from grpo_jax.stages.rl import loss_settings, settings

    section = setup.config.rl
    algorithm, resolved = settings(section)
    on_policy = section.num_iterations * section.num_minibatches == 1
    return section, algorithm, resolved, on_policy, loss_settings(section, on_policy=on_policy)


def compile_update(setup: Setup):
    """The compiled train step of one micro-batch (`rl.update.make_train_step`)."""
    import jax

    from grpo_jax.rl.update import make_train_step
    from grpo_jax.training import make_optimizer

    section, _, resolved, _, loss = _rl_pieces(setup)
    o = setup.config.optim
    optimizer, _ = make_optimizer(lr=section.lr, steps=max(section.steps, 1),
                                  warmup_frac=o.warmup_frac, final_lr_frac=o.final_lr_frac,
                                  weight_decay=o.weight_decay, b1=o.b1, b2=o.b2,
                                  clip_norm=o.clip_norm)
    rows = section.num_prompts * section.group_size // section.micro_batches
    whole_groups = section.group_size if section.num_minibatches == 1 else 1
    step = make_train_step(setup.policy, optimizer, loss, prompt_len=setup.prompt_len,
                           micro_batches=1, group_size=whole_groups)
    params = setup.params
    opt_state = _opt_state(optimizer, params, setup.mesh)
    batch = _batch(setup, rows, prepared=True)
    if resolved.beta != 0.0:
        batch = batch.replace(ref_logp=batch.behaviour_logp)
    if not loss.on_policy:
        batch = batch.replace(old_logp=batch.behaviour_logp)
    shardings = lambda tree: jax.tree.map(lambda x: x.sharding, tree)
    jitted = jax.jit(step.fn, donate_argnums=(0, 1),
                     out_shardings=(shardings(params), shardings(opt_state), None))
    return jitted.lower(params, opt_state, batch).compile()


def compile_reference(setup: Setup):
    """The compiled batch preparation (`rl.update.make_prepare_fn`) over the rollout batch."""
    import jax
    import jax.numpy as jnp

    from grpo_jax import parallel
    from grpo_jax.rl.update import make_prepare_fn

    section, algorithm, resolved, on_policy, _ = _rl_pieces(setup)
    prepare = make_prepare_fn(setup.policy, algorithm, resolved,
                              prompt_len=setup.prompt_len, temperature=section.temperature,
                              group_size=section.group_size, adv_eps=section.adv_eps,
                              on_policy=on_policy,
                              micro_batches=section.micro_batches * section.num_minibatches)
    rows = section.num_prompts * section.group_size
    data = parallel.data_sharding(setup.mesh)
    flags = (_spec((rows,), jnp.bool_, data), _spec((rows,), jnp.bool_, data))
    return jax.jit(prepare).lower(setup.params, setup.params, _batch(setup, rows, prepared=False),
                                  *flags).compile()


def compile_decode(setup: Setup, layout: str = "rollout"):
    """The compiled decode step of the sampler (the body of its decode loop)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from grpo_jax import parallel
    from grpo_jax.models.transformer import KVCache
    from grpo_jax.sampling import decode, sampler

    if layout not in DECODE_LAYOUTS:
        raise ValueError(f"decode layout: expected one of {DECODE_LAYOUTS}, got {layout!r}")
    section = setup.config.rl
    rows = section.num_prompts * section.group_size
    n = section.max_new_tokens
    config = sampler.SamplingConfig(max_new_tokens=n, temperature=section.temperature,
                                    top_k=section.top_k, top_p=section.top_p, eos_ids=(0,),
                                    prompt_group=section.group_size)
    policy, model_config = setup.policy, setup.model_config

    spec = decode.DecodeSpec(sampling=config, columns=n)

    def init_state():
        return decode.initial_state(spec, KVCache.init(model_config, rows, setup.prompt_len + n),
                                    jnp.zeros((rows,), jnp.int32))

    replicated = parallel.replicated_sharding(setup.mesh)
    data = replicated if layout == "replicated" else parallel.data_sharding(setup.mesh)
    params = setup.params
    if layout == "rollout":  # what `sampling.generate` hands its decode loop
        shardings = parallel.state_shardings(setup.policy.template, setup.mesh,
                                             parallel.rollout_rules(setup.rules))
        shardings = nnx.to_pure_dict(shardings)
        dtype = model_config.compute_dtype
        params = jax.tree.map(
            lambda p, s: _spec(p.shape, dtype if p.ndim >= 2 else p.dtype, s),
            params, shardings)
    cache_rows = rows * model_config.num_kv_heads

    def place(x):
        # Row-major leaves (batch rows, or (row, KV head) pairs in the cache) follow the
        # layout; the rotary tables, scalars and inv_freq are replicated.
        row_major = x.ndim >= 1 and x.shape[0] in (rows, cache_rows) and (
            x.ndim > 1 or x.shape[0] == rows)
        return _spec(x.shape, x.dtype, data if row_major else replicated)

    state = jax.tree.map(place, jax.eval_shape(init_state))
    key = _spec((), jax.random.key(0).dtype, replicated)

    def decode_step(params, s, key):  # the body of the decode loop (`sampling.decode.run`)
        return decode.step(policy.bind(params), s, key, spec)

    return jax.jit(decode_step, donate_argnums=(1,)).lower(params, state, key).compile()


def model_config_for(config, name: str, **overrides):
    """The named ModelConfig with the preset's numerics (dtype, param_dtype, remat,
    max_seq_len), its model shape fields and `overrides` (None values ignored)."""
    from grpo_jax.models import named_config
    from grpo_jax.runner.model_init import MODEL_SHAPE_FIELDS

    fields = {field: config.model[field] for field in MODEL_SHAPE_FIELDS
              if config.model.get(field) is not None}
    fields.update({k: v for k, v in overrides.items() if v is not None})
    fields.setdefault("max_seq_len", max(config.model.max_seq_len, 1))
    return named_config(name, dtype=config.model.dtype, param_dtype=config.model.param_dtype,
                        **fields)


def report(setup: Setup, programs=PROGRAMS, *, decode_layout: str = "rollout",
           loops_once: bool = False, verbose: bool = False) -> dict[str, dict]:
    """{program: summary} for the named programs, printing one line per program."""
    compilers = {"update": compile_update, "reference": compile_reference,
                 "decode": lambda s: compile_decode(s, decode_layout)}
    results = {}
    for name in programs:
        t0 = time.time()
        summary = summarize(compilers[name](setup), loops_once=loops_once)
        summary["compile_s"] = time.time() - t0
        results[name] = summary
        print(format_line(name, summary), flush=True)
        if verbose:
            biggest = sorted(summary["collectives"], key=lambda c: -c.nbytes * c.count)[:12]
            for c in biggest:
                print(f"    {c.kind:14s} {c.nbytes * c.count / GIB:9.3f} GiB  x{c.count:<4d} "
                      f"{c.shape[:90]}  [{c.computation}]")
            print(f"    compiled in {summary['compile_s']:.0f}s", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/gsm8k.py:tpu",
                        help="config file and preset, e.g. configs/gsm8k.py:tpu")
    parser.add_argument("--model", default="qwen2.5-0.5b",
                        help="named model size (grpo_jax.models.available_models())")
    for field in SHAPE_FIELDS:
        parser.add_argument(f"--{field}", type=int, default=None)
    parser.add_argument("--num_devices", type=int, default=8,
                        help="virtual CPU devices (the config's mesh must fit them)")
    parser.add_argument("--prompt_len", type=int, default=None,
                        help="prompt bucket (default: the config's, else 256)")
    parser.add_argument("--programs", default=",".join(PROGRAMS))
    parser.add_argument("--decode_layout", default="rollout", choices=DECODE_LAYOUTS)
    parser.add_argument("--set", action="append", default=[],
                        help="config override, e.g. --set rl.num_prompts=16")
    parser.add_argument("--loops_once", action="store_true",
                        help="count each collective once, ignoring loop trip counts")
    parser.add_argument("--verbose", action="store_true",
                        help="list the largest collectives of each program")
    args = parser.parse_args()

    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    flags = os.environ.get("XLA_FLAGS", "")
    flags += f" --xla_force_host_platform_device_count={args.num_devices}"
    if "xla_backend_optimization_level" not in flags:
        flags += " --xla_backend_optimization_level=0"
    os.environ["XLA_FLAGS"] = flags.strip()
    import jax

    if jax.device_count() < args.num_devices:
        raise SystemExit(f"{jax.device_count()} devices, expected {args.num_devices}: set "
                         "XLA_FLAGS before anything imports jax")
    config = load_config(args.config, args.set)
    model_config = model_config_for(config, args.model,
                                    **{f: getattr(args, f) for f in SHAPE_FIELDS})
    prompt_len = args.prompt_len or config.task.prompt_len or 256
    setup = build_setup(config, model_config, num_devices=args.num_devices,
                        prompt_len=prompt_len)
    rl = config.rl
    print(f"{args.config} on {dict(setup.mesh.shape)}: {args.model} {model_config.num_layers} "
          f"layers ({model_config.num_params() / 1e6:.0f}M parameters, "
          f"{model_config.param_dtype} / {model_config.dtype}, remat {model_config.remat}, "
          f"scan_layers {model_config.scan_layers}), "
          f"{rl.num_prompts} x {rl.group_size} rows of {prompt_len} + {rl.max_new_tokens} "
          f"tokens, {rl.micro_batches} micro-batches, log-prob tiles of "
          f"{config.model.get('logprob_chunk_rows') or 'all'} rows x "
          f"{config.model.logprob_chunk_size or 'all'} positions", flush=True)
    programs = [p for p in args.programs.split(",") if p]
    unknown = sorted(set(programs) - set(PROGRAMS))
    if unknown:
        raise SystemExit(f"--programs: unknown {unknown}; expected some of {PROGRAMS}")
    report(setup, programs, decode_layout=args.decode_layout, loops_once=args.loops_once,
           verbose=args.verbose)


if __name__ == "__main__":
    main()
