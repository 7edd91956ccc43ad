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
    done = subprocess.run([sys.executable, *command[1:], "--config.rl.steps=3"],
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
    for spec, needle in (("user_rewards", "expected module:function"),
                         ("no_such_module_xyz:f", "cannot import 'no_such_module_xyz'"),
                         ("user_rewards:missing", "has no function 'missing'")):
        with pytest.raises(ValueError, match=needle):
            python_rewards.load_python_reward(spec)


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
    config's folder is importable, and the preset's arithmetic task.kwargs that the new
    task does not take are left out with one warning line."""
    files = _readme_example("task")
    user, elsewhere = tmp_path / "user", tmp_path / "elsewhere"
    user.mkdir()
    elsewhere.mkdir()
    for name, code in files.items():
        if name != "command":
            (user / name).write_text(code, encoding="utf-8")
    command = files["command"].replace("--config=", "--config=../user/").split()
    done = subprocess.run([sys.executable, *command[1:], "--config.rl.steps=2"],
                          cwd=elsewhere, capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    warnings = [line for line in done.stdout.splitlines() if "task.kwargs" in line]
    assert len(warnings) == 1 and "error_mode" in warnings[0] and "'digit_sum'" in warnings[0]
    recorded = json.loads((elsewhere / "runs" / "digit_sum" / "config.json").read_text())
    assert recorded["task"]["name"] == "digit_sum"
    samples = (elsewhere / "runs" / "digit_sum" / "samples.jsonl").read_text()
    assert "digitsum" in samples
