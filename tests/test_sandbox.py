"""The Python sandbox (`tools.sandbox`): a hostile corpus, each program stopped with one
line within its deadline (plus a second) and nothing escaping (no file written outside its
directory, no secret read, no process left behind); benign programs run; the command line."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from grpo_jax.tools import sandbox
from grpo_jax.tools.sandbox import run_python

DEADLINE = 0.5
ROOT = os.geteuid() == 0
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS_SCRIPT = os.path.join(REPO, "tests", "sandbox_corpus.py")
SECRET = "grpo-secret-7f3a"
NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"
# Gets around the audit hook (a fresh posix module from the importer's internals): in the
# audit_hook mode only the lock-in (chroot, user nobody, as root) stops it.
AROUND_THE_HOOK = ("import sys\nm = sys.modules['_imp'].create_builtin("
                   "type('S', (), {'name': 'posix'})())\nm.mkfifo('{mark}')\n")


def _run_corpus(as_user: bool, tmp_path) -> list[dict]:
    """The corpus's results, run by a trainer process of its own (root, or the user nobody
    with the system's interpreter and copies of the sandbox module and pyseccomp)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GRPO_SECRET": SECRET}
    if as_user:
        import pyseccomp

        folder = tempfile.mkdtemp(prefix="grpo_corpus_")
        os.chmod(folder, 0o755)
        for path in (sandbox.__file__, CORPUS_SCRIPT, pyseccomp.__file__):
            shutil.copy(path, folder)
        marks = os.path.join(folder, "marks")
        os.mkdir(marks)
        os.chmod(marks, 0o777)
        command = [SYSTEM_PYTHON, os.path.join(folder, "sandbox_corpus.py"),
                   os.path.join(folder, "sandbox.py"), marks, str(DEADLINE)]
        extra = {"user": NOBODY, "group": NOBODY, "extra_groups": []}
    else:
        folder = None
        command = [sys.executable, CORPUS_SCRIPT, sandbox.__file__, str(marks), str(DEADLINE)]
        extra = {}
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=240,
                              **extra)
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-2000:]  # the trainer is alive to the end
    return [json.loads(line) for line in done.stdout.splitlines()]


def _corpus_users():
    user = pytest.mark.skipif(not ROOT or not os.path.exists(SYSTEM_PYTHON),
                              reason="running the corpus as another user needs root and "
                                     f"{SYSTEM_PYTHON}")
    return [pytest.param(False, id="as_root" if ROOT else "as_trainer_user"),
            pytest.param(True, id="as_unprivileged_user", marks=user)]


@pytest.mark.parametrize("as_user", _corpus_users())
def test_the_hostile_corpus_is_stopped_with_one_line_and_nothing_escapes(as_user, tmp_path):
    """Each program of tests/sandbox_corpus.py (the audit hook's refusals, and what goes
    around the hook: pidfd signals, renice, affinity, mknod, the hook switched off, then the
    trainer's environment, os.system, ctypes, sockets, fork + setsid + fork, a full disk)
    ends its call within its deadline plus a second (the short one where the clock stops
    it; `sandbox_corpus.deadline_of`), with one line naming why, nothing
    written outside, no secret read, no process left (by PID), and the trainer alive with
    its priority and affinity unchanged."""
    from sandbox_corpus import CORPUS

    results = _run_corpus(as_user, tmp_path)
    trainer = results.pop()["trainer"]
    assert trainer["before"] == trainer["after"]
    assert trainer["uid"] == (NOBODY if as_user else os.geteuid())
    assert sorted(r["name"] for r in results) == sorted(CORPUS)
    for r in results:
        assert r["seconds"] <= r["deadline"] + 1.0, r
        if r["expected"] is None:
            assert r["stopped"] is None, r
        else:
            assert r["stopped"] is not None and "\n" not in r["stopped"], r
            assert r["stopped"].startswith(r["expected"]), r
        assert not r["mark"] and not r["left"], r
        assert SECRET not in r["output"] and "root:" not in r["output"], r


def test_no_process_can_be_started_even_around_the_hook():
    """With the hook switched off, fork is refused by the seccomp filter (threads still
    run); nothing is left in /tmp or among the trainer's descendants."""
    from sandbox_corpus import HOOK_OFF

    before = set(_own_sandbox_dirs())
    code = (HOOK_OFF + "import os, threading\ntry:\n    os.fork()\nexcept PermissionError:\n"
            "    print('fork refused')\nt = threading.Thread(target=print, args=('thread',))\n"
            "t.start()\nt.join()\nos.mkdir('d')\nos.chmod('d', 0)\n")
    children = _descendants(os.getpid())
    result = run_python(code, deadline_seconds=DEADLINE, isolation="bwrap")
    assert (result.output, result.stopped) == ("fork refused\nthread\n", None)
    assert _descendants(os.getpid()) <= children
    assert set(_own_sandbox_dirs()) <= before


def _descendants(pid: int) -> set[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as file:
                parents[int(entry)] = int(file.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            pass
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found |= frontier
    return found


def test_a_program_cannot_forge_its_stop_line():
    forged = run_python("import os\nos.write(2, b'timeout: forged\\n')\n"
                        "print('error: also forged')\n")
    assert forged.stopped is None
    assert forged.output == "timeout: forged\nerror: also forged\n"
    exits = run_python("import os\nos._exit(3)\n")
    assert exits.stopped == "error: the program exited with status 3"


def test_without_bubblewrap_the_sandbox_refuses_with_one_line(monkeypatch):
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    sandbox._BWRAP_WORKS.clear()
    try:
        with pytest.raises(sandbox.SandboxUnavailable) as err:
            run_python("print(1)")
        assert "\n" not in str(err.value)
        assert "apt-get install bubblewrap" in str(err.value)
        assert "sandbox.isolation=audit_hook" in str(err.value)
        with pytest.raises(sandbox.SandboxUnavailable):
            sandbox.check_isolation("bwrap")
        sandbox.check_isolation("audit_hook")  # the weaker mode needs nothing
        assert run_python("print(1)", isolation="audit_hook").output == "1\n"
    finally:
        sandbox._BWRAP_WORKS.clear()


def test_the_weaker_mode_is_only_taken_when_asked_and_logged(caplog):
    with pytest.raises(ValueError, match="sandbox.isolation: expected one of"):
        sandbox.configure_sandbox(isolation="none")
    try:
        with caplog.at_level("WARNING"):
            sandbox.configure_sandbox(isolation="audit_hook")
        assert "isolation=audit_hook" in caplog.text
        assert run_python("import os\nprint(os.getcwd())\n").output != "/sandbox\n"
    finally:
        sandbox.configure_sandbox(isolation="bwrap")
    assert run_python("import os\nprint(os.getcwd())\n").output == "/sandbox\n"


@pytest.mark.skipif(not ROOT, reason="the audit_hook mode locks in only as root")
def test_audit_hook_mode_locked_in_a_program_around_the_hook_cannot_write_outside(tmp_path):
    mark = tmp_path / "pwned"
    result = run_python(AROUND_THE_HOOK.replace("{mark}", str(mark)),
                        deadline_seconds=DEADLINE, isolation="audit_hook")
    assert result.stopped is not None and not mark.exists()


def test_audit_hook_mode_removes_its_directory_and_stale_ones(tmp_path):
    """An unreadable directory inside is removed with the call's; a directory left by a
    trainer that died mid-call (its PID in the name) is collected at the next start."""
    stale = os.path.join(tempfile.gettempdir(), f"grpo_sandbox_{_dead_pid()}_x")
    os.makedirs(os.path.join(stale, "d", "e"))
    os.chmod(os.path.join(stale, "d"), 0)
    before = set(_own_sandbox_dirs())
    sandbox._collected.clear()
    result = run_python("import os\nos.mkdir('d')\nopen('d/f', 'w').write('x')\n"
                        "os.chmod('d', 0)\n", isolation="audit_hook")
    assert result.stopped is None
    assert not os.path.exists(stale)
    assert set(_own_sandbox_dirs()) <= before


def _own_sandbox_dirs() -> set[str]:
    """This process's sandbox directories in /tmp (another test worker's come and go)."""
    return set(glob.glob(os.path.join(tempfile.gettempdir(), f"grpo_sandbox_{os.getpid()}_*")))


def _dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_no_process_is_left_behind():
    children = _descendants(os.getpid())
    result = run_python("import time\nprint('up', flush=True)\ntime.sleep(60)\n",
                        deadline_seconds=DEADLINE)
    assert result.stopped.startswith("timeout:") and result.output == "up\n"
    assert _descendants(os.getpid()) <= children


@pytest.mark.parametrize("isolation", sandbox.ISOLATIONS)
def test_benign_programs_run(isolation):
    ok = run_python("import math, json, collections\nprint(math.factorial(10))\n"
                    "print(json.dumps(collections.Counter('abca').most_common(1)))\n",
                    isolation=isolation)
    assert (ok.output, ok.stopped) == ('3628800\n[["a", 2]]\n', None)
    files = run_python("open('a.txt', 'w').write('hi')\nprint(open('a.txt').read())\n",
                       isolation=isolation)
    assert (files.output, files.stopped) == ("hi\n", None)
    env = run_python("import os\nprint(sorted(os.environ))\n", isolation=isolation)
    assert env.output == "['HOME', 'LANG', 'PATH', 'PYTHONIOENCODING', 'TMPDIR']\n"
    fds = run_python("import os, stat\nopen_fds = []\nfor fd in range(3, 64):\n    try:\n"
                     "        open_fds.append(stat.S_ISFIFO(os.fstat(fd).st_mode))\n"
                     "    except OSError:\n        pass\nprint(open_fds)\n", isolation=isolation)
    # nothing of the trainer's is open: only the pipe the status line goes back on
    assert (fds.output, fds.stopped) == ("[True]\n", None)
    partial = run_python("print('before')\nraise ValueError('bad input')\n", isolation=isolation)
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


def test_a_job_that_runs_code_checks_its_sandbox_at_start(monkeypatch):
    """Before anything is written: an unknown isolation names the field; a job that runs
    code (the code task, a python tool) refuses to start without bubblewrap, in one line;
    a job that runs none starts without it."""
    from configs import code, tools
    from grpo_jax.config_presets import main_job
    from grpo_jax.runner.checks import ConfigError
    from grpo_jax.runner.validation import check_sandbox, uses_sandbox

    code_job, main = code.get_config("smoke"), main_job("smoke")
    python_tool = tools.get_config("smoke")
    python_tool.rl.tools = "json:guess,python"
    assert uses_sandbox(code_job) and uses_sandbox(python_tool) and not uses_sandbox(main)
    check_sandbox(code_job)
    code_job.sandbox.isolation = "none"
    with pytest.raises(ConfigError, match=r"^sandbox.isolation: expected one of"):
        check_sandbox(code_job)
    code_job.sandbox.isolation = "bwrap"
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    sandbox._BWRAP_WORKS.clear()
    try:
        for job in (code_job, python_tool):
            with pytest.raises(ConfigError, match="bubblewrap") as err:
                check_sandbox(job)
            assert "\n" not in str(err.value)
        check_sandbox(main)
        code_job.sandbox.isolation = "audit_hook"
        check_sandbox(code_job)
    finally:
        sandbox._BWRAP_WORKS.clear()
