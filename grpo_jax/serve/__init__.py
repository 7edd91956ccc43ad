"""The policy as an OpenAI-compatible server on 127.0.0.1 (FastAPI + uvicorn, the `serve` extra).

    python -m grpo_jax.serve --workdir=runs/main --port=8000

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
    client.completions.create(model="main", prompt="Q: 3+4\\nA: ", max_tokens=16, seed=0)

`engine` loads the policy and samples the waiting requests together on a scheduler thread
(one `sampling.generate` call a batch, the decode core's continuous-batching layout);
`app` is the HTTP layer; `eval` scores a task's held-out problems through an endpoint.
`ServerThread` runs the server in this process (tests, notebooks, the benchmark).
"""

from __future__ import annotations

import socket
import threading

from grpo_jax.serve.engine import (Completion, Engine, Request, ServedPolicy, Settings,
                                   load_policy, served_model)

__all__ = ["Completion", "Engine", "HOST", "Request", "ServedPolicy", "ServerThread",
           "Settings", "load_policy", "served_model"]

HOST = "127.0.0.1"  # the only address the server listens on


class ServerThread:
    """The server of `engine` on 127.0.0.1 in a thread of this process (a free port when
    `port` is 0); a context manager that stops the server and the engine on exit.

        with ServerThread(Engine(served_model(model, tokenizer, name="tiny"))) as server:
            OpenAI(base_url=server.base_url, api_key="unused")
    """

    def __init__(self, engine: Engine, *, port: int = 0):
        try:
            import uvicorn
        except ModuleNotFoundError:
            from grpo_jax.serve.app import MISSING_PACKAGES

            raise ModuleNotFoundError(MISSING_PACKAGES) from None
        from grpo_jax.serve.app import create_app

        self.engine = engine
        if port == 0:
            with socket.socket() as probe:
                probe.bind((HOST, 0))
                port = probe.getsockname()[1]
        self.port = port
        self.base_url = f"http://{HOST}:{port}/v1"
        config = uvicorn.Config(create_app(engine), host=HOST, port=port, log_level="warning",
                                lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="grpo_jax-http",
                                        daemon=True)

    def __enter__(self) -> "ServerThread":
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"the server did not start on {HOST}:{self.port}")
            self._thread.join(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join()
        self.engine.close()
