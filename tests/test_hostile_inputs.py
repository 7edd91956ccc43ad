"""Hostile inputs outside the config's values: a workdir or an export directory that cannot be
written, a checkpoint cut short, an unwritable compilation cache, a denormal temperature,
JSON nested 100000 levels deep, an unknown field among several flags; each is one stderr
line and exit status 2 (the cache: one warning line, and the run goes on without it), with
nothing written. And TensorBoard keeps the metric names and gets the run's hparams."""

from __future__ import annotations

import contextlib
import glob
import io
import json
import os
import re
import struct

import pytest

from grpo_jax import compilation
from grpo_jax import main as main_lib
from grpo_jax.runner.checks import output_dir_problem

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = os.path.join(REPO, "configs", "default.py") + ":smoke"
R1 = os.path.join(REPO, "configs", "r1_pipeline.py") + ":smoke"
DEEP = "[" * 100_000 + "]" * 100_000  # RecursionError in json.loads before the fix


def _cli(*args) -> tuple[int, list[str]]:
    """(exit code, non-blank stderr lines) of the command line run in-process."""
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main_lib.cli(["grpo_jax", *args])
    return code, [line for line in err.getvalue().splitlines() if line.strip()]


def _one_line(code: int, lines: list[str], needle: str) -> str:
    assert code == 2, (code, lines)
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    assert needle in lines[0], lines[0]
    return lines[0]


# ------------------------------------------------------------------ 1. the workdir
def test_a_workdir_that_is_a_file_or_under_one(tmp_path):
    file = tmp_path / "notes.txt"
    file.write_text("keep me")
    line = _one_line(*_cli(f"--config={DEFAULT}", f"--workdir={file}"),
                     f"error: --workdir: '{file}' exists and is not a directory")
    assert "expected a directory" in line
    _one_line(*_cli(f"--config={DEFAULT}", f"--workdir={file / 'run'}"),
              f"'{file}' is a file, so '{file / 'run'}' cannot be created")
    assert file.read_text() == "keep me"


def test_a_read_only_workdir(tmp_path, monkeypatch):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        if os.access(parent, os.W_OK):  # root: the mode does not stop writes
            monkeypatch.setattr(os, "access", lambda path, mode: False)
            assert "is not writable by this user" in output_dir_problem(str(parent / "run"))
            pytest.skip("running as root: chmod 555 does not block writes (checked with "
                        "os.access stubbed instead)")
        _one_line(*_cli(f"--config={DEFAULT}", f"--workdir={parent / 'run'}"),
                  f"error: --workdir: '{parent}' is not writable by this user")
        assert not (parent / "run").exists()
    finally:
        parent.chmod(0o755)


# ------------------------------------------------------------------ 2. export --out
def _fake_run(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"stages": "rl", "tokenizer": "char",
                                                 "model": {"init_from": ""}}))
    return run


def test_export_to_an_existing_file(tmp_path, capsys):
    from grpo_jax.export import main as export_main

    run, file = _fake_run(tmp_path), tmp_path / "model.bin"
    file.write_bytes(b"x")
    for out, needle in ((file, f"error: --out: '{file}' exists and is not a directory"),
                        (file / "sub", f"'{file}' is a file, so")):
        assert export_main([f"--workdir={run}", f"--out={out}"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err
    assert file.read_bytes() == b"x"
    # The run's config.json nested too deeply: one line naming it, not a RecursionError.
    (run / "config.json").write_text(DEEP)
    assert export_main([f"--workdir={run}", f"--out={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{run / 'config.json'}:1: JSON nested 100000 levels" in err[0]


# ------------------------------------------------------------------ 3. a truncated checkpoint
def _tiny_checkpoint(directory, **save):
    from flax import nnx

    from grpo_jax.models import ModelConfig, Transformer, save_pretrained

    config = ModelConfig(vocab_size=128, hidden_size=32, num_layers=1, num_heads=2,
                         num_kv_heads=1, head_dim=16, mlp_size=64, max_seq_len=128,
                         qkv_bias=True)
    save_pretrained(Transformer(config, rngs=nnx.Rngs(0)), config, directory, **save)
    return directory


def _cut_in_half(file):
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


def test_a_truncated_safetensors_checkpoint(tmp_path):
    from grpo_jax.models.hf import check_tensor_files

    ckpt = _tiny_checkpoint(tmp_path / "ckpt")
    check_tensor_files(ckpt)  # complete: no error
    _cut_in_half(ckpt / "model.safetensors")
    workdir = tmp_path / "run"
    line = _one_line(*_cli(f"--config={DEFAULT}", f"--config.model.init_from={ckpt}",
                           "--config.tokenizer=char", f"--workdir={workdir}"),
                     f"config error: model.init_from: {ckpt / 'model.safetensors'}: not a "
                     "complete safetensors file")
    assert "copy it again" in line and not workdir.exists()

    # Sharded: the shard cut short is named.
    sharded = _tiny_checkpoint(tmp_path / "sharded", max_shard_bytes=8_000)
    shards = sorted(sharded.glob("model-*.safetensors"))
    assert len(shards) > 1
    _cut_in_half(shards[1])
    with pytest.raises(ValueError, match=re.escape(f"{shards[1]}: not a complete")):
        check_tensor_files(sharded)


# ------------------------------------------------------------------ 4. the compilation cache
@pytest.mark.parametrize("from_env", [False, True])
def test_an_unwritable_compilation_cache_warns_once_and_turns_it_off(tmp_path, monkeypatch,
                                                                      capsys, from_env):
    blocker = tmp_path / "file"
    blocker.write_text("")
    bad = str(blocker / "xla")  # under a regular file: cannot be created, even as root
    if from_env:
        monkeypatch.setenv(compilation.ENV_VAR, bad)
    else:
        monkeypatch.delenv(compilation.ENV_VAR, raising=False)
    try:
        assert compilation.use_cache(bad) is None
        import jax

        assert jax.config.jax_compilation_cache_dir is None
    finally:
        monkeypatch.undo()
        compilation.use_cache(os.environ.get(compilation.ENV_VAR, ""))  # the session's
    err = capsys.readouterr().err.strip().splitlines()
    source = f"${compilation.ENV_VAR}" if from_env else "config.compilation_cache_dir"
    assert len(err) == 1 and err[0].startswith(f"warning: {source}: cannot create '{bad}'")
    assert err[0].endswith("running without the compilation cache")


# ------------------------------------------------------------------ 5. temperatures
@pytest.mark.parametrize("config,field", [(DEFAULT, "rl.temperature"),
                                          (DEFAULT, "eval_base.temperature"),
                                          (DEFAULT, "eval_final.temperature"),
                                          (R1, "rejection_sft.temperature")])
def test_a_denormal_temperature_is_rejected(tmp_path, config, field):
    workdir = tmp_path / "run"
    _one_line(*_cli(f"--config={config}", f"--config.{field}=1e-45", f"--workdir={workdir}"),
              f"config error: {field}: expected a temperature >= 0.0001 (below it")
    assert not workdir.exists()


def test_the_smallest_temperature_is_accepted():
    import ml_collections

    from grpo_jax.runner.checks import MIN_TEMPERATURE, ConfigError, Fields

    node = Fields(ml_collections.ConfigDict({"temperature": MIN_TEMPERATURE}), "rl")
    assert node.temperature() == MIN_TEMPERATURE
    for bad in (0.0, 1e-45, MIN_TEMPERATURE / 2):
        node.node.temperature = bad
        with pytest.raises(ConfigError, match=r"^rl.temperature: expected a temperature"):
            node.temperature()


# ------------------------------------------------------------------ 6. deep JSON
def test_deeply_nested_json_data_names_the_file_and_line(tmp_path):
    from grpo_jax.json_files import load_json_file
    from grpo_jax.tasks.data import load_jsonl
    from grpo_jax.tasks.gsm8k import GSM8KTask

    row = json.dumps({"question": "1+1?", "answer": "1+1=<<1+1=2>>2\n#### 2"})
    (tmp_path / "train.jsonl").write_text(f"{row}\n{DEEP}\n")
    (tmp_path / "test.jsonl").write_text(f"{row}\n")
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'train.jsonl'}:2: JSON nested "
                                                   "100000 levels deep")):
        GSM8KTask(str(tmp_path)).examples("train", 1, seed=0)
    with pytest.raises(ValueError, match=":2: JSON nested 100000"):
        load_jsonl(tmp_path / "train.jsonl")
    (tmp_path / "deep.json").write_text('{"a": "[[[",\n "b": ' + DEEP + "}")
    with pytest.raises(ValueError, match=r"deep.json:2: JSON nested 100001 levels deep"):
        load_json_file(tmp_path / "deep.json")  # the "[[[" inside a string does not count


def test_deeply_nested_checkpoint_json_is_one_line(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(DEEP)
    workdir = tmp_path / "run"
    _one_line(*_cli(f"--config={DEFAULT}", f"--config.model.init_from={ckpt}",
                    "--config.tokenizer=char", f"--workdir={workdir}"),
              f"config error: model.init_from: {ckpt / 'config.json'}:1: JSON nested 100000 "
              "levels deep")
    assert not workdir.exists()


def test_deeply_nested_tokenizer_files_are_a_value_error(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from grpo_jax.text import HFTokenizer

    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "</s>": 1},
                                                           unk_token="a"))
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(DEEP)
    with pytest.raises(ValueError, match=r"tokenizer_config.json:1: JSON nested 100000"):
        HFTokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").unlink()
    (tmp_path / "tokenizer.json").write_text('{"model": ' + DEEP + "}")
    with pytest.raises(ValueError, match=r"tokenizer.json: not a tokenizer.json the "
                                         r"tokenizers package can read \(recursion limit"):
        HFTokenizer(tmp_path)


# ------------------------------------------------------------------ 7. messages
@pytest.mark.parametrize("flags_,flag,name", [
    ("--config.rl.steps=5 --config.eval_final.steps=3", "--config.eval_final.steps", "steps"),
    ("--config.eval_final.steps=3 --config.rl.steps=5", "--config.eval_final.steps", "steps"),
    ("--config.rl.rewards.accuracy=1 --config.eval_base.rewards.accuracy=1",
     "--config.eval_base.rewards.accuracy", "rewards"),
])
def test_the_unknown_field_error_names_the_flag_typed(tmp_path, flags_, flag, name):
    _one_line(*_cli(f"--config={DEFAULT}", *flags_.split(), f"--workdir={tmp_path / 'r'}"),
              f"config error: {flag}: no such config field {name!r}")


TOOLS = os.path.join(REPO, "configs", "tools.py") + ":smoke"


@pytest.mark.parametrize("args,needle", [
    ((f"--config={DEFAULT}", "--config.rl.max_staleness=1000000"),
     "config error: rl.max_staleness: expected <= 1, got 1000000"),
    ((f"--config={DEFAULT}", "--config.model.lora_rank=100000"),
     "config error: model.lora_rank: expected <= the model's hidden_size 128"),
    ((f"--config={TOOLS}", "--config.rl.max_turns=0"),
     "config error: rl.max_turns: expected >= 1, got 0"),
    ((f"--config={DEFAULT}", "--config.tokenizer=sentencepiece",
      "--config.tokenizer_vocab_size=12"),
     "config error: tokenizer_vocab_size: 12 is smaller than the"),
    ((DEFAULT,), f"unexpected argument {DEFAULT!r}: every argument is a --flag; a config "
                 f"file is given as --config={DEFAULT}"),
])
def test_out_of_range_values_and_a_bare_config_path_are_one_line(tmp_path, args, needle):
    workdir = tmp_path / "run"
    _one_line(*_cli(*args, f"--workdir={workdir}"), needle)
    assert not workdir.exists()


def test_an_unknown_preset_is_its_own_line_not_a_traceback(tmp_path):
    workdir = tmp_path / "run"
    _one_line(*_cli(f"--config={DEFAULT.rsplit(':', 1)[0]}:bogus", f"--workdir={workdir}"),
              "config error: --config: unknown preset 'bogus' for configs/default.py; "
              "expected smoke or cpu")
    assert not workdir.exists()


def test_a_workdir_the_os_refuses_is_one_line():
    code, lines = _cli(f"--config={DEFAULT}", "--workdir=/proc/grpo_jax_no_such/run")
    _one_line(code, lines, "error: --workdir: '/proc/grpo_jax_no_such/run' cannot be created")


def test_a_damaged_config_json_falls_back_to_the_checkpoints(tmp_path, capsys):
    """A run's config.json cut short: the run compares with the config its checkpoints hold,
    says so in one warning line, and goes on (config.json rewritten)."""
    workdir = tmp_path / "run"
    args = (f"--config={DEFAULT}", "--config.stages=pretrain", "--config.pretrain.steps=2",
            f"--workdir={workdir}")
    assert main_lib.cli(["grpo_jax", *args]) == 0
    (workdir / "config.json").write_text('{"seed": 0, "model": {', encoding="utf-8")
    capsys.readouterr()
    assert main_lib.cli(["grpo_jax", *args]) == 0
    out = capsys.readouterr().out
    warnings = [line for line in out.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "config.json:1: invalid JSON" in warnings[0]
    assert json.loads((workdir / "config.json").read_text())["seed"] == 0
    # a real difference from the checkpoints' config is still caught
    (workdir / "config.json").write_text("{", encoding="utf-8")
    _one_line(*_cli(*args[:-2], "--config.pretrain.steps=1", args[-1]), "config error")


def test_help_exits_0():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "grpo_jax.main", "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and "--workdir" in done.stdout + done.stderr


def test_readme_sections_cited_by_messages_exist():
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    cited = []
    for path in glob.glob(os.path.join(REPO, "grpo_jax", "**", "*.py"), recursive=True) + \
            glob.glob(os.path.join(REPO, "configs", "*.py")):
        source = open(path, encoding="utf-8").read()
        cited += [(path, m) for m in re.findall(r"README ['\"]([^'\"]+)['\"]", source)]
    assert cited  # the walker finds the references it checks
    missing = [(os.path.relpath(p, REPO), title) for p, title in cited if title not in readme]
    assert not missing, missing


def test_an_init_from_that_is_not_prepared_says_how_to_prepare_it(tmp_path):
    empty, half = tmp_path / "empty", tmp_path / "half"
    empty.mkdir()
    (half / "config.json").parent.mkdir()
    (half / "config.json").write_text(json.dumps({"stages": "pretrain"}))
    line = _one_line(*_cli(f"--config={DEFAULT}", f"--config.model.init_from={empty}",
                           f"--workdir={tmp_path / 'r'}"),
                     f"model.init_from: '{empty}' is neither a Hugging Face checkpoint")
    assert (f"`python -m grpo_jax.main --config=configs/default.py --config.stages=pretrain "
            f"--workdir={empty}`") in line and f"`hf download ORG/NAME --local-dir {empty}`" in line
    _one_line(*_cli(f"--config={DEFAULT}", f"--config.model.init_from={half}",
                    f"--workdir={tmp_path / 'r'}"),
              f"'{half}' is a grpo_jax run directory without checkpoints/ (that run saved none "
              "yet); train it first: `python -m grpo_jax.main")


# ------------------------------------------------------------------ 8. TensorBoard
def _events(workdir) -> list[tuple[int, object]]:
    from tensorboardX.proto import event_pb2

    out = []
    for file in sorted(glob.glob(os.path.join(workdir, "tensorboard", "events.out.*"))):
        data, i = open(file, "rb").read(), 0
        while i < len(data):
            (length,) = struct.unpack("<Q", data[i:i + 8])
            event = event_pb2.Event()
            event.ParseFromString(data[i + 12:i + 12 + length])
            i += 12 + length + 4
            out += [(event.step, value) for value in event.summary.value]
    return out


def test_tensorboard_keeps_metric_names_and_writes_hparams_once(tmp_path):
    pytest.importorskip("tensorboardX")
    from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData

    from grpo_jax.metrics import MetricWriter

    (tmp_path / "config.json").write_text(json.dumps(
        {"seed": 0, "rl": {"lr": 2e-4, "rewards": {"accuracy": 1.0}},
         "mesh": {"rules": [["batch", "data"]]}, "model": {"head_dim": None}, "_history": []}))
    with MetricWriter(tmp_path) as writer:
        writer.write(1, {"pass@1": 0.5, "maj@8": 0.25, "reward/accuracy": 1.0},
                     stage="eval_base")
    with MetricWriter(tmp_path) as writer:  # a resume: no second hparams
        writer.write(2, {"pass@1": 0.75}, stage="rl")
    events = _events(tmp_path)
    scalars = {(step, v.tag): v.simple_value for step, v in events if v.HasField("simple_value")
               and not v.tag.startswith("_hparams_")}
    assert scalars == {(1, "eval_base/pass@1"): 0.5, (1, "eval_base/maj@8"): 0.25,
                       (1, "eval_base/reward/accuracy"): 1.0, (2, "rl/pass@1"): 0.75}
    starts = [v for _, v in events if v.tag == "_hparams_/session_start_info"]
    assert len(starts) == 1
    data = HParamsPluginData()
    data.ParseFromString(starts[0].metadata.plugin_data.content)
    hparams = {k: getattr(v, v.WhichOneof("kind"))
               for k, v in data.session_start_info.hparams.items()}
    assert hparams == {"seed": 0.0, "rl.lr": 2e-4, "rl.rewards.accuracy": 1.0,
                       "mesh.rules": '[["batch", "data"]]'}


# ------------------------------------------------------------------ 9. start-up (issue 53)
def test_start_up_flags_help_space_form_and_an_empty_workdir(tmp_path, monkeypatch, capsys):
    """-h is --help (exit 0); `--config PATH` checks overrides against PATH's config, as
    `--config=PATH` does; `--workdir=` (empty) is one line, not a run in ./runs/."""
    assert main_lib.cli(["grpo_jax", "-h"]) == 0
    assert "USAGE: grpo_jax [flags]" in capsys.readouterr().out  # absl's --help
    ppo = DEFAULT.replace("default.py", "ppo.py")
    for form in ([f"--config={ppo}"], ["--config", ppo], [f"-config={ppo}"], ["-config", ppo]):
        argv = ["grpo_jax", *form, "--config.ppo.steps=3"]
        assert main_lib._config_given(argv) == ppo  # pylint: disable=protected-access
        config = main_lib._loaded_config(argv)  # pylint: disable=protected-access
        assert config is not None and "ppo" in config
        assert main_lib._override_problem(argv, config) is None  # pylint: disable=protected-access
    monkeypatch.chdir(tmp_path)
    _one_line(*_cli(f"--config={DEFAULT}", "--workdir="),
              "error: --workdir: '' is empty (it would be the current folder); expected a "
              "directory")
    from grpo_jax import api

    with pytest.raises(ValueError, match=r"^api.train: workdir: '' is empty"):
        api.train(api.config("smoke"), "")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("body,needle", [
    ("raise RuntimeError('no GPU here')",
     "importing module '{name}' failed: {file}:1: RuntimeError: no GPU here"),
    ("def broken(:\n    pass", "importing module '{name}' failed: {file}:1: SyntaxError:"),
    ("import grpo_jax_no_such_module", "{file}:1: no module named 'grpo_jax_no_such_module'"),
    ("raise ValueError('bad table')",
     "importing module '{name}' failed: {file}:1: ValueError: bad table"),
])
def test_a_task_module_that_fails_to_import_is_one_line(tmp_path, body, needle):
    name = f"task_53_{abs(hash(body)) % 10**8}"  # a fresh module name per case
    (tmp_path / f"{name}.py").write_text(body + "\n")
    (tmp_path / "my_config.py").write_text(
        f"import {name}  # noqa: F401\nfrom grpo_jax.config_presets import main_job\n\n\n"
        "def get_config(preset=None):\n    return main_job(preset)\n")
    workdir = tmp_path / "run"
    line = _one_line(*_cli(f"--config={tmp_path / 'my_config.py'}:smoke",
                           f"--workdir={workdir}"),
                     needle.format(name=name, file=tmp_path / f"{name}.py"))
    assert line.startswith("config error: --config: ") and not workdir.exists()


def _recorded_run(tmp_path, record: dict, config_json) -> str:
    """A run directory whose newest checkpoint holds `record` as the run's config and whose
    config.json is `config_json` (a dict, any JSON text, or a folder for None)."""
    run = tmp_path / "run"
    (run / "checkpoints" / "3" / "meta").mkdir(parents=True)
    (run / "checkpoints" / "3" / "meta" / "metadata").write_text(
        json.dumps({"run_config": record}))
    if config_json is None:
        (run / "config.json").mkdir()
    else:
        (run / "config.json").write_text(config_json if isinstance(config_json, str)
                                         else json.dumps(config_json))
    return str(run)


def test_an_edited_or_unusable_config_json_is_refused(tmp_path):
    """config.json is compared with the config the checkpoints hold: one edited to another
    seed (and the command given that seed) is refused, as are a folder and a non-object;
    an extension config.json records, and a changed logger, are not refusals."""
    import copy

    from configs import default as default_config
    from grpo_jax.runner.checks import ConfigError
    from grpo_jax.runner.resume import check_config_drift

    config = default_config.get_config("smoke")
    record = json.loads(config.to_json_best_effort())
    assert check_config_drift(config, _recorded_run(tmp_path / "same", record, record)) == []
    edited = {**record, "seed": 1}
    reseeded = copy.deepcopy(config)
    reseeded.seed = 1
    with pytest.raises(ConfigError, match=r"^config.json: .*config.json was edited: it differs "
                                          r"from the config its checkpoints hold \(seed 0 -> 1\);"
                                          r" .*delete it to resume the run as it was"):
        check_config_drift(reseeded, _recorded_run(tmp_path / "edited", record, edited))
    with pytest.raises(ConfigError, match=r"^config.json: .* holds a JSON array, not the run's "
                                          r"config \(a JSON object\)"):
        check_config_drift(config, _recorded_run(tmp_path / "list", record, "[]"))
    folder = _recorded_run(tmp_path / "folder", record, None)
    with pytest.raises(ConfigError, match=r"^config.json: .* is a directory"):
        check_config_drift(config, folder)
    extended = copy.deepcopy(config)  # killed after the extension's start, before a checkpoint
    extended.rl.steps += 2
    history = [{"time": "t", "changed": {"rl.steps": [config.rl.steps, extended.rl.steps]}}]
    written = {**json.loads(extended.to_json_best_effort()), "_history": history,
               "loggers": "none"}
    assert check_config_drift(extended, _recorded_run(tmp_path / "ext", record, written)) == \
        history
    # the command line: one line, exit 2, the folder left as it was
    _one_line(*_cli(f"--config={DEFAULT}", f"--workdir={folder}"),
              "config error: config.json: ")
    assert sorted(os.listdir(folder)) in (["checkpoints", "config.json"],
                                          [".lock", "checkpoints", "config.json"])
