"""Our own speed, two source trees side by side: the same MAGRPO and MAAC runs on the tiny Qwen2 of the yardstick
(`$PEER_DIR/tiny-model`), each in a fresh subprocess with one torch thread, the two trees alternating run by run.

    .venv/bin/python benchmarks/trees.py --before /path/to/old/tree --after . [--repeats 5]

Prints per algorithm the median wall and process-CPU seconds of `train()` for each tree, the after/before ratios,
and whether both trees ended with identical weights (they must, for a refactor).
"""
import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def worker(algo: str) -> None:
    sys.path.insert(0, HERE)
    import benchutil as bu
    bu.worker_setup()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from comlrl_nb import MAACConfig, MAACTrainer, MAGRPOConfig, MAGRPOTrainer
    model = str(bu.TINY_MODEL)
    tok = AutoTokenizer.from_pretrained(model)
    agents = [AutoModelForCausalLM.from_pretrained(model) for _ in range(2)]
    common = dict(num_agents=2, max_new_tokens=16, **bu.SAMPLING, num_train_epochs=1, eval_interval=0,
                  output_dir=tempfile.mkdtemp(), progress_bar=False, save_steps=-1, logging_steps=1000, save_plot=False)
    data = [{"prompt": p} for p in bu.PROMPTS * 2]
    if algo == "maac":
        tr = MAACTrainer(agents=agents, tokenizer=tok, reward_func=bu.linear_reward, train_dataset=data,
                         args=MAACConfig(**common), critic_model=AutoModelForCausalLM.from_pretrained(model))
    else:
        tr = MAGRPOTrainer(agents=agents, tokenizer=tok, reward_func=bu.linear_reward, train_dataset=data,
                           args=MAGRPOConfig(**common, early_termination_threshold=None))
    bu.seed_like_peer(0)
    c0, t0 = time.process_time(), time.perf_counter()
    tr.train()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    h = hashlib.sha256()
    for p in (p for m in tr.agents for p in m.parameters()):
        h.update(p.detach().float().numpy().tobytes())
    print("RESULT " + json.dumps({"wall": wall, "cpu": cpu, "weights": h.hexdigest()[:16]}))


def run(tree: str, algo: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", algo], env=env, capture_output=True,
                         text=True, check=True).stdout
    return json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESULT "))[7:])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--before", default=None)
    p.add_argument("--after", default=".")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--algos", default="magrpo,maac")
    p.add_argument("--worker", default=None)
    a = p.parse_args()
    if a.worker:
        return worker(a.worker)
    print(f"# load1={os.getloadavg()[0]:.2f} (shared machine: wall times inflate; CPU times are the steadier figure)")
    for algo in a.algos.split(","):
        res = {"before": [], "after": []}
        for _ in range(a.repeats):
            for side in ("before", "after"):
                res[side].append(run(getattr(a, side), algo))
        med = {s: {k: statistics.median(r[k] for r in res[s]) for k in ("wall", "cpu")} for s in res}
        same = len({r["weights"] for s in res for r in res[s]}) == 1
        print(f"{algo:7s} before wall {med['before']['wall']:.3f} s cpu {med['before']['cpu']:.3f} s | after wall "
              f"{med['after']['wall']:.3f} s cpu {med['after']['cpu']:.3f} s | after/before wall "
              f"{med['after']['wall'] / med['before']['wall']:.2f} cpu {med['after']['cpu'] / med['before']['cpu']:.2f}"
              f" | identical weights: {same}")


if __name__ == "__main__":
    main()
