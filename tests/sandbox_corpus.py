"""The sandbox's hostile corpus, run by a "trainer" process of its own (tests/test_sandbox.py
starts it as root and as an unprivileged user): each program through `run_python`, then one
JSON line per program with what the trainer observed.

    python sandbox_corpus.py SANDBOX_PY MARK_DIR DEADLINE > results.jsonl

The trainer holds a secret in its environment (GRPO_SECRET, set by the test), listens on a
loopback port, and records its own priority and CPU affinity before and after the corpus;
each program is told the trainer's PID ({trainer}), a path outside the sandbox that must
never appear ({mark}), the port ({port}) and a nonce its descendants carry in their
command line ({nonce}) so that the test can look for them by PID afterwards. This file
imports nothing but the standard library and the sandbox module (loaded from its path), so
that an unprivileged user can run it with the system's interpreter.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import sys
import time

# Switches the audit hook off (it finds the hook's re-entrancy flag among the heap's
# objects): everything after it meets only the operating system's walls.
HOOK_OFF = ("import gc\n"
            "for f in gc.get_objects():\n"
            "    if type(f).__name__ == 'function' and f.__name__ == 'hook':\n"
            "        for cell in f.__closure__ or ():\n"
            "            if type(cell.cell_contents) is dict and 'inside' in cell.cell_contents:\n"
            "                cell.cell_contents['inside'] = True\n")

# name -> (program, the start of its stop line: a prefix; "" any line; None it runs to its
# end (the harm it tries fails without an exception, or it only forges a line))
CORPUS = {
    # the audit hook's own refusals
    "fork_bomb": ("import os\nwhile True:\n    os.fork()\n", "blocked: os.fork"),
    "infinite_loop": ("while True:\n    pass\n", "timeout:"),
    "sleep_forever": ("import time\ntime.sleep(100)\n", "timeout:"),
    "ignores_sigterm": ("import _signal, time\n_signal.signal(15, _signal.SIG_IGN)\n"
                        "while True:\n    time.sleep(0.01)\n", "timeout:"),
    "memory_bomb": ("x = 'a' * (10 ** 10)\n", "memory:"),
    "memory_growth": ("x = []\nwhile True:\n    x.append(bytearray(32 << 20))\n", "memory:"),
    "os_system": ("import os\nos.system('echo pwned > {mark}')\n", "blocked: os.system"),
    "subprocess": ("import subprocess\nsubprocess.run(['sh', '-c', 'echo pwned > {mark}'])\n",
                   "blocked:"),
    "posix_spawn": ("import os\nos.posix_spawn('/bin/sh', ['sh', '-c', 'echo x > {mark}'], "
                    "{{}})\n", "blocked: os.posix_spawn"),
    "exec": ("import os\nos.execv('/bin/sh', ['sh', '-c', 'echo x > {mark}'])\n",
             "blocked: os.exec"),
    "socket": ("import socket\nsocket.socket().connect(('127.0.0.1', {port}))\n",
               "blocked: import socket"),
    "ctypes": ("import ctypes\nctypes.CDLL(None).system(b'echo x > {mark}')\n",
               "blocked: import ctypes"),
    "kill_the_trainer": ("import os\nos.kill({trainer}, 9)\n", "blocked: os.kill"),
    "read_etc_passwd": ("print(open('/etc/passwd').read())\n", ""),
    "read_trainer_environ": ("print(open('/proc/{trainer}/environ').read())\n", ""),
    "list_trainer_files": ("import os\nprint(os.listdir('{mark_dir}'))\n", ""),
    "write_outside": ("open('{mark}', 'w').write('x')\n", ""),
    "symlink_out": ("import os\nos.symlink('/etc/passwd', 'l')\nprint(open('l').read())\n", ""),
    "huge_output": ("while True:\n    print('x' * 1000)\n", "output: more than"),
    "one_huge_print": ("print('y' * 10 ** 6)\n", "output: more than"),
    "huge_file": ("open('big', 'wb').write(b'0' * (10 ** 8))\n", "error: OSError"),
    "threads": ("import _thread\nfor _ in range(10000):\n"
                "    _thread.start_new_thread(lambda: [None for _ in iter(int, 1)], ())\n", ""),
    "recursion": ("def f():\n    return f()\nf()\n", "error: RecursionError"),
    # what the audit hook never saw: the operating system's walls
    "pidfd_kill": ("import os, signal\n"
                   "signal.pidfd_send_signal(os.pidfd_open({trainer}), signal.SIGKILL)\n",
                   "error:"),
    "pidfd_kill_parent": ("import os, signal\n"
                          "signal.pidfd_send_signal(os.pidfd_open(os.getppid()), 9)\n",
                          "error:"),
    "renice_trainer": ("import os\nos.setpriority(os.PRIO_PROCESS, {trainer}, 19)\n", "error:"),
    "renice_user": ("import os\nos.setpriority(os.PRIO_USER, 0, 19)\n", "error:"),
    "pin_trainer": ("import os\nos.sched_setaffinity({trainer}, {{0}})\n", "error:"),
    "mkfifo_outside": ("import os\nos.mkfifo('{mark}')\n", "error:"),
    "mknod_outside": ("import os, stat\nos.mknod('{mark}', stat.S_IFIFO | 0o600)\n", "error:"),
    "mkfifo_inside": ("import os\nos.mkfifo('fifo')\n", "error:"),  # mknod is refused
    "unreadable_directory": ("import os\nos.mkdir('d')\nopen('d/f', 'w').write('x')\n"
                             "os.chmod('d', 0)\n", None),
    "hook_off_read_environ": (HOOK_OFF + "print(open('/proc/{trainer}/environ').read())\n",
                              "error:"),
    "hook_off_read_passwd": (HOOK_OFF + "print(open('/etc/passwd').read())\n", "error:"),
    "hook_off_list_trainer_files": (HOOK_OFF + "import os\nprint(os.listdir('{mark_dir}'))\n",
                                    "error:"),
    "hook_off_system": (HOOK_OFF + "import os\n"
                        "assert os.system('echo pwned > {mark}') == 0, 'no write'\n",
                        "error: AssertionError"),
    "hook_off_ctypes_kill": (HOOK_OFF + "import ctypes\n"
                             "assert ctypes.CDLL(None).kill({trainer}, 9) == 0, 'no kill'\n",
                             "error: AssertionError"),
    "hook_off_socket": (HOOK_OFF + "import socket\n"
                        "socket.create_connection(('127.0.0.1', {port}), timeout=0.2)\n",
                        "error:"),
    "hook_off_write_dev": (HOOK_OFF + "open('/dev/shm/x', 'w').write('x')\n", "error:"),
    "hook_off_write_root": (HOOK_OFF + "open('/x', 'w').write('x')\n", "error:"),
    "hook_off_fill_disk": (HOOK_OFF + "for i in range(64):\n"
                           "    open(f'f{{i}}', 'wb').write(b'0' * (1 << 20))\n", "error:"),
    "hook_off_fork_bomb": (HOOK_OFF + "import os\nwhile True:\n    os.fork()\n",
                           "error: PermissionError"),
    # a grandchild in a session of its own, sleeping with the nonce in its command line (the
    # filter refuses the fork; the PID namespace would end it with the call)
    "hook_off_escape": (HOOK_OFF + "import os, sys\n"
                        "if os.fork() == 0:\n"
                        "    os.setsid()\n"
                        "    if os.fork() == 0:\n"
                        "        os.execv(sys.executable, [sys.executable, '-c', "
                        "'import time; time.sleep(20)', '{nonce}'])\n"
                        "    os._exit(0)\n"
                        "os.wait()\n", "error: PermissionError"),
    # lines a program writes cannot stop the call nor name why it stopped
    "forged_stop_line": ("import os, sys\nos.write(2, b'timeout: forged\\n')\n"
                         "for fd in range(3, 10):\n"
                         "    try:\n"
                         "        os.write(fd, b'blocked: forged')\n"
                         "    except OSError:\n"
                         "        pass\n", None),
}


# The clock of a program that a limit other than the clock must stop (memory, file size,
# output, a refusal): long enough that a loaded machine's slow start never lets the clock
# stop it first, so the test sees the limit it is about. Programs stopped by the clock, or
# by any line, keep the short deadline.
LIMIT_DEADLINE = 5.0


def deadline_of(expected: str | None, deadline: float) -> float:
    """The deadline a program of the corpus runs under (see LIMIT_DEADLINE)."""
    if not expected or expected.startswith("timeout:"):
        return deadline
    return max(deadline, LIMIT_DEADLINE)


def main() -> None:
    sandbox_path, mark_dir, deadline = sys.argv[1], sys.argv[2], float(sys.argv[3])
    sys.path.insert(0, os.path.dirname(os.path.abspath(sandbox_path)))  # pyseccomp beside it
    spec = importlib.util.spec_from_file_location("corpus_sandbox", sandbox_path)
    sandbox = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = sandbox  # dataclasses look their module up
    spec.loader.exec_module(sandbox)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    before = (os.getpriority(os.PRIO_PROCESS, 0), sorted(os.sched_getaffinity(0)))
    names = sys.argv[4].split(",") if len(sys.argv) > 4 else sorted(CORPUS)
    for name in names:
        program, expected = CORPUS[name]
        nonce = f"grpo-corpus-{os.getpid()}-{name}"
        mark = os.path.join(mark_dir, name)
        code = program.format(trainer=os.getpid(), mark=mark, mark_dir=mark_dir, port=port,
                              nonce=nonce)
        start = time.monotonic()
        own_deadline = deadline_of(expected, deadline)
        result = sandbox.run_python(code, deadline_seconds=own_deadline)
        seconds = time.monotonic() - start
        left = []
        for pid in os.listdir("/proc"):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as file:
                    if nonce.encode() in file.read():
                        left.append(int(pid))
            except (OSError, ValueError):
                pass
        print(json.dumps({"name": name, "expected": expected, "stopped": result.stopped,
                          "output": result.output, "seconds": seconds, "left": left,
                          "deadline": own_deadline,
                          "mark": os.path.exists(mark)}), flush=True)
    after = (os.getpriority(os.PRIO_PROCESS, 0), sorted(os.sched_getaffinity(0)))
    print(json.dumps({"trainer": {"before": before, "after": after,
                                  "uid": os.getuid()}}), flush=True)


if __name__ == "__main__":
    main()
