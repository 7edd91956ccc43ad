"""The task "file": a researcher's own JSONL / CSV / Parquet rows, checked row by row before
any work, split by a hash of the prompt; tasks whose answers are strings (noisy worked
solutions, the device rewards' integer answers caught at validation); README's recipe run
from a folder outside the checkout."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from grpo_jax import api
from grpo_jax.runner.checks import ConfigError
from grpo_jax.tasks import Example, Task, get_task
from grpo_jax.tasks.base import perturb_text
from test_user_code import _readme_example

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ["ab", "abc", "bca", "cab", "dab", "bad", "cad", "fed", "bee", "deaf", "face", "bead",
         "cafe", "dace", "aced", "fade", "head", "ache", "each", "beef", "feed", "deed", "babe",
         "hag", "gab", "egg", "fig", "hid", "bid", "dig", "gag", "hah", "ebb", "add", "gif",
         "chef", "chad", "bach", "dice", "hide", "ride", "bide", "gibe", "heed", "edge", "bag"]
ROWS = [{"question": f"rev {w}", "answer": w[::-1], "level": len(w)} for w in WORDS]


def _held_out(prompt: str, fraction: float = 0.1) -> bool:
    """The split rule written out: blake2b-64 of the prompt below fraction x 2**64."""
    digest = hashlib.blake2b(prompt.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") < fraction * 2.0**64


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The same rows as JSONL, CSV and Parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path_factory.mktemp("own_data")
    paths = {"jsonl": _write_jsonl(folder / "rows.jsonl", ROWS)}
    lines = ["question,answer,level"] + [f"{r['question']},{r['answer']},{r['level']}"
                                         for r in ROWS]
    (folder / "rows.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    paths["csv"] = str(folder / "rows.csv")
    pq.write_table(pa.Table.from_pylist(ROWS), folder / "rows.parquet")
    paths["parquet"] = str(folder / "rows.parquet")
    return paths


def test_three_formats_give_the_same_problems_and_split(data):
    held_out = [r["question"] for r in ROWS if _held_out(r["question"])]
    assert 0 < len(held_out) < len(ROWS)  # the fixture's rows fall on both sides
    tasks = {kind: get_task("file", path=path, prompt_field="question")
             for kind, path in data.items()}
    for kind, task in tasks.items():
        test = task.examples("test", len(held_out), seed=0)
        assert [ex.prompt for ex in test] == held_out, kind  # file order
        assert [ex.answer for ex in test] == [p[4:][::-1] for p in held_out]
        assert task.num_rows == {"train": len(ROWS) - len(held_out), "test": len(held_out)}
    # row numbers: JSONL lines, CSV lines under the header, Parquet rows from 1
    first = {kind: task.examples("test", 1, seed=0)[0] for kind, task in tasks.items()}
    index = [r["question"] for r in ROWS].index(held_out[0])
    assert first["jsonl"].id == f"rows:{index + 1}"
    assert first["csv"].id == f"rows:{index + 2}"
    assert first["parquet"].id == f"rows:{index + 1}"
    # the other columns reach Example.meta (CSV reads text)
    assert first["jsonl"].meta["level"] == first["parquet"].meta["level"] == len(held_out[0]) - 4
    assert first["csv"].meta["level"] == str(len(held_out[0]) - 4)


def test_split_follows_the_prompt_not_the_row_order(tmp_path):
    shuffled = [ROWS[i] for i in np.random.default_rng(0).permutation(len(ROWS))]
    task = get_task("file", path=_write_jsonl(tmp_path / "s.jsonl", shuffled),
                    prompt_field="question", test_fraction=0.3)
    expected = [r["question"] for r in shuffled if _held_out(r["question"], 0.3)]
    assert [ex.prompt for ex in task.examples("test", len(expected), seed=5)] == expected
    train = task.examples("train", 3 * len(ROWS), seed=1)  # more than the file holds
    assert train == task.examples("train", 3 * len(ROWS), seed=1)
    assert train != task.examples("train", 3 * len(ROWS), seed=2)
    prompts = [ex.prompt for ex in train]
    assert set(prompts) == {r["question"] for r in ROWS} - set(expected)
    # each pass is a permutation: every training row 3 times in the first 3 passes' rows
    counts = {p: prompts.count(p) for p in set(prompts)}
    passes = len(prompts) // len(counts)
    assert all(passes <= c <= passes + 1 for c in counts.values())


@pytest.mark.parametrize("content,message", [
    ('{"question": "rev ab", "answer": "ba"}\n{"answer": "x"}\n',
     "bad.jsonl: row 2: missing field 'question' (the row has 'answer'; "
     "task.kwargs.prompt_field names it)"),
    ('{"question": "rev ab", "answer": "ba"}\n\n{"question": "  ", "answer": "x"}\n',
     "bad.jsonl: row 3: field 'question': expected a non-empty string, got str '  '"),
    ('{"question": "rev ab", "answer": [1, 2]}\n',
     "bad.jsonl: row 1: field 'answer': expected a non-empty string, got list [1, 2]"),
    ('{"question": "half", "answer": 0.5}\n',
     "bad.jsonl: row 1: field 'answer': expected a non-empty string, got float 0.5 "
     '(write it as text: "0.5")'),
    ('{"question": "rev ab", "answer": true}\n',
     "bad.jsonl: row 1: field 'answer': expected a non-empty string, got bool True"),
    ('{"question": "rev ab", "answer": null}\n',
     "bad.jsonl: row 1: field 'answer': expected a non-empty string, got NoneType None"),
    ('{"question": "rev ab", "answer": "ba"}\n{"question": "x", \n',
     "bad.jsonl: row 2: invalid JSON"),
    ('["rev ab", "ba"]\n', "bad.jsonl: row 1: expected a JSON object, got list"),
])
def test_bad_rows_are_one_line_naming_file_row_and_field(tmp_path, monkeypatch, content,
                                                         message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.jsonl").write_text(content, encoding="utf-8")
    config = _file_config("bad.jsonl")
    workdir = tmp_path / "run"
    with pytest.raises(ConfigError) as err:
        api.train(config, str(workdir))
    assert str(err.value).startswith(f"task.kwargs: {message}")
    assert "\n" not in str(err.value)
    assert not workdir.exists()  # before any work


@pytest.mark.parametrize("name,content,message", [
    ("rows.txt", "question,answer\n", "task.kwargs.path: expected a file ending in .jsonl, "
                                      ".csv, .parquet, got 'rows.txt'"),
    ("missing.jsonl", None, "task.kwargs.path: no such file 'missing.jsonl' (a relative path "
                            "is read from the current folder)"),
    ("empty.jsonl", "\n\n", "task.kwargs.path: empty.jsonl has no rows"),
    ("rows.csv", "question,solution\nrev ab,x\n",
     "task.kwargs: rows.csv: row 2: missing field 'answer'"),
    ("rows.csv", "question,answer\nrev ab,ba\nrev cd,\n",
     "task.kwargs: rows.csv: row 3: field 'answer': expected a non-empty string, got str ''"),
    ("rows.csv", "question,answer\nrev ab,ba,extra\n",
     "task.kwargs: rows.csv: row 2: 3 values for the 2 columns of the header"),
    ("rows.csv", b"question,answer\nrev ab,ba\nrev \xff,x\n",
     "task.kwargs: rows.csv: row 3: not UTF-8 (byte 0xff)"),
    ("rows.parquet", "not parquet", "task.kwargs: rows.parquet: not a readable Parquet file"),
])
def test_bad_files_are_one_line(tmp_path, monkeypatch, name, content, message):
    monkeypatch.chdir(tmp_path)
    if isinstance(content, bytes):
        (tmp_path / name).write_bytes(content)
    elif content is not None:
        (tmp_path / name).write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        api.train(_file_config(name), str(tmp_path / "run"))
    assert str(err.value).startswith(message), str(err.value)
    assert not (tmp_path / "run").exists()


def test_parquet_column_of_numbers_names_the_row(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.chdir(tmp_path)
    pq.write_table(pa.table({"question": ["a", "b"], "answer": [1.5, 2.0]}), "n.parquet")
    with pytest.raises(ValueError, match=r"^n\.parquet: row 1: field 'answer': expected a "
                                         r"non-empty string, got float 1\.5"):
        get_task("file", path="n.parquet", prompt_field="question")
    pq.write_table(pa.table({"question": ["a", "b"], "answer": [3, -4]}), "i.parquet")
    task = get_task("file", path="i.parquet", prompt_field="question", test_fraction=0.0)
    assert [ex.answer for ex in task.examples("train", 2, seed=0, unique=True)] in (
        ["3", "-4"], ["-4", "3"])  # integers read as their decimal text


def test_a_byte_order_mark_is_read_past(tmp_path):
    for name, text in (("b.jsonl", '{"prompt": "rev ab", "answer": "ba"}\n'),
                       ("b.csv", "prompt,answer\nrev ab,ba\n")):
        (tmp_path / name).write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
        task = get_task("file", path=str(tmp_path / name), test_fraction=0.0)
        assert [(ex.prompt, ex.answer) for ex in task.examples("train", 1, seed=0)] == [
            ("rev ab", "ba")]


def test_sizes_past_the_file_name_the_field(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write_jsonl(tmp_path / "rows.jsonl", ROWS)
    held_out = sum(_held_out(r["question"]) for r in ROWS)
    config = _file_config("rows.jsonl")
    config.task.eval_size = held_out + 1
    with pytest.raises(ConfigError, match=rf"^task\.eval_size: {held_out + 1} held-out "
                                          rf"problems asked for, rows\.jsonl has {held_out} "
                                          rf"\(test_fraction 0\.1 of {len(ROWS)} rows\)"):
        api.train(config, str(tmp_path / "run"))


def test_relative_path_resolves_from_the_current_folder(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    _write_jsonl(tmp_path / "sub" / "rows.jsonl", ROWS)
    monkeypatch.chdir(tmp_path / "sub")
    task = get_task("file", path="rows.jsonl", prompt_field="question")
    assert task.path == str(tmp_path / "sub" / "rows.jsonl")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="no such file 'rows.jsonl'"):
        get_task("file", path="rows.jsonl", prompt_field="question")


def test_rows_reach_python_rewards_and_the_char_tokenizer(tmp_path, monkeypatch):
    from grpo_jax.rewards import python as python_rewards

    rows = [{"prompt": "ünï", "answer": "ïnü", "id": "x1", "note": "keep", "completion": 3},
            {"prompt": "ab", "answer": 12, "solution": "b then a"}]
    task = get_task("file", path=_write_jsonl(tmp_path / "u.jsonl", rows),
                    solution_field="solution", test_fraction=0.0)
    first, second = sorted(task.examples("train", 2, seed=0, unique=True), key=lambda e: e.id)
    assert first.meta == {"row": 1, "note": "keep"}  # id, completion: the rewards' own names
    (tmp_path / "row_rewards.py").write_text(
        "def noted(prompt, completion, answer, **meta):\n"
        "    return float(meta.get('note') == 'keep') + meta['row'] / 10\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    noted = python_rewards.load_python_reward("row_rewards:noted")
    assert noted("x", first) == pytest.approx(1.1) and noted("x", second) == pytest.approx(0.2)
    assert (second.answer, second.solution) == ("12", "b then a")
    assert task.characters == "ïü"  # beyond the char tokenizer's default alphabet
    # a worked solution is the thinking of pretraining completions
    text, correct = task.solution(second, rng=0, error_rate=0.0)
    assert (text, correct) == ("<think>b then a</think><answer>12</answer>", True)


def test_answers_compare_as_text_exact_or_math(tmp_path):
    rows = [{"prompt": "rev abc", "answer": "cba"}, {"prompt": "half", "answer": "0.5"},
            {"prompt": "frac", "answer": "\\frac{1}{2}"}]
    path = _write_jsonl(tmp_path / "c.jsonl", rows)
    verdicts = {}
    for compare in ("text", "exact", "math"):
        task = get_task("file", path=path, test_fraction=0.0, compare=compare)
        reverse, half, frac = sorted(task.examples("train", 3, seed=0, unique=True),
                                     key=lambda e: e.id)
        verdicts[compare] = [task.accuracy_reward(f"<answer>{a}</answer>", ex) for a, ex in
                             [("cba", reverse), ("CBA", reverse), ("abc", reverse),
                              ("1/2", half), ("0.50", half), ("0.5", frac)]]
    assert verdicts == {"text": [1, 1, 0, 1, 1, 0], "exact": [1, 0, 0, 0, 0, 0],
                        "math": [1, 1, 0, 1, 1, 1]}  # words never reach math-verify
    with pytest.raises(ValueError, match=r"^compare: expected one of \('text', 'exact', "
                                         r"'math'\), got 'fuzzy'"):
        get_task("file", path=path, compare="fuzzy")


def test_chat_template_renders_the_file_prompt(tmp_path, monkeypatch):
    from grpo_jax.runner.inputs import build_inputs
    from grpo_jax.runner.prompts import prompt_of
    from grpo_jax.tasks.templates import CHAT_USER

    monkeypatch.chdir(tmp_path)
    _write_jsonl(tmp_path / "rows.jsonl", ROWS)
    config = _file_config("rows.jsonl")
    config.task.template, config.task.chat_template = "chat", "miniature"
    inputs = build_inputs(config)
    example = inputs.task.examples("test", 1, seed=0)[0]
    prompt = prompt_of(config, inputs.task, inputs.tokenizer, example)
    user = CHAT_USER.replace("{question}", example.prompt)
    assert prompt == inputs.tokenizer.apply_chat_template(
        [{"role": "user", "content": user}], add_generation_prompt=True)
    assert user in prompt and prompt != user


# ---- tasks whose answers are strings ----------------------------------------------------------


class _Reverse(Task):
    """A string-answer task of the user's own, without worked solutions."""

    name = "reverse_for_test"

    def generate(self, rng, difficulty):
        word = "".join("abcdefgh"[i] for i in rng.integers(0, 8, size=3))
        return Example(id=word, prompt=f"rev {word}", answer=word[::-1])

    def check_answer(self, answer, example):
        return answer == example.answer


def test_noisy_solutions_of_string_answers():
    task, rng = _Reverse(), np.random.default_rng(0)
    examples = task.examples("train", 200, seed=0)
    wrong = [task.solution(ex, rng=rng, error_rate=1.0) for ex in examples]
    for ex, (text, correct) in zip(examples, wrong):
        answer = re.fullmatch(r"<think></think><answer>(.*)</answer>", text).group(1)
        assert answer != ex.answer and not correct
        assert abs(len(answer) - len(ex.answer)) <= 1  # one character edit
    text, correct = task.solution(examples[0], rng=rng, error_rate=0.0)
    assert (text, correct) == (f"<think></think><answer>{examples[0].answer}</answer>", True)
    # the edits: a swap of neighbours, a dropped or doubled character
    edits = {perturb_text("abc", np.random.default_rng(seed)) for seed in range(60)}
    assert edits == {"bac", "acb", "bc", "ac", "ab", "aabc", "abbc", "abcc"}
    assert {perturb_text("a", np.random.default_rng(s)) for s in range(5)} == {"aa"}
    assert {perturb_text("aa", np.random.default_rng(s)) for s in range(20)} == {"a", "aaa"}


def test_fused_device_rewards_of_string_answers_fail_validation(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write_jsonl(tmp_path / "rows.jsonl", ROWS)
    config = api.config()  # the main job at full size: rl.fused_steps 10
    config.stages = "rl"  # (without the check the RL stage fails on its first chunk)
    config.task.name, config.task.prompt_len, config.task.eval_size = "file", 0, 2
    config.task.kwargs = {"path": "rows.jsonl", "prompt_field": "question"}
    assert config.rl.fused_steps == 10
    with pytest.raises(ConfigError, match=r"^rl\.fused_steps: device rewards need integer "
                                          r"answers below 10\*\*9; example 'rows:\d+' has "
                                          r"'\w+'; set fused_steps to 0"):
        api.train(config, str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()  # the corrected rerun finds no workdir
    numbers = [{"question": f"{a}+{b}", "answer": a + b} for a in range(6) for b in range(6)]
    _write_jsonl(tmp_path / "rows.jsonl", numbers)  # integer answers: the same config passes
    from grpo_jax.runner.validation import validate
    from grpo_jax.stages import KINDS

    validate(config, KINDS)


# ---- README's recipe, from a folder outside the checkout ---------------------------------------


def _file_config(path: str):
    config = api.config("smoke")
    config.task.name, config.task.prompt_len, config.task.eval_size = "file", 0, 2
    config.task.kwargs = {"path": path, "prompt_field": "question"}
    return config


@pytest.mark.slow
def test_readme_recipe_runs_from_a_folder_outside_the_checkout(tmp_path):
    recipe = _readme_example("own_data")
    for name, code in recipe.items():
        if name != "command":
            (tmp_path / name).write_text(code, encoding="utf-8")
    data = re.search(r"(\w+\.jsonl)", recipe["my_data_config.py"]).group(1)
    _write_jsonl(tmp_path / data, ROWS * 4)  # repeated rows stay on their side
    command = recipe["command"].split()
    assert command[:3] == ["python", "-m", "grpo_jax.main"]
    assert sum(_held_out(r["question"]) for r in ROWS) * 4 >= 8
    # The prompts fit the smoke preset's 16-token bucket and the eval its 8 problems. One
    # layer on one device: less CPU time than the smoke job's four layers on the tests' 8
    # virtual devices even with those programs in the session's compilation cache (the test
    # 19 -> 13 CPU s warm, 24 -> 13 cold).
    tiny = ["--config.stages=pretrain,rl,eval_final", "--config.rl.steps=1",
            "--config.pretrain.steps=1", "--config.task.eval_size=8",
            "--config.model.num_layers=1", "--config.mesh.num_devices=1"]
    done = subprocess.run([sys.executable, *command[1:], *tiny], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    workdir = tmp_path / re.search(r"--workdir=(\S+)", recipe["command"]).group(1)
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if r.get("stage") == "eval_final" and "num_problems" in r]
    assert [r["num_problems"] for r in evals] == [8]
    samples = [json.loads(line) for line in (workdir / "samples.jsonl").read_text().splitlines()]
    scored = {s["prompt"] for s in samples if s["stage"] == "eval_final"}
    assert scored and all(_held_out(re.fullmatch(r"Q: (.*)\nA: ", p).group(1)) for p in scored)
    trained = {s["prompt"] for s in samples if s["stage"] == "rl"}
    assert trained and not any(_held_out(re.fullmatch(r"Q: (.*)\nA: ", p).group(1))
                               for p in trained)
