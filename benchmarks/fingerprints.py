"""Weights fingerprints of seeded tiny-model runs, one line per trainer: a refactor of the trainer floor must print the
same lines before and after.

    PYTHONPATH=. .venv/bin/python benchmarks/fingerprints.py [--only magrpo,maac] [--out FILE]

Each run: the tiny llama of `comlrl_nb.models.make_tiny_model` (seed 0), 4 prompts, one torch thread, a couple of
batches. `weights` is a short sha256 of every trained parameter (agents, then critics / reward model when the trainer
has them) in order; `metrics` a short sha256 of metrics.jsonl without its timing keys; then a few key numbers.
"""
import argparse
import hashlib
import json
import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ITEMS = [{"prompt": p} for p in ["Write a story", "Explain physics", "Create a recipe", "Describe a city"]]
COMMON = dict(max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=None, eval_interval=0, progress_bar=False,
              save_steps=-1, logging_steps=1000, save_plot=False)


def vowels(a, b):
    f = lambda s: sum(ch in "aeiou " for ch in s) / max(len(s), 1)
    return [0.5 * f(x) + 0.5 * f(y) for x, y in zip(a, b)]


def revise(prompt, agent_completions, num_agents, prompt_history_per_agent=None, response_history_per_agent=None):
    return [f"{prompt} | revise {len(prompt_history_per_agent[i])}: {c[:5]}" for i, c in enumerate(agent_completions)]


def sha(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def metrics_sha(path) -> tuple[str, dict]:
    from comlrl_nb.engine import read_metrics
    rows = [{k: v for k, v in r.items() if not ("time" in k or "per_s" in k)} for r in read_metrics(path)]
    last = rows[-1] if rows else {}
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16], last


def tiny():
    from comlrl_nb.models import make_tiny_model
    return make_tiny_model(seed=0)


def build(name: str, out: str):
    "(trainer, extra modules to fingerprint) for one named run."
    import comlrl_nb as C
    from comlrl_nb.models import make_tiny_model
    m, tok = tiny()
    base = dict(agents=[m, m], tokenizer=tok, reward_func=vowels, train_dataset=ITEMS)
    if name in ("magrpo", "magrpo_kl_turns", "marloo"):
        cfg = dict(COMMON, num_train_epochs=2, num_generations=4, agent_learning_rate=1e-2, rollout_batch_size=1,
                   output_dir=out)
        if name == "magrpo_kl_turns":
            cfg.update(num_turns=2, num_generations=2, reference_kl_enabled=True, early_termination_threshold=None,
                       rollout_buffer_size=3, train_batch_size=2)
            base["external_transition"] = revise
        cls, ccls = (C.MARLOOTrainer, C.MARLOOConfig) if name == "marloo" else (C.MAGRPOTrainer, C.MAGRPOConfig)
        return cls(**base, args=ccls(**cfg)), []
    if name in ("maac", "maac_turns", "iac_heads"):
        cm, _ = make_tiny_model(seed=3, tokenizer=tok)
        cfg = dict(COMMON, num_train_epochs=1, agent_learning_rate=1e-2, critic_learning_rate=1e-2,
                   rollout_buffer_size=2, output_dir=out)
        if name == "maac_turns":
            cfg.update(num_turns=2, early_termination_threshold=None)
            base["external_transition"] = revise
        if name == "iac_heads":
            tr = C.IACTrainer(**base, args=C.IACConfig(**cfg, use_separate_critic=False, num_generations=2))
        else:
            tr = C.MAACTrainer(**base, critic_model=cm, args=C.MAACConfig(**cfg))
        return tr, [p for c in tr.critics for p in c.parameters()]
    pref = dict(COMMON, preference_num_candidates=4, preference_pairs_per_sample=2, agent_learning_rate=3e-3,
                output_dir=out)          # MADPO has no rollout_batch_size (it never read it); MARLHF's backend does
    if name == "madpo":
        return C.MADPOTrainer(**base, args=C.MADPOConfig(**pref, num_train_epochs=2, dpo_beta=0.5)), []
    if name == "marlhf":
        rm, _ = make_tiny_model(seed=5, tokenizer=tok)
        cfg = dict(pref, rollout_batch_size=2, num_train_epochs=1, num_generations=4, reward_learning_rate=1e-3,
                   reward_num_train_epochs=2, reward_train_batch_size=2, agent_learning_rate=1e-2)
        tr = C.MARLHFTrainer(**base, args=C.MARLHFConfig(**cfg), reward_model=rm)
        return tr, "reward_model"
    if name == "madpo_iter":
        cfg = dict(pref, preference_pairs_per_sample=4, dpo_beta=0.5, num_iterations=2)
        return C.MADPOIterTrainer(**base, args=C.MADPOIterConfig(**cfg)), []
    raise SystemExit(f"unknown run {name!r}")


RUNS = ("magrpo", "magrpo_kl_turns", "marloo", "maac", "maac_turns", "iac_heads", "madpo", "marlhf", "madpo_iter")


def one(name: str) -> str:
    import torch
    torch.set_num_threads(1)
    from comlrl_nb.core import seed_everything
    seed_everything(0)
    out = tempfile.mkdtemp(prefix=f"fp_{name}_")
    tr, extra = build(name, out)
    res = tr.train()
    if extra == "reward_model":
        rm = getattr(tr, "reward_model", None)
        extra = list(rm.parameters()) if rm is not None and hasattr(rm, "parameters") else []
    w = sha([p for a in tr.agents for p in a.parameters()] + list(extra))
    mpath = res.get("metrics_path") if isinstance(res, dict) else None
    msha, last = metrics_sha(mpath or os.path.join(out, "metrics.jsonl"))
    keys = [k for k in last if k.endswith("reward_mean") or k.endswith("/loss") or k.endswith("optimizer_steps")][:6]
    info = " ".join(f"{k}={last[k]:.6g}" if isinstance(last[k], float) else f"{k}={last[k]}" for k in keys)
    return f"{name:16s} weights={w} metrics={msha} {info}"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--only", default=",".join(RUNS))
    p.add_argument("--out", default=None)
    a = p.parse_args()
    lines = [one(n) for n in a.only.split(",")]
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
