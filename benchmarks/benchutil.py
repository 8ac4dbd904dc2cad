"""Shared pieces of the benchmark workers and driver: the fixed workload, paths, timing and reporting helpers.

Imported by the worker scripts (run in fresh subprocesses) and by `run.py`. Nothing here imports torch at module level,
so the driver stays light.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PEER_DIR = Path(os.environ.get("PEER_DIR", REPO / ".peer"))
BENCH_DIR = Path(os.environ.get("BENCH_DIR", "/work/shared/bench"))  # the yardstick's run_peer.py lives here
TINY_MODEL = PEER_DIR / "tiny-model"  # Qwen2, 107k params, eos id 0, pad id 1 (built by setup_peer.sh)
PEER_PYTHON = PEER_DIR / "venv" / "bin" / "python"

# The 8 prompts of the yardstick (same strings, same order as run_peer.py).
PROMPTS = [
    "Write a story about a robot:",
    "Explain quantum physics:",
    "Create a recipe for chocolate cake:",
    "Describe a city in the clouds:",
    "Invent a new holiday and explain it:",
    "Write a bedtime story for a dragon:",
    "Explain how teleportation might work:",
    "Design a futuristic bicycle:",
]

# Sampling settings shared by every suite.
SAMPLING = dict(temperature=0.6, top_p=0.6, top_k=50)

# Same environment for both sides (the yardstick sets these before importing torch).
BENCH_ENV = {
    "WANDB_MODE": "disabled",
    "WANDB_SILENT": "true",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "CUDA_VISIBLE_DEVICES": "",
    "TRANSFORMERS_VERBOSITY": "error",
}


def linear_reward(c1, c2):
    "Joint reward of the yardstick: -|len(c1) - 2 len(c2)| / 50 on character lengths, one value per joint response."
    return [-abs(len(a) - 2 * len(b)) / 50.0 for a, b in zip(c1, c2)]


def worker_setup() -> None:
    "Call first in every worker: fixed environment, then one torch thread."
    for k, v in BENCH_ENV.items():
        os.environ.setdefault(k, v)
    import torch

    torch.set_num_threads(1)


def seed_like_peer(seed: int = 0) -> None:
    "The yardstick's seeding before train(): python, numpy, torch, deterministic algorithms (warn only)."
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def emit(result: dict) -> None:
    "One JSON line on stdout, prefixed like the yardstick's output."
    print("RESULT " + json.dumps(result), flush=True)


def parse_result(stdout: str) -> dict | None:
    line = next((ln for ln in stdout.splitlines() if ln.startswith("RESULT ")), None)
    return json.loads(line[len("RESULT "):]) if line else None


class Clock:
    """Accumulates seconds per label: `with clock('generate'): ...` -> clock.s (wall) and clock.cpu (process CPU time).

    With one torch thread the process CPU time is close to the wall time on an idle machine, and it is much less
    disturbed than the wall time when other processes share the cores (time slices spent elsewhere are not counted)."""

    def __init__(self):
        self.s: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    def __call__(self, label: str):
        clock = self

        class _Ctx:
            def __enter__(self):
                self.t0, self.c0 = time.perf_counter(), time.process_time()

            def __exit__(self, *exc):
                clock.s[label] = clock.s.get(label, 0.0) + time.perf_counter() - self.t0
                clock.cpu[label] = clock.cpu.get(label, 0.0) + time.process_time() - self.c0

        return _Ctx()


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, spec: str = ".3f", none: str = "-") -> str:
    return none if x is None else format(x, spec)


def table(headers: list[str], rows: list[list], out=sys.stdout) -> None:
    "A plain fixed-width text table (first column left-aligned, the rest right-aligned)."
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    w = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r):
        return "  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(r))

    print(line(cells[0]), file=out)
    print("  ".join("-" * x for x in w), file=out)
    for r in cells[1:]:
        print(line(r), file=out)
    out.flush()
