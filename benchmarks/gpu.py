r"""The prepared GPU check of issue X ("Real models on GPUs"): one call on a device machine (no downloads), under 8
minutes on one H200; on a CPU, `--small --device cpu` (the dry mode) runs every section end to end on tiny shapes.

    # here, once: the wheels the device image lacks (fastcore; python 3.12 wheels) into .whl/ (ignored)
    make gpu-wheels
    # on the device machine (run with carry=[".whl"]; its image has torch, transformers, peft, numpy, pyyaml, tqdm):
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site:$PWD || exit; PYTHONUNBUFFERED=1 python3 benchmarks/gpu.py --out $OUT/gpu.json
    # here, on the CPU, tiny shapes (a few minutes; --sections memory alone: seconds):
    .venv/bin/python benchmarks/gpu.py --small --device cpu [--sections gen,magrpo,memory,trainers]

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
  memory  two agents of Qwen2.5-1.5B's shape (28 layers, hidden 1536, 12/2 heads, intermediate 8960, vocab 151936,
          tied) loaded in bf16 with the memory fields on: gradient_checkpointing, micro_batch_size, master_weights
          (fp32 master copy + AdamW), reference KL with the one shared reference of their common base; one MAGRPO
          epoch of 2 batches: tokens/s and step time of the second, torch.cuda.max_memory_allocated next to
          plan_memory's estimate for the same settings (plan_from_config of the same config) and measured/planned
          (also without the plan's 1 GiB overhead, which max_memory_allocated does not see); on a CPU the planner's
          number only ("measured: n/a on cpu")
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
    "qwen1.5b": ("qwen2", dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
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


def memory_bench(shape, device, B, K, T, micro: int = 4, plen: int = 24):
    """Two agents of one bf16 base with the memory features on (gradient_checkpointing, micro_batch_size, fp32 master
    weights, the one shared reference with reference KL): one MAGRPO epoch of 2 batches; the second batch's tokens/s,
    step time and the peak GPU memory (above what was allocated before) next to `plan_memory`'s estimate for the same
    settings, and their ratio."""
    from comlrl_nb.engine import read_metrics
    from comlrl_nb.plan import format_bytes, plan_from_config, plan_memory
    from comlrl_nb.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
    vocab = SHAPES[shape][1]["vocab_size"]
    tok = word_tokenizer(vocab)
    g = torch.Generator().manual_seed(4)
    items = [{"prompt": " ".join(f"w{int(x)}" for x in torch.randint(2, vocab, (plen,), generator=g))}
             for _ in range(2 * B)]
    cuda = torch.device(device).type == "cuda"
    if cuda:
        __import__("gc").collect()                                     # what earlier sections left is not this run's
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if cuda else 0
    base = build(shape, device, torch.bfloat16)                        # as model_config={"dtype": "bfloat16"} loads
    cfg = MAGRPOConfig(num_agents=2, num_generations=K, max_new_tokens=T, temperature=1.0, top_p=0.95, top_k=50,
                       num_train_epochs=1, agent_learning_rate=1e-5, eval_interval=0, rollout_batch_size=B,
                       rollout_buffer_size=B, train_batch_size=B, early_termination_threshold=None,
                       autocast_dtype=None, gradient_checkpointing=True, micro_batch_size=micro, master_weights=True,
                       reference_kl_enabled=True, reference_kl_coef=0.05, agent_devices=str(device),
                       output_dir=tempfile.mkdtemp(prefix="gpu_memory_"), progress_bar=False, save_steps=-1,
                       save_plot=False)
    settings = plan_from_config(cfg, model_config={"dtype": "bfloat16"}, prompt_length=plen)
    plan = plan_memory(base, device_type="cuda", suggestions=False,
                       **{k: v for k, v in __import__("dataclasses").asdict(settings).items() if k != "algo"},
                       algo=settings.algo)
    lens = lambda *cs: [float(len(c[j]) % 7) for c in cs[:1] for j in range(len(c))]
    tr = MAGRPOTrainer(reward_func=lens, args=cfg, train_dataset=items, agents=[base, base], tokenizer=tok)
    t0 = time.perf_counter()
    tr.train()
    sync(device)
    wall = time.perf_counter() - t0
    r = [x for x in read_metrics(os.path.join(cfg.output_dir, "metrics.jsonl")) if "time/batch" in x][-1]
    planned = plan.peak_bytes
    res = {"model": shape, "agents": "2 agents of one bf16 base, one shared reference",
           "settings": {"gradient_checkpointing": True, "micro_batch_size": micro, "master_weights": True,
                        "model_dtype": "bfloat16", "reference_kl_enabled": True, "rows_per_agent": B * K,
                        "prompt_tokens": plen, "new_tokens": T},
           "step_s": round(r["time/batch"], 3), "tokens_per_s": round(r["tokens_per_s"], 1),
           "generate_s": round(r["time/generate"], 3), "train_s": round(wall, 2),
           "planned_peak_bytes": planned, "planned_peak": format_bytes(planned),
           "planned_components": plan.per_device[0].components if plan.per_device else None}
    # the planner counts a reference per agent; the trainer keeps one for agents of one base: the plan less one copy
    refs = (res["planned_components"] or {}).get("references", 0)
    res["planned_peak_one_reference_bytes"] = planned - refs // 2
    if cuda:
        peak = torch.cuda.max_memory_allocated() - before
        res.update(measured_peak_bytes=peak, allocated_before_bytes=before, measured_peak=format_bytes(peak),
                   measured_over_planned=round(peak / planned, 3),
                   measured_over_planned_without_overhead=round(peak / max(planned - plan.settings["overhead_bytes"],
                                                                           1), 3),
                   measured_over_planned_one_reference=round(peak / res["planned_peak_one_reference_bytes"], 3),
                   note="the plan counts overhead_bytes (1 GiB: CUDA context, allocator slack) that "
                        "max_memory_allocated does not")
        m = f"measured {res['measured_peak']} = {res['measured_over_planned']} x planned"
    else:
        res.update(measured_peak_bytes=None, measured_peak="n/a on cpu", measured_over_planned=None)
        m = "measured: n/a on cpu"
    print(f"  memory {shape:9s} gc+micro{micro}+master+shared ref: step {res['step_s']:.2f}s, "
          f"{res['tokens_per_s']:.0f} tok/s, planned {res['planned_peak']}, {m}", flush=True)
    del tr, base
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


SECTIONS = ("gen", "magrpo", "memory", "trainers")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--models", default="smollm2,qwen0.5b")
    p.add_argument("--small", action="store_true", help="tiny shapes and lengths: a smoke test of the code path")
    p.add_argument("--out", default=None, help="write every result as JSON here")
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help="comma list of sections to run: " + ", ".join(SECTIONS) + " (default: all)")
    p.add_argument("--shape", default=None,
                   help="B,K,T,repeats override (prompts, samples per prompt, new tokens, timed calls)")
    p.add_argument("--trainers", default="all",
                   help="algorithms for the every-trainer pass ('all', 'none' or a comma list)")
    p.add_argument("--trainer-shape", default=None,
                   help="B,K,T of the every-trainer pass (default 4,4,64; --small 2,2,8)")
    p.add_argument("--memory-model", default="qwen1.5b", help="shape of the memory section (--small: small)")
    p.add_argument("--memory-shape", default=None,
                   help="B,K,T,micro of the memory section (default 4,4,128,4; --small 2,2,8,2)")
    a = p.parse_args()
    sections = [x for x in a.sections.split(",") if x]
    bad = sorted(set(sections) - set(SECTIONS))
    if bad: p.error(f"--sections: unknown {bad}; use a comma list of " + ", ".join(SECTIONS))
    torch.backends.cuda.matmul.allow_tf32 = True
    models = ["small"] if a.small else a.models.split(",")
    B, K, T, reps = (2, 2, 8, 1) if a.small else (8, 8, 128, 3)
    if a.shape: B, K, T, reps = (int(x) for x in a.shape.split(","))
    info = {"device": str(a.device), "torch": torch.__version__, "sections": sections,
            "gpu": torch.cuda.get_device_name(0) if torch.device(a.device).type == "cuda" else None}
    print(f"# gpu check: {info}", flush=True)
    res = {"info": info}

    def save():
        if a.out:
            with open(a.out, "w") as f:
                json.dump(res, f, indent=1)
    for shape in models:
        if "gen" in sections:
            res.setdefault("gen", []).extend(gen_bench(shape, a.device, B, K, T, reps))
        for lora in ((False, True) if "magrpo" in sections else ()):
            try:
                res.setdefault("magrpo", []).append(magrpo_bench(shape, a.device, B, K, T, lora))
            except ImportError as e:                                  # peft missing: say so, keep the rest
                print(f"  magrpo {shape} lora skipped: {e}", flush=True)
        save()
    if "memory" in sections:
        mB, mK, mT, micro = (2, 2, 8, 2) if a.small else (4, 4, 128, 4)
        if a.memory_shape: mB, mK, mT, micro = (int(x) for x in a.memory_shape.split(","))
        res["memory"] = [memory_bench("small" if a.small else a.memory_model, a.device, mB, mK, mT, micro)]
        save()
    if "trainers" in sections and a.trainers != "none":
        tB, tK, tT = (2, 2, 8) if a.small else (4, 4, 64)
        if a.trainer_shape: tB, tK, tT = (int(x) for x in a.trainer_shape.split(","))
        res["trainers"] = trainers_bench(models[0], a.device, tB, tK, tT,
                                         None if a.trainers == "all" else a.trainers.split(","))
        save()
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
