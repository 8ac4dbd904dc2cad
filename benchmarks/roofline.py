"""Roofline of this CPU, and where our generation sits under it; prints one table and one `RESULT {json}` line.

Measured here, in one process, side by side:
  peak GFLOP/s   a large square matmul (torch.mm, n x n by n x n, 2 n^3 FLOPs), fp32 and bf16, 1 and 2 threads
  memory GB/s    a large copy (dst.copy_(src), 256 MB each way: bytes read + bytes written), 1 and 2 threads
  generation     comlrl_nb.generation.generate_completions on SmolLM2-135M (the embedded model): B rows
                 (prompts x K), N new tokens, fp32 and bf16 autocast, at the thread count(s) asked

Decoding one token for B rows multiplies every weight once per row (2 * P * B FLOPs, P = parameters used per token:
all of them, the embedding table doubling as the LM head) and streams the weights from memory once (4 * P bytes in
fp32; bf16 autocast reads the same fp32 weights, casts them, so at least as many). The roofline time per decode step
is max(2 P B / peak, 4 P / bandwidth); the fraction printed is roofline time / measured time (1.0 = at the limit).
Attention over the KV cache, sampling and Python work are not in the model, so the fraction is an upper bound on
how close the arithmetic is to the hardware, not a claim that the rest is free.

    .venv/bin/python benchmarks/roofline.py                      # ~1 min on 2 idle cores
    .venv/bin/python benchmarks/roofline.py --threads 1 --rows 4,16,64 --new-tokens 32
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchutil as bu  # noqa: E402


def best_of(fn, reps: int, budget: float = 3.0) -> float:
    "Best wall seconds of `reps` calls of fn (after one warm-up), stopping early past `budget` seconds."
    fn()
    best, t_end = float("inf"), time.perf_counter() + budget
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
        if time.perf_counter() > t_end:
            break
    return best


def peak_gflops(dtype, threads: int, n: int = 1024, reps: int = 5) -> float:
    import torch

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=g).to(dtype) for _ in range(2))
    return 2 * n**3 / best_of(lambda: torch.mm(a, b), reps) / 1e9


def bandwidth_gbs(threads: int, mb: int = 256, reps: int = 5) -> float:
    import torch

    torch.set_num_threads(threads)
    src = torch.ones(mb * 2**20 // 4)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / best_of(lambda: dst.copy_(src), reps) / 1e9


def generation(model, tok, rows: int, k: int, new_tokens: int, dtype, threads: int, reps: int) -> dict:
    "Tokens/s of generate_completions (rows = prompts x k), every row forced to run all `new_tokens` steps."
    import torch

    from comlrl_nb.generation import generate_completions
    from comlrl_nb.rewards import apply_chat_template

    torch.set_num_threads(threads)
    prompts = [apply_chat_template(tok, p) for p in bu.PROMPTS[: max(1, rows // k)]]
    eos = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = None          # no early stop: every step decodes every row
    try:
        kw = dict(k=k, max_new_tokens=new_tokens, temperature=0.7, autocast_dtype=dtype,
                  keys=[(0, i) for i in range(len(prompts))])
        out = {}
        t = best_of(lambda: out.setdefault("c", generate_completions(model, tok, prompts, **kw)), reps, budget=30.0)
    finally:
        model.generation_config.eos_token_id = eos
    B, steps = len(prompts) * k, int(out["c"].completion_ids.shape[1])
    return {"rows": B, "steps": steps, "seconds": t, "tokens_per_s": B * steps / t}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", default="1,2", help="thread counts to measure, comma-separated")
    p.add_argument("--rows", default="16", help="generation batch sizes (prompts x K), comma-separated")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--skip-generation", action="store_true")
    a = p.parse_args()
    bu.worker_setup()
    import torch

    from comlrl_nb.core import BF16_CPU_FLAGS, cpu_flags

    threads = [int(x) for x in a.threads.split(",")]
    dts = {"fp32": (torch.float32, None), "bf16": (torch.bfloat16, "bfloat16")}
    dtypes = [d for d in a.dtypes.split(",") if d in dts]
    flags = sorted(cpu_flags() & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", *BF16_CPU_FLAGS})
    res = {"cpu_flags": flags, "load_avg": os.getloadavg()[0], "peak_gflops": {}, "bandwidth_gbs": {}, "generation": []}
    for t in threads:
        res["bandwidth_gbs"][t] = bandwidth_gbs(t)
        for d in dtypes:
            res["peak_gflops"][f"{d}/{t}"] = peak_gflops(dts[d][0], t)
    print(f"CPU flags: {' '.join(flags)}; load average at start {res['load_avg']:.1f}")
    print("| threads | fp32 GFLOP/s | bf16 GFLOP/s | copy GB/s |\n|---|---|---|---|")
    for t in threads:
        g = [f"{res['peak_gflops'].get(f'{d}/{t}', float('nan')):.0f}" for d in ("fp32", "bf16")]
        print(f"| {t} | {g[0]} | {g[1]} | {res['bandwidth_gbs'][t]:.1f} |")
    if not a.skip_generation:
        from comlrl_nb.models import load_embedded

        model, tok = load_embedded()
        model.eval()
        P = sum(p.numel() for p in model.parameters())
        print(f"\nSmolLM2-135M: {P / 1e6:.1f}M parameters per token; roofline step = max(2 P B / peak, 4 P / "
              "bandwidth)")
        print("| dtype | threads | rows | tokens/s | achieved GFLOP/s | roofline tokens/s | fraction "
              "|\n|---|---|---|---|---|---|---|")
        for t in threads:
            for B in [int(x) for x in a.rows.split(",")]:
                for d in dtypes:
                    r = generation(model, tok, B, min(a.k, B), a.new_tokens, dts[d][1], t, a.reps)
                    step_roof = max(2 * P * r["rows"] / (res["peak_gflops"][f"{d}/{t}"] * 1e9),
                                    4 * P / (res["bandwidth_gbs"][t] * 1e9))
                    roof_tps = r["rows"] / step_roof
                    r.update(dtype=d, threads=t, achieved_gflops=2 * P * r["tokens_per_s"] / 1e9,
                             roofline_tokens_per_s=roof_tps, fraction=r["tokens_per_s"] / roof_tps)
                    res["generation"].append(r)
                    print(f"| {d} | {t} | {r['rows']} | {r['tokens_per_s']:.0f} | {r['achieved_gflops']:.1f} | "
                          f"{roof_tps:.0f} | {r['fraction']:.2f} |")
    res["load_avg_end"] = os.getloadavg()[0]
    bu.emit(res)


if __name__ == "__main__":
    main()
