"""Test set-up: CPU with 8 virtual devices so sharding tests run on any machine."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402

jax.config.update("jax_enable_x64", False)


import pytest  # noqa: E402


@pytest.fixture
def example_module():
    """grpo_jax.tasks.base (the Example dataclass used by data and GSM8K tests)."""
    from grpo_jax.tasks import base

    return base
