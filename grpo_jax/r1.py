"""DeepSeek-R1 stages: rejection-sampling SFT and distillation (https://arxiv.org/abs/2501.12948).

- "rejection_sft" (sec. 2.3.3): sample k completions per training problem from the current
  policy, keep the verified-correct and well-formed ones (accuracy >= 1 and format >= 1),
  optionally mix in clean worked solutions, and fine-tune the policy on them with the SFT
  loss (completion tokens only).
- "distill" (sec. 2.4): a teacher (the run's current parameters, or the final parameters of
  another run's workdir) generates; verified traces are kept; a student of another named
  size is initialised fresh and fine-tuned on them. The student then *replaces*
  `run.policy`, `run.params` and `run.model_config`, so every later stage (eval, rl, ...)
  works on the student; `run.extra_meta["model_name"]` records the swap in every later
  checkpoint's meta (see `rebuild_model_for_meta` for resuming such a run).
- cold start is the existing "sft" kind.

The selected training rows of both stages are written to `<workdir>/<stage>/data.jsonl` the
first time, and read back on a resume (the sampling model is not available then).
"""

from __future__ import annotations

import json
import os

import jax
import ml_collections
import numpy as np
from flax import nnx



# ---------------------------------------------------------------------------------------
# Selection


def select_verified(records, *, min_accuracy: float = 1.0, min_format: float = 1.0,
                    dedupe: bool = True) -> list[dict]:
    """Records (as from `stages.sample_and_score`) that are correct and well-formed.

    Keeps r with components["accuracy"] >= min_accuracy and components["format"] >=
    min_format; with `dedupe`, one copy of each (example id, text).
    """
    kept, seen = [], set()
    for r in records:
        comps = r["components"]
        if "accuracy" not in comps or "format" not in comps:
            raise ValueError("select_verified: records need 'accuracy' and 'format' components, "
                             f"got {sorted(comps)}")
        if comps["accuracy"] < min_accuracy or comps["format"] < min_format:
            continue
        key = (getattr(r["example"], "id", None), r["text"])
        if dedupe and key in seen:
            continue
        seen.add(key)
        kept.append(r)
    return kept


def fill_rows(prompts: list[str], completions: list[str], batch_size: int):
    """Repeats the rows cyclically until there are at least `batch_size` of them."""
    if not prompts:
        return prompts, completions
    reps = -(-batch_size // len(prompts))
    if reps <= 1:
        return prompts, completions
    return prompts * reps, completions * reps


def _data_path(run, stage) -> str:
    return os.path.join(run.workdir, stage.name, "data.jsonl")


def _save_rows(path: str, prompts, completions, info: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps({"info": info}) + "\n")
        for p, c in zip(prompts, completions):
            f.write(json.dumps({"prompt": p, "completion": c}) + "\n")
    os.replace(tmp, path)


def _load_rows(path: str):
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    info = lines[0]["info"]
    return [r["prompt"] for r in lines[1:]], [r["completion"] for r in lines[1:]], info


def sample_verified(run, stage, section, policy, params, *, seed: int):
    """Samples section.num_samples per training problem with (policy, params); keeps verified.

    Returns (prompts, completions, info) of the kept rows.
    """
    from grpo_jax.stages import prompt_text, sample_and_score, sampling_config

    examples = run.task.examples("train", section.num_problems, seed=seed)
    sampling = sampling_config(run, max_new_tokens=section.max_new_tokens,
                               temperature=section.temperature)
    saved = run.policy, run.params
    run.policy, run.params = policy, params  # sample_and_score samples with run.policy
    try:
        records = sample_and_score(run, examples, num_samples=section.num_samples,
                                   batch_size=section.sample_batch_size, sampling=sampling,
                                   key=run.stage_key(stage.index, 0))
    finally:
        run.policy, run.params = saved
    kept = select_verified(records, min_accuracy=section.min_accuracy,
                           min_format=section.min_format, dedupe=section.dedupe)
    info = {"sampled": len(records), "kept": len(kept),
            "kept_frac": len(kept) / max(len(records), 1),
            "problems_covered": len({getattr(r["example"], "id", i) for i, r in
                                     enumerate(kept)})}
    return ([prompt_text(run, r["example"]) for r in kept], [r["text"] for r in kept], info)


def clean_solutions(run, num: int, *, seed: int):
    """`num` clean worked solutions of training problems: (prompts, completions)."""
    from grpo_jax.stages import prompt_text

    if num <= 0:
        return [], []
    rng = np.random.default_rng(seed)
    prompts, completions = [], []
    for ex in run.task.examples("train", num, seed=seed):
        text, _ = run.task.solution(ex, rng=rng, error_rate=0.0, format_error_rate=0.0)
        prompts.append(prompt_text(run, ex))
        completions.append(text)
    return prompts, completions


def _train_on_rows(run, stage, prompts, completions, info) -> None:
    from grpo_jax.stages import supervised_stage

    section = stage.section
    run.writer.write(run.global_step, {k: float(v) for k, v in info.items()}, stage=stage.name)
    print(f"[grpo_jax] {stage.name}: " + ", ".join(f"{k}={v}" for k, v in info.items()),
          flush=True)
    if not prompts:
        print(f"[grpo_jax] {stage.name}: no verified completions and no mixed-in data; "
              "skipping training", flush=True)
        run.finish_stage(stage)
        return
    prompts, completions = fill_rows(prompts, completions, section.batch_size)
    supervised_stage(run, stage, prompts, completions, loss_on_prompt=False)


# ---------------------------------------------------------------------------------------
# Stage kinds


def _common_fields(s: ml_collections.ConfigDict) -> None:
    s.num_problems = 256  # training problems to sample from
    s.num_samples = 4  # k completions per problem
    s.temperature = 1.0  # sampling temperature
    s.max_new_tokens = 40  # completion budget when sampling
    s.sample_batch_size = 64  # sequences per sampler call (compile once)
    s.min_accuracy = 1.0  # keep completions with accuracy reward >= this
    s.min_format = 1.0  # ... and strict format reward >= this
    s.dedupe = True  # drop repeated (problem, completion) pairs
    s.steps = 100  # SFT optimizer steps on the kept rows
    s.batch_size = 32  # SFT rows per step
    s.micro_batches = 1
    s.lr = 1e-3
    s.checkpoint_every = 0  # SFT steps between checkpoints (0 = only at the end)


def default_rejection_sft_section() -> ml_collections.ConfigDict:
    """Config section of a "rejection_sft" stage (every field commented)."""
    s = ml_collections.ConfigDict()
    s.kind = "rejection_sft"
    _common_fields(s)
    s.mix_sft_examples = 0  # clean worked solutions mixed into the kept rows
    return s


def default_distill_section() -> ml_collections.ConfigDict:
    """Config section of a "distill" stage (every field commented)."""
    s = ml_collections.ConfigDict()
    s.kind = "distill"
    _common_fields(s)
    s.teacher = ""  # "": the run's current params | a finished grpo_jax run's workdir
    s.student_model = "tiny-1m"  # grpo_jax.models.named_config name of the student
    return s


def validate_section(name: str, section, config) -> None:
    """Raises ValueError naming the field for an unusable rejection_sft / distill section."""
    from grpo_jax.models.config import _NAMED

    for field in ("num_problems", "num_samples", "max_new_tokens", "sample_batch_size",
                  "steps", "batch_size", "micro_batches"):
        if int(section[field]) < 1:
            raise ValueError(f"{name}.{field}: expected >= 1, got {section[field]}")
    if section.temperature <= 0:
        raise ValueError(f"{name}.temperature: expected > 0, got {section.temperature}")
    if section.sample_batch_size % jax.device_count():
        raise ValueError(f"{name}.sample_batch_size: {section.sample_batch_size} is not "
                         f"divisible by the {jax.device_count()} devices")
    if section.batch_size % (section.micro_batches * jax.device_count()):
        raise ValueError(f"{name}.batch_size: {section.batch_size} is not divisible by "
                         f"micro_batches x devices = {section.micro_batches} x "
                         f"{jax.device_count()}")
    if config.task.prompt_len + section.max_new_tokens > config.model.max_seq_len:
        raise ValueError(f"{name}.max_new_tokens: prompt_len {config.task.prompt_len} + "
                         f"{section.max_new_tokens} exceeds model.max_seq_len "
                         f"{config.model.max_seq_len}")
    if section.kind == "rejection_sft" and section.mix_sft_examples < 0:
        raise ValueError(f"{name}.mix_sft_examples: expected >= 0")
    if section.kind == "distill":
        if section.student_model not in _NAMED:
            raise ValueError(f"{name}.student_model: unknown model {section.student_model!r}; "
                             f"expected one of {sorted(_NAMED)}")
        if section.teacher and not os.path.isfile(os.path.join(section.teacher, "config.json")):
            raise ValueError(f"{name}.teacher: {section.teacher!r} is not a grpo_jax workdir "
                             "(no config.json); use '' for the run's current params")


def _stage_rows(run, stage, sample):
    """The stage's (prompts, completions, info): loaded when an earlier attempt of the stage
    saved them, else `sample()` and saved, so a resumed stage trains on the same rows."""
    path = _data_path(run, stage)
    if os.path.exists(path):
        return _load_rows(path)
    prompts, completions, info = sample()
    _save_rows(path, prompts, completions, info)
    return prompts, completions, info


def rejection_sft_stage(run, stage) -> None:
    """Rejection-sampling SFT: sample from the policy, keep verified, fine-tune on them."""
    section = stage.section
    seed = run.config.seed + 1000 * stage.index

    def sample():
        prompts, completions, info = sample_verified(run, stage, section, run.policy,
                                                     run.params, seed=seed)
        mix_p, mix_c = clean_solutions(run, section.mix_sft_examples, seed=seed + 1)
        info["mixed_in"] = len(mix_p)
        return prompts + mix_p, completions + mix_c, info

    prompts, completions, info = _stage_rows(run, stage, sample)
    _train_on_rows(run, stage, prompts, completions, info)


def load_teacher(run, workdir: str):
    """(Policy, params) of the final checkpoint of another grpo_jax run (same tokenizer)."""
    from grpo_jax.checkpoint import Checkpointer
    from grpo_jax.models import Transformer, named_config
    from grpo_jax.training import Policy

    with open(os.path.join(workdir, "config.json")) as f:
        cfg = json.load(f)
    with Checkpointer(os.path.join(workdir, "checkpoints")) as ckpt:
        step = ckpt.latest_step()
        if step is None:
            raise ValueError(f"teacher: no checkpoint in {workdir}/checkpoints")
        meta = ckpt.restore_meta(step)
        name = meta.get("model_name", cfg["model"]["name"])
        model_config = named_config(name, vocab_size=run.tokenizer.vocab_size,
                                    max_seq_len=cfg["model"]["max_seq_len"],
                                    dtype=cfg["model"]["dtype"],
                                    param_dtype=cfg["model"]["param_dtype"])
        abstract = nnx.eval_shape(lambda: Transformer(model_config, rngs=nnx.Rngs(0)))
        policy, template = Policy.from_model(abstract)
        state, _ = ckpt.restore(step, target={"params": template})
    return policy, state["params"]


def build_student(run, model_name: str, *, seed: int):
    """A fresh model of `model_name` on the run's tokenizer and mesh:
    (model_config, policy, params)."""
    from grpo_jax.models import Transformer
    from grpo_jax.pipeline import model_config_for

    model_config = model_config_for(run.config, run.tokenizer, model_name)
    policy, params = run.place_model(Transformer(model_config, rngs=nnx.Rngs(seed)))
    return model_config, policy, params


def distill_stage(run, stage) -> None:
    """Distillation: teacher samples, verified traces kept, a fresh student is fine-tuned."""
    section = stage.section
    seed = run.config.seed + 1000 * stage.index

    def sample():
        if section.teacher:
            teacher_policy, teacher_params = load_teacher(run, section.teacher)
        else:
            teacher_policy, teacher_params = run.policy, run.params
        return sample_verified(run, stage, section, teacher_policy, teacher_params, seed=seed)

    prompts, completions, info = _stage_rows(run, stage, sample)
    # The student replaces the run's model for this and every later stage.
    run.model_config, run.policy, run.params = build_student(run, section.student_model,
                                                             seed=seed)
    run.extra_meta["model_name"] = section.student_model
    _train_on_rows(run, stage, prompts, completions, info)


def rebuild_model_for_meta(run, meta: dict) -> None:
    """Resume hook: if a distill stage swapped the model, rebuild the student's shape.

    Call in `pipeline._resume_point` right after reading `meta` and before restoring params:
    a checkpoint written after (or during) a distill stage holds the student's params,
    named by meta["model_name"]; without this the restore target has the wrong structure.
    """
    name = meta.get("model_name")
    if not name:
        return
    run.model_config, run.policy, run.params = build_student(run, name, seed=run.config.seed)
    run.extra_meta["model_name"] = name

