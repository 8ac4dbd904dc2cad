"""What data parallel costs and saves on this machine, measured side by side in one run: the same small job (the tiny
llama of `make_tiny_model`, 2 agents, 4 prompts, 2 epochs; `tests/shard_script.py`) in one process, then under
torchrun on 2 processes with distributed='ddp' (whole agents, torch's gradient sum) and 'fsdp' (agents sharded).

    PYTHONPATH=. .venv/bin/python benchmarks/sharding.py [--algo magrpo,maac] [--port 29850]

Prints, per family and strategy: this process' agent parameter and optimizer bytes (process 1, its own shards), the
references', a separate critic's and a reward model's bytes, and train() seconds, with the ratios to the one-process run. On a CPU the
two processes share the cores and talk over gloo: the time ratio is the collectives' cost on a tiny model, not a
speed-up to expect on GPUs.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "shard_script.py"
BIN = Path(sys.executable).parent


def run(out: Path, strategy: str, algo: str, port=None) -> dict:
    "One run of the job; this process' (or process 1's) memory record."
    env = {**os.environ, "SHARD_ALGO": algo, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, str(SCRIPT), str(out), strategy] if port is None else \
        [str(BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", str(port), str(SCRIPT), str(out), strategy]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if p.returncode: sys.exit(f"{' '.join(cmd)} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return json.loads((out / f"mem_rank{0 if port is None else 1}.json").read_text())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--algo", default="magrpo_kl,maac,marlhf", help="families of tests/shard_script.py, comma-separated")
    ap.add_argument("--port", type=int, default=29850, help="first torchrun port (two per family)")
    a = ap.parse_args()
    keys = ("parameter_bytes", "optimizer_bytes", "reference_bytes", "critic_bytes", "reward_model_bytes",
            "train_seconds")
    print(f"{'family':<10} {'run':<16} " + " ".join(f"{k.replace('_bytes', ' B'):>16}" for k in keys))
    for n, algo in enumerate(a.algo.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            rows = {"one process": run(Path(tmp, "one"), "none", algo)}
            for k, strategy in enumerate(("ddp", "fsdp")):
                rows[f"2 procs {strategy}"] = run(Path(tmp, strategy), strategy, algo, a.port + 2 * n + k)
        base = rows["one process"]
        for name, r in rows.items():
            print(f"{algo:<10} {name:<16} " + " ".join(f"{r.get(k, 0):>16.6g}" for k in keys))
            if name != "one process":
                ratio = lambda k: f"{r[k] / base[k]:>16.3f}" if base.get(k) else f"{'-':>16}"
                print(f"{'':<10} {'  ratio to one':<16} " + " ".join(ratio(k) for k in keys))


if __name__ == "__main__":
    main()
