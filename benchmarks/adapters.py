"""Adapter agents vs full copies on SmolLM2-135M: memory and MAGRPO step time, side by side.

    .venv/bin/python benchmarks/adapters.py [--agents 2,4] [--batches 2] [--dtype bf16]

For each number of agents n, two fresh subprocesses run the same MAGRPO job (4 chat-templated prompts per batch, K=4,
16 new tokens, one AdamW step per agent per batch, `--batches` batches):

  full   n full copies of SmolLM2-135M-Instruct (loaded once, deep-copied), every weight trained
  lora   LoRAAgents(base="embedded", num_agents=n, r=8): one frozen base + n LoRA adapters (all linear layers)

Printed per run: weights held in memory (MB of parameter tensors, counted once per storage), trainable parameters,
AdamW state after training (MB), peak RSS of the process, and the median batch time after the first batch
(metrics.jsonl `time/batch`, split into generate and update). Nothing is asserted; the figures go in
benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import benchutil as bu  # noqa: E402

WORKER = r'''
import copy, json, os, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
import benchutil as bu
bu.worker_setup()
import torch
from comlrl_nb.adapters import LoRAAgents
from comlrl_nb.models import load_embedded
from comlrl_nb.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
mode, n, batches, dtype = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
t0 = time.perf_counter()
if mode == "full":
    m0, tok = load_embedded(); spec = dict(agents=[m0] + [copy.deepcopy(m0) for _ in range(n - 1)], tokenizer=tok)
else:
    spec = dict(agents=LoRAAgents(base="embedded", num_agents=n, r=8))
out = tempfile.mkdtemp(prefix="bench_adapters_")
items = [{"prompt": p} for p in (bu.PROMPTS * 4)[:4 * batches]]
cfg = MAGRPOConfig(num_agents=n, num_generations=4, max_new_tokens=16, **bu.SAMPLING, num_train_epochs=1,
                   agent_learning_rate=1e-5, eval_interval=0, rollout_batch_size=4, rollout_buffer_size=4,
                   early_termination_threshold=None, autocast_dtype=None if dtype == "fp32" else "bf16",
                   use_chat_template=True, output_dir=out, progress_bar=False, save_steps=-1, logging_steps=1000,
                   save_plot=False)
tr = MAGRPOTrainer(reward_func=lambda *cs: [float(len(set(len(c[j]) for c in cs))) for j in range(len(cs[0]))],
                   args=cfg, train_dataset=items, **spec)
build_s = time.perf_counter() - t0
tr.train()
rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if l.strip()]
seen, weights = set(), 0
for m in tr.agents:                                  # every tensor held: adapter agents share their base model's
    for p in (m.peft.get_base_model() if hasattr(m, "peft") else m).parameters():
        key = p.untyped_storage().data_ptr()
        if key not in seen: seen.add(key); weights += p.untyped_storage().nbytes()
trainable = sum(p.numel() for m in tr.agents for p in m.parameters())   # what each agent's optimizer steps
opt_bytes = sum(t.numel() * t.element_size() for o in tr.optimizers for s in o.state.values() for t in s.values()
                if torch.is_tensor(t))
steady = rows[1:] or rows
med = lambda k: sorted(r[k] for r in steady)[len(steady) // 2]
bu.emit({"mode": mode, "agents": n, "dtype": dtype, "build_s": round(build_s, 1),
         "weights_mb": round(weights / 2**20, 1), "trainable_params_m": round(trainable / 1e6, 2),
         "optimizer_state_mb": round(opt_bytes / 2**20, 1), "peak_rss_mb": round(bu.peak_rss_mb()),
         "batch_s": round(med("time/batch"), 2), "generate_s": round(med("time/generate"), 2),
         "update_s": round(med("time/update"), 2), "batches": len(rows),
         "optimizer_steps": [rows[-1].get(f"agent_{i}/optimizer_steps") for i in range(n)]})
'''


def run(mode: str, n: int, batches: int, dtype: str) -> dict:
    out = subprocess.run([sys.executable, "-c", WORKER, HERE, mode, str(n), str(batches), dtype], capture_output=True,
                         text=True, env={**os.environ, **bu.BENCH_ENV, "OMP_NUM_THREADS": "1"}, timeout=1800)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"{mode} n={n} failed:\n{out.stderr[-3000:]}")
    return json.loads(line[7:])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--agents", default="2,4")
    p.add_argument("--batches", type=int, default=2)
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    a = p.parse_args()
    print(f"## adapters vs full copies: SmolLM2-135M, 4 prompts x K=4, 16 new tokens, {a.batches} batches, {a.dtype}, "
          f"1 thread [load1={os.getloadavg()[0]:.2f}]", flush=True)
    rows = []
    for n in [int(x) for x in a.agents.split(",")]:
        for mode in ("full", "lora") if n % 2 == 0 else ("lora", "full"):
            t0 = time.perf_counter()
            r = run(mode, n, a.batches, a.dtype)
            print(f"#   {mode:4s} n={n}: {json.dumps(r)}  ({time.perf_counter() - t0:.0f}s)", flush=True)
            rows.append(r)
    cols = ("mode", "agents", "weights_mb", "trainable_params_m", "optimizer_state_mb", "peak_rss_mb", "batch_s",
            "generate_s", "update_s")
    print("\n" + "  ".join(f"{c:>18s}" for c in cols))
    for r in rows:
        print("  ".join(f"{str(r[c]):>18s}" for c in cols))
    for n in sorted({r["agents"] for r in rows}):
        f, l = (next(r for r in rows if r["agents"] == n and r["mode"] == m) for m in ("full", "lora"))
        print(f"n={n}: lora/full  weights {l['weights_mb'] / f['weights_mb']:.2f}  optimizer state "
              f"{l['optimizer_state_mb'] / max(f['optimizer_state_mb'], 1e-9):.3f}  peak RSS "
              f"{l['peak_rss_mb'] / f['peak_rss_mb']:.2f}  batch time {l['batch_s'] / f['batch_s']:.2f}")
    print(f"# done [load1={os.getloadavg()[0]:.2f}]")


if __name__ == "__main__":
    main()
