"""Worker: comlrl_nb MAGRPO on the yardstick workload, in this (fresh) process; prints one `RESULT {json}` line.

Workload = the yardstick's: tiny Qwen2 model from $PEER_DIR/tiny-model, the 8 prompts, 2 agents, K=4, 16 new tokens,
1 epoch, rollout_buffer_size=2, aligned joint mode, linear reward, seed 0, one torch thread.
Timed like the yardstick: seed, then wall time of the `trainer.train()` call only (imports, model loading and trainer
construction are reported separately).

    .venv/bin/python benchmarks/ours_magrpo.py --rollout-batch-size 1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchutil as bu  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rollout-batch-size", default="1",
                   help="task items per sampling loop (the default is 1); 'auto' = None: one rollout buffer, 2 "
                        "items here")
    p.add_argument("--model", default=str(bu.TINY_MODEL))
    a = p.parse_args()

    t_imp = time.perf_counter()
    bu.worker_setup()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import comlrl_nb.trainers.reinforce as rf_mod
    from comlrl_nb.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

    import_s = time.perf_counter() - t_imp

    # Time the end-of-run plot separately (the call still happens: same work, just a stopwatch around it).
    plot = {"s": 0.0, "cpu": 0.0, "calls": 0}
    orig_plot = rf_mod.plot_run

    def timed_plot(*args, **kw):
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            return orig_plot(*args, **kw)
        finally:
            plot["s"] += time.perf_counter() - t0
            plot["cpu"] += time.process_time() - c0
            plot["calls"] += 1

    rf_mod.plot_run = timed_plot

    t_build = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(a.model)
    agents = [AutoModelForCausalLM.from_pretrained(a.model) for _ in range(2)]
    out_dir = tempfile.mkdtemp(prefix="bench_magrpo_")
    cfg = MAGRPOConfig(
        num_agents=2, num_generations=4, max_new_tokens=16, **bu.SAMPLING, num_train_epochs=1,
        agent_learning_rate=5e-6, eval_interval=0, rollout_buffer_size=2, joint_mode="aligned",
        early_termination_threshold=None, output_dir=out_dir, progress_bar=False, save_steps=-1,
        logging_steps=1000, rollout_batch_size=None if a.rollout_batch_size == "auto" else int(a.rollout_batch_size),
        save_plot=False,  # the yardstick draws no plot: compare the same work
    )
    tr = MAGRPOTrainer(agents=agents, tokenizer=tok, reward_func=bu.linear_reward, args=cfg,
                       train_dataset=[{"prompt": q} for q in bu.PROMPTS])
    build_s = time.perf_counter() - t_build

    bu.seed_like_peer(0)
    c0, t0 = time.process_time(), time.perf_counter()
    tr.train()
    train_s, train_cpu_s = time.perf_counter() - t0, time.process_time() - c0

    rows = [json.loads(ln) for ln in open(os.path.join(out_dir, "metrics.jsonl")) if ln.strip()]
    tsum = lambda k: sum(r.get(k, 0.0) for r in rows)  # noqa: E731
    gen, rew, upd, batch = tsum("time/generate"), tsum("time/reward"), tsum("time/update"), tsum("time/batch")
    score, bwd = tsum("time/score"), tsum("time/backward_step")   # parts of time/update: log-prob
                                                                  # forward | backward + step
    tokens = sum(r["tokens_per_s"] * r["time/batch"] for r in rows)  # tokens_per_s = generated tokens / time/batch
    steps = [max((r.get(f"agent_{i}/optimizer_steps", 0) for r in rows), default=0) for i in range(2)]
    # Fingerprint of the learning outcome (rewards, losses, lengths; no timings) to check repeat determinism.
    learn = [{k: round(v, 6) for k, v in r.items() if isinstance(v, float) and not k.startswith("time/")
              and not k.endswith("per_s")} for r in rows]
    params = [round(float(sum(p.detach().double().sum() for p in m.parameters())), 6) for m in tr.agents]
    shutil.rmtree(out_dir, ignore_errors=True)
    bu.emit({
        "side": "ours", "rollout_batch_size": cfg.rollout_batch_size, "rollout_batch_size_arg": a.rollout_batch_size,
        "threads": torch.get_num_threads(), "import_s": round(import_s, 3), "build_trainer_s": round(build_s, 3),
        "train_s": round(train_s, 4), "train_cpu_s": round(train_cpu_s, 4),
        "batches": len(rows), "time_generate_s": round(gen, 4), "time_reward_s": round(rew, 4),
        "time_update_s": round(upd, 4), "time_score_s": round(score, 4), "time_backward_step_s": round(bwd, 4),
        "time_batch_s": round(batch, 4),
        "time_plot_s": round(plot["s"], 4), "time_plot_cpu_s": round(plot["cpu"], 4), "plot_calls": plot["calls"],
        "generated_tokens": round(tokens), "optimizer_steps_per_agent": steps,
        "mean_reward": sum(r["turn_1/reward_mean"] for r in rows) / max(1, len(rows)),
        "fingerprint": hashlib.sha1(json.dumps([learn, params]).encode()).hexdigest()[:12],
        "peak_rss_mb": round(bu.peak_rss_mb(), 1),
    })


if __name__ == "__main__":
    main()
