"""grpo_jax: reinforcement learning of language models on verifiable rewards, in JAX."""

from setuptools import find_packages, setup

setup(
    name="grpo_jax",
    version="0.1.0",
    description=(
        "Policy gradient, TRPO, PPO, GAE, GRPO and the DeepSeek-R1 recipes in JAX/Flax NNX."
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["grpo_jax", "grpo_jax.*"]),
    package_data={"grpo_jax.studies": ["cpu_mask.c"]},  # built on use: studies/cpu_mask.py
    # Compatible ranges: the API of jax / flax NNX / orbax / grain moves quickly, so a newer
    # Python must not silently pull a release with a different API.
    install_requires=[
        "jax>=0.10.2,<0.11",
        "flax>=0.12.8,<0.13",
        "optax>=0.2.8,<0.3",
        "orbax-checkpoint>=0.12.8,<0.13",
        "etils[epath]>=1.7,<2",  # workdirs as paths or URLs (grpo_jax.storage)
        "chex>=0.1.92,<0.2",
        "ml-collections>=1.1,<2",
        "absl-py>=2.1,<3",
        # the code sandbox's seccomp filter (libseccomp through ctypes; with bubblewrap)
        "pyseccomp>=0.1.2,<0.2; sys_platform == 'linux'",
        "numpy>=2.0,<3",
        "sentencepiece>=0.2,<0.3",
        "grain>=0.2.18,<0.3",
        "tensorflow-datasets>=4.9.10,<5",
        "importlib_resources>=6.0",
        "safetensors>=0.5,<1",
        "tokenizers>=0.21,<1",
        "jinja2>=3.1,<4",  # checkpoints' chat templates
        "tensorboardX>=2.6,<3",
        "tqdm>=4.66,<5",
        "matplotlib>=3.8,<4",
        "math-verify>=0.8,<0.10",
    ],
    extras_require={
        "dev": [
            # <9.2: under pytest 9.2 xdist's --dist loadgroup silently stops grouping
            # (pytest-dev/pytest-xdist#1386), and the studies' sharing checks need it
            "pytest>=8,<9.2",
            "pytest-xdist>=3.5,<4",  # pytest.ini runs the suite on 2 workers
            "hypothesis>=6.100,<7",
            "nbformat>=5.10,<6",
            "nbclient>=0.10,<0.12",
            "ipykernel>=6.29,<8",
            "ruff>=0.6",
            # the trackers' tests write offline runs and read them back
            "wandb>=0.31,<1",
            "mlflow-skinny>=3.18,<4",
            "sqlalchemy>=2,<3",
            "alembic>=1.13,<2",
            # the server's tests drive it with the real OpenAI client; the field's tasks and
            # OpenEnv environments are tested against their own packages
            "fastapi>=0.110,<1",
            "uvicorn>=0.29,<1",
            "openai>=1.40,<4",
            "reasoning-gym>=0.1.19,<0.2",
            "openenv-core>=0.2,<0.4",
            "pyarrow>=15",
        ],
        # The policy as an OpenAI-compatible server (python -m grpo_jax.serve).
        "serve": ["fastapi>=0.110,<1", "uvicorn>=0.29,<1"],
        # reasoning-gym's procedural tasks (task.name=reasoning_gym).
        "reasoning_gym": ["reasoning-gym>=0.1.19,<0.2"],
        # Environments served by OpenEnv (tools/openenv.py).
        "openenv": ["openenv-core>=0.2,<0.4"],
        # Own data in Parquet (JSONL and CSV need nothing more).
        "parquet": ["pyarrow>=15"],
        # Experiment trackers beside TensorBoard (config.loggers; grpo_jax/trackers.py).
        "wandb": ["wandb>=0.31,<1"],
        "mlflow": ["mlflow-skinny>=3.18,<4", "sqlalchemy>=2,<3", "alembic>=1.13,<2"],
        # Only for parity tests and benchmarks against Hugging Face. On CPU-only machines
        # install torch first with `pip install torch==2.13.0` (a CPU build).
        "hf": ["torch>=2.13,<2.15", "transformers>=4.50,<6"],
        # The notebooks: executing them (tests/test_notebooks.py, `jupyter execute`) needs
        # only what "dev" has; this adds JupyterLab to open and edit them.
        "notebooks": [
            "nbformat>=5.10,<6",
            "nbclient>=0.10,<0.12",
            "ipykernel>=6.29,<8",
            "jupyterlab>=4,<5",
        ],
        "gpu": ["jax[cuda12]>=0.10.2,<0.11"],
        "tpu": ["jax[tpu]>=0.10.2,<0.11"],
        # Workdirs on Google Cloud Storage (gs://): epath's backend and TensorBoard's writer.
        "gcs": ["etils[epath-gcs]>=1.7,<2", "google-cloud-storage>=2,<4"],
    },
    entry_points={"console_scripts": ["grpo-jax=grpo_jax.main:run"]},
)
