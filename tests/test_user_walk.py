"""What a new user meets first: jobs by name from any folder, the config file's folder on the
import path in either flag form, progress lines with elapsed time and ETA, a transformers-
loadable export of a char-tokenizer run, README's examples without warnings, and the config
reference page kept current."""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import os
import re
import types
import warnings

import pytest

from grpo_jax import api, config_presets
from grpo_jax import main as main_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load_config_file(path: str):
    spec = importlib.util.spec_from_file_location(
        "user_walk_" + os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- jobs by name ------------------------------------------------------------------------

def test_every_job_config_file_is_a_thin_shim_of_its_job_by_name():
    """The config file of each job is one `return builder(preset)` and names the same
    config as the job by name at every preset (`JOBS`), so the name reaches it from any
    folder."""
    by_file = {job.config_file: name for name, job in config_presets.JOBS.items()}
    assert len(by_file) == 8
    for path in sorted(os.path.join(ROOT, file) for file in by_file):
        tree = ast.parse(open(path).read())
        (get_config,) = [n for n in tree.body
                         if isinstance(n, ast.FunctionDef) and n.name == "get_config"]
        assert len(get_config.body) == 1 and isinstance(get_config.body[0], ast.Return), path
        name = by_file[os.path.relpath(path, ROOT)]
        module = _load_config_file(path)
        for preset in (None, *config_presets.JOBS[name].presets):
            assert module.get_config(preset).to_dict() == \
                config_presets.job_config(name, preset).to_dict(), (name, preset)


def test_every_job_at_its_default_preset_passes_validation():
    """What `python -m grpo_jax.main --config=NAME` checks before any work: every job's
    default config is valid as shipped (the GSM8K job, which needs a local checkpoint, says
    so in one line)."""
    from grpo_jax.runner.checks import ConfigError
    from grpo_jax.runner.validation import validate
    from grpo_jax.stages import KINDS

    for name in config_presets.JOBS:
        config = config_presets.job_config(name, None)
        if name == "gsm8k":
            with pytest.raises(ConfigError, match="needs model.init_from"):
                validate(config, KINDS)
            continue
        validate(config, KINDS)


def test_api_config_reaches_every_job():
    assert api.JOBS == ("main", "ppo", "trpo", "r1_pipeline", "tools", "agents", "code",
                        "gsm8k")
    assert api.config("ppo").stages == "pretrain,eval_base,ppo,eval_final"
    assert api.config("ppo:smoke").ppo.checkpoint_every == 1
    assert api.config("r1_pipeline:smoke").final_rl.steps == 1
    assert api.config("gsm8k:smoke").task.name == "gsm8k"
    assert api.config("agents:tags_smoke").rl.tools == "guess"
    assert api.config("smoke").rl.steps == 2  # a preset alone: the main job
    assert api.config("smoke", job="tools").task.name == "tool_arithmetic"
    with pytest.raises(ValueError, match=r"^api.config: 'pp0' is neither a job \(main, ppo, "):
        api.config("pp0")
    with pytest.raises(ValueError, match=r"unknown job 'pp0'; expected one of main, ppo"):
        api.config("pp0:smoke")


def test_default_workdir_of_a_job_by_name():
    jobs_file = config_presets.__file__
    assert main_lib.default_workdir(f"{jobs_file}:ppo:smoke") == os.path.join("runs",
                                                                            "ppo_smoke")
    assert main_lib.default_workdir(f"{jobs_file}:main") == os.path.join("runs", "default")
    assert main_lib.default_workdir("configs/ppo.py:smoke") == os.path.join("runs",
                                                                           "ppo_smoke")


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """The current folder is outside the checkout, with nothing on the path from it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    return tmp_path


@pytest.mark.parametrize("form", ["equals", "space"])
def test_a_job_by_name_from_another_folder(elsewhere, capsys, form):
    config = ["--config=ppo:smoke"] if form == "equals" else ["--config", "ppo:smoke"]
    code = main_lib.cli(["main", *config, "--config.ppo.steps=3", "--print_config"])
    out = capsys.readouterr().out
    assert code == 0
    assert re.search(r"^ppo:\n(  .*\n)*  steps: 3$", out, re.M), out[:2000]
    assert main_lib._JOBS_FILE not in __import__("sys").path  # the package folder stays off


def test_an_unknown_job_is_one_line_listing_the_names(elsewhere, capsys):
    assert main_lib.cli(["main", "--config=pp0:smoke", "--print_config"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == ("config error: --config: unknown job 'pp0'; expected one of main, ppo, "
                    "trpo, r1_pipeline, tools, agents, code, gsm8k, or a config file such as "
                    "configs/default.py[:preset]")


@pytest.mark.parametrize("form", ["equals", "space"])
def test_the_config_folder_is_on_the_path_in_either_form(elsewhere, capsys, form):
    """A config file importing a module beside it, given by a relative path from another
    folder, as --config=PATH and as --config PATH."""
    folder = elsewhere / "mine"
    folder.mkdir()
    (folder / f"beside_{form}.py").write_text("STEPS = 5\n")
    (folder / "job.py").write_text(
        f"import beside_{form}\nfrom grpo_jax.config_presets import main_job\n\n"
        "def get_config(preset=None):\n    config = main_job(preset)\n"
        f"    config.rl.steps = beside_{form}.STEPS\n    return config\n")
    config = (["--config=mine/job.py:smoke"] if form == "equals"
              else ["--config", "mine/job.py:smoke"])
    assert main_lib.cli(["main", *config, "--print_config"]) == 0
    assert re.search(r"^rl:\n(  .*\n)*  steps: 5$", capsys.readouterr().out, re.M)


# ---- progress lines ----------------------------------------------------------------------

def test_progress_lines_give_elapsed_and_eta_on_a_fake_clock(capsys, monkeypatch):
    """Steps 3..6 of 10 at 2 s each, 4 s of compiling in the first: 2.00 s/step, elapsed
    12 s at step 6 (the wall time since the stage started), 4 steps left = 0:08."""
    from grpo_jax.runner import toolkit

    now, compiled = [100.0], [0.0]
    monkeypatch.setattr(toolkit, "time", types.SimpleNamespace(time=lambda: now[0]))
    monkeypatch.setattr(toolkit, "CLOCK", types.SimpleNamespace(seconds=lambda: compiled[0]))
    bar = toolkit.PlainProgress("rl", 10, 2, 0.0)
    for step_seconds, compiling in ((6.0, 4.0), (2.0, 0.0), (2.0, 0.0), (2.0, 0.0)):
        now[0] += step_seconds
        compiled[0] += compiling
        bar.update(1)
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == ("[grpo_jax] rl: step 6/10, 2.00 s/step, 4.0 s compiling, elapsed 0:12, "
                    "ETA 0:08")
    assert [toolkit.clock_text(s) for s in (0, 59.6, 61, 3725)] == \
        ["0:00", "1:00", "1:01", "1:02:05"]


def test_the_rl_progress_line_names_the_overlong_term_of_the_reward(capsys):
    """A smoke preset's rl.overlong_cache adds a term rl.rewards does not name (and makes
    reward_mean negative): the first line already shows the reward and that term."""
    from grpo_jax.runner import toolkit

    written = []
    run = types.SimpleNamespace(global_step=0, writer=types.SimpleNamespace(
        write=lambda step, record, stage: written.append((step, stage))))
    bar = toolkit.PlainProgress("rl", 2, 0, 0.0)
    record = {"reward_mean": -0.8125, "reward/accuracy": 0.0, "reward/overlong": -0.8125,
              "pass@1": 0.0}
    toolkit.log_step(run, types.SimpleNamespace(name="rl"), record, bar,
                     reward="reward_mean", acc="pass@1")
    line = capsys.readouterr().out.strip()
    assert line.startswith("[grpo_jax] rl: step 1/2, reward -0.812 (overlong -0.812), "
                           "acc 0.000, ") and written == [(1, "rl")]
    toolkit.log_step(run, types.SimpleNamespace(name="rl"), {"reward_mean": 0.5}, bar,
                     reward="reward_mean")
    assert ", reward 0.500, " in capsys.readouterr().out


# ---- README's examples without warnings ----------------------------------------------------

def test_the_sandbox_command_prints_no_runpy_warning():
    """`python -m grpo_jax.tools.sandbox` (README): the package imports the module before
    runpy runs it, which printed a RuntimeWarning on every call."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-W", "default", "-m", "grpo_jax.tools.sandbox",
         "--isolation=audit_hook"], input="print(6 * 7)\n", capture_output=True, text=True,
        timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0 and done.stdout == "42\n"
    assert "RuntimeWarning" not in done.stderr, done.stderr


def test_a_new_task_on_the_main_job_gets_no_arithmetic_settings(capsys):
    """main_job(preset, task=NAME) (README's new-task recipe) runs NAME at its own defaults:
    no warning line about the preset's arithmetic task.kwargs, which the command-line form
    (--config.task.name=NAME over the arithmetic kwargs) does print."""
    from grpo_jax import tasks as tasks_lib
    from grpo_jax.runner.inputs import build_task

    if "user_walk_digits" not in tasks_lib.available_tasks():
        @tasks_lib.register_task("user_walk_digits")
        class DigitsTask(tasks_lib.Task):  # noqa: F841  registered
            def generate(self, rng, difficulty):
                digits = "".join(map(str, rng.integers(0, 10, size=difficulty + 1)))
                return tasks_lib.Example(id=digits, prompt=f"digits {digits}",
                                         answer=str(len(digits)), difficulty=difficulty)

    config = config_presets.main_job("smoke", task="user_walk_digits")
    assert (config.task.name, config.task.kwargs.to_dict()) == ("user_walk_digits", {})
    assert type(build_task(config)).__name__ == "DigitsTask"
    assert "warning" not in capsys.readouterr().out
    config = config_presets.main_job("smoke")
    config.task.name = "user_walk_digits"
    build_task(config)
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert line.startswith("[grpo_jax] warning: task.kwargs error_mode, max_operators, ")
    assert config_presets.main_job("smoke", task=None).to_dict() == \
        config_presets.main_job("smoke").to_dict()


# ---- export of a char-tokenizer run --------------------------------------------------------

@pytest.fixture(scope="module")
def char_run(tmp_path_factory):
    """A tiny run whose policy ends its answers with EOS: 200 pretraining steps of a 56k
    parameter model (one layer; tests/test_hf.py exports two) on the arithmetic task (the
    character tokenizer), on one device."""
    from grpo_jax.pipeline import train_and_evaluate

    config = api.config("smoke")
    config.stages = "pretrain"
    config.loggers = ""
    config.pretrain.update(steps=200, batch_size=16, lr=1e-2)
    config.model.update(hidden_size=64, num_layers=1, mlp_size=128)
    config.mesh.num_devices = 1
    workdir = str(tmp_path_factory.mktemp("char_run"))
    printed = io.StringIO()
    with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(printed):
        warnings.simplefilter("always")
        train_and_evaluate(config, workdir)
    CHAR_RUN_OUTPUT.update(lines=printed.getvalue().splitlines(), warnings=[
        f"{w.category.__name__}: {w.message}" for w in caught
        if not issubclass(w.category, DeprecationWarning)])  # flax's own, not ours
    return workdir


CHAR_RUN_OUTPUT = {}


def test_a_tiny_main_job_prints_no_warning(char_run):
    """The run above (api.config("smoke") at a smaller model, as README's Python example):
    its progress lines end with elapsed and ETA, and nothing warns."""
    lines, caught = CHAR_RUN_OUTPUT["lines"], CHAR_RUN_OUTPUT["warnings"]
    assert caught == []
    assert not [line for line in lines if "warning" in line.lower()], lines
    assert re.search(r"^\[grpo_jax\] pretrain: step 200/200, loss [0-9.]+, [0-9.]+ s/step, "
                     r"[0-9.]+ s compiling, elapsed \d+:\d\d, ETA 0:00$", "\n".join(lines), re.M)


def test_a_char_run_exports_for_transformers_and_generate_stops_at_eos(char_run, tmp_path):
    """The export loads with AutoTokenizer / AutoModelForCausalLM; the tokenizer encodes the
    run's prompts as the run does (<bos> first), greedy `generate` ends at EOS and equals
    the library's greedy decode token for token; every file is mode 0644 (umask 022)."""
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import jax
    from flax import nnx

    from grpo_jax import tasks as tasks_lib
    from grpo_jax.export import export
    from grpo_jax.runner.model_init import load_run_policy
    from grpo_jax.runner.prompts import prompt_of
    from grpo_jax.runner.run_directory import run_directory_config
    from grpo_jax.runner.tokenizers import build_tokenizer
    from grpo_jax.sampling import SamplingConfig
    from grpo_jax.sampling.sampler import generate, pad_prompts

    out = tmp_path / "export"
    old_umask = os.umask(0o022)
    try:
        summary = export(char_run, str(out))
    finally:
        os.umask(old_umask)
    assert "tokenizer files ['tokenizer.json'" in summary
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert modes == {name: 0o644 for name in (
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
        "special_tokens_map.json", "generation_config.json")}

    config = run_directory_config(char_run)
    task = tasks_lib.task_of(config.task.name, config.task.kwargs.to_dict())[0]
    mine = build_tokenizer(config, task, char_run)
    hf_config = __import__("json").loads((out / "config.json").read_text())
    assert (hf_config["bos_token_id"], hf_config["eos_token_id"], hf_config["pad_token_id"]) \
        == (mine.bos_id, mine.eos_id, mine.pad_id) == (1, 2, 0)

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    text = "Q: 12+3\nA: <think>1+2=3</think> <answer>15</answer>"
    assert tokenizer(text)["input_ids"] == [mine.bos_id, *mine.encode(text)]
    assert tokenizer.decode([mine.bos_id, *mine.encode(text), mine.eos_id],
                            skip_special_tokens=True) == text

    prompts = [prompt_of(config, task, None, ex) for ex in task.examples("test", 4, seed=0)]
    _, policy, _, _ = load_run_policy(char_run, tokenizer=mine)
    graphdef, state = nnx.split(policy)
    ids = [[mine.bos_id, *mine.encode(p)] for p in prompts]
    tokens, mask = pad_prompts(ids, max(map(len, ids)), pad_id=mine.pad_id)
    ours = generate(graphdef, state, tokens, mask, jax.random.key(0), config=SamplingConfig(
        max_new_tokens=24, greedy=True, eos_ids=(mine.eos_id,), pad_id=mine.pad_id))
    for row, prompt in enumerate(prompts):
        expected = np.asarray(ours.tokens[row])[:int(ours.lengths[row])].tolist()
        assert expected[-1] == mine.eos_id and len(expected) < 24  # the policy ends itself
        inputs = tokenizer(prompt, return_tensors="pt")
        with torch.no_grad():
            theirs = model.generate(**inputs, max_new_tokens=24, do_sample=False)
        assert theirs[0, inputs["input_ids"].shape[1]:].tolist() == expected, prompt


# ---- the config reference page ----------------------------------------------------------------

def test_the_config_reference_page_is_current():
    """docs/config_reference.md is what its command writes from the code now."""
    from grpo_jax import config_reference

    page = os.path.join(ROOT, "docs", "config_reference.md")
    expected = config_reference.reference()
    current = open(page, encoding="utf-8").read() if os.path.exists(page) else ""
    assert current == expected, (f"docs/config_reference.md is out of date; regenerate it "
                                 f"with: {config_reference.COMMAND}")


def test_the_config_reference_reads_types_defaults_ranges_and_comments():
    """Rows checked against the code by hand: a run-wide field, a mapping, a field group's
    field, a kind's own field and a bound recorded from its check."""
    from grpo_jax import config_reference

    page = config_reference.reference()
    rows = {line.split(" | ")[0].strip("| `"): line for line in page.splitlines()
            if line.startswith("| `")}
    assert rows["seed"] == ("| `seed` | int | `0` | int >= 0 | one seed for data, "
                            "initialisation and sampling |")
    assert rows["optim.b2"].startswith("| `optim.b2` | float | `0.99` | number in [0.0, 1.0) |")
    assert "| `{data: -1, fsdp: 1, tensor: 1}` |" in rows["mesh.shape"]
    assert "data: batch parallelism" in rows["mesh.shape"]
    section = page.split("### `rl`", 1)[1].split("### ", 1)[0]
    rl_rows = {line.split(" | ")[0].strip("| `"): line for line in section.splitlines()
               if line.startswith("| `")}
    assert rl_rows["top_p"] == ("| `top_p` | float | `1.0` | number in (0.0, 1.0] | "
                                "[sampling] nucleus sampling; 1 = off |")
    assert rl_rows["kl_kind"].startswith("| `kl_kind` | str | `\"auto\"` | one of `auto`, "
                                         "`k1`, `k2`, `k3` |")
    assert rl_rows["beta"].startswith("| `beta` | float | `None` | ")
    comments = config_reference.field_comments(config_presets.main_job, "config")
    assert comments["model.hidden_size"].startswith("Shape overrides on top of the named size")
    assert comments["task.train_size"] == "distinct training problems for RL prompts"


# ---- another task's keywords on the command line -------------------------------------------

def test_a_task_keyword_the_config_lacks_reaches_the_task(tmp_path, capsys):
    """--config.task.kwargs.NAME=VALUE for a keyword the job's task.kwargs does not declare
    (ml-collections refuses new keys) is set on the config, typed as a literal or kept as
    text, so a task named on the command line gets its settings; one no task takes is the
    constructor's one-line error."""
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(f'{{"prompt": "echo {i}", "answer": "{i}"}}\n' for i in range(100)))
    code = main_lib.cli(["main", "--config=main:smoke", "--config.task.name=file",
                         f"--config.task.kwargs.path={data}", "--config.task.kwargs.test_fraction=0.25",
                         "--config.task.prompt_len=0", "--print_config"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"path: {data}" in out and "test_fraction: 0.25" in out
    assert main_lib.cli(["main", "--config=main:smoke", "--config.task.kwargs.bogus=1",
                         "--print_config"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "unexpected keyword argument 'bogus'" in line
    assert main_lib._kwarg_value("countdown,chain_sum:2") == "countdown,chain_sum:2"
    assert main_lib._kwarg_value("3") == 3 and main_lib._kwarg_value("True") is True
