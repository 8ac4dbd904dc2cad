"""Sampling ahead on vs off, same trainer, same run: MAAC and MAGRPO at their defaults on the tiny model (16 items).

    .venv/bin/python benchmarks/ahead.py [--repeats 3]

"off" replaces the trainer's `_batches_ahead` with a function that returns nothing, so every batch samples on its own.
Prints the median train() time of each and whether the final weights are identical (they must be).
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchutil as bu  # noqa: E402


def run(algo: str, ahead: bool):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from comlrl_nb import MAACConfig, MAACTrainer, MAGRPOConfig, MAGRPOTrainer
    model = str(bu.TINY_MODEL)
    tok = AutoTokenizer.from_pretrained(model)
    agents = [AutoModelForCausalLM.from_pretrained(model) for _ in range(2)]
    common = dict(num_agents=2, max_new_tokens=16, **bu.SAMPLING, num_train_epochs=1, eval_interval=0,
                  output_dir=tempfile.mkdtemp(), progress_bar=False, save_steps=-1, logging_steps=1000, save_plot=False)
    data = [{"prompt": p} for p in bu.PROMPTS * 2]
    if algo == "maac":     # defaults: K=1, rollout_buffer_size 8, rollout_batch_size 1
        tr = MAACTrainer(agents=agents, tokenizer=tok, reward_func=bu.linear_reward, train_dataset=data,
                         args=MAACConfig(**common), critic_model=AutoModelForCausalLM.from_pretrained(model))
    else:                  # defaults: K=4, rollout_buffer_size 2, rollout_batch_size 1
        tr = MAGRPOTrainer(agents=agents, tokenizer=tok, reward_func=bu.linear_reward, train_dataset=data,
                           args=MAGRPOConfig(**common, early_termination_threshold=None))
    if not ahead:
        tr._batches_ahead = lambda *a: []
    t = time.perf_counter()
    tr.train()
    return time.perf_counter() - t, [p.detach().clone() for m in tr.agents for p in m.parameters()]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    bu.worker_setup()
    import torch
    for algo in ("magrpo", "maac"):
        res = {False: [], True: []}
        for _ in range(a.repeats):
            for ahead in (False, True):
                res[ahead].append(run(algo, ahead))
        same = all(torch.equal(x, y) for x, y in zip(res[False][0][1], res[True][0][1]))
        off, on = (statistics.median(r[0] for r in res[k]) for k in (False, True))
        print(f"{algo:7s} sampling ahead off {off:.3f} s   on {on:.3f} s   ratio {on / off:.2f}   identical "
              f"weights: {same}")


if __name__ == "__main__":
    main()
