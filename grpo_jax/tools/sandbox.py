"""Run untrusted Python (a policy's code) in a sandbox process, never in the trainer.

    result = run_python("print(2 ** 10)", deadline_seconds=2.0)
    result.output, result.stopped      # "1024\\n", None

    python -m grpo_jax.tools.sandbox --deadline_seconds=2 < code.py

Isolation comes from the operating system, not from Python (`isolation="bwrap"`, the
default): each program runs in a fresh interpreter (`python -I -S`) under bubblewrap
(`bwrap`, Debian package `bubblewrap`) with

* new user, PID, network, IPC, UTS and mount namespaces, as the user nobody with no
  capabilities and no further user namespaces; `--die-with-parent`. The program's PID
  namespace holds only it and its descendants, so it can signal, renice or trace nothing
  of the trainer's, and every descendant dies with the call (the namespace's init exits);
* a file system of its own: the interpreter and standard library read-only (their
  site-packages hidden), /usr read-only, a fresh /proc and minimal /dev, a private
  writable directory on a tmpfs of `disk_mb` (the total bytes a call can write; nothing
  reaches the trainer's disk, so nothing is left behind whatever the program does), and
  no view of the trainer's files, environment (five variables: PATH, HOME, TMPDIR, LANG,
  PYTHONIOENCODING) or open files;
* a seccomp filter (libseccomp through `pyseccomp`) refusing what no sandboxed program
  needs (`DENIED_SYSCALLS`: new processes (fork; a thread's clone is allowed), ptrace,
  pidfd, setpriority and affinity, mknod, mount, keyctl, bpf, perf, namespaces, ...);
* resource limits set before the program's first line: CPU seconds (the deadline's),
  address space (memory_mb), file size (1 MiB), open files, processes, no core files;
* an audit hook (PEP 578) as a second wall: it refuses new processes, signals, sockets,
  ctypes and the modules that reach around it (`BLOCKED_MODULES`), and reads or writes
  outside the standard library and the program's directory. CPython documents the hook as
  no security boundary, and it is not one here: a program can switch it off, and the
  namespaces and the filter above still hold (tests/test_sandbox.py does both);
* a wall deadline enforced from outside: at the deadline plus half a second the sandbox is
  killed with SIGKILL (a handler that ignores SIGTERM changes nothing), as soon as the
  output passes its cap too.

Where bubblewrap is missing or cannot make namespaces, `check_isolation` (run at a job's
start when it uses the sandbox) and `run_python` refuse with one line saying how to
install it. `isolation="audit_hook"` (config `sandbox.isolation`) is the weaker mode, taken
only when asked for and logged as such: the hook and the limits in a temporary directory,
and as root a chroot into it as nobody; a program that knows the interpreter's internals
gets around the hook there.

What stopped a program is one line (`SandboxResult.stopped`) that the trainer writes from
its own observations (the exit status, the clock, the output's size), so a program cannot
forge it: "timeout: ...", "memory: ...", "blocked: ...", "output: ...", "error: ..." or
"killed: ...". Only the detail after "blocked:" and "error:" (the refused action, the
exception and its line) is the child's report.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import glob
import logging
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings

if __name__ == "grpo_jax.tools.sandbox" and sys.argv[:1] == ["-m"]:
    # `python -m grpo_jax.tools.sandbox`: the package grpo_jax.tools imports this module
    # before runpy runs it as __main__ (sys.argv[0] is "-m" meanwhile), which runpy would
    # report as a RuntimeWarning on every call; the two copies share no state that matters.
    warnings.filterwarnings("ignore", category=RuntimeWarning,
                            message=r"'grpo_jax\.tools\.sandbox' found in sys\.modules")

# The first words of the line that says what stopped a program.
STOP_PREFIXES = ("timeout:", "memory:", "blocked:", "output:", "error:", "killed:")
ISOLATIONS = ("bwrap", "audit_hook")
DEADLINE_SECONDS = 2.0
MEMORY_MB = 256
DISK_MB = 16
MAX_OUTPUT_CHARS = 2000
MAX_PROCESSES = 32  # processes and threads of one program (the PID namespace's)
NOBODY = 65534
# The sandbox's directory, inside its mount namespace.
WORK_DIR = "/sandbox"
# The child's exit statuses the parent reads as "blocked", "memory" and "error" (others:
# a signal, a status of the program's own).
EXIT_BLOCKED, EXIT_MEMORY, EXIT_ERROR = 70, 71, 72
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf "
                "install bubblewrap) and allow user namespaces (sysctl "
                "kernel.unprivileged_userns_clone=1 where the kernel has it), or set "
                "--config.sandbox.isolation=audit_hook for the weaker, hook-only sandbox")

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
# System calls the seccomp filter refuses (EPERM): new processes (fork, vfork, and clone
# except for a thread: as root the process limit does not hold, since the sandbox's user
# maps to root outside), tracing and reaching other processes, scheduling, device nodes
# and mounts, the kernel's keyrings, BPF and perf, namespaces, modules, clocks. Names the
# machine's architecture lacks are skipped.
DENIED_SYSCALLS = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_open",
    "pidfd_send_signal", "pidfd_getfd", "setpriority", "sched_setaffinity",
    "sched_setscheduler", "sched_setparam", "sched_setattr", "ioprio_set", "mknod", "mknodat",
    "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsmount",
    "fsconfig", "fspick", "mount_setattr", "keyctl", "add_key", "request_key", "bpf",
    "perf_event_open", "unshare", "setns", "userfaultfd", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module", "reboot", "swapon", "swapoff", "acct",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "syslog", "io_uring_setup",
    "io_uring_enter", "io_uring_register", "open_by_handle_at", "name_to_handle_at",
    "quotactl", "lookup_dcookie", "iopl", "ioperm", "vhangup", "personality", "fork", "vfork")
_CLONE_THREAD = 0x00010000
# clone() flags that make new namespaces (clone3 answers ENOSYS, so the C library falls
# back to clone, whose flags the filter can read).
_CLONE_NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000,
                          0x20000000, 0x40000000, 0x00000080)
# Run as root in the audit_hook mode, the program is locked into its directory (chroot) as
# the user nobody: the standard library is then out of reach, so these modules are imported
# before (the ones a short program needs); any other import fails as a missing module.
PREIMPORTED = ("math", "cmath", "re", "json", "itertools", "functools", "collections",
               "heapq", "bisect", "random", "string", "statistics", "fractions", "decimal",
               "operator", "copy", "dataclasses", "typing", "textwrap", "datetime", "array",
               "enum", "numbers", "struct", "encodings.latin_1", "encodings.ascii",
               "encodings.utf_8", "traceback")
_TEMP_PREFIX = "grpo_sandbox_"
_settings = {"isolation": "bwrap"}
_lock = threading.Lock()
_collected = []  # whether this process has collected stale directories

# The child's first lines: set its limits, read the program, install the hook (audit_hook
# mode as root: lock itself into its directory as nobody), run the program, write the detail
# of what stopped it on the status descriptor and exit with a status that says which kind.
_BOOTSTRAP = r"""
import sys
def _sandbox(blocked_modules, blocked_events, path_events, preimported, cpu, memory, nproc,
             drop_to, status_fd):
    import os, resource, sysconfig, traceback
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    resource.setrlimit(resource.RLIMIT_NOFILE, (32, 32))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    code = sys.stdin.read()
    os.environ.pop("PWD", None)  # bubblewrap's; the program gets the five variables only
    work = os.path.realpath(os.getcwd())
    if drop_to is not None:
        import importlib
        for name in preimported:
            importlib.import_module(name)
        os.chroot(work)
        os.chdir("/")
        os.setgroups([])
        os.setgid(drop_to)
        os.setuid(drop_to)
        work, readable = "/", ("/",)
    else:
        paths = sysconfig.get_paths()
        roots = {os.path.realpath(p) for p in (paths["stdlib"], paths["platstdlib"]) if p}
        roots.update(os.path.realpath(p) for p in sys.path if p and os.path.isdir(p))
        readable = tuple(sorted(roots)) + (work,)
    if nproc:
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
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
            raise Blocked(f"{event} {'writes' if written else 'reads'} {path!r} "
                          f"outside the sandbox's directory")

    def hook(event, args):
        if state["inside"]:
            return
        state["inside"] = True
        try:
            if event == "import":
                name = args[0] or ""
                if any(name == m or name.startswith(m + ".") for m in blocked_modules):
                    raise Blocked(f"import {name} is not allowed in the sandbox")
            elif any(event == e or (e.endswith(".") and event.startswith(e))
                     for e in blocked_events):
                raise Blocked(f"{event} is not allowed in the sandbox")
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

    os.dup2(1, 2)  # the program's errors are part of its output, at the descriptor too
    sys.stderr = sys.stdout
    sys.addaudithook(hook)
    status, exit_code = "", 0
    try:
        exec(compile(code, "<program>", "exec"), {"__name__": "__main__",
                                                   "__builtins__": __builtins__})
    except Blocked as err:
        status, exit_code = str(err), EXIT_BLOCKED
    except MemoryError:
        exit_code = EXIT_MEMORY
    except SystemExit as err:
        if err.code not in (None, 0):
            status, exit_code = f"SystemExit: {err.code}", EXIT_ERROR
    except BaseException as err:
        cause = err
        while cause is not None and not isinstance_(cause, Blocked):
            cause = cause.__context__
        if cause is not None:
            status, exit_code = str(cause), EXIT_BLOCKED
        else:
            frames = [f for f in traceback.extract_tb(err.__traceback__)
                      if f.filename == "<program>"]
            line = f" (line {frames[-1].lineno})" if frames else ""
            message = str(err).splitlines()[0] if str(err) else ""
            status, exit_code = f"{type(err).__name__}: {message}"[:240] + line, EXIT_ERROR
    try:
        sys.stdout.flush()
    except BaseException:
        pass
    try:
        os.write(status_fd, status.replace("\n", " ").encode("utf-8", "replace")[:4000])
    except OSError:
        pass
    os._exit(exit_code)
"""


class SandboxUnavailable(RuntimeError):
    """The requested isolation cannot run on this machine (its message says how to fix it)."""


def configure_sandbox(*, isolation: str) -> None:
    """Sets the process's isolation (config `sandbox.isolation`): "bwrap" (the default) or
    "audit_hook" (weaker; logged)."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"sandbox.isolation: expected one of {list(ISOLATIONS)}, got "
                         f"{isolation!r}")
    if isolation == "audit_hook" and _settings["isolation"] != isolation:
        logging.warning("sandbox: isolation=audit_hook: code runs under the audit hook and "
                        "limits only (no namespaces, no seccomp); a program that knows the "
                        "interpreter's internals can get around it")
    _settings["isolation"] = isolation


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


@functools.lru_cache(maxsize=1)
def _seccomp_program() -> bytes:
    """The seccomp filter as a BPF program (bubblewrap's --seccomp), compiled once."""
    try:
        import pyseccomp
    except (ImportError, OSError) as err:
        raise SandboxUnavailable(f"sandbox: the seccomp filter needs pyseccomp and "
                                 f"libseccomp ({err}); pip install pyseccomp") from None
    deny = pyseccomp.ERRNO(1)  # EPERM
    program = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    for name in DENIED_SYSCALLS:
        try:
            program.add_rule(deny, name)
        except (RuntimeError, ValueError, OSError):
            pass  # not a system call of this architecture
    program.add_rule(pyseccomp.ERRNO(38), "clone3")  # ENOSYS: the C library uses clone
    for flag in _CLONE_NAMESPACE_FLAGS:
        program.add_rule(deny, "clone", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, flag, flag))
    # no new process at all: a clone that is not a thread (fork's) is refused
    program.add_rule(deny, "clone", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, _CLONE_THREAD, 0))
    with tempfile.TemporaryFile() as file:
        program.export_bpf(file)
        file.seek(0)
        return file.read()


def _interpreter() -> str:
    return os.path.realpath(sys.executable)


def _bwrap_command(seccomp_fd: int, disk_mb: int) -> list[str]:
    """bubblewrap's arguments before the interpreter's (module docstring)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(f"sandbox: bubblewrap (bwrap) is not installed: "
                                 f"{INSTALL_HINT}")
    command = [bwrap, "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc",
               "--unshare-uts", "--unshare-cgroup-try", "--disable-userns",
               "--die-with-parent", "--new-session", "--cap-drop", "ALL",
               "--uid", str(NOBODY), "--gid", str(NOBODY), "--hostname", "sandbox",
               "--ro-bind", "/usr", "/usr"]
    for path in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(path):
            command += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            command += ["--ro-bind", path, path]
    prefix = os.path.realpath(sys.base_prefix)
    bound = ["/usr"]
    if not prefix.startswith("/usr/"):
        command += ["--ro-bind", prefix, prefix]
        bound.append(prefix)
    interpreter = _interpreter()
    if not any(interpreter.startswith(root + "/") for root in bound):
        command += ["--ro-bind", interpreter, interpreter]
    # the base interpreter's site-packages (installed packages) are not the program's
    for site in glob.glob(os.path.join(prefix, "lib", "python3*", "site-packages")):
        command += ["--tmpfs", site]
    command += ["--proc", "/proc", "--dev", "/dev",
                "--size", str(disk_mb << 20), "--perms", "0700", "--tmpfs", WORK_DIR,
                "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", WORK_DIR,
                "--clearenv"]
    for name, value in _environment(WORK_DIR).items():
        command += ["--setenv", name, value]
    return command + ["--seccomp", str(seccomp_fd)]


def _environment(work: str) -> dict:
    return {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8",
            "PYTHONIOENCODING": "utf-8"}


_BWRAP_WORKS: list = []  # the probe's verdict, once it has one


def _bwrap_works() -> str | None:
    """None when a bubblewrap sandbox starts here, else the one line that says why not.
    A definite answer is kept for the process; a probe that only ran out of time (a
    machine under load) is not, and is tried again at the next call."""
    if _BWRAP_WORKS:
        return _BWRAP_WORKS[0]
    try:
        result = _run("import sys", 30.0, MEMORY_MB, 16, DISK_MB, "bwrap")
    except SandboxUnavailable as err:
        _BWRAP_WORKS.append(str(err))
        return str(err)
    if result.stopped is None:
        _BWRAP_WORKS.append(None)
        return None
    reason = (f"sandbox: bubblewrap cannot start a sandbox here ({result.stopped}): "
              f"{INSTALL_HINT}")
    if not result.stopped.startswith("timeout:"):
        _BWRAP_WORKS.append(reason)
    return reason


def check_isolation(isolation: str | None = None) -> None:
    """Raises SandboxUnavailable (one line, how to fix it) when `isolation` (default: the
    configured one) cannot run on this machine. A job that uses the sandbox calls this at
    its start, before anything is written."""
    isolation = _settings["isolation"] if isolation is None else isolation
    if isolation not in ISOLATIONS:
        raise ValueError(f"sandbox.isolation: expected one of {list(ISOLATIONS)}, got "
                         f"{isolation!r}")
    if isolation == "bwrap" and (reason := _bwrap_works()) is not None:
        raise SandboxUnavailable(reason)


def run_python(code: str, *, deadline_seconds: float = DEADLINE_SECONDS,
               memory_mb: int = MEMORY_MB, max_output_chars: int = MAX_OUTPUT_CHARS,
               disk_mb: int = DISK_MB, isolation: str | None = None) -> SandboxResult:
    """Runs `code` in a sandbox process (module docstring) and returns its output, cut to
    `max_output_chars`, with the line naming what stopped it, within `deadline_seconds` plus
    half a second.

    Args:
      disk_mb: the most the program may write in all (bwrap; audit_hook caps each file).
      isolation: "bwrap" or "audit_hook"; None: the configured one (`configure_sandbox`).

    Raises:
      SandboxUnavailable: bubblewrap is missing or cannot start (the message says how to
        install it), before the program runs.
    """
    if not isinstance(code, str):
        raise TypeError(f"run_python: code must be a str, got {type(code).__name__}")
    if not deadline_seconds > 0 or memory_mb < 32 or max_output_chars < 1 or disk_mb < 1:
        raise ValueError("run_python: deadline_seconds > 0, memory_mb >= 32, disk_mb >= 1 "
                         "and max_output_chars >= 1 are needed")
    isolation = _settings["isolation"] if isolation is None else isolation
    check_isolation(isolation)
    return _run(code, deadline_seconds, memory_mb, max_output_chars, disk_mb, isolation)


def _run(code, deadline_seconds, memory_mb, max_output_chars, disk_mb, isolation):
    start = time.monotonic()
    bwrap = isolation == "bwrap"
    cpu = max(1, math.ceil(deadline_seconds))
    status_read, status_write = os.pipe()
    passed = [status_write]
    work = None
    try:
        if bwrap:
            program = _seccomp_program()
            seccomp_read, seccomp_write = os.pipe()
            passed.append(seccomp_read)
            os.write(seccomp_write, program)  # well under a pipe's buffer
            os.close(seccomp_write)
            prefix, cwd, env, drop_to = _bwrap_command(seccomp_read, disk_mb), None, {}, None
            nproc = MAX_PROCESSES
        else:
            _collect_stale_directories()
            work = tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{os.getpid()}_")
            drop_to = NOBODY if os.geteuid() == 0 else None
            if drop_to is not None:
                os.chown(work, drop_to, drop_to)
            prefix, cwd, env = [], work, _environment(work)
            nproc = 16 if drop_to is not None else 0  # as non-root it would count the trainer's
        launch = (f"EXIT_BLOCKED, EXIT_MEMORY, EXIT_ERROR = {EXIT_BLOCKED}, {EXIT_MEMORY}, "
                  f"{EXIT_ERROR}\n{_BOOTSTRAP}\n_sandbox({BLOCKED_MODULES!r}, "
                  f"{BLOCKED_EVENTS!r}, {PATH_EVENTS!r}, {PREIMPORTED!r}, {cpu}, "
                  f"{memory_mb << 20}, {nproc}, {drop_to!r}, {status_write})\n")
        process = subprocess.Popen(
            prefix + [_interpreter(), "-I", "-S", "-B", "-c", launch], cwd=cwd, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            pass_fds=passed, start_new_session=True)
        for fd in passed:
            os.close(fd)
        passed = []
        output, status, errors, stopped = _collect(process, code, start, deadline_seconds,
                                                   max_output_chars, status_read)
    finally:
        for fd in passed + [status_read]:
            try:
                os.close(fd)
            except OSError:
                pass
        if work is not None:
            _remove_tree(work)
    text = output.decode("utf-8", "replace")[:max_output_chars]
    if stopped is None:
        stopped = _stop_line(process.returncode, status, errors, memory_mb, bwrap)
    return SandboxResult(output=text, stopped=stopped, seconds=time.monotonic() - start)


def _stop_line(returncode: int, status: bytes, errors: bytes, memory_mb: int,
               bwrap: bool) -> str | None:
    """The stop line from the exit status (the kind) and the child's report (the detail)."""
    if returncode == 0:
        return None
    detail = status.decode("utf-8", "replace").replace("\n", " ").strip()[:300]
    if returncode == EXIT_BLOCKED:
        return f"blocked: {detail or 'refused by the sandbox'}"
    if returncode == EXIT_MEMORY:
        return "memory: over the sandbox's memory limit"
    if returncode == EXIT_ERROR:
        return f"error: {detail or 'the program failed'}"
    if bwrap and returncode > 128:  # bubblewrap's status for a child killed by a signal
        returncode = 128 - returncode
    if returncode < 0:
        return _signal_line(returncode, memory_mb)
    message = errors.decode("utf-8", "replace").strip().splitlines()
    if bwrap and message and message[-1].startswith("bwrap:"):
        return f"error: the sandbox did not start ({message[-1][:200]})"
    return f"error: the program exited with status {returncode}"


def _signal_line(returncode: int, memory_mb: int) -> str:
    number = -returncode
    if number == signal.SIGXCPU or number == signal.SIGKILL:
        return "timeout: the CPU-time limit was reached"
    if number == signal.SIGSEGV:
        return f"killed: SIGSEGV (a crash, or memory past the sandbox's {memory_mb} MB limit)"
    try:
        return f"killed: {signal.Signals(number).name}"
    except ValueError:
        return f"killed: signal {number}"


def _kill(process) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.kill()


def _collect(process, code: str, start: float, deadline_seconds: float, cap: int,
             status_fd: int):
    """(stdout, status, stderr bytes, the stop line of what the parent stopped or None):
    writes the program, reads the pipes until they close, the deadline passes or the
    output passes the cap; the sandbox is killed in the last two cases."""
    try:
        process.stdin.write(code.encode("utf-8", "surrogatepass"))
        process.stdin.close()
    except (BrokenPipeError, OSError):
        pass
    output, status, errors = bytearray(), bytearray(), bytearray()
    stopped = None
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ, output)
    selector.register(process.stderr, selectors.EVENT_READ, errors)
    selector.register(status_fd, selectors.EVENT_READ, status)
    open_pipes = 3
    # the deadline counts from the program's start (the interpreter's start is not its)
    deadline = start + deadline_seconds + 0.5
    while open_pipes:
        left = deadline - time.monotonic()
        if left <= 0:
            stopped = f"timeout: no result within {deadline_seconds:g} s"
            break
        for item, _ in selector.select(timeout=left):
            fd = item.fileobj if isinstance(item.fileobj, int) else item.fileobj.fileno()
            chunk = os.read(fd, 65536)
            if not chunk:
                selector.unregister(item.fileobj)
                open_pipes -= 1
                continue
            item.data.extend(chunk)
            if len(output) > cap * 4 or len(status) > 4096 or len(errors) > 4096:
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
    return bytes(output), bytes(status), bytes(errors), stopped


def _remove_tree(path: str) -> None:
    """Removes a directory the program may have made unreadable (chmod 000 inside it)."""
    def make_writable(directory):
        try:
            os.chmod(directory, 0o700)
            with os.scandir(directory) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        make_writable(entry.path)
        except OSError:
            pass

    make_writable(path)
    shutil.rmtree(path, ignore_errors=True)


def _collect_stale_directories() -> None:
    """Removes the audit_hook mode's directories of trainers that died mid-call, once per
    process (a directory's name holds its trainer's PID)."""
    with _lock:
        if _collected:
            return
        _collected.append(True)
    for path in glob.glob(os.path.join(tempfile.gettempdir(), _TEMP_PREFIX + "*")):
        owner = os.path.basename(path)[len(_TEMP_PREFIX):].split("_")[0]
        if not owner.isdigit():
            continue
        try:
            os.kill(int(owner), 0)
            continue  # its trainer is alive
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        _remove_tree(path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m grpo_jax.tools.sandbox",
        description="Runs the Python program on stdin in the sandbox; prints its output, or "
                    "one line naming what stopped it. Exit status 0 when it ran to its end.")
    parser.add_argument("--deadline_seconds", type=float, default=DEADLINE_SECONDS)
    parser.add_argument("--memory_mb", type=int, default=MEMORY_MB)
    parser.add_argument("--max_output_chars", type=int, default=MAX_OUTPUT_CHARS)
    parser.add_argument("--isolation", choices=ISOLATIONS, default="bwrap")
    args = parser.parse_args(argv)
    try:
        result = run_python(sys.stdin.read(), deadline_seconds=args.deadline_seconds,
                            memory_mb=args.memory_mb, max_output_chars=args.max_output_chars,
                            isolation=args.isolation)
    except SandboxUnavailable as err:
        print(err, file=sys.stderr)
        return 2
    sys.stdout.write(result.output)
    if result.stopped is not None:
        if result.output and not result.output.endswith("\n"):
            sys.stdout.write("\n")
        sys.stdout.write(result.stopped + "\n")
    return 0 if result.stopped is None else 1


if __name__ == "__main__":
    sys.exit(main())
