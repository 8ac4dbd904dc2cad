"""Worker: one MAGRPO batch-step for two SmolLM2-135M agents vs the bare "floor" doing the same calls directly.

Workload per step: 4 chat-templated prompts, K=4, 32 new tokens, aligned joint responses, linear reward; each agent
then takes ONE AdamW step on its 16 completions (rollout_buffer_size = train_batch_size = 4 items).

  ours   MAGRPOTrainer(rollout_batch_size=4, rollout_buffer_size=4, use_chat_template=True).train() over a 4-item
         dataset = exactly one batch. Reported: the train() call (wall and process CPU time), and the batch time from
         metrics.jsonl (time/batch, split into time/generate, time/reward and the update).
  floor  the same work written out by hand: generate_completions per agent, the reward, group-normalized advantages,
         completion_logprobs + plain REINFORCE loss, backward, AdamW step. No buffers, metrics, plots or checks.

Both run in this process on the same two models (loaded once, then one untimed floor step as warm-up), in the order
floor, ours, ours, floor, ... (ABBA), each with fresh AdamW optimizers (so both pay for creating the optimizer state).

    .venv/bin/python benchmarks/floor.py --dtype bf16 --pairs 2
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchutil as bu  # noqa: E402

N_ITEMS, K, NEW_TOKENS = 4, 4, 32


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    p.add_argument("--pairs", type=int, default=2, help="floor/ours pairs, run in ABBA order")
    p.add_argument("--warmup", type=int, default=1, help="1: one untimed floor step first; 0: none")
    a = p.parse_args()
    dt = None if a.dtype == "fp32" else "bf16"

    bu.worker_setup()
    import torch

    import comlrl_nb.trainers.reinforce as rf_mod
    from comlrl_nb.engine import adamw
    from comlrl_nb.generation import generate_completions
    from comlrl_nb.models import load_embedded
    from comlrl_nb.rewards import apply_chat_template
    from comlrl_nb.scoring import completion_logprobs
    from comlrl_nb.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

    plot = {"s": 0.0}
    orig_plot = rf_mod.plot_run

    def timed_plot(*args, **kw):
        t0 = time.perf_counter()
        try:
            return orig_plot(*args, **kw)
        finally:
            plot["s"] += time.perf_counter() - t0

    rf_mod.plot_run = timed_plot

    t_load = time.perf_counter()
    m0, tok = load_embedded()
    agents = [m0, copy.deepcopy(m0)]
    load_s = time.perf_counter() - t_load
    items = [{"prompt": q} for q in bu.PROMPTS[:N_ITEMS]]
    prompts = [apply_chat_template(tok, it["prompt"]) for it in items]
    gen_kw = dict(k=K, max_new_tokens=NEW_TOKENS, **bu.SAMPLING, autocast_dtype=dt)

    def floor_step(rep: int) -> dict:
        clock = bu.Clock()
        c0, t0 = time.process_time(), time.perf_counter()
        opts = [adamw(m.parameters(), 5e-6) for m in agents]       # the trainer's optimizer (fused AdamW)
        with clock("generate"):
            comps = [generate_completions(m, tok, prompts, seed=rep, **gen_kw) for m in agents]
        with clock("reward"):
            r = torch.tensor(bu.linear_reward(comps[0].texts, comps[1].texts)).view(N_ITEMS, K)  # aligned joints
            adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-8)).flatten()
        with clock("update"):
            for m, opt, c in zip(agents, opts, comps):
                m.train()
                _, seq = completion_logprobs(m, c.prompt_ids, c.prompt_mask, c.completion_ids, c.completion_mask,
                                             autocast_dtype=dt)
                loss = -(adv * seq).mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                m.eval()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        del opts
        return {"step_s": wall, "step_cpu_s": cpu, "generate_s": clock.s["generate"], "reward_s": clock.s["reward"],
                "update_s": clock.s["update"], "generate_cpu_s": clock.cpu["generate"],
                "update_cpu_s": clock.cpu["update"], "tokens": sum(int(c.lengths.sum()) for c in comps)}

    def ours_step(rep: int) -> dict:
        out_dir = tempfile.mkdtemp(prefix="bench_floor_")
        cfg = MAGRPOConfig(
            num_agents=2, num_generations=K, max_new_tokens=NEW_TOKENS, **bu.SAMPLING, num_train_epochs=1,
            agent_learning_rate=5e-6, eval_interval=0, rollout_batch_size=N_ITEMS, rollout_buffer_size=N_ITEMS,
            joint_mode="aligned", early_termination_threshold=None, autocast_dtype=dt, use_chat_template=True,
            output_dir=out_dir, progress_bar=False, save_steps=-1, logging_steps=1000, seed=rep,
        )
        tr = MAGRPOTrainer(agents=agents, tokenizer=tok, reward_func=bu.linear_reward, args=cfg, train_dataset=items)
        p0 = plot["s"]
        c0, t0 = time.process_time(), time.perf_counter()
        tr.train()
        train_s, train_cpu_s = time.perf_counter() - t0, time.process_time() - c0
        import comlrl_nb.engine as E
        if hasattr(E, "wait_for_plots"): E.wait_for_plots()   # the background plot, outside the
                                                              # timed call and the next step
        (row,) = [json.loads(ln) for ln in open(os.path.join(out_dir, "metrics.jsonl")) if ln.strip()]
        steps = [row.get(f"agent_{i}/optimizer_steps") for i in range(2)]
        del tr
        shutil.rmtree(out_dir, ignore_errors=True)
        return {"train_s": train_s, "train_cpu_s": train_cpu_s, "step_s": row["time/batch"],
                "generate_s": row["time/generate"], "reward_s": row["time/reward"], "update_s": row["time/update"],
                "plot_s": plot["s"] - p0, "tokens": round(row["tokens_per_s"] * row["time/batch"]),
                "optimizer_steps": steps}

    # Untimed warm-up: one full floor step (first-touch of gradient/optimizer memory, kernel selection per shape).
    warm = floor_step(-1) if a.warmup else None
    if warm:
        print(f"# {a.dtype} warm-up floor step (untimed): {warm['step_s']:.3f}s", file=sys.stderr, flush=True)
    order = []
    for i in range(a.pairs):
        order += ["floor", "ours"] if i % 2 == 0 else ["ours", "floor"]
    runs = {"floor": [], "ours": []}
    for rep, side in enumerate(order):
        res = (floor_step if side == "floor" else ours_step)(rep)
        runs[side].append(res)
        print(f"# {a.dtype} {side}: "
              + json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in res.items()}),
              file=sys.stderr, flush=True)

    def med(side, key):
        return statistics.median(r[key] for r in runs[side])

    summary = {s: {k: round(med(s, k), 3) for k in runs[s][0] if isinstance(runs[s][0][k], (int, float))} for s in runs}
    summary["ours"]["optimizer_steps"] = runs["ours"][0]["optimizer_steps"]
    bu.emit({"dtype": a.dtype, "order": order, "warmup_step_s": round(warm["step_s"], 3) if warm else None,
             "load_s": round(load_s, 2), "threads": torch.get_num_threads(),
             "summary": summary, "runs": runs, "peak_rss_mb": round(bu.peak_rss_mb(), 1)})


if __name__ == "__main__":
    main()
