"""The Python sandbox (`tools.sandbox`): a hostile corpus, each program stopped with one
line within its deadline (plus a second) and nothing escaping (no file written outside its
directory, no secret read, no process left behind); benign programs run; the command line."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from grpo_jax.tools import sandbox
from grpo_jax.tools.sandbox import run_python

DEADLINE = 0.5
ROOT = os.geteuid() == 0
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = "{mark}"  # replaced by a path outside the sandbox that must never be written

# name -> (program, the start of the line that stops it)
HOSTILE = {
    "fork_bomb": ("import os\nwhile True:\n    os.fork()\n", "blocked: os.fork"),
    "infinite_loop": ("while True:\n    pass\n", "timeout:"),
    "sleep_forever": ("import time\ntime.sleep(100)\n", "timeout:"),
    "ignores_sigterm": ("import _signal, time\n_signal.signal(15, _signal.SIG_IGN)\n"
                        "while True:\n    time.sleep(0.01)\n", "timeout:"),
    "memory_bomb": ("x = 'a' * (10 ** 10)\n", "memory:"),
    "memory_growth": ("x = []\nwhile True:\n    x.append([0] * 10 ** 6)\n", "memory:"),
    "os_system": (f"import os\nos.system('echo pwned > {MARK}')\n", "blocked: os.system"),
    "subprocess": (f"import subprocess\nsubprocess.run(['sh', '-c', 'echo pwned > {MARK}'])\n",
                   ""),  # no subprocess module (locked in) or blocked (_posixsubprocess)
    "posix_spawn": (f"import os\nos.posix_spawn('/bin/sh', ['sh', '-c', 'echo x > {MARK}'], "
                    "{})\n", "blocked: os.posix_spawn"),
    "exec": (f"import os\nos.execv('/bin/sh', ['sh', '-c', 'echo x > {MARK}'])\n",
             "blocked: os.exec"),
    "socket": ("import socket\nsocket.socket().connect(('127.0.0.1', 22))\n",
               "blocked: import socket"),
    "ctypes": (f"import ctypes\nctypes.CDLL(None).system(b'echo x > {MARK}')\n",
               "blocked: import ctypes"),
    "kill_the_trainer": ("import os\nos.kill(os.getppid(), 9)\n", "blocked: os.kill"),
    "read_etc_passwd": ("print(open('/etc/passwd').read())\n", ""),
    "read_trainer_files": (f"print(open({os.path.join(REPO, 'setup.py')!r}).read())\n", ""),
    "list_trainer_files": (f"import os\nprint(os.listdir({REPO!r}))\n", ""),
    "write_outside": (f"open('{MARK}', 'w').write('x')\n", ""),
    "symlink_out": ("import os\nos.symlink('/etc/passwd', 'l')\nprint(open('l').read())\n", ""),
    "huge_output": ("while True:\n    print('x' * 1000)\n", "output: more than"),
    "one_huge_print": ("print('y' * 10 ** 6)\n", "output: more than"),
    "huge_file": ("open('big', 'wb').write(b'0' * (10 ** 8))\n", "error: OSError"),
    "threads": ("import _thread\nfor _ in range(10000):\n"
                "    _thread.start_new_thread(lambda: [None for _ in iter(int, 1)], ())\n",
                ""),  # stopped by the process limit or the CPU time
    "recursion": ("def f():\n    return f()\nf()\n", "error: RecursionError"),
}
# Gets around the audit hook (a fresh posix module from the importer's internals): only
# the lock-in (chroot, user nobody) stops it, which is why the trainer runs it as root.
AROUND_THE_HOOK = (f"import sys\nm = sys.modules['_imp'].create_builtin("
                   f"type('S', (), {{'name': 'posix'}})())\nm.mkfifo('{MARK}')\n")
SECRETS = ("root:", "setup(", "grpo_jax")


def _modes():
    return [pytest.param(True, id="locked_in", marks=pytest.mark.skipif(
        not ROOT, reason="locking in needs root")), pytest.param(False, id="hook_only")]


@pytest.mark.parametrize("lock_in", _modes())
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_program_is_stopped_with_one_line_and_nothing_escapes(name, lock_in,
                                                                          tmp_path):
    program, expected = HOSTILE[name]
    mark = tmp_path / "pwned"
    start = time.monotonic()
    result = run_python(program.replace(MARK, str(mark)), deadline_seconds=DEADLINE,
                        lock_in=lock_in)
    assert time.monotonic() - start <= DEADLINE + 1.0
    assert result.stopped is not None and "\n" not in result.stopped, result
    assert result.stopped.startswith(expected), result.stopped
    assert not mark.exists()
    assert not any(secret in result.output for secret in SECRETS), result.output[:200]


@pytest.mark.skipif(not ROOT, reason="locking in needs root")
def test_locked_in_even_a_program_around_the_audit_hook_cannot_write_outside(tmp_path):
    mark = tmp_path / "pwned"
    result = run_python(AROUND_THE_HOOK.replace(MARK, str(mark)), deadline_seconds=DEADLINE,
                        lock_in=True)
    assert result.stopped is not None and not mark.exists()


def test_no_process_is_left_behind(tmp_path):
    result = run_python("import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(60)\n",
                        deadline_seconds=DEADLINE)
    assert result.stopped.startswith("timeout:")
    pid = int(result.output.split()[0])
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.parametrize("lock_in", _modes())
def test_benign_programs_run(lock_in):
    ok = run_python("import math, json, collections\nprint(math.factorial(10))\n"
                    "print(json.dumps(collections.Counter('abca').most_common(1)))\n",
                    lock_in=lock_in)
    assert (ok.output, ok.stopped) == ('3628800\n[["a", 2]]\n', None)
    files = run_python("open('a.txt', 'w').write('hi')\nprint(open('a.txt').read())\n",
                       lock_in=lock_in)
    assert (files.output, files.stopped) == ("hi\n", None)
    env = run_python("import os\nprint(sorted(os.environ))\n", lock_in=lock_in)
    assert env.output == "['HOME', 'LANG', 'PATH', 'PYTHONIOENCODING', 'TMPDIR']\n"
    fds = run_python("import os\nopen_fds = []\nfor fd in range(3, 64):\n    try:\n"
                     "        os.fstat(fd)\n        open_fds.append(fd)\n"
                     "    except OSError:\n        pass\nprint(open_fds)\n", lock_in=lock_in)
    assert (fds.output, fds.stopped) == ("[]\n", None)  # nothing of the trainer's is open
    partial = run_python("print('before')\nraise ValueError('bad input')\n", lock_in=lock_in)
    assert partial.output == "before\n"
    assert partial.stopped == "error: ValueError: bad input (line 2)"
    assert partial.observation == "before\nerror: ValueError: bad input (line 2)"
    assert run_python("def (:\n").stopped.startswith("error: SyntaxError")


def test_the_command_line(tmp_path):
    command = [sys.executable, "-m", "grpo_jax.tools.sandbox", "--deadline_seconds=1"]
    done = subprocess.run(command, input="print(6 * 7)\n", capture_output=True, text=True,
                          cwd=REPO, timeout=30)
    assert (done.returncode, done.stdout) == (0, "42\n")
    start = time.monotonic()
    done = subprocess.run(command, input="while True:\n    pass\n", capture_output=True,
                          text=True, cwd=REPO, timeout=30)
    assert time.monotonic() - start <= 1.0 + 1.0 + 1.5  # our interpreter's own start too
    assert done.returncode == 1 and done.stdout.count("\n") == 1
    assert done.stdout.startswith("timeout:")


def test_bad_arguments():
    with pytest.raises(TypeError, match="code must be a str"):
        run_python(b"print(1)")
    with pytest.raises(ValueError, match="deadline_seconds > 0"):
        run_python("print(1)", deadline_seconds=0)
    assert sandbox.BLOCKED_MODULES and sandbox.BLOCKED_EVENTS


def test_the_python_tool_answers_a_turn_and_counts_stopped_programs_as_errors():
    from grpo_jax.tools import ToolEnvironment

    environment = ToolEnvironment(tool="python")
    assert environment.stop_text == "</python>"
    ok = environment("so <python>print(sum(i * i for i in range(10)))</python>")
    assert ok == "<result>285\n</result>" and not environment.is_error(ok)
    for code, line in (("import os; os.system('ls')", "blocked: os.system"),
                       ("while True: pass", "timeout:"), ("print(1/0)", "error: ZeroDiv")):
        observation = environment(f"<python>{code}</python>")
        assert line in observation and environment.is_error(observation), observation
    long = environment("<python>print('z' * 10000)</python>")
    assert "output: more than 150" in long and len(long) < 250
