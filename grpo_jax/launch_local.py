"""Start a multi-controller run on this machine: N processes of `grpo_jax.main`, CPU devices.

    python -m grpo_jax.launch_local --num_processes=2 --devices_per_process=2 -- \
        --config=configs/default.py:smoke --workdir=runs/mp

Each process is `python -m grpo_jax.main <main flags> --coordinator_address=localhost:PORT
--num_processes=N --process_id=i` with `devices_per_process` virtual CPU devices and CPU
collectives (gloo), i.e. the program every host of a TPU pod or GPU cluster runs, with one
global mesh over N x devices_per_process devices. Process 0's output is streamed; the others'
go to `<workdir>/launch_local/process_<i>.log` (shown when a process fails; for a workdir
on an object store, to a local temporary directory).

SIGTERM or Ctrl-C to the launcher reaches every process: they agree on a step, save it and
exit 0, as one process does (a second signal kills them at once). A process that exits with
an error or dies stops the others at once (they would wait on it), named in one line, and
the launcher exits with its status. Running the same command again resumes from the last
checkpoint.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

from grpo_jax import storage

__all__ = ["free_port", "launch", "main"]


def free_port() -> int:
    """A TCP port on localhost that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _workdir(main_flags: list[str]) -> str | None:
    for flag in main_flags:
        if flag.startswith("--workdir="):
            return flag.split("=", 1)[1]
    return None


def launch(main_flags: list[str], *, num_processes: int, devices_per_process: int,
           log_dir: str | None = None, python: str = sys.executable,
           env: dict | None = None) -> int:
    """Runs `grpo_jax.main` in `num_processes` local processes; returns the exit status.

    Args:
      main_flags: the flags of `python -m grpo_jax.main` (config, workdir, overrides).
      num_processes: processes (hosts) to start.
      devices_per_process: virtual CPU devices of each process.
      log_dir: where processes 1.. write their output; default <workdir>/launch_local
        (a local temporary directory for a workdir on an object store).
      python: the interpreter.
      env: the environment (default os.environ).

    Returns:
      0 when every process exited 0, else the first failure's status.
    """
    if num_processes < 1 or devices_per_process < 1:
        raise ValueError("num_processes and devices_per_process must be >= 1")
    for flag in ("--coordinator_address", "--num_processes", "--process_id"):
        if any(f.startswith(flag) for f in main_flags):
            raise ValueError(f"{flag} is set by the launcher; leave it out of the main flags")
    base = dict(os.environ if env is None else env)
    flags = [f for f in base.get("XLA_FLAGS", "").split()
             if "xla_force_host_platform_device_count" not in f]
    base["XLA_FLAGS"] = " ".join(
        flags + [f"--xla_force_host_platform_device_count={devices_per_process}"])
    base["JAX_PLATFORMS"] = "cpu"
    if log_dir is None:
        local = storage.local_path(_workdir(main_flags) or ".")
        log_dir = os.path.join(local, "launch_local") if local is not None \
            else tempfile.mkdtemp(prefix="grpo_jax_launch_local_")
    os.makedirs(log_dir, exist_ok=True)
    address = f"localhost:{free_port()}"
    procs, logs = [], []
    for pid in range(num_processes):
        cmd = [python, "-m", "grpo_jax.main", *main_flags, f"--coordinator_address={address}",
               f"--num_processes={num_processes}", f"--process_id={pid}"]
        if pid == 0:
            out = None  # streamed
        else:
            out = open(os.path.join(log_dir, f"process_{pid}.log"), "w")
            logs.append(out)
        procs.append(subprocess.Popen(cmd, env=base, stdout=out,
                                      stderr=subprocess.STDOUT if out else None,
                                      start_new_session=True))
    status, signals = 0, []

    def forward(signum, frame):  # the first signal reaches every process: they save
        del frame
        signals.append(signum)
        if len(signals) > 1:
            raise KeyboardInterrupt
        name = signal.Signals(signum).name
        print(f"[launch_local] {name}: passed to every process, which agree on the step, "
              "save it and exit (send it again to kill them at once)", file=sys.stderr,
              flush=True)
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            running = [p.poll() is None for p in procs]
            failed = [(pid, p) for pid, p in enumerate(procs) if p.returncode not in (None, 0)]
            if failed:
                # Its peers wait on it forever (or until a collective times out): stop them.
                # Of those gone since the last look, name one killed by a signal first: the
                # others exit with an error because they lost it.
                pid, p = min(failed, key=lambda item: (item[1].returncode >= 0, item[0]))
                status = p.returncode
                print(f"[launch_local] process {pid} exited with status {_status(status)}; "
                      "stopping the others (the same command resumes from the last "
                      "checkpoint)", file=sys.stderr, flush=True)
                break
            if not any(running):
                break
            time.sleep(0.1)
    except KeyboardInterrupt:
        status = 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        for p in procs:
            p.wait()
        for f in logs:
            f.close()
    if status:
        for pid, p in enumerate(procs):
            if p.returncode and pid:
                path = os.path.join(log_dir, f"process_{pid}.log")
                tail = open(path, encoding="utf-8", errors="replace").read().splitlines()[-5:]
                print(f"[launch_local] process {pid} exited {_status(p.returncode)}; last "
                      f"lines of {path}:", *tail, sep="\n  ", file=sys.stderr)
    return status


def _status(code: int) -> str:
    return f"{code} ({signal.Signals(-code).name})" if code < 0 else str(code)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" in argv:
        split = argv.index("--")
        own, main_flags = argv[:split], argv[split + 1:]
    else:
        own, main_flags = argv, []
    parser = argparse.ArgumentParser(prog="python -m grpo_jax.launch_local",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--num_processes", type=int, default=2)
    parser.add_argument("--devices_per_process", type=int, default=1)
    args = parser.parse_args(own)
    try:
        status = launch(main_flags, num_processes=args.num_processes,
                        devices_per_process=args.devices_per_process)
        return status if status >= 0 else 128 - status  # killed by signal N: 128 + N

    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
