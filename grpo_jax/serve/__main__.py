"""python -m grpo_jax.serve --workdir=RUN --port=PORT: a run's policy (or a checkpoint's)
served on 127.0.0.1 with OpenAI's /v1/models, /v1/completions and /v1/chat/completions.

Every problem before serving (a missing package, a path that holds no policy, a bad flag) is
one line on stderr and exit status 2.
"""

from __future__ import annotations

import sys

from grpo_jax.command_line import OneLineParser
from grpo_jax.serve import HOST


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m grpo_jax.serve", description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True,
                        help="a run directory, its checkpoints/ folder, or an exported "
                             "(Hugging Face) checkpoint directory")
    parser.add_argument("--port", type=int, default=8000, help="the port on 127.0.0.1")
    parser.add_argument("--model-name", default=None,
                        help="the model id clients ask for (default: the folder's name)")
    parser.add_argument("--max-rows", type=int, default=64,
                        help="the most completions sampled in one batch")
    parser.add_argument("--slots", type=int, default=16,
                        help="rows decoded at once (continuous batching)")
    parser.add_argument("--batch-wait-ms", type=float, default=10.0,
                        help="how long a request waits for others to join its batch")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ModuleNotFoundError:
        from grpo_jax.serve.app import MISSING_PACKAGES

        print(f"error: {MISSING_PACKAGES}", file=sys.stderr)
        return 2
    from grpo_jax.serve.app import create_app
    if not 0 < args.port < 65536:
        print(f"error: --port: expected 1..65535, got {args.port}", file=sys.stderr)
        return 2
    from grpo_jax.serve.engine import Engine, load_policy

    try:
        served = load_policy(args.workdir, name=args.model_name)
        engine = Engine(served, max_rows=args.max_rows, slots=args.slots,
                        batch_wait_s=args.batch_wait_ms / 1000)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"[grpo_jax] serving {served.name!r} ({served.context} tokens of context) on "
          f"http://{HOST}:{args.port}/v1", flush=True)
    uvicorn.run(create_app(engine), host=HOST, port=args.port, log_level="warning")
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
