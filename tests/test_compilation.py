"""The persistent compilation cache and compile time logged apart from step time."""

import contextlib
import os

import jax

from configs import default as default_config
from grpo_jax import compilation
from grpo_jax.metrics import read_metrics
from grpo_jax.pipeline import train_and_evaluate


def pretrain_config(cache_dir):
    config = default_config.get_config("smoke")
    config.stages = "pretrain"
    config.model.num_layers = 1  # one block: the same programs to cache, compiled faster
    config.compilation_cache_dir = str(cache_dir)
    return config


@contextlib.contextmanager
def back_to_the_session_cache(monkeypatch):
    """Afterwards the variable and jax's cache are the test session's again (conftest)."""
    session = os.environ.get(compilation.ENV_VAR, "")
    minimum = compilation.MIN_COMPILE_SECS
    try:
        yield
    finally:
        monkeypatch.setenv(compilation.ENV_VAR, session)
        monkeypatch.setattr(compilation, "MIN_COMPILE_SECS", minimum)
        assert compilation.use_cache(session) == jax.config.jax_compilation_cache_dir


def test_a_rerun_loads_every_program_from_the_cache_and_logs_compile_time_apart(
        tmp_path, monkeypatch):
    cache = tmp_path / "xla"
    with back_to_the_session_cache(monkeypatch):
        monkeypatch.setenv(compilation.ENV_VAR, str(cache))  # over the config's directory
        monkeypatch.setattr(compilation, "MIN_COMPILE_SECS", 0.0)  # the library's default
        check_rerun(tmp_path, cache)


def check_rerun(tmp_path, cache):
    clock = compilation.CLOCK
    train_and_evaluate(pretrain_config(tmp_path / "unused"), str(tmp_path / "first"))
    assert len(os.listdir(cache)) > 0 and not (tmp_path / "unused").exists()
    rows = read_metrics(str(tmp_path / "first" / "metrics.jsonl"))
    assert rows[0]["compile_time_s"] > 0  # the first step compiles the train step
    assert all(r["compile_time_s"] == 0 for r in rows[1:])  # the same program afterwards
    assert all(r["step_time_s"] >= 0 for r in rows)

    # The same job again (as a rerun or a resume builds it): every program that reaches the
    # backend comes out of the cache; none is compiled.
    compiles, hits = clock.compiles(), clock.cache_hits()
    train_and_evaluate(pretrain_config(cache), str(tmp_path / "second"))
    assert clock.compiles() - compiles > 0
    assert clock.cache_hits() - hits == clock.compiles() - compiles
    again = read_metrics(str(tmp_path / "second" / "metrics.jsonl"))
    # Loaded programs compute what compiled ones did.
    assert [r["loss"] for r in again] == [r["loss"] for r in rows]
    assert all(r["compile_time_s"] < rows[0]["compile_time_s"] for r in again)


def test_the_config_names_the_directory_and_the_environment_overrides_it(tmp_path,
                                                                         monkeypatch):
    with back_to_the_session_cache(monkeypatch):
        monkeypatch.delenv(compilation.ENV_VAR)
        assert compilation.use_cache("") is None  # off
        assert jax.config.jax_compilation_cache_dir is None
        monkeypatch.setattr(compilation, "MIN_COMPILE_SECS", 0.25)
        assert compilation.use_cache(str(tmp_path / "c")) == str(tmp_path / "c")
        assert (tmp_path / "c").is_dir()
        assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.25
        monkeypatch.setenv(compilation.ENV_VAR, str(tmp_path / "env"))
        assert compilation.use_cache(str(tmp_path / "c")) == str(tmp_path / "env")
