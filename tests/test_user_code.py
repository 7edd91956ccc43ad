"""What a researcher writes first, run as README shows it, from a folder outside the checkout:
a config file and a module of Python reward functions (`module:function`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from grpo_jax.rewards import python as python_rewards
from grpo_jax.tasks import Example

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Appended to README's commands: a one-layer model on one device (not the tests' 8 virtual
# ones) runs the same stages, rewards and task code in under half the CPU time of the smoke
# preset's four layers on 8 devices (the main job's smoke tests run those).
ONE_LAYER = ("--config.model.num_layers=1", "--config.mesh.num_devices=1")


def _readme_example(name: str) -> dict[str, str]:
    """{file name: code} of README's `<!-- example:NAME -->` block (each code block's first
    line names its file: `# my_rewards.py`), and "command" for its bash line."""
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        text = f.read()
    block = text.split(f"<!-- example:{name} -->", 1)[1].split("<!-- example:end -->", 1)[0]
    files = {}
    for lang, code in re.findall(r"```(\w+)\n(.*?)```", block, re.S):
        if lang == "bash":
            files["command"] = code.strip()
        else:
            first = code.splitlines()[0]
            files[re.match(r"# (\S+\.py)", first).group(1)] = code
    return files


@pytest.mark.slow
def test_readme_reward_example_runs_from_any_folder(tmp_path):
    files = _readme_example("reward")
    for name, code in files.items():
        if name != "command":
            (tmp_path / name).write_text(code, encoding="utf-8")
    # a third function that fails on some completions: scored 0 and counted, the run goes on
    (tmp_path / "flaky.py").write_text(
        "def odd(prompt, completion, answer):\n"
        "    if len(completion) % 2:\n        raise RuntimeError('odd length')\n"
        "    return 1.0\n", encoding="utf-8")
    config = (tmp_path / "my_config.py").read_text(encoding="utf-8")
    (tmp_path / "my_config.py").write_text(config.replace(
        '"my_rewards:mentions_answer": 0.1}', '"my_rewards:mentions_answer": 0.1, '
        '"flaky:odd": 0.1}'), encoding="utf-8")
    command = files["command"].split()
    assert command[:3] == ["python", "-m", "grpo_jax.main"]
    done = subprocess.run([sys.executable, *command[1:], "--config.rl.steps=3", *ONE_LAYER],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in
            (tmp_path / "runs" / "mine" / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r.get("stage") == "rl" and "reward_mean" in r]
    assert len(rl) == 3
    for row in rl:
        # brevity is 1 - length / 64 of each completion, so strictly inside (0, 1) here
        brevity = row["reward/my_rewards:brevity"]
        assert 0.0 < brevity < 1.0
        assert "reward/my_rewards:mentions_answer" in row
        assert row["reward_errors"] >= 0
    assert sum(r["reward_errors"] for r in rl) > 0  # odd lengths raised, were counted
    assert sum(r["reward/flaky:odd"] for r in rl) > 0  # even lengths scored
    assert done.stdout.count("warning: reward flaky:odd: RuntimeError: odd length") == 1


def test_python_rewards_called_as_documented(tmp_path, monkeypatch):
    (tmp_path / "user_rewards.py").write_text(
        "def per_sample(prompt, completion, answer, difficulty):\n"
        "    return float(answer in completion) + difficulty / 10\n"
        "def batched(completions, answers, **meta):\n"
        "    return [len(c) + len(meta['id']) for c in completions]\n"
        "def bad(prompt, completion, answer):\n    return 'yes'\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    example = Example(id="p1", prompt="2+2", answer="4", difficulty=3)
    per_sample = python_rewards.load_python_reward("user_rewards:per_sample")
    assert per_sample("it is 4", example) == pytest.approx(1.3)
    assert per_sample("five", example) == pytest.approx(0.3)
    batched = python_rewards.load_python_reward("user_rewards:batched")
    assert batched.batched(["ab", "abcd"], [example, example]) == [4.0, 6.0]
    before = python_rewards.reward_errors()
    assert python_rewards.load_python_reward("user_rewards:bad")("x", example) == 0.0
    assert python_rewards.reward_errors() == before + 1
    (tmp_path / "raises_on_import.py").write_text("x = 1\nraise RuntimeError('boom')\n",
                                                  encoding="utf-8")
    (tmp_path / "bad_syntax.py").write_text("def f(:\n", encoding="utf-8")
    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit(3)\n", encoding="utf-8")
    for spec, needle in (("user_rewards", "expected module:function"),
                         ("no_such_module_xyz:f", "cannot import 'no_such_module_xyz'"),
                         ("user_rewards:missing", "has no function 'missing'"),
                         ("raises_on_import:f", r"importing 'raises_on_import' failed at "
                                                r".*raises_on_import.py:2: RuntimeError: boom"),
                         ("bad_syntax:f", r"bad_syntax.py:1: SyntaxError"),
                         ("exits_on_import:f", r"exits_on_import.py:2: SystemExit: 3")):
        with pytest.raises(ValueError, match=needle) as err:
            python_rewards.load_python_reward(spec)
        assert "\n" not in str(err.value)


def test_a_python_reward_that_does_not_import_is_one_line_before_any_work(tmp_path):
    (tmp_path / "cfg.py").write_text(
        "from grpo_jax.config_presets import main_job\n"
        "def get_config(preset=None):\n"
        "    config = main_job(preset)\n"
        "    config.rl.rewards = {'accuracy': 1.0, 'nowhere_xyz:fn': 0.5}\n"
        "    return config\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "grpo_jax.main", "--config=cfg.py:smoke",
                           "--workdir=w"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, check=False)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert "rl.rewards.nowhere_xyz:fn" in lines[0] and "cannot import" in lines[0]
    assert not (tmp_path / "w").exists()


@pytest.mark.slow
def test_readme_python_api_example_runs_from_any_folder(tmp_path):
    files = _readme_example("api")
    (tmp_path / "my_script.py").write_text(files["my_script.py"], encoding="utf-8")
    done = subprocess.run([sys.executable, "my_script.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    pass1, reward = map(float, done.stdout.strip().splitlines()[-1].split())
    from grpo_jax import api

    result = api.load(str(tmp_path / "runs" / "from_python"))
    assert set(result.evals) == {"eval_base", "eval_final"}
    assert result.evals["eval_final"]["pass@1"] == pass1
    assert result.metrics("rl")[-1]["reward_mean"] == reward
    assert result.report()["provenance"]["commit"] is None or len(
        result.report()["provenance"]["commit"]) == 40
    # the config the script edited is the one that ran
    recorded = json.loads((tmp_path / "runs" / "from_python" / "config.json").read_text())
    assert recorded["rl"]["beta"] == 0.0


def test_the_api_names_a_bad_field_before_writing(tmp_path):
    from grpo_jax import api

    config = api.config("smoke")
    config.rl.temperature = -1.0
    with pytest.raises(api.ConfigError, match="rl.temperature"):
        api.train(config, str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="job 'nope'"):
        api.config(job="nope")
    with pytest.raises(FileNotFoundError, match="not a finished run"):
        api.load(str(tmp_path))


@pytest.mark.slow
def test_readme_task_recipe_runs_from_another_folder(tmp_path):
    """The README's new task, its config beside it, run from a different folder: the
    config's folder is importable, and no arithmetic task.kwargs reach the new task: none
    with main_job(preset, task=...), else those it does not take are left out with one
    warning line."""
    files = _readme_example("task")
    user, elsewhere = tmp_path / "user", tmp_path / "elsewhere"
    user.mkdir()
    elsewhere.mkdir()
    for name, code in files.items():
        if name != "command":
            (user / name).write_text(code, encoding="utf-8")
    command = files["command"].replace("--config=", "--config=../user/").split()
    done = subprocess.run([sys.executable, *command[1:], "--config.rl.steps=2", *ONE_LAYER],
                          cwd=elsewhere, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    warnings = [line for line in done.stdout.splitlines() if "task.kwargs" in line]
    if "task=" in files["digit_sum_config.py"]:  # main_job(preset, task=...): no arithmetic
        assert warnings == [], warnings
    else:
        assert len(warnings) == 1 and "error_mode" in warnings[0] and \
            "'digit_sum'" in warnings[0]
    recorded = json.loads((elsewhere / "runs" / "digit_sum" / "config.json").read_text())
    assert recorded["task"]["name"] == "digit_sum"
    samples = (elsewhere / "runs" / "digit_sum" / "samples.jsonl").read_text()
    assert "digitsum" in samples


# ---- the guard every Python reward is called behind (grpo_jax/rewards/python.py) ----------

GUARD_CASES = '''
import sys
import numpy as np

def _exit():
    sys.exit(0)

def _raise():
    raise ValueError("no answer here")

def _interrupt():
    raise KeyboardInterrupt("from the reward")

RETURNS = {
    "huge_int": lambda: 10**400, "huge_negative_int": lambda: -10**400,
    "float_1e300": lambda: 1e300, "inf": lambda: float("inf"), "nan": lambda: float("nan"),
    "numpy_1e300": lambda: np.float64(1e300), "numpy_array": lambda: np.array([1.0, 2.0]),
    "numpy_0d_array": lambda: np.array(1.0), "str": lambda: "1.0", "none": lambda: None,
    "dict": lambda: {"reward": 1.0}, "complex": lambda: 1j, "exit": _exit, "raise": _raise,
    "interrupt": _interrupt, "true": lambda: True, "numpy_float32": lambda: np.float32(0.5),
    "numpy_int64": lambda: np.int64(3), "float32_max": lambda: 3.0e38,
}
for _name, _make in RETURNS.items():
    globals()["case_" + _name] = lambda prompt, completion, answer, _make=_make: _make()

def batch_of(completions, **meta):  # the first completion names what this call returns
    n = len(completions)
    kind = completions[0]
    if kind == "dict":
        return {c: 1.0 for c in completions}
    if kind == "short_generator":
        return (1.0 for _ in range(n - 1))
    if kind == "endless_generator":
        return (1.0 for _ in iter(int, 1))
    if kind == "str":
        return "1" * n
    if kind == "none":
        return None
    if kind == "matrix":
        return np.ones((n, 1))
    if kind == "set":
        return {float(i) for i in range(n)}
    if kind == "raising_generator":
        return (1.0 / (i - 1) for i in range(n))
    if kind == "array":
        return np.arange(n, dtype=np.float32)
    return [1.0, np.array([1.0, 2.0]), 10**400, 1e300, None, sys.exit] + [0.5] * (n - 6)

def sleepy(prompt, completion, answer):
    import time
    time.sleep(0.05)
    return 1.0

def sleepy_batch(completions, **meta):
    import time
    time.sleep(0.05 * len(completions))
    return [1.0] * len(completions)
'''


@pytest.fixture(scope="module")
def guard_cases(tmp_path_factory):
    """The module `guard_cases` (GUARD_CASES), importable."""
    folder = tmp_path_factory.mktemp("guard_cases")
    (folder / "guard_cases.py").write_text(GUARD_CASES, encoding="utf-8")
    sys.path.insert(0, str(folder))
    yield Example(id="p1", prompt="2+2", answer="4", difficulty=1)
    sys.path.remove(str(folder))
    sys.modules.pop("guard_cases", None)


def _delta(before: dict) -> dict:
    return {k: v - before[k] for k, v in python_rewards.reward_error_counts().items()
            if v != before[k]}


@pytest.mark.parametrize("case, reason", [
    ("huge_int", "non_finite"), ("huge_negative_int", "non_finite"),
    ("float_1e300", "non_finite"), ("inf", "non_finite"), ("nan", "non_finite"),
    ("numpy_1e300", "non_finite"), ("numpy_array", "non_number"),
    ("numpy_0d_array", "non_number"), ("str", "non_number"), ("none", "non_number"),
    ("dict", "non_number"), ("complex", "non_number"), ("exit", "exception"),
    ("raise", "exception")])
def test_a_bad_value_or_exception_scores_0_is_counted_by_reason_and_named_once(
        guard_cases, capsys, case, reason):
    fn = python_rewards.load_python_reward(f"guard_cases:case_{case}")
    before = python_rewards.reward_error_counts()
    assert fn("x", guard_cases) == 0.0 and fn("y", guard_cases) == 0.0
    assert _delta(before) == {reason: 2}
    warned = [line for line in capsys.readouterr().out.splitlines() if "warning" in line]
    assert len(warned) == 1, warned
    assert f"reward guard_cases:case_{case}: " in warned[0]
    assert f"(counted in reward_errors/{reason})" in warned[0]
    assert python_rewards.reward_error_record(before)[f"reward_errors/{reason}"] == 2.0


@pytest.mark.parametrize("case, value", [("true", 1.0), ("numpy_float32", 0.5),
                                         ("numpy_int64", 3.0), ("float32_max", 3.0e38)])
def test_numbers_within_float32_range_are_scored_as_they_are(guard_cases, case, value):
    fn = python_rewards.load_python_reward(f"guard_cases:case_{case}")
    before = python_rewards.reward_error_counts()
    score = fn("x", guard_cases)
    assert score == value and type(score) is float
    assert _delta(before) == {}


@pytest.mark.parametrize("kind, reason", [
    ("dict", "bad_batch"), ("short_generator", "bad_batch"), ("endless_generator", "bad_batch"),
    ("str", "bad_batch"), ("none", "bad_batch"), ("matrix", "bad_batch"), ("set", "bad_batch"),
    ("raising_generator", "exception")])
def test_a_malformed_batch_scores_the_whole_batch_0(guard_cases, kind, reason):
    fn = python_rewards.load_python_reward("guard_cases:batch_of")
    before = python_rewards.reward_error_counts()
    assert fn.batched([kind] + ["x"] * 7, [guard_cases] * 8) == [0.0] * 8
    assert _delta(before) == {reason: 8}


def test_a_batch_is_checked_value_by_value(guard_cases):
    fn = python_rewards.load_python_reward("guard_cases:batch_of")
    before = python_rewards.reward_error_counts()
    assert fn.batched(["mixed"] + ["x"] * 7, [guard_cases] * 8) == \
        [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5]
    assert _delta(before) == {"non_number": 3, "non_finite": 2}
    assert fn.batched(["array"] * 4, [guard_cases] * 4) == [0.0, 1.0, 2.0, 3.0]
    assert fn("array", guard_cases) == 0.0  # one completion through the batched form


def test_keyboard_interrupt_in_a_reward_is_the_runs_stop(guard_cases, capsys):
    """With the run's SIGINT handler (guards.StopRequest) a KeyboardInterrupt from a reward
    scores 0, is counted and requests the run's stop, as a Ctrl-C does; a second one stops
    at once (KeyboardInterrupt, as a second Ctrl-C); without the run's handler it is a
    plain KeyboardInterrupt."""
    from grpo_jax.runner.guards import StopRequest

    fn = python_rewards.load_python_reward("guard_cases:case_interrupt")
    before = python_rewards.reward_error_counts()
    with StopRequest() as stop:
        assert fn("x", guard_cases) == 0.0
        assert stop.requested == "SIGINT" and stop.received == 1
        assert _delta(before) == {"interrupt": 1}
        out = capsys.readouterr().out
        assert "reward guard_cases:case_interrupt: KeyboardInterrupt: from the reward; the " \
               "run stops as on SIGINT" in out and "SIGINT received" in out
        with pytest.raises(KeyboardInterrupt):
            fn("x", guard_cases)
    with pytest.raises(KeyboardInterrupt, match="from the reward"):
        fn("x", guard_cases)


def test_a_reward_over_its_budget_is_counted_and_kept(guard_cases, capsys):
    fn = python_rewards.load_python_reward("guard_cases:sleepy", budget_seconds=0.01)
    before = python_rewards.reward_error_counts()
    assert fn("x", guard_cases) == 1.0 and fn("y", guard_cases) == 1.0
    assert _delta(before) == {"slow": 2}
    assert python_rewards.reward_error_record(before)["reward_slow"] == 2.0
    assert capsys.readouterr().out.count("reward guard_cases:sleepy: took") == 1
    batch = python_rewards.load_python_reward("guard_cases:sleepy_batch",
                                              budget_seconds=0.01)
    before = python_rewards.reward_error_counts()
    assert batch.batched(["a", "b"], [guard_cases] * 2) == [1.0, 1.0]
    assert _delta(before) == {"slow": 2}  # per completion the call scored
    within = python_rewards.load_python_reward("guard_cases:sleepy_batch", budget_seconds=1)
    before = python_rewards.reward_error_counts()
    within.batched(["a", "b"], [guard_cases] * 2)
    assert _delta(before) == {}
    with pytest.raises(ValueError, match="budget_seconds"):
        python_rewards.load_python_reward("guard_cases:sleepy", budget_seconds=0)


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf")])
def test_a_bad_reward_budget_is_one_line_naming_the_field(value):
    from grpo_jax.config_presets import main_job
    from grpo_jax.runner import ConfigError
    from grpo_jax.runner.validation import check_run_fields
    from grpo_jax.stages import KINDS

    config = main_job("smoke")
    check_run_fields(config, KINDS)
    config.python_rewards.budget_seconds = value
    with pytest.raises(ConfigError, match=r"^python_rewards\.budget_seconds: expected") as err:
        check_run_fields(config, KINDS)
    assert "\n" not in str(err.value)


PROBE_REWARDS = '''
# probe_rewards.py: on the first completion of each group of 4 (every 4th call) a reward
# that misbehaves, in turn; real scores that differ within the group on the others.
import itertools
import os
import sys

import numpy as np

def _interrupt():
    if os.path.exists("interrupted"):  # once over both runs
        return 0.5
    open("interrupted", "w").close()
    raise KeyboardInterrupt("from the reward")

def _exit():
    sys.exit(0)

def _raise():
    raise ValueError("no answer here")

PLAN = [_interrupt, lambda: 10**400, lambda: np.array([1.0, 2.0]), _exit,
        lambda: 1e300, _raise, lambda: None]
_calls = itertools.count()
_batches = itertools.count()

def per_sample(prompt, completion, answer):
    n = next(_calls)
    if n % 4 == 0 and n // 4 < len(PLAN):
        return PLAN[n // 4]()
    return len(set(completion)) / 10

def batch(completions, **meta):
    n = next(_batches)
    if n == 0:
        return {c: 1.0 for c in completions}  # once read as its keys
    if n == 1:
        return (1.0 for _ in completions[1:])  # one value short
    return [c.count("1") / 4 for c in completions]
'''

PROBE_CONFIG = '''
from grpo_jax.config_presets import main_job

def get_config(preset=None):
    config = main_job(preset)
    config.stages = "rl"
    config.mesh.num_devices = 1
    config.model.num_layers = 1
    config.rl.steps = 3
    config.rl.max_new_tokens = 12
    config.rl.rewards = {"probe_rewards:per_sample": 1.0, "probe_rewards:batch": 0.5}
    return config
'''


@pytest.mark.slow
def test_a_run_whose_rewards_misbehave_every_way_finishes_with_the_counts(tmp_path):
    """A main-job run (RL, 3 steps of 4 groups of 4) whose per-sample reward raises
    KeyboardInterrupt, returns 10**400, a numpy array, calls sys.exit(0), returns 1e300,
    raises and returns None on one completion of a group each, and whose batched reward
    returns a dict, then a generator one value short: the KeyboardInterrupt stops the run
    as a Ctrl-C does (checkpoint, one line, exit 0), the same command resumes and finishes,
    with the counts per step in metrics.jsonl and in total in the report."""
    (tmp_path / "probe_rewards.py").write_text(PROBE_REWARDS, encoding="utf-8")
    (tmp_path / "probe_config.py").write_text(PROBE_CONFIG, encoding="utf-8")
    command = [sys.executable, "-m", "grpo_jax.main", "--config=probe_config.py:smoke",
               "--workdir=run"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    outs = []
    for _ in range(2):
        done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True,
                              timeout=600, check=False, env=env)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
        outs.append(done.stdout)
    assert "stopped on SIGINT after rl step 1" in outs[0]
    assert outs[0].count("reward probe_rewards:per_sample: KeyboardInterrupt: from the "
                         "reward; the run stops as on SIGINT") == 1
    for out in outs:  # the first of each kind, named once per process
        warned = [line for line in out.splitlines() if "warning: reward probe_rewards" in line]
        assert len(warned) == len(set(warned)) == 4 + (out is outs[0]), warned
        for name in ("per_sample: returned an int of 1329 bits", "per_sample: returned array(",
                     "per_sample: SystemExit: 0", "batch: returned a dict"):
            assert sum(name in line for line in warned) == 1, (name, warned)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text()
            .splitlines()]
    rl = [r for r in rows if r.get("stage") == "rl" and "reward_mean" in r]
    assert [r["stage_step"] for r in rl] == [1, 2, 3]
    for row in rl:
        assert 0 < row["reward_std"] < 10 and row.get("skipped_steps", 0) == 0, row
    totals = {k: sum(r[k] for r in rl) for k in rl[0] if k.startswith(("reward_errors",
                                                                        "reward_slow"))}
    # step 1: interrupt, 10**400, array, exit, dict; the resumed process from its start:
    # step 2: (no second interrupt) 10**400, array, exit, dict; step 3: 1e300, raise, None,
    # a generator one short
    assert totals == {"reward_errors": 58.0, "reward_errors/exception": 3.0,
                      "reward_errors/interrupt": 1.0, "reward_errors/non_number": 3.0,
                      "reward_errors/non_finite": 3.0, "reward_errors/bad_batch": 48.0,
                      "reward_slow": 0.0}, totals
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["reward_errors"] == totals
    assert ("Python rewards: 58 completions scored 0 by the guard (reward_errors: exception 3, "
            "interrupt 1, non_number 3, non_finite 3, bad_batch 48)") in \
        (tmp_path / "run" / "report.md").read_text()
