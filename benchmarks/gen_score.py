"""Worker: generation and scoring micro-benchmarks for one model, in this (fresh) process; prints one `RESULT {json}`.

For each dtype (fp32, bf16 autocast) on a batch of 4 prompts x K=4 samples, N new tokens:
  gen/ours       comlrl_nb.generation.generate_completions
  gen/hf         transformers `model.generate` doing the same sampling (do_sample, num_return_sequences=K, same
                 max_new_tokens / temperature / top_p / top_k, left padding, same EOS ids, same autocast)
  score/fwd      comlrl_nb.scoring.completion_logprobs under no_grad (on the gen/ours completions)
  score/fwd_bwd  completion_logprobs + backward of the mean sequence log-prob (gradients dropped between calls)
  score/fwd_hf   reference: one plain forward with full-length logits + log_softmax + gather (no_grad)
gen/ours and gen/hf calls alternate; every op gets `--warmup` untimed calls first; medians over `--repeats` of the
wall time and of the process CPU time of each call (the latter is robust to other load on a shared machine).

    .venv/bin/python benchmarks/gen_score.py --model tiny
    .venv/bin/python benchmarks/gen_score.py --model smollm2 --repeats 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchutil as bu  # noqa: E402


def hf_generated_tokens(seqs, prompt_len: int, eos: list[int]) -> int:
    "Tokens HF generated per row, counted up to and including the first EOS (what comlrl_nb's completion mask counts)."
    import torch

    gen = seqs[:, prompt_len:]
    if gen.shape[1] == 0:
        return 0
    is_eos = torch.isin(gen, torch.tensor(eos))
    first = torch.where(is_eos.any(1), is_eos.float().argmax(1) + 1,
                        torch.full_like(is_eos[:, 0], gen.shape[1], dtype=torch.long))
    return int(first.sum())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--num-prompts", type=int, default=4)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--skip-hf-forward", action="store_true")
    a = p.parse_args()

    bu.worker_setup()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from comlrl_nb.core import autocast
    from comlrl_nb.generation import eos_ids, generate_completions
    from comlrl_nb.models import load_embedded
    from comlrl_nb.rewards import apply_chat_template
    from comlrl_nb.scoring import completion_logprobs

    t_load = time.perf_counter()
    if a.model == "tiny":
        tok = AutoTokenizer.from_pretrained(str(bu.TINY_MODEL))
        model = AutoModelForCausalLM.from_pretrained(str(bu.TINY_MODEL)).eval()
    else:
        model, tok = load_embedded()
    load_s = time.perf_counter() - t_load
    prompts = [apply_chat_template(tok, q) for q in bu.PROMPTS[: a.num_prompts]]  # no-op without a chat template
    eos = eos_ids(model, tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos[0]
    n_params = sum(x.numel() for x in model.parameters())

    def ours(dt):
        c = generate_completions(model, tok, prompts, k=a.k, max_new_tokens=a.max_new_tokens, **bu.SAMPLING,
                                 autocast_dtype=dt)
        return c, int(c.lengths.sum())

    def hf(dt):
        tok.padding_side = "left"
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad(), autocast("cpu", dt):
            out = model.generate(**enc, do_sample=True, num_return_sequences=a.k, max_new_tokens=a.max_new_tokens,
                                 **bu.SAMPLING, pad_token_id=pad, eos_token_id=eos)
        return out, hf_generated_tokens(out, enc.input_ids.shape[1], eos)

    def timed(fn, *args):
        "Wall seconds and result of fn(*args); the call's process CPU seconds are left in timed.last_cpu."
        c0, t0 = time.process_time(), time.perf_counter()
        out = fn(*args)
        wall = time.perf_counter() - t0
        timed.last_cpu = time.process_time() - c0
        return wall, out

    rows = []

    def add(dt, op, times, tokens=None, cpus=None):
        med = statistics.median(times)
        rows.append({"model": a.model, "dtype": dt or "fp32", "op": op, "calls": len(times),
                     "ms_median": round(1e3 * med, 2), "ms_min": round(1e3 * min(times), 2),
                     "cpu_ms_median": round(1e3 * statistics.median(cpus), 2) if cpus else None,
                     "tokens_per_call": tokens, "tok_per_s": round(tokens / med, 1) if tokens else None})

    torch.manual_seed(0)
    for dname in a.dtypes.split(","):
        dt = None if dname == "fp32" else dname
        # --- generation: ours and HF alternate
        for _ in range(a.warmup):
            ours(dt)
            hf(dt)
        t_o, t_h, n_o, n_h, c_o, c_h = [], [], [], [], [], []
        for _ in range(a.repeats):
            s, (comps, n) = timed(ours, dt)
            t_o.append(s)
            n_o.append(n)
            c_o.append(timed.last_cpu)
            s, (_, n) = timed(hf, dt)
            t_h.append(s)
            n_h.append(n)
            c_h.append(timed.last_cpu)
        add(dt, "gen/ours generate_completions", t_o, statistics.median(n_o), c_o)
        add(dt, "gen/hf model.generate", t_h, statistics.median(n_h), c_h)
        # --- scoring on the last completions of ours (B*K rows)
        args = (comps.prompt_ids, comps.prompt_mask, comps.completion_ids, comps.completion_mask)
        n_tok = int(comps.completion_mask.sum())

        def fwd():
            with torch.no_grad():
                completion_logprobs(model, *args, autocast_dtype=dt)

        def fwd_bwd():
            _, seq = completion_logprobs(model, *args, autocast_dtype=dt)
            seq.mean().backward()

        def fwd_hf():
            ids = torch.cat([args[0], args[2]], 1)
            att = torch.cat([args[1], args[3]], 1)
            with torch.no_grad(), autocast("cpu", dt):
                logits = model(input_ids=ids, attention_mask=att).logits
            C = args[2].shape[1]
            lp = logits[:, -C - 1:-1].float().log_softmax(-1).gather(-1, args[2][..., None])[..., 0]
            return (lp * args[3]).sum(-1)

        ops = [("score/fwd completion_logprobs", fwd), ("score/fwd_bwd completion_logprobs", fwd_bwd)]
        if not a.skip_hf_forward:
            ops.append(("score/fwd_hf full-logits reference", fwd_hf))
        for name, fn in ops:
            ts, cs = [], []
            for r in range(a.warmup + a.repeats):
                model.zero_grad(set_to_none=True)
                s, _ = timed(fn)
                if r >= a.warmup:
                    ts.append(s)
                    cs.append(timed.last_cpu)
            model.zero_grad(set_to_none=True)
            add(dt, name, ts, n_tok, cs)
    bu.emit({"model": a.model, "params": n_params, "load_s": round(load_s, 2), "rows_per_call": a.num_prompts * a.k,
             "prompt_len": int(comps.prompt_ids.shape[1]), "max_new_tokens": a.max_new_tokens,
             "threads": torch.get_num_threads(), "results": rows, "peak_rss_mb": round(bu.peak_rss_mb(), 1)})


if __name__ == "__main__":
    main()
