"""The sandbox under hostile code: every case must be contained, reported, and leave the trainer able to go on."""
import os
import signal
import socket
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from comlrl_nb.sandbox import SANDBOX_UID, SandboxError, run_sandboxed, run_tests, run_tests_batch, sandbox_python

ROOT = Path(__file__).resolve().parents[1]
IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="dropping to another uid needs root (CI runs as root)")


def procs_of(uid):
    "Host pids of the processes owned by `uid`."
    out = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.stat(f"/proc/{d}").st_uid == uid: out.add(int(d))
            except OSError: pass
    return out


def wait_gone(before, uid=SANDBOX_UID, within=5.0):
    "The processes of `uid` that appeared since `before` and are still there after `within` seconds."
    end = time.time() + within
    while True:
        left = procs_of(uid) - before
        if not left or time.time() > end: return left
        time.sleep(0.05)


def still_works():
    "The sandbox still runs normal code quickly after a hostile run."
    rep = run_tests("def f(x):\n    return 2 * x", ["assert f(2) == 4", "assert f(0) == 0"])
    assert rep.passed == [True, True] and rep.result.duration < 1.0


def test_normal_run_and_isolation():
    r = run_sandboxed("import sys\nprint('out'); print('err', file=sys.stderr)")
    assert (r.stdout, r.stderr, r.returncode, r.timed_out, r.killed_reason) == ("out\n", "err\n", 0, False, None)
    assert r.duration < 1.0
    if IS_ROOT: assert {"uid", "netns", "pidns"} <= set(r.isolation), r.isolation


def test_infinite_loop():
    t0 = time.time()
    r = run_sandboxed("while True: pass", timeout=1.0)
    assert r.timed_out and r.killed_reason == "timeout" and r.returncode is None
    assert time.time() - t0 < 2.5
    still_works()


def test_sleeping_forever_and_per_test_timeout():
    r = run_sandboxed("import time\ntime.sleep(10**6)", timeout=0.5)
    assert r.timed_out and r.duration < 1.5
    rep = run_tests("import time\ndef f():\n    time.sleep(100)", ["assert f() is None", "assert 1 + 1 == 2"],
                    test_timeout=0.3)
    assert rep.passed == [False, True] and rep.errors[0] == "timed out"


def test_fork_bomb():
    before = procs_of(SANDBOX_UID)
    bomb = "import os, time\nwhile True:\n    try: os.fork()\n    except OSError: time.sleep(0.01)"
    t0 = time.time()
    r = run_sandboxed(bomb, timeout=1.5, max_processes=16)
    assert r.timed_out and time.time() - t0 < 3.5
    if IS_ROOT: assert wait_gone(before) == set(), "fork bomb processes survived the run"
    still_works()


@needs_root
def test_processes_left_behind_are_killed():
    before = procs_of(SANDBOX_UID)
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent exits')"
    r = run_sandboxed(code, timeout=5.0)
    assert r.returncode == 0 and r.stdout == "parent exits\n" and r.duration < 1.0
    assert wait_gone(before) == set(), "a detached child outlived the run"


def test_huge_memory():
    r = run_sandboxed("x = bytearray(10 * 2**30)\nprint('allocated')", memory_mb=256)
    assert r.killed_reason == "memory limit" and r.returncode == 1 and "allocated" not in r.stdout
    rep = run_tests("def f():\n    return [0] * (10**10)", ["assert len(f()) == 10**10", "assert True"], memory_mb=256)
    assert rep.passed == [False, True] and rep.errors[0].startswith("MemoryError")


def test_huge_output():
    t0 = time.time()
    r = run_sandboxed("while True:\n    print('x' * 10000)", max_output=1000, file_size_mb=2)
    assert r.killed_reason == "file size limit" and r.stdout_truncated and len(r.stdout) == 1000
    assert time.time() - t0 < 3.0
    r = run_sandboxed("print('y' * 50_000_000)", max_output=500, file_size_mb=2)     # one giant write
    assert len(r.stdout) <= 500 and r.killed_reason in ("file size limit", "memory limit")


@needs_root
def test_writing_outside_the_working_directory():
    protected = Path(tempfile.mkdtemp(prefix="comlrl_nb_protected_"))          # root-owned, 0755: not world-writable
    protected.chmod(0o755)
    victim = protected / "keep.txt"
    victim.write_text("original")
    victim.chmod(0o644)
    assert not protected.stat().st_mode & stat.S_IWOTH
    targets = [protected / "pwned.txt", ROOT / "PWNED.txt", Path("/etc/pwned.txt")]
    code = "import os, shutil\n" + "".join(
        f"try:\n    open({str(t)!r}, 'w').write('x')\n    print('WROTE', {str(t)!r})\nexcept OSError as e: "
        "print('refused', type(e).__name__)\n" for t in targets) + (
        f"try:\n    os.remove({str(victim)!r}); print('DELETED')\nexcept OSError: print('refused')\n"
        f"try:\n    open({str(victim)!r}, 'w').write('changed'); print('CHANGED')\nexcept OSError: print('refused')\n"
        f"try:\n    shutil.rmtree({str(ROOT / 'tests')!r}); print('RMTREE')\nexcept OSError: print('refused')\n"
        "open('mine.txt', 'w').write('fine'); print('cwd write ok', os.getcwd())")
    try:
        r = run_sandboxed(code)
        assert "WROTE" not in r.stdout and "DELETED" not in r.stdout and "CHANGED" not in r.stdout \
            and "RMTREE" not in r.stdout, r.stdout
        assert r.stdout.count("refused") == 6 and "cwd write ok" in r.stdout
        assert victim.read_text() == "original" and not any(t.exists() for t in targets)
        assert (ROOT / "tests" / "test_sandbox.py").exists()
        workdir = r.stdout.strip().split()[-1]
        assert not Path(workdir).exists(), "the working directory was not removed"
    finally:
        for p in protected.iterdir(): p.unlink()
        protected.rmdir()


def test_scratch_space_is_private_and_thrown_away():
    name = "comlrl_nb_scratch_" + os.urandom(4).hex()
    code = ("import os\n" + "".join(f"open('{d}/{name}', 'w').write('x')\n" for d in ("/tmp", "/var/tmp", "/dev/shm"))
            + "open('here.txt', 'w').write('x')\nprint(os.getcwd())\n"
            + "open('/tmp/big.bin', 'wb').write(b'x' * 40 * 2**20)\n")          # over the 16 MB tmpfs: refused
    r = run_sandboxed(code, file_size_mb=4)
    workdir = r.stdout.strip()
    assert workdir.startswith(tempfile.gettempdir()) and not Path(workdir).exists()
    if "private-tmp" in r.isolation:
        assert not any(Path(d, name).exists() for d in ("/tmp", "/var/tmp", "/dev/shm"))
    assert r.returncode == 1 and r.killed_reason == "file size limit"


@pytest.mark.parametrize("namespaces", [True, False])
def test_no_network(namespaces):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(0.3)
    port = srv.getsockname()[1]
    code = ("import socket\n"
            f"for addr in [('127.0.0.1', {port}), ('1.1.1.1', 80), ('example.com', 80)]:\n"
            "    try:\n        socket.create_connection(addr, timeout=0.5); print('CONNECTED', addr)\n"
            "    except Exception as e: print('blocked', type(e).__name__)\n")
    try:
        r = run_sandboxed(code, timeout=5.0, namespaces=namespaces)
        assert "CONNECTED" not in r.stdout and r.stdout.count("blocked") == 3, (r.stdout, r.stderr)
        with pytest.raises(socket.timeout): srv.accept()
        assert ("netns" in r.isolation) if namespaces and IS_ROOT else True
        if not namespaces: assert "audit-hook" in r.isolation and "PermissionError" in r.stdout
    finally: srv.close()


def test_audit_fallback_blocks_new_programs():
    r = run_sandboxed("import subprocess\nsubprocess.run(['echo', 'escaped'])", namespaces=False)
    assert r.returncode == 1 and "escaped" not in r.stdout and "not allowed" in r.stderr


def test_environment_secrets(monkeypatch):
    secret = "sk-test-" + os.urandom(8).hex()
    monkeypatch.setenv("COMLRL_NB_TEST_API_KEY", secret)
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    code = ("import os, glob\nprint(dict(os.environ))\n"
            f"for path in ['/proc/{os.getpid()}/environ', '/proc/{os.getppid()}/environ', '/proc/1/environ'] + "
            "glob.glob('/proc/*/environ'):\n    try: print(path, open(path, 'rb').read())\n    except OSError as e: "
            "print(path, 'refused', type(e).__name__)\n")
    r = run_sandboxed(code)
    assert r.returncode == 0 and "HOME" in r.stdout
    assert secret not in r.stdout and secret not in r.stderr
    assert "API_KEY" not in r.stdout.split("\n", 1)[0]


@needs_root
def test_private_proc_hides_the_host():
    r = run_sandboxed("import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))")
    if "private-proc" in r.isolation: assert r.stdout.strip() == "[1, 2]", r.stdout


def test_cannot_kill_the_trainer():
    victim = subprocess.Popen(["sleep", "30"])
    try:
        me = os.getpid()
        code = ("import os, signal\n"
                f"for pid in [{victim.pid}, {me}, os.getppid(), -os.getpgid(0), -1]:\n"
                "    try: os.kill(pid, signal.SIGKILL); print('sent', pid)\n    except OSError as e: print('refused', "
                "pid, type(e).__name__)\n")
        r = run_sandboxed(code)
        time.sleep(0.1)
        assert victim.poll() is None, "the sandbox killed an outside process"
        if IS_ROOT: assert f"refused {victim.pid}" in r.stdout and f"refused {me}" in r.stdout, r.stdout
        still_works()                                    # and we are obviously still alive
    finally:
        victim.kill()
        victim.wait()


def test_exits_and_signals():
    assert run_sandboxed("import os\nos._exit(5)").returncode == 5
    assert run_sandboxed("import sys\nsys.exit('bye')").returncode == 1
    r = run_sandboxed("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)")
    assert r.returncode == -signal.SIGSEGV and r.killed_reason == "signal SIGSEGV"
    rep = run_tests("def f():\n    return 1\nimport os\nos._exit(0)", ["assert f() == 1"])
    assert rep.passed == [False] and "program stopped" in rep.load_error


def test_reward_batch_survives_hostile_neighbours():
    hostile = ["while True: pass", "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass",
               "x = bytearray(2**40)", "import os\nos._exit(0)", "import os, signal\nos.killpg(0, signal.SIGKILL)"]
    good = "def f(x):\n    return x + 1"
    jobs = [(good, ["assert f(1) == 2"])] + [(h + "\n" + good, ["assert f(1) == 2"]) for h in hostile] \
        + [(good, ["assert f(2) == 3"])]
    t0 = time.time()
    reps = run_tests_batch(jobs, timeout=1.5)
    assert [r.passed[0] for r in reps] == [True, False, False, False, False, False, True]
    assert time.time() - t0 < 6.0


def test_bad_arguments():
    with pytest.raises(ValueError, match="memory_mb"): run_sandboxed("pass", memory_mb=1)
    with pytest.raises(ValueError, match="timeout"): run_sandboxed("pass", timeout=-1)
    with pytest.raises(TypeError, match="code must be a string"): run_sandboxed(b"print(1)")
    with pytest.raises(TypeError, match="tests must be a list of strings"): run_tests("pass", "assert True")
    with pytest.raises(SandboxError, match="no Python interpreter"): sandbox_python("/bin/false")


def test_speed():
    t = []
    for _ in range(5): t.append(run_tests("def f(x):\n    return x", ["assert f(1) == 1"] * 3).result.duration)
    assert sorted(t)[2] < 0.5, t


# ------------------------------------------------------------------ the problem's own code (harness=), S3
ENC = "def enc(s):\n    return s[1:] + s[:1]\n"
ROUND_TRIP = ["assert dec(enc('abcd')) == 'abcd'", "assert dec(enc('xy')) == 'xy'"]


@pytest.mark.parametrize("program", [
    "def enc(s):\n    return s\ndef dec(s):\n    return s\n",                                  # redefined
    "enc = str\ndef dec(s):\n    return s\n",                                                 # rebound to a builtin
    "globals()['enc'] = lambda s: s\ndef dec(s):\n    return s\n",                            # rebound at run time
    "import builtins\nbuiltins.enc = lambda s: s\ndel enc\ndef dec(s):\n    return s\n",      # through builtins
    "enc = 'not a function'\ndef dec(s):\n    return s\n",                                    # a plain value
])
def test_the_problems_own_code_wins_over_the_programs_names(program):
    assert run_tests(ENC + program, ROUND_TRIP, harness=ENC).passed == [False, False]


def test_harness_code_survives_a_restart_and_may_call_the_program():
    program = ENC + "import os\ndef enc(s):\n    return s\ndef dec(s):\n    if s == 'die': os._exit(0)\n    return s\n"
    rep = run_tests(program, ["dec('die')"] + ROUND_TRIP + ["assert twice('ab') == 'ab'"],
                    harness=ENC + "def twice(s):\n    return dec(dec(s))\n")
    assert rep.passed == [False, False, False, True], rep.errors     # the fresh interpreter still meets the real enc
    honest = ENC + "def dec(s):\n    return s[-1:] + s[:-1]\n"
    assert run_tests(honest, ROUND_TRIP, harness=ENC).passed == [True, True]


def test_harness_errors_and_bad_jobs_are_named():
    rep = run_tests("def dec(s):\n    return s\n", ROUND_TRIP, harness="import no_such_module_here\n")
    assert rep.load_error is None and rep.passed == [False, False]
    assert rep.errors[0].startswith("not run: the problem's own code (harness=) failed: ModuleNotFoundError"), rep.errors
    with pytest.raises(TypeError, match="harness must be a string of code"): run_tests("x = 1", [], harness=b"x")
    reps = run_tests_batch([(ENC + "def dec(s):\n    return s[-1:] + s[:-1]\n", ROUND_TRIP, ENC),
                            ("def enc(s):\n    return s\ndef dec(s):\n    return s\n", ROUND_TRIP, ENC),
                            ("def enc(s):\n    return s\ndef dec(s):\n    return s\n", ROUND_TRIP)])
    assert [r.passed for r in reps] == [[True, True], [False, False], [True, True]]
    with pytest.raises(ValueError, match=r"each job is \(code, tests\) or \(code, tests, harness\)"):
        run_tests_batch([("x = 1",)])
