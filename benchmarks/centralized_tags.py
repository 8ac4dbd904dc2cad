"""Centralized MAGRPO on the embedded SmolLM2-135M: how often the actor follows the tagged `<agent_i>` format
(and its task reward) on the held-out items, before and after a short CPU run on the length_ratio task.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/centralized_tags.py                    # defaults: 3 batches, 2 samples

Measured (shared 2-core machine, one torch thread, fp32): before 0/12 tagged answers, after 3 batches 0/12;
every training completion unparsed (reward 1/3 = the score of two empty answers for all K), so every advantage
is 0 and the update cannot move the actor. See the notebook's closing note.
"""
import argparse
import json
import tempfile
import time

import numpy as np
import torch

from comlrl_nb import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer, get_task, load_embedded, setup_logging


def tag_rate(tr, items, k: int, tag: str) -> dict:
    "Share of k joint answers per item that parse into every role's section, and their mean task reward."
    x = tr.central_sample(items, [(tr.args.seed, tag, j, "actor") for j in range(len(items))], k)
    n = len(items) * k
    any_tag = float(np.mean(["<agent_" in t for t in x["comps"].texts]))
    return {"tag_rate": 1 - x["unparsed"] / n, "any_tag_rate": any_tag, "reward": float(np.mean(x["rewards"])), "n": n,
            "len": float(x["comps"].lengths.float().mean()), "example": x["comps"].texts[0]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batches", type=int, default=3,
                   help="training batches (rollout + one update each); 0: measure only")
    p.add_argument("--samples", type=int, default=2, help="joint answers per held-out item for the rate")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", default=None, help="autocast dtype (e.g. bfloat16); default fp32")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    setup_logging()
    task = get_task("length_ratio")
    t0 = time.perf_counter()
    model, tok = load_embedded()
    with tempfile.TemporaryDirectory() as d:
        cfg = CentralizedMAGRPOConfig(num_agents=2, num_train_epochs=1, num_generations=4,
                                      max_new_tokens=a.max_new_tokens, temperature=0.8, top_p=0.95, top_k=50,
                                      agent_learning_rate=a.lr, rollout_batch_size=2, rollout_buffer_size=2,
                                      use_chat_template=True, autocast_dtype=a.dtype, eval_interval=0,
                                      save_steps=-1, progress_bar=False, logging_steps=1, output_dir=d)
        tr = CentralizedMAGRPOTrainer(agents=[model], tokenizer=tok, reward_func=task.reward_func,
                                      formatters=task.formatters, train_dataset=task.train_dataset, args=cfg)
        before = tag_rate(tr, task.eval_dataset, a.samples, "tags")
        print("before", json.dumps(before), f"({time.perf_counter() - t0:.0f}s)", flush=True)
        if a.batches <= 0: return
        print("config", json.dumps({k: getattr(cfg, k) for k in ("num_generations", "max_new_tokens",
              "agent_learning_rate", "rollout_batch_size", "temperature", "autocast_dtype")}), flush=True)
        t1 = time.perf_counter()
        out = tr.train(stop_after_batch=a.batches)
        rows = [json.loads(l) for l in open(out["metrics_path"])]
        train_s = time.perf_counter() - t1
        after = tag_rate(tr, task.eval_dataset, a.samples, "tags")
    print("train", json.dumps({"batches": len(rows), "seconds": round(train_s),
                               "unparsed_rate": [r["unparsed_rate"] for r in rows],
                               "reward_mean": [round(r["turn_1/reward_mean"], 3) for r in rows]}))
    print("after", json.dumps(after), flush=True)


if __name__ == "__main__":
    main()
