"""GPU check, prepared for a session that is lent a device machine (one call, no downloads); also runs on a CPU with
`--small` as a smoke test of the same code path.

    # on the device machine (its image has torch, transformers, peft; the package needs nothing else):
    PYTHONPATH=. python3 benchmarks/gpu.py --out $OUT/gpu.json
    # here, on the CPU, tiny shapes:
    .venv/bin/python benchmarks/gpu.py --small --device cpu

Models are built from configs with random weights (nothing to download): `smollm2` has SmolLM2-135M's shape (Llama,
30 layers, hidden 576, 9/3 heads, vocab 49152), `qwen0.5b` Qwen2.5-0.5B's (24 layers, hidden 896, 14/2 heads, vocab
151936). The tokenizer is a word-level one built in-process over the whole vocabulary, so any sampled id decodes.
Random weights rarely emit EOS, so every row runs to max_new_tokens: the timings are of full-length generation.

Per model it prints and records:
  gen     tokens/s of `generate_completions` and of HF `generate` (same rows, same sampling settings), fp32 weights with
          bf16 autocast and pure bf16 weights
  magrpo  one MAGRPO batch for 2 agents (B prompts x K samples): time/batch, generate, score (log-prob forward),
          backward + step, and peak GPU memory
  lora    the same batch with 2 LoRA adapter agents over one base (peft), for memory and time against full copies
  trainers  every algorithm of `comlrl-nb train --algo` (MAGRPO, MAREINFORCE, MARLOO, MAReMax, MAAC, IAC, MADPO,
          MARLHF and the two iterative ones) for one epoch of 2 batches on the first model's shape, with
          autocast_dtype="auto" (the precision the probe picked is recorded): train() wall, the last batch's time,
          peak GPU memory; a trainer that fails is recorded with its error and the rest go on
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch

SHAPES = {
    "smollm2": ("llama", dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                              num_key_value_heads=3, vocab_size=49152, rope_theta=100000.0)),
    "qwen0.5b": ("qwen2", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                               num_key_value_heads=2, vocab_size=151936, rope_theta=1000000.0)),
    "small": ("llama", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=512)),
}


def word_tokenizer(vocab_size: int):
    "A word-level tokenizer over ids 0..vocab_size-1 ('<eos>'=0, '<pad>'=1, then 'w2', 'w3', ...), left padding."
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast
    vocab = {"<eos>": 0, "<pad>": 1, **{f"w{i}": i for i in range(2, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")          # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>")
    fast.padding_side = "left"
    return fast


def build(shape: str, device, dtype=torch.float32, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    arch, kw = SHAPES[shape]
    cfg_cls, cls = (LlamaConfig, LlamaForCausalLM) if arch == "llama" else (Qwen2Config, Qwen2ForCausalLM)
    cfg = cfg_cls(**kw, tie_word_embeddings=True, max_position_embeddings=4096, eos_token_id=0, bos_token_id=0,
                  pad_token_id=1)
    torch.manual_seed(seed)
    with torch.device(device):
        m = cls(cfg).to(dtype)
    m.generation_config.pad_token_id = 1
    return m.eval()


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device, repeats: int):
    out, ts = None, []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        ts.append(time.perf_counter() - t0)
    return out, sorted(ts)[len(ts) // 2]


def gen_bench(shape, device, B, K, T, repeats):
    from comlrl_nb.core import autocast
    from comlrl_nb.generation import generate_completions
    vocab = SHAPES[shape][1]["vocab_size"]
    tok = word_tokenizer(vocab)
    g = torch.Generator().manual_seed(0)
    prompts = [" ".join(f"w{int(x)}" for x in torch.randint(2, vocab, (int(n),), generator=g))
               for n in torch.randint(16, 48, (B,), generator=g)]
    rows = []
    for label, dtype, ac in (("fp32 weights + bf16 autocast", torch.float32, "bfloat16"),
                             ("bf16 weights", torch.bfloat16, None)):
        m = build(shape, device, dtype)
        ours = lambda: generate_completions(m, tok, prompts, k=K, max_new_tokens=T, temperature=1.0, top_p=0.95,
                                            top_k=50, autocast_dtype=ac)
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)

        def hf():
            with torch.no_grad(), autocast(torch.device(device), ac):
                return m.generate(**enc, do_sample=True, num_return_sequences=K, max_new_tokens=T, temperature=1.0,
                                  top_p=0.95, top_k=50, pad_token_id=1, eos_token_id=0)
        ours()
        hf()                                                          # warm-up: kernels, allocator
        c, t_ours = timed(ours, device, repeats)
        h, t_hf = timed(hf, device, repeats)
        n_ours, n_hf = int(c.completion_mask.sum()), int((h[:, enc.input_ids.shape[1]:] != 1).sum())
        rows.append({"model": shape, "dtype": label, "rows": B * K, "new_tokens": T, "ours_s": round(t_ours, 3),
                     "hf_s": round(t_hf, 3), "ours_tok_s": round(n_ours / t_ours), "hf_tok_s": round(n_hf / t_hf),
                     "ours_vs_hf": round((n_ours / t_ours) / (n_hf / t_hf), 2)})
        print(f"  gen {shape:9s} {label:28s} rows={B * K} T={T}: ours {n_ours / t_ours:9.0f} tok/s  hf "
              f"{n_hf / t_hf:9.0f} tok/s", flush=True)
        del m
    return rows


def magrpo_bench(shape, device, B, K, T, lora: bool):
    from comlrl_nb.engine import read_metrics
    from comlrl_nb.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
    vocab = SHAPES[shape][1]["vocab_size"]
    tok = word_tokenizer(vocab)
    g = torch.Generator().manual_seed(1)
    items = [{"prompt": " ".join(f"w{int(x)}" for x in torch.randint(2, vocab, (24,), generator=g))}
             for _ in range(2 * B)]
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    if lora:
        from comlrl_nb.adapters import LoRAAgents
        spec = dict(agents=LoRAAgents(base=build(shape, device), num_agents=2, r=16, tokenizer=tok))
    else:
        spec = dict(agents=[build(shape, device, seed=0), build(shape, device, seed=1)], tokenizer=tok)
    out = tempfile.mkdtemp(prefix="gpu_magrpo_")
    cfg = MAGRPOConfig(num_agents=2, num_generations=K, max_new_tokens=T, temperature=1.0, top_p=0.95, top_k=50,
                       num_train_epochs=1, agent_learning_rate=1e-5, eval_interval=0, rollout_batch_size=B,
                       rollout_buffer_size=B, early_termination_threshold=None, autocast_dtype="bfloat16",
                       agent_devices=str(device), output_dir=out, progress_bar=False, save_steps=-1, save_plot=False)
    lens = lambda *cs: [float(len(c[j]) % 7) for c in cs[:1] for j in range(len(c))]
    tr = MAGRPOTrainer(reward_func=lens, args=cfg, train_dataset=items, **spec)
    t0 = time.perf_counter()
    tr.train()
    sync(device)
    wall = time.perf_counter() - t0
    rows = read_metrics(os.path.join(out, "metrics.jsonl"))
    r = rows[-1]                                                      # the second batch: kernels warm
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.device(device).type == "cuda" else float("nan")
    res = {"model": shape, "agents": "2 LoRA (r=16) over one base" if lora else "2 full copies",
           "rows_per_agent": B * K, "new_tokens": T, "batch_s": round(r["time/batch"], 3),
           "generate_s": round(r["time/generate"], 3), "score_s": round(r.get("time/score", float("nan")), 3),
           "backward_step_s": round(r.get("time/backward_step", float("nan")), 3),
           "train_s": round(wall, 2), "peak_gpu_gib": round(peak, 2),
           "gen_tok_s": round(r["tokens_per_s"] * r["time/batch"] / max(r["time/generate"], 1e-9))}
    print(f"  magrpo {shape:9s} {res['agents']:28s}: batch {res['batch_s']:.2f}s (generate "
          f"{res['generate_s']:.2f}, score {res['score_s']:.2f}, backward+step {res['backward_step_s']:.2f}), peak "
          f"{res['peak_gpu_gib']} GiB", flush=True)
    del tr
    return res


def trainers_bench(shape, device, B, K, T, algos=None):
    "One short train() per algorithm (2 batches of B prompts x K samples, T new tokens), 2 agents, random weights."
    from comlrl_nb.cli import ALGORITHMS, _algorithms
    from comlrl_nb.core import auto_precision
    from comlrl_nb.engine import read_metrics
    vocab = SHAPES[shape][1]["vocab_size"]
    tok = word_tokenizer(vocab)
    g = torch.Generator().manual_seed(2)
    items = [{"prompt": " ".join(f"w{int(x)}" for x in torch.randint(2, vocab, (24,), generator=g))}
             for _ in range(2 * B)]
    reward = lambda *cs: [float(len(c[j]) % 7) for c in cs[:1] for j in range(len(c))]
    prec = auto_precision(device)
    print(f"  trainers {shape}: autocast_dtype='auto' -> {prec[0] or 'float32'} ({prec[1]})", flush=True)
    rows = []
    for algo in (algos or ALGORITHMS):
        cfg_cls, trainer_cls = _algorithms()[algo]
        names = {f.name for f in __import__("dataclasses").fields(cfg_cls)}
        want = dict(num_agents=2, num_generations=K, max_new_tokens=T, temperature=1.0, top_p=0.95, top_k=50,
                    num_train_epochs=1, eval_interval=0, rollout_batch_size=B, rollout_buffer_size=B,
                    train_batch_size=B, early_termination_threshold=None, autocast_dtype="auto",
                    agent_devices=str(device), output_dir=tempfile.mkdtemp(prefix=f"gpu_{algo}_"), progress_bar=False,
                    save_steps=-1, save_plot=False, preference_num_candidates=K, preference_pairs_per_sample=1,
                    num_iterations=2,  # preference ones: small
                    reward_train_batch_size=B)
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        n_models = 1 if algo == "centralized_magrpo" else 2          # one actor model plays both roles
        kw = dict(agents=[build(shape, device, seed=j) for j in range(n_models)], tokenizer=tok)
        if algo in ("maac", "iac"): kw["critic_model"], kw["critic_tokenizer"] = build(shape, device, seed=2), tok
        if algo in ("marlhf", "marlhf_iter"): kw.update(reward_model=build(shape, device, seed=3), reward_tokenizer=tok)
        res = {"algo": algo, "model": shape, "rows_per_agent": B * K, "new_tokens": T}
        try:
            cfg = cfg_cls(**{k: v for k, v in want.items() if k in names})
            tr = trainer_cls(reward_func=reward, args=cfg, train_dataset=items, eval_dataset=items[:B], **kw)
            t0 = time.perf_counter()
            state = tr.train()
            sync(device)
            wall = time.perf_counter() - t0
            recs = [r for r in read_metrics(os.path.join(cfg.output_dir, "metrics.jsonl")) if "time/batch" in r]
            peak = torch.cuda.max_memory_allocated() / 2**30 if torch.device(device).type == "cuda" else float("nan")
            res.update(train_s=round(wall, 2), batches=int(state.get("global_batch", len(recs))),
                       peak_gpu_gib=round(peak, 2), last_batch_s=round(recs[-1]["time/batch"], 3) if recs else None)
            print(f"  trainer {algo:12s} {shape}: train() {wall:.2f}s, {res['batches']} batches, last batch "
                  f"{res['last_batch_s']}s, peak {res['peak_gpu_gib']} GiB", flush=True)
            del tr
        except Exception as e:                                      # record it, keep the others
            res["error"] = f"{type(e).__name__}: {e}"[:300]
            print(f"  trainer {algo:12s} {shape}: FAILED {res['error']}", flush=True)
        rows.append(res)
        del kw
    return {"precision": {"autocast_dtype": prec[0], "reason": prec[1]}, "runs": rows}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--models", default="smollm2,qwen0.5b")
    p.add_argument("--small", action="store_true", help="tiny shapes and lengths: a smoke test of the code path")
    p.add_argument("--out", default=None, help="write every result as JSON here")
    p.add_argument("--shape", default=None,
                   help="B,K,T,repeats override (prompts, samples per prompt, new tokens, timed calls)")
    p.add_argument("--trainers", default="all",
                   help="algorithms for the every-trainer pass ('all', 'none' or a comma list)")
    p.add_argument("--trainer-shape", default=None,
                   help="B,K,T of the every-trainer pass (default 4,4,64; --small 2,2,8)")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    models = ["small"] if a.small else a.models.split(",")
    B, K, T, reps = (2, 2, 8, 1) if a.small else (8, 8, 128, 3)
    if a.shape: B, K, T, reps = (int(x) for x in a.shape.split(","))
    info = {"device": str(a.device), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(0) if torch.device(a.device).type == "cuda" else None}
    print(f"# gpu check: {info}", flush=True)
    res = {"info": info, "gen": [], "magrpo": []}
    for shape in models:
        res["gen"] += gen_bench(shape, a.device, B, K, T, reps)
        for lora in (False, True):
            try:
                res["magrpo"].append(magrpo_bench(shape, a.device, B, K, T, lora))
            except ImportError as e:                                  # peft missing: say so, keep the rest
                print(f"  magrpo {shape} lora skipped: {e}", flush=True)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(res, f, indent=1)
    if a.trainers != "none":
        tB, tK, tT = (2, 2, 8) if a.small else (4, 4, 64)
        if a.trainer_shape: tB, tK, tT = (int(x) for x in a.trainer_shape.split(","))
        res["trainers"] = trainers_bench(models[0], a.device, tB, tK, tT,
                                         None if a.trainers == "all" else a.trainers.split(","))
        if a.out:
            with open(a.out, "w") as f:
                json.dump(res, f, indent=1)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
