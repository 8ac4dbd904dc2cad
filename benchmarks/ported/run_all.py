"""Run every ported project's runs on both libraries and print the outcome table (markdown) for README.md.

    python benchmarks/ported/run_all.py                               # all runs, both libraries
    python benchmarks/ported/run_all.py --only writing/magrpo --libs comlrl_nb
    python benchmarks/ported/run_all.py --ours /work/main             # which comlrl_nb tree (default: this one)

comlrl 1.4.3 runs with $PEER_PYTHON (default /work/main/.peer/venv/bin/python), comlrl_nb with $OURS_PYTHON
(default /work/main/.venv/bin/python) and PYTHONPATH=<--ours>. Each run is a subprocess; a run passes when it exits
0 and prints `RESULT ok`. The error column is the last exception line of a failed run.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PEER_PYTHON = os.environ.get("PEER_PYTHON", "/work/main/.peer/venv/bin/python")
OURS_PYTHON = os.environ.get("OURS_PYTHON", "/work/main/.venv/bin/python")

# (project dir, algo, what the run is: algorithm, turns, agents)
RUNS = [
    ("writing", "magrpo", "MAGRPO, 1 turn, 2 agents (model id; *args reward with batch_items/prompts; eval logger)"),
    ("writing", "grpo", "MAGRPO, 1 turn, 1 agent (loaded model in agents=)"),
    ("writing", "iac", "IAC, 1 turn, 2 agents, separate critics (reward(prompts, c1, c2))"),
    ("writing", "maac", "MAAC, 1 turn, 2 agents, critic_type v"),
    ("writing", "ac", "IAC, 1 turn, 1 agent (reward(responses))"),
    ("minecraft_str", "magrpo", "MAGRPO, 2 turns, 2 agents, external transition (reward one joint response per call)"),
    ("minecraft_str", "grpo", "MAGRPO, 2 turns, 1 agent (trainer num_agents=1, config left at 2)"),
    ("minecraft_str", "iac", "IAC, 2 turns, 2 agents, separate critics, value_clip_range=0.05"),
    ("minecraft_str", "maac", "MAAC, 2 turns, 2 agents, external transition"),
    ("code_completion", "magrpo", "MAGRPO, 2 turns, 2 agents, code-feedback transition (per-index batched reward)"),
]


def run_one(project: str, algo: str, lib: str, ours: str, timeout: int = 600) -> dict:
    env = dict(os.environ)
    if lib == "comlrl":
        python = PEER_PYTHON
        env.pop("PYTHONPATH", None)
    else:
        python = OURS_PYTHON
        env["PYTHONPATH"] = ours
    t0 = time.time()
    try:
        p = subprocess.run([python, "run.py", "--lib", lib, "--algo", algo], cwd=os.path.join(HERE, project),
                           env=env, capture_output=True, text=True, timeout=timeout)
        out, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = f"{e.stdout or ''}{e.stderr or ''}\nTimeoutExpired: over {timeout} s", 124
    ok = rc == 0 and f"RESULT ok {project}/{algo}" in out
    errors = [ln.strip() for ln in out.splitlines() if re.match(r"^[\w.]*(Error|Exception|Expired)\b.*:", ln.strip())]
    calls = re.findall(r"^calls .*$", out, flags=re.M)
    return {"ok": ok, "rc": rc, "error": "" if ok else (errors[-1] if errors else out.strip().splitlines()[-1:]),
            "seconds": round(time.time() - t0, 1), "calls": calls[-1] if calls else ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--libs", default="comlrl,comlrl_nb")
    ap.add_argument("--only", default=None, help="comma-separated project/algo names")
    ap.add_argument("--ours", default=ROOT, help="the comlrl_nb tree put on PYTHONPATH")
    a = ap.parse_args()
    libs = a.libs.split(",")
    only = set(a.only.split(",")) if a.only else None
    rows = []
    for project, algo, what in RUNS:
        if only and f"{project}/{algo}" not in only:
            continue
        res = {lib: run_one(project, algo, lib, a.ours) for lib in libs}
        for lib, r in res.items():
            print(f"# {project}/{algo} {lib}: {'ok' if r['ok'] else 'FAIL'} {r['seconds']} s {r['calls']} {r['error']}",
                  file=sys.stderr, flush=True)
        rows.append((project, algo, what, res))
    print("| project | run | algorithm, turns, agents | " + " | ".join(libs) + " | first error (comlrl_nb) |")
    print("|---|---|---|" + "---|" * len(libs) + "---|")
    for project, algo, what, res in rows:
        cells = [("pass" if r["ok"] else "FAIL") for r in res.values()]
        err = res.get("comlrl_nb", {}).get("error", "") or ""
        print(f"| {project} | {algo} | {what} | " + " | ".join(cells) + f" | {str(err).replace('|', '/')} |")


if __name__ == "__main__":
    main()
