"""Real downstream projects of the existing library, ported by the import change alone (benchmarks/ported/).

Each case runs one project's runner with `--lib comlrl_nb` in a subprocess (tiny offline model, a few rows, seconds).
Only the runs that pass today are here; benchmarks/ported/README.md lists the others and why they stop.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PORTED = ROOT / "benchmarks" / "ported"
PASSING = [("writing", "magrpo"), ("writing", "grpo"), ("writing", "iac"), ("writing", "maac"), ("writing", "ac"),
           ("minecraft_str", "magrpo"), ("minecraft_str", "grpo"), ("minecraft_str", "iac"), ("minecraft_str", "maac"),
           ("code_completion", "magrpo")]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    "A tiny random model saved as a HF directory (TINY_MODEL overrides it, e.g. the yardstick's Qwen2 model)."
    if os.environ.get("TINY_MODEL"):
        return os.environ["TINY_MODEL"]
    from comlrl_nb.models import make_tiny_model
    d = tmp_path_factory.mktemp("tiny-model")
    m, tok = make_tiny_model(seed=0)
    m.save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


def _run(project, algo, tiny):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TINY_MODEL=tiny, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "run.py", "--lib", "comlrl_nb", "--algo", algo], cwd=PORTED / project,
                       env=env, capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout + p.stderr


def test_runners_name_only_the_library_they_port():
    "The porting change is the import prefix: runners spell `comlrl.` paths and never name comlrl_nb themselves."
    for path in PORTED.glob("*/run.py"):
        src = path.read_text()
        assert not re.search(r"(import\s+comlrl_nb|from\s+comlrl_nb|['\"]comlrl_nb\.)", src), path
        assert re.search(r'lib_import\("comlrl\.', src), path


@pytest.mark.parametrize("project,algo", PASSING, ids=[f"{p}/{a}" for p, a in PASSING])
def test_ported_run(project, algo, tiny_dir):
    rc, out = _run(project, algo, tiny_dir)
    assert rc == 0 and f"RESULT ok {project}/{algo} lib=comlrl_nb" in out, out[-3000:]
    calls = re.search(r"calls transition=(\d+) reward=(\d+)", out)
    if calls:   # 2 turns: the transition ran, and each one sits between a scored turn-1 and a scored turn-2 response
        transitions, rewards = map(int, calls.groups())
        assert transitions > 0 and rewards >= 2 * transitions, calls.group(0)
