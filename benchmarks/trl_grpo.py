"""Worker: one GRPO step of ONE agent, ours (comlrl_nb MAGRPO with num_agents=1) or TRL's GRPOTrainer, same work.

Work: 4 chat-templated prompts x K=4 completions, at most 32 new tokens (temperature 0.6, top_p 0.6, top_k 50), the
reward -|len(c) - 60| / 50 per completion, group-normalised advantages, one AdamW step (lr 5e-6) on the 16
completions; no reference model (beta 0), fp32, one torch thread. Timed: the `trainer.train()` call only (wall and
process CPU time); model loading and trainer construction are outside it. Prints one `RESULT {json}` line.

    .venv/bin/python benchmarks/trl_grpo.py --side ours --model .peer/smollm2-hf
    $PEER_DIR/venv/bin/python benchmarks/trl_grpo.py --side trl --model .peer/smollm2-hf  # needs trl (pip install trl)

`--model` is a local HF model folder (benchmarks/ratios.py writes SmolLM2-135M there once from the embedded model).
TRL's GRPO defaults differ from ours in ways that do not change the work: its loss is the clipped-ratio form (equal to
REINFORCE with one update per generation) and it scales advantages by the group std, as ours does by default.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchutil as bu  # noqa: E402

PROMPTS = bu.PROMPTS[:4]
K, NEW, LR = 4, 32, 5e-6


def length_reward(c):
    return -abs(len(c) - 60) / 50.0


def ours(model_dir: str) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from comlrl_nb.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    cfg = MAGRPOConfig(num_agents=1, num_generations=K, max_new_tokens=NEW, **bu.SAMPLING, num_train_epochs=1,
                       agent_learning_rate=LR, eval_interval=0, rollout_batch_size=len(PROMPTS),
                       rollout_buffer_size=len(PROMPTS), train_batch_size=len(PROMPTS), use_chat_template=True,
                       early_termination_threshold=None, output_dir=tempfile.mkdtemp(), progress_bar=False,
                       save_steps=-1, logging_steps=1000, save_plot=False)
    tr = MAGRPOTrainer(agents=[model], tokenizer=tok, reward_func=lambda c: [length_reward(x) for x in c], args=cfg,
                       train_dataset=[{"prompt": p} for p in PROMPTS])
    bu.seed_like_peer(0)
    c0, t0 = time.process_time(), time.perf_counter()
    tr.train()
    return {"train_s": time.perf_counter() - t0, "train_cpu_s": time.process_time() - c0,
            "optimizer_steps": tr.state["optimizer_steps"][0]}


def trl(model_dir: str) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    import trl as trl_mod

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS])

    def reward(completions, **kw):
        return [length_reward(c[0]["content"] if isinstance(c, list) else c) for c in completions]

    cfg = GRPOConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=len(PROMPTS) * K, num_generations=K,
                     gradient_accumulation_steps=1, max_completion_length=NEW, temperature=bu.SAMPLING["temperature"],
                     top_p=bu.SAMPLING["top_p"], top_k=bu.SAMPLING["top_k"], learning_rate=LR, beta=0.0, max_steps=1,
                     num_train_epochs=1, logging_steps=1, save_strategy="no", report_to="none", use_cpu=True,
                     bf16=False, disable_tqdm=True, seed=0, dataloader_num_workers=0)
    tr = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=ds, processing_class=tok)
    steps = {"n": 0}
    orig = tr.optimizer.step if tr.optimizer is not None else None
    bu.seed_like_peer(0)
    c0, t0 = time.process_time(), time.perf_counter()
    out = tr.train()
    return {"train_s": time.perf_counter() - t0, "train_cpu_s": time.process_time() - c0,
            "optimizer_steps": int(tr.state.global_step), "trl_version": trl_mod.__version__}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--side", choices=["ours", "trl"], required=True)
    p.add_argument("--model", default=str(bu.PEER_DIR / "smollm2-hf"))
    a = p.parse_args()
    bu.worker_setup()
    res = ours(a.model) if a.side == "ours" else trl(a.model)
    res.update(side=a.side, peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1))
    bu.emit(res)


if __name__ == "__main__":
    main()
