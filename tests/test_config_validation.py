"""Start-up validation: every bad config exits 2 with one stderr line naming the field,
before anything is written; --print_config validates and prints without writing."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys

import ml_collections
import pytest

from grpo_jax import main as main_lib
from grpo_jax.models import named_config
from grpo_jax.runner import ConfigError, validate
from grpo_jax.stages import KINDS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from configs import default as default_config  # noqa: E402

DEFAULT = os.path.join(REPO, "configs", "default.py") + ":smoke"
PPO = os.path.join(REPO, "configs", "ppo.py") + ":smoke"
TRPO = os.path.join(REPO, "configs", "trpo.py") + ":smoke"
R1 = os.path.join(REPO, "configs", "r1_pipeline.py") + ":smoke"

# (config, flag, what the one error line must contain). The tests see 8 CPU devices, so the
# data-parallel size is 8 unless mesh fields say otherwise.
HOSTILE = [
    (DEFAULT, "--config.rl.lr=abc", "--config.rl.lr=abc: expected a float"),
    (DEFAULT, "--config.rl.steps=2.5", "--config.rl.steps=2.5: expected an int"),
    (DEFAULT, "--config.rl.lrr=1", "no such config field 'lrr' (did you mean 'lr'?)"),
    (DEFAULT, "--config.nope.x=1", "no such config field 'nope'"),
    (DEFAULT, "--config.rl.rewards.acuracy=1.0", "did you mean 'accuracy'"),
    (DEFAULT, "--config.rl.lr=-1", "rl.lr: expected a value in (0.0, inf)"),
    (DEFAULT, "--config.rl.lr=0", "rl.lr"),
    (DEFAULT, "--config.rl.lr=inf", "rl.lr: expected a finite number"),
    (DEFAULT, "--config.rl.lr=nan", "rl.lr: expected a finite number"),
    (DEFAULT, "--config.rl.beta=-1", "rl.beta: expected a value in [0.0, inf)"),
    (DEFAULT, "--config.rl.top_p=0", "rl.top_p: expected a value in (0.0, 1.0]"),
    (DEFAULT, "--config.rl.top_p=1.5", "rl.top_p"),
    (DEFAULT, "--config.rl.top_k=-1", "rl.top_k"),
    (DEFAULT, "--config.rl.temperature=0", "rl.temperature"),
    (DEFAULT, "--config.rl.group_size=1", "rl.group_size: grpo needs G >= 2"),
    (DEFAULT, "--config.rl.group_size=0", "rl.group_size"),
    (DEFAULT, "--config.rl.num_prompts=0", "rl.num_prompts"),
    (DEFAULT, "--config.rl.num_minibatches=3", "rl.num_minibatches"),
    (DEFAULT, "--config.rl.micro_batches=3", "rl.micro_batches: minibatch of 16 rows"),
    (DEFAULT, "--config.rl.algorithm=ppo2", "rl.algorithm"),
    (DEFAULT, "--config.rl.loss_agg=mean", "rl.loss_agg"),
    (DEFAULT, "--config.rl.kl_kind=k4", "rl.kl_kind"),
    (DEFAULT, "--config.rl.ratio_level=word", "rl.ratio_level"),
    (DEFAULT, "--config.rl.max_new_tokens=500", "rl.max_new_tokens: task.prompt_len 16"),
    (DEFAULT, "--config.rl.dynamic_sampling=yes", "rl.dynamic_sampling"),
    (DEFAULT, "--config.rl.overlong_cache=100", "rl.overlong_cache"),
    (DEFAULT, "--config.rl.epsilon=0", "rl.epsilon"),
    (DEFAULT, "--config.rl.dual_clip=0.5", "rl.dual_clip"),
    (DEFAULT, "--config.rl.checkpoint_every=-1", "rl.checkpoint_every"),
    (DEFAULT, "--config.rl.fused_steps=-1", "rl.fused_steps"),
    (DEFAULT, "--config.rl.fused_steps=3", "rl.fused_steps: steps 2 is not a multiple of "
                                           "fused_steps 3"),
    (DEFAULT.replace(":smoke", ":cpu"), "--config.rl.checkpoint_every=15",
     "rl.fused_steps: checkpoint_every 15 is not a multiple of fused_steps 10"),
    (DEFAULT, "--config.rl.rewards.accuracy=inf", "rl.rewards.accuracy"),
    (DEFAULT, "--config.rl.kind=ppo", "rl.kind: this section's fields are not those of a 'ppo'"),
    (DEFAULT, "--config.rl.kind=nope", "rl.kind: expected one of"),
    (DEFAULT, "--config.pretrain.batch_size=7", "pretrain.batch_size: 7 is not divisible"),
    (DEFAULT, "--config.pretrain.steps=0", "pretrain.steps"),
    (DEFAULT, "--config.pretrain.lr=-0.001", "pretrain.lr"),
    (DEFAULT, "--config.eval_base.num_samples=0", "eval_base.num_samples"),
    (DEFAULT, "--config.eval_base.batch_size=12", "eval_base.batch_size: 12 is not divisible by "
                                                  "the 8 data-parallel devices"),
    (DEFAULT, "--config.eval_base.max_new_tokens=100", "eval_base.max_new_tokens"),
    (DEFAULT, "--config.task.name=nope", "task.name"),
    (DEFAULT, "--config.task.template=chat", "task.template: 'chat' renders a chat template: the checkpoint's"),
    (DEFAULT, "--config.task.chat_template=nowhere.jinja",
     "task.chat_template: 'nowhere.jinja' is neither a built-in template"),
    (DEFAULT, "--config.task.prompt_len=1", "task.prompt_len: expected 0 (auto"),
    (DEFAULT, "--config.task.prompt_len=-4", "task.prompt_len: expected >= 0"),
    (DEFAULT, "--config.tokenizer=checkpoint", "tokenizer: 'checkpoint' needs model.init_from"),
    (DEFAULT, "--config.task.name=gsm8k", "task.kwargs.data_dir: expected a directory"),
    (DEFAULT, "--config.task.prompt_len=8", "task.prompt_len: 8 cannot hold prompt"),
    (DEFAULT, "--config.task.solution_error_rate=1.5", "task.solution_error_rate"),
    (DEFAULT, "--config.task.train_size=0", "task.train_size"),
    (DEFAULT, "--config.tokenizer=bpe", "tokenizer"),
    (DEFAULT, "--config.model.name=gpt5", "model.name"),
    (DEFAULT, "--config.model.dtype=float8", "model.dtype"),
    (DEFAULT, "--config.model.num_heads=3", "model.num_heads"),
    (DEFAULT, "--config.model.head_dim=15", "model.head_dim"),
    (DEFAULT, "--config.model.hidden_size=0", "model.hidden_size"),
    (DEFAULT, "--config.model.attention=flash", "model.attention"),
    (DEFAULT, "--config.rl.pack_blocks=1000000", "rl.pack_blocks: expected a value in [0, 16] "
                                                 "(the rollout batch N*G = 4 x 4 rows"),
    (DEFAULT, "--config.rl.slots=1000", "rl.slots: expected a value in [0, 16]"),
    (DEFAULT, "--config.math_verify.workers=10000", "math_verify.workers: expected <= 64"),
    (DEFAULT, "--config.model.mlp_size=10000000000", "parameters x 4 bytes"),
    (DEFAULT, "--config.rl.max_staleness=-1", "rl.max_staleness"),
    (DEFAULT, "--config.rl.off_policy_correction=vtrace", "rl.off_policy_correction"),
    (DEFAULT, "--config.rl.mis_high=0.9", "rl.mis_high"),
    (DEFAULT, "--config.rl.partial_tokens=4", "rl.partial_tokens: a carried row's tokens are "
                                              "at least one update old: set max_staleness"),
    (DEFAULT, "--config.rl.partial_tokens=24 --config.rl.max_staleness=1",
     "rl.partial_tokens: expected <= 23"),
    (DEFAULT, "--config.rl.partial_tokens=4 --config.rl.max_staleness=1 --config.rl.tools=calc "
              "--config.rl.max_observation_tokens=8",
     "rl.partial_tokens: multi-turn episodes are not continued"),
    (DEFAULT, "--config.rl.partial_tokens=4 --config.rl.max_staleness=1 "
              "--config.rl.algorithm=dapo", "rl.partial_tokens: dynamic sampling (dapo)"),
    (DEFAULT, "--config.mesh.rollout_devices=64", "mesh.rollout_devices"),
    (DEFAULT.replace(":smoke", ""), "--config.mesh.num_devices=2 "
     "--config.mesh.rollout_devices=1", "rl.fused_steps: samples and trains in one program"),
    (DEFAULT, "--config.model.attention=cudnn", "model.attention='cudnn' needs dtype"),
    (DEFAULT, "--config.model.max_seq_len=20 --config.pretrain.pack_len=0",
     "max_new_tokens: task.prompt_len 16"),
    (DEFAULT, "--config.model.max_seq_len=20",
     "pretrain.pack_len: 64 exceeds model.max_seq_len 20"),
    (DEFAULT, "--config.model.init_from=/nonexistent",
     "model.init_from: '/nonexistent' does not exist"),
    (DEFAULT, "--config.mesh.num_devices=99", "mesh.num_devices: expected <= 8"),
    (DEFAULT, "--config.mesh.shape.data=3", "mesh.shape"),
    (DEFAULT, "--config.optim.b2=1.0", "optim.b2"),
    (DEFAULT, "--config.optim.clip_norm=-1", "optim.clip_norm"),
    (DEFAULT, "--config.checkpoint.max_to_keep=0", "checkpoint.max_to_keep"),
    (DEFAULT, "--config.stages=pretrain,missing", "stages: 'missing' has no config section"),
    (DEFAULT, "--config.stages=pretrain,pretrain", "stages: 'pretrain' is listed twice"),
    (DEFAULT, "--config.stages=", "stages"),
    (DEFAULT, "--config.seed=-1", "seed"),
    (DEFAULT, "--config.reuse_host_memory=maybe", "reuse_host_memory"),
    (DEFAULT, "--config.model.batch_streams=-1", "model.batch_streams"),
    (PPO, "--config.ppo.gamma=1.5", "ppo.gamma"),
    (PPO, "--config.ppo.num_minibatches=3", "ppo.num_minibatches"),
    (PPO, "--config.ppo.critic_lr=0", "ppo.critic_lr"),
    (PPO, "--config.ppo.adaptive_kl=True --config.ppo.beta=0.0", "ppo.beta"),
    (TRPO, "--config.trpo.group_size=1", "trpo.group_size"),
    (TRPO, "--config.trpo.max_kl=0", "trpo.max_kl"),
    (TRPO, "--config.trpo.backtrack_ratio=1", "trpo.backtrack_ratio"),
    (R1, "--config.rejection_sft.sample_batch_size=12", "rejection_sft.sample_batch_size"),
    (R1, "--config.cold_start.error_rate=2", "cold_start.error_rate"),
    (R1, "--config.reasoning_rl.rewards.language=-inf", "reasoning_rl.rewards.language"),
]


def _cli(*args) -> tuple[int, str, str]:
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main_lib.cli(["grpo_jax", *args])
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("config,flags_,needle", HOSTILE,
                         ids=[f"{os.path.basename(c)}|{f}" for c, f, _ in HOSTILE])
def test_hostile_config_exits_2_with_one_line(tmp_path, config, flags_, needle):
    workdir = tmp_path / "run"
    code, out, err = _cli(f"--config={config}", *flags_.split(), f"--workdir={workdir}")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (code, err)
    assert len(lines) == 1 and lines[0].startswith("config error: "), err
    assert needle in lines[0], lines[0]
    assert "Traceback" not in err and not workdir.exists() and out == ""


def test_the_corpus_is_large():
    assert len(HOSTILE) >= 40


@pytest.mark.parametrize("mutate,needle", [
    (lambda c: c.task.kwargs.update({"nope": 1}), "task.kwargs"),
    (lambda c: setattr(c, "rl", ml_collections.ConfigDict({**c.rl.to_dict(), "steps": 3.0})),
     "rl.steps: expected an int"),
    (lambda c: setattr(c, "rl", ml_collections.ConfigDict({**c.rl.to_dict(), "stpes": 3})),
     "rl.stpes: unknown field for a 'rl' stage (did you mean 'steps'?)"),
    (lambda c: setattr(c.rl, "rewards", {"reward_model": 1.0}), "rl.reward_model"),
    (lambda c: c.rl.update({"reward_model": "later"}) or setattr(
        c.rl, "rewards", {"reward_model": 1.0}), "'later' is not an earlier stage"),
    (lambda c: setattr(c.pretrain, "pack_len", 65), "pretrain.pack_len: 65 exceeds "
                                                    "model.max_seq_len 64"),
    (lambda c: setattr(c.pretrain, "pack_len", -1), "pretrain.pack_len: expected >= 0"),
    (lambda c: setattr(c.rl, "rewards", {"environment": 1.0}),
     "rl.rewards.environment: the reward 'environment' is a stateful environment's own; "
     "tools '' gives none"),
])
def test_python_level_config_errors(mutate, needle):
    config = default_config.get_config("smoke")
    mutate(config)
    with pytest.raises(ConfigError) as error:
        validate(config, KINDS)
    assert needle in str(error.value)


def test_override_names_are_checked_against_the_loaded_config_before_they_apply():
    """The first --config.* name that is no field of the config it applies to, walked
    through that config (the one of --config=, else the default), with a close match."""
    problem = main_lib._override_problem  # pylint: disable=protected-access
    assert problem(["grpo_jax", f"--config={DEFAULT}", "--config.rl.steps=3",
                    "--config.rl.stpes=2", "--config.rl.lrr=1"]) == (
        "--config.rl.stpes: no such config field 'stpes' (did you mean 'steps'?)")
    assert problem(["grpo_jax", "--config.nope.x=1"]) == \
        "--config.nope.x: no such config field 'nope'"
    assert problem(["grpo_jax", f"--config={DEFAULT}", "--config.rl.lr=abc",
                    "--config.model.hidden_size=64"]) is None  # values are checked later
    assert problem(["grpo_jax", "--config=configs/nonexistent.py", "--config.x=1"]) is None


def test_the_cli_exits_2_in_a_real_process(tmp_path):
    """The same in a fresh interpreter: exit status 2, one line, no traceback; also without
    --config= (the default config's overrides apply at import) and for a missing file."""
    for flags_, needle in (([f"--config={DEFAULT}", "--config.rl.beta=-1"], "rl.beta"),
                           ([f"--config={DEFAULT}", "--config.rl.lrr=1"], "did you mean 'lr'"),
                           (["--config.rl.lrr=1"], "--config.rl.lrr: no such config field"),
                           (["--config=configs/nonexistent.py"],
                            "--config: No such file or directory: 'configs/nonexistent.py'")):
        result = subprocess.run(
            [sys.executable, "-m", "grpo_jax.main", *flags_, f"--workdir={tmp_path / 'run'}"],
            cwd=REPO, capture_output=True, text=True, timeout=120,
            env={**os.environ, "JAX_PLATFORMS": "cpu"})
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2 and len(lines) == 1 and needle in lines[0], result.stderr
        assert not (tmp_path / "run").exists()


def test_print_config_validates_prints_and_writes_nothing(tmp_path):
    workdir = tmp_path / "run"
    code, out, err = _cli(f"--config={DEFAULT}", "--config.model.hidden_size=192",
                          "--config.model.num_layers=6", "--print_config",
                          f"--workdir={workdir}")
    assert code == 0, err
    assert not workdir.exists()
    expected = named_config("tiny-1m", vocab_size=103, hidden_size=192, num_layers=6,
                            max_seq_len=64).num_params()
    assert f"{expected:,} parameters" in out and "hidden 192, 6 layers" in out
    assert "hidden_size: 192" in out  # the resolved config, plain YAML
    assert "!!python" not in out and "  lora_targets:\n  - q_kernel\n" in out
    assert "  steps: 2\n" in out and "  temperature: 1.0\n" in out  # ints and floats as such
    assert "devices: 8 x cpu" in out and "mesh: data=8, fsdp=1, tensor=1" in out
    assert "stages: pretrain (pretrain) -> eval_base (eval) -> rl (rl) -> eval_final (eval)" in out
    # A bad value is still refused.
    code, _, err = _cli(f"--config={DEFAULT}", "--config.model.num_heads=3", "--print_config")
    assert code == 2 and "model.num_heads" in err


def test_model_shape_overrides_reach_the_run(tmp_path):
    from grpo_jax.runner import Run

    config = default_config.get_config("smoke")
    config.mesh.num_devices = 1
    config.model.hidden_size, config.model.num_layers, config.model.mlp_size = 96, 3, 160
    validate(config, KINDS)
    run = Run(config, str(tmp_path), KINDS)
    try:
        assert run.model_config.hidden_size == 96 and run.model_config.num_layers == 3
        assert len(run.params["blocks"]) == 3 and run.params["embedding"].shape[-1] == 96
    finally:
        run.close()


@pytest.mark.parametrize("config", [DEFAULT, PPO, TRPO, R1, DEFAULT.replace(":smoke", ""),
                                    PPO.replace(":smoke", ""), TRPO.replace(":smoke", ""),
                                    R1.replace(":smoke", "")])
def test_every_shipped_config_validates(tmp_path, config):
    code, out, err = _cli(f"--config={config}", "--print_config", f"--workdir={tmp_path / 'r'}")
    assert code == 0, err
    assert "parameters" in out and not (tmp_path / "r").exists()
