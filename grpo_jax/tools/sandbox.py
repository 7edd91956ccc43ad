"""Run untrusted Python (a policy's code) in a sandbox process, never in the trainer.

    result = run_python("print(2 ** 10)", deadline_seconds=2.0)
    result.output, result.stopped      # "1024\\n", None

    python -m grpo_jax.tools.sandbox --deadline_seconds=2 < code.py

The program runs in a fresh interpreter (`python -I -S`: no site packages, no user paths, no
PYTHON* variables) started in a session of its own, in a temporary directory of its own that
is removed afterwards, with:

* resource limits set before the program's first line: CPU seconds (the deadline's), address
  space (memory_mb), file size (1 MiB), open files, no core files;
* nothing inherited from the trainer: an environment of PATH, HOME, TMPDIR, LANG and
  PYTHONIOENCODING only, no open file but its three pipes;
* an audit hook (PEP 578), impossible to remove from Python, that refuses new processes
  (fork, exec, spawn, system, subprocess), signals to other processes, sockets, ctypes and
  the modules that reach around it (`BLOCKED_MODULES`), reads outside the standard library
  and its directory, and writes anywhere but its directory;
* locked in (`lock_in`, the default when the trainer runs as root, as in a container): the
  process chroots into its directory and becomes the user nobody with a process limit, after
  importing the modules a short program needs (`PREIMPORTED`; any other import fails as a
  missing module). The file system, the network modules and the trainer are then out of
  its reach whatever it does; the hook is a second wall. Without root only the hook and the
  limits stand, and a program that knows the interpreter's internals can get around the
  hook (tests/test_sandbox.py has one): run the trainer as root in a container to sample
  code from a policy you do not trust;
* a wall deadline enforced from outside: at the deadline plus half a second the process
  group is killed with SIGKILL (a handler that ignores SIGTERM changes nothing), as soon as
  the output passes its cap too.

What stopped a program is one line (`SandboxResult.stopped`): "timeout: ...", "memory:
...", "blocked: ...", "output: ...", "error: <exception>: <message> (line N)" or
"killed: ...".
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time

# The first words of the line that says what stopped a program.
STOP_PREFIXES = ("timeout:", "memory:", "blocked:", "output:", "error:", "killed:")
DEADLINE_SECONDS = 2.0
MEMORY_MB = 256
MAX_OUTPUT_CHARS = 2000
NOBODY = 65534

# Imported by a program, these would reach around the audit hook (ctypes calls libc
# directly) or open the network.
BLOCKED_MODULES = ("ctypes", "_ctypes", "cffi", "_imp", "_posixsubprocess", "pty", "socket",
                   "_socket", "ssl", "_ssl", "mmap", "multiprocessing", "_multiprocessing",
                   "asyncio", "_asyncio", "urllib.request", "http.client", "ftplib",
                   "smtplib", "telnetlib", "xmlrpc.client")
# Audit events refused outright: new processes, signals to others, sockets, ctypes, limits.
BLOCKED_EVENTS = ("os.system", "os.exec", "os.fork", "os.forkpty", "os.posix_spawn",
                  "os.spawn", "os.kill", "os.killpg", "subprocess.Popen", "pty.spawn",
                  "signal.pthread_kill", "socket.", "ctypes.", "resource.setrlimit",
                  "resource.prlimit", "os.chown", "shutil.chown", "webbrowser.open")
# Path events: event -> ((argument index, whether it writes), ...).
PATH_EVENTS = {"os.listdir": ((0, False),), "os.scandir": ((0, False),),
               "os.chdir": ((0, False),), "os.mkdir": ((0, True),), "os.rmdir": ((0, True),),
               "os.remove": ((0, True),), "os.rename": ((0, True), (1, True)),
               "os.link": ((0, True), (1, True)), "os.symlink": ((0, True), (1, True)),
               "os.truncate": ((0, True),), "os.chmod": ((0, True),), "os.utime": ((0, True),),
               "os.chflags": ((0, True),), "os.setxattr": ((0, True),),
               "os.removexattr": ((0, True),), "os.getxattr": ((0, False),),
               "os.listxattr": ((0, False),), "shutil.copyfile": ((0, False), (1, True)),
               "shutil.copymode": ((0, False), (1, True)),
               "shutil.copystat": ((0, False), (1, True)),
               "shutil.copytree": ((0, False), (1, True)), "shutil.move": ((0, True), (1, True)),
               "shutil.rmtree": ((0, True),), "shutil.make_archive": ((0, True),),
               "shutil.unpack_archive": ((0, False), (1, True)), "glob.glob": ((0, False),),
               "glob.glob/2": ((0, False), (2, False)), "sqlite3.connect": ((0, True),)}
# Run as root, the program is locked into its directory (chroot) as the user nobody: the
# standard library is then out of reach, so these modules are imported before (the ones a
# short program needs); any other import fails as a missing module.
PREIMPORTED = ("math", "cmath", "re", "json", "itertools", "functools", "collections",
               "heapq", "bisect", "random", "string", "statistics", "fractions", "decimal",
               "operator", "copy", "dataclasses", "typing", "textwrap", "datetime", "array",
               "enum", "numbers", "struct", "encodings.latin_1", "encodings.ascii",
               "encodings.utf_8", "traceback")

# The child's first lines: set its limits, read the program, install the hook (as root:
# lock itself into its directory as nobody), run the program, and write the one status
# line on fd 2 (the program's own stderr goes to its output).
_BOOTSTRAP = r"""
import sys
def _sandbox(blocked_modules, blocked_events, path_events, preimported, cpu, memory, drop_to):
    import os, resource, sysconfig, traceback
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    resource.setrlimit(resource.RLIMIT_NOFILE, (32, 32))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    code = sys.stdin.read()
    work = os.path.realpath(os.getcwd())
    if drop_to is not None:
        import importlib
        for name in preimported:
            importlib.import_module(name)
        os.chroot(work)
        os.chdir("/")
        resource.setrlimit(resource.RLIMIT_NPROC, (16, 16))
        os.setgroups([])
        os.setgid(drop_to)
        os.setuid(drop_to)
        work, readable = "/", ("/",)
    else:
        paths = sysconfig.get_paths()
        roots = {os.path.realpath(p) for p in (paths["stdlib"], paths["platstdlib"]) if p}
        roots.update(os.path.realpath(p) for p in sys.path if p and os.path.isdir(p))
        readable = tuple(sorted(roots)) + (work,)
    flags_written = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    realpath, fspath, isinstance_ = os.path.realpath, os.fspath, isinstance
    state = {"inside": False}

    class Blocked(PermissionError):
        pass

    def under(path, roots):
        return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)

    def check_path(event, path, written):
        if isinstance_(path, int) or path is None:
            return  # an open file descriptor (only the pipes are open)
        path = fspath(path)
        if isinstance_(path, bytes):
            path = path.decode("utf-8", "surrogateescape")
        if not under(realpath(path), (work,) if written else readable):
            raise Blocked(f"blocked: {event} {'writes' if written else 'reads'} {path!r} "
                          f"outside the sandbox's directory")

    def hook(event, args):
        if state["inside"]:
            return
        state["inside"] = True
        try:
            if event == "import":
                name = args[0] or ""
                if any(name == m or name.startswith(m + ".") for m in blocked_modules):
                    raise Blocked(f"blocked: import {name} is not allowed in the sandbox")
            elif any(event == e or (e.endswith(".") and event.startswith(e))
                     for e in blocked_events):
                raise Blocked(f"blocked: {event} is not allowed in the sandbox")
            elif event == "open":
                path, mode, flags = (tuple(args) + (None, None))[:3]
                written = (isinstance_(mode, str) and any(c in mode for c in "wax+")) or \
                    (isinstance_(flags, int) and bool(flags & flags_written))
                check_path("open", path, written)
            elif event in path_events:
                for index, written in path_events[event]:
                    if index < len(args):
                        check_path(event, args[index], written)
        finally:
            state["inside"] = False

    sys.stderr = sys.stdout  # the program's errors are part of its output
    sys.addaudithook(hook)
    status = ""
    try:
        exec(compile(code, "<program>", "exec"), {"__name__": "__main__",
                                                   "__builtins__": __builtins__})
    except Blocked as err:
        status = str(err)
    except MemoryError:
        status = "memory: over the sandbox's memory limit"
    except SystemExit as err:
        if err.code not in (None, 0):
            status = f"error: SystemExit: {err.code}"
    except BaseException as err:
        cause = err
        while cause is not None and not isinstance_(cause, Blocked):
            cause = cause.__context__
        if cause is not None:
            status = str(cause)
        else:
            frames = [f for f in traceback.extract_tb(err.__traceback__)
                      if f.filename == "<program>"]
            line = f" (line {frames[-1].lineno})" if frames else ""
            message = str(err).splitlines()[0] if str(err) else ""
            status = f"error: {type(err).__name__}: {message}"[:240] + line
    try:
        sys.stdout.flush()
    except BaseException:
        pass
    os.write(2, (status.replace("\n", " ") + "\n").encode("utf-8", "replace"))
    os._exit(0)
"""


def python_tool(code: str) -> str:
    """The `python` tool (`<python>print(2 ** 10)</python>`): the code run in the sandbox
    with a 1 s deadline and 256 MB; its output (150 characters at most) followed by the
    line naming what stopped it, if anything did."""
    return run_python(code, deadline_seconds=1.0, max_output_chars=150).observation


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """What a program wrote (stdout and stderr, cut to the cap) and, when it did not run to
    its end, the one line naming what stopped it (None when it did)."""

    output: str
    stopped: str | None
    seconds: float

    @property
    def observation(self) -> str:
        """The tool's answer: the output, or the output followed by the stop line."""
        if self.stopped is None:
            return self.output
        return (self.output + ("\n" if self.output and not self.output.endswith("\n")
                               else "") + self.stopped)


def run_python(code: str, *, deadline_seconds: float = DEADLINE_SECONDS,
               memory_mb: int = MEMORY_MB, max_output_chars: int = MAX_OUTPUT_CHARS,
               lock_in: bool | None = None) -> SandboxResult:
    """Runs `code` in a sandbox process (module docstring) and returns its output, cut to
    `max_output_chars`, with the line naming what stopped it, within `deadline_seconds` plus
    half a second.

    Args:
      lock_in: lock the program into its directory as the user nobody (chroot); needs root.
        None: when the trainer runs as root. False: the audit hook and the limits only.
    """
    if not isinstance(code, str):
        raise TypeError(f"run_python: code must be a str, got {type(code).__name__}")
    if not deadline_seconds > 0 or memory_mb < 32 or max_output_chars < 1:
        raise ValueError("run_python: deadline_seconds > 0, memory_mb >= 32 and "
                         "max_output_chars >= 1 are needed")
    start = time.monotonic()
    work = tempfile.mkdtemp(prefix="grpo_sandbox_")
    if lock_in is None:
        lock_in = os.geteuid() == 0
    if lock_in and os.geteuid() != 0:
        raise ValueError("run_python: lock_in needs root (chroot and a change of user)")
    drop_to = NOBODY if lock_in else None
    try:
        if drop_to is not None:
            os.chown(work, drop_to, drop_to)
        env = {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8",
               "PYTHONIOENCODING": "utf-8"}
        cpu = max(1, math.ceil(deadline_seconds))
        launch = (f"{_BOOTSTRAP}\n_sandbox({BLOCKED_MODULES!r}, {BLOCKED_EVENTS!r}, "
                  f"{PATH_EVENTS!r}, {PREIMPORTED!r}, {cpu}, {memory_mb << 20}, {drop_to!r})\n")
        process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", "-c", launch], cwd=work, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            close_fds=True, start_new_session=True)
        output, status, stopped = _collect(process, code, start, deadline_seconds,
                                           max_output_chars)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = output.decode("utf-8", "replace")[:max_output_chars]
    if stopped is None:
        line = status.decode("utf-8", "replace").strip().splitlines()
        stopped = line[-1] if line and line[-1] else None
        if stopped is None and process.returncode:
            stopped = _signal_line(process.returncode, memory_mb)
    return SandboxResult(output=text, stopped=stopped, seconds=time.monotonic() - start)


def _signal_line(returncode: int, memory_mb: int) -> str:
    if returncode < 0:
        number = -returncode
        if number == signal.SIGXCPU or number == signal.SIGKILL:
            return "timeout: the CPU-time limit was reached"
        if number == signal.SIGSEGV:
            return (f"killed: SIGSEGV (a crash, or memory past the sandbox's {memory_mb} MB "
                    "limit)")
        return f"killed: {signal.Signals(number).name}"
    return f"error: the interpreter exited with status {returncode}"


def _kill(process) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.kill()


def _collect(process, code: str, start: float, deadline_seconds: float, cap: int):
    """(stdout bytes, status bytes, the stop line of what the parent stopped, or None):
    writes the program, reads both pipes until they close, the deadline passes or the
    output passes the cap; the process group is killed in the last two cases."""
    try:
        process.stdin.write(code.encode("utf-8", "surrogatepass"))
        process.stdin.close()
    except (BrokenPipeError, OSError):
        pass
    output, status = bytearray(), bytearray()
    stopped = None
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ, output)
    selector.register(process.stderr, selectors.EVENT_READ, status)
    open_pipes = 2
    # the deadline counts from the program's start (the interpreter's start is not its)
    deadline = start + deadline_seconds + 0.5
    while open_pipes:
        left = deadline - time.monotonic()
        if left <= 0:
            stopped = f"timeout: no result within {deadline_seconds:g} s"
            break
        for item, _ in selector.select(timeout=left):
            chunk = os.read(item.fileobj.fileno(), 65536)
            if not chunk:
                selector.unregister(item.fileobj)
                open_pipes -= 1
                continue
            item.data.extend(chunk)
            if len(output) > cap * 4 or len(status) > 4096:
                stopped = f"output: more than {cap} characters"
                break
        if stopped:
            break
    selector.close()
    if stopped:
        _kill(process)
    try:
        process.wait(timeout=max(deadline - time.monotonic(), 0) + 1.0)
    except subprocess.TimeoutExpired:
        _kill(process)
        process.wait()
        stopped = stopped or f"timeout: no result within {deadline_seconds:g} s"
    _kill(process)  # anything the program left in its group
    if stopped is None and len(output.decode("utf-8", "replace")) > cap:
        stopped = f"output: more than {cap} characters"
    return bytes(output), bytes(status), stopped


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m grpo_jax.tools.sandbox",
        description="Runs the Python program on stdin in the sandbox; prints its output, or "
                    "one line naming what stopped it. Exit status 0 when it ran to its end.")
    parser.add_argument("--deadline_seconds", type=float, default=DEADLINE_SECONDS)
    parser.add_argument("--memory_mb", type=int, default=MEMORY_MB)
    parser.add_argument("--max_output_chars", type=int, default=MAX_OUTPUT_CHARS)
    args = parser.parse_args(argv)
    result = run_python(sys.stdin.read(), deadline_seconds=args.deadline_seconds,
                        memory_mb=args.memory_mb, max_output_chars=args.max_output_chars)
    sys.stdout.write(result.output)
    if result.stopped is not None:
        if result.output and not result.output.endswith("\n"):
            sys.stdout.write("\n")
        sys.stdout.write(result.stopped + "\n")
    return 0 if result.stopped is None else 1


if __name__ == "__main__":
    sys.exit(main())
