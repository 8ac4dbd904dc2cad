"""MADPO and MARLHF side by side with the yardstick (comlrl 1.4.3) on its settings: tiny Qwen2, 8 prompts, 2 agents,
4 candidates, 2 pairs per item, 16 new tokens, 1 epoch, 1 thread. Ours and theirs alternate in fresh subprocesses.

    .venv/bin/python benchmarks/pref.py [--repeats 3]

Prints the median wall time of the training call on each side, the ratio and peak RSS. (Theirs: the yardstick's own
`train_s`; ours: the same call, `train()`, timed the same way.)
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PEER = os.environ.get("PEER_DIR", os.path.join(ROOT, ".peer"))

OURS = r'''
import json, os, resource, sys, tempfile, time
import torch
torch.set_num_threads(1)
sys.path.insert(0, sys.argv[2])
import benchutil as bu
from transformers import AutoModelForCausalLM, AutoTokenizer
from comlrl_nb import MADPOConfig, MADPOTrainer, MARLHFConfig, MARLHFTrainer
algo, model = sys.argv[1], sys.argv[3]
tok = AutoTokenizer.from_pretrained(model)
agents = [AutoModelForCausalLM.from_pretrained(model) for _ in range(2)]
common = dict(num_agents=2, max_new_tokens=16, **bu.SAMPLING, num_train_epochs=1, agent_learning_rate=5e-6, eval_interval=0,
              rollout_buffer_size=2, output_dir=tempfile.mkdtemp(), progress_bar=False, save_steps=-1, logging_steps=1000,
              save_plot=False, preference_num_candidates=4, preference_pairs_per_sample=2, pair_selection="reward_gap")
if algo == "madpo":
    tr = MADPOTrainer(agents=agents, tokenizer=tok, reward_func=bu.linear_reward, args=MADPOConfig(**common, dpo_beta=0.1),
                      train_dataset=[{"prompt": p} for p in bu.PROMPTS])
else:
    tr = MARLHFTrainer(agents=agents, tokenizer=tok, reward_func=bu.linear_reward, train_dataset=[{"prompt": p} for p in bu.PROMPTS],
                       args=MARLHFConfig(**common, rl_algorithm="magrpo", num_generations=4, early_termination_threshold=None,
                                         reward_model_name=model, reward_learning_rate=1e-5, reward_num_train_epochs=1,
                                         reward_train_batch_size=1))
bu.seed_like_peer(0)
t0 = time.perf_counter(); tr.train(); dt = time.perf_counter() - t0
print("RESULT " + json.dumps({"train_s": dt, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
'''


def run(cmd, env=None):
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=900)
    line = next((l for l in out.stdout.splitlines() if l.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"{cmd[:3]} failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    return json.loads(line[7:])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--algos", default="madpo,marlhf")
    a = p.parse_args()
    model = os.path.join(PEER, "tiny-model")
    env = {"PEER_DIR": PEER, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    rows = []
    for algo in a.algos.split(","):
        ours, theirs = [], []
        for r in range(a.repeats):
            ours.append(run([sys.executable, "-c", OURS, algo, HERE, model], env))
            theirs.append(run([os.path.join(PEER, "venv", "bin", "python"), "/work/shared/bench/run_peer.py" if os.path.exists("/work/shared/bench/run_peer.py")
                               else os.path.join(ROOT, "..", "shared", "bench", "run_peer.py"), "--single", algo, "--threads", "1"], env))
            print(f"# {algo} round {r + 1}: ours {ours[-1]['train_s']:.3f}s  theirs {theirs[-1]['train_s']:.3f}s", flush=True)
        mo, mt = statistics.median(x["train_s"] for x in ours), statistics.median(x["train_s"] for x in theirs)
        rows.append((algo, mo, mt, mo / mt, max(x["peak_rss_mb"] for x in ours), max(x.get("peak_rss_mb", float("nan")) for x in theirs)))
    print(f"\n{'algo':8s} {'ours s':>8s} {'theirs s':>9s} {'ours/theirs':>12s} {'RSS ours MB':>12s} {'RSS theirs MB':>14s}  target <= 0.5")
    for algo, mo, mt, ratio, ro, rt in rows:
        print(f"{algo:8s} {mo:8.3f} {mt:9.3f} {ratio:12.2f} {ro:12.0f} {rt:14.0f}  {'met' if ratio <= 0.5 else 'NOT met'}")


if __name__ == "__main__":
    main()
