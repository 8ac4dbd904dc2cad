"""Weights fingerprints of seeded tiny-model runs of the preference trainers (MADPO, centralized MADPO, MARLHF,
MADPOIter, MARLHFIter): the refactor of the trainer floor must leave every line of the output unchanged.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/fingerprints_pref.py > benchmarks/fingerprints_pref_after.txt
    diff benchmarks/fingerprints_pref_before.txt benchmarks/fingerprints_pref_after.txt

Per run: a sha256 of every trained weight (agents, and the reward model for MARLHF), of the stored pairs / replay files,
and of the metrics file without its timing fields. One torch thread, CPU, no network.
"""
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MPLBACKEND", "Agg")
import torch  # noqa: E402

torch.set_num_threads(1)
from comlrl_nb.engine import read_metrics  # noqa: E402
from comlrl_nb.models import make_tiny_model  # noqa: E402
from comlrl_nb.trainers.iterative import (MADPOIterConfig, MADPOIterTrainer, MARLHFIterConfig,  # noqa: E402
                                          MARLHFIterTrainer)
from comlrl_nb.trainers.madpo import MADPOConfig, MADPOTrainer  # noqa: E402
from comlrl_nb.trainers.marlhf import MARLHFConfig, MARLHFTrainer  # noqa: E402

ITEMS = [{"prompt": p} for p in ["Write a story", "Explain physics", "Create a recipe", "Describe a city"]]
BASE = dict(preference_num_candidates=4, preference_pairs_per_sample=2, max_new_tokens=8, temperature=1.0, top_p=1.0,
            top_k=None, agent_learning_rate=3e-3, eval_interval=2, eval_num_samples=2,
            logging_steps=1000, progress_bar=False, save_steps=0, save_plot=False)


def vowels(a, b):
    f = lambda s: sum(ch in "aeiou " for ch in s) / max(len(s), 1)
    return [0.5 * f(x) + 0.5 * f(y) for x, y in zip(a, b)]


def weights(models) -> str:
    h = hashlib.sha256()
    for m in models:
        for k, v in sorted(m.state_dict().items()):
            h.update(k.encode())
            h.update(v.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def files(paths) -> str:
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def metrics(path) -> str:
    rows = [{k: v for k, v in r.items() if "time" not in k and not k.endswith("_per_s")} for r in read_metrics(path)]
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16]


def run_madpo(d, **kw):
    m, tok = make_tiny_model(seed=0)
    cfg = MADPOConfig(**{**BASE, "num_train_epochs": 2, "dpo_beta": 0.5, "output_dir": str(d), **kw})
    tr = MADPOTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, args=cfg, train_dataset=ITEMS,
                      eval_dataset=ITEMS)
    tr.train()
    return [("weights", weights(tr.agents)), ("pairs", files([d / "pairs.json"])),
            ("metrics", metrics(d / "metrics.jsonl"))]


def run_central(d):
    m, tok = make_tiny_model(seed=0)
    cfg = MADPOConfig(**{**BASE, "num_train_epochs": 2, "dpo_beta": 0.5, "output_dir": str(d),
                         "collaboration_mode": "centralized"})
    tr = MADPOTrainer(agent_model=m, tokenizer=tok, reward_func=vowels, args=cfg, train_dataset=ITEMS,
                      eval_dataset=ITEMS, centralized_parser=lambda t, n: [t[: len(t) // 2], t[len(t) // 2:]])
    tr.train()
    return [("weights", weights(tr.agents)), ("pairs", files([d / "pairs.json"])),
            ("metrics", metrics(d / "metrics.jsonl"))]


def run_marlhf(d, **kw):
    m, tok = make_tiny_model(seed=0)
    cfg = MARLHFConfig(**{**BASE, "rollout_batch_size": 2, "num_train_epochs": 2, "num_generations": 4,
                          "reward_learning_rate": 1e-3, "reward_num_train_epochs": 2, "reward_train_batch_size": 2,
                          "agent_learning_rate": 1e-2, "output_dir": str(d), **kw})
    tr = MARLHFTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, args=cfg, train_dataset=ITEMS,
                       eval_dataset=ITEMS, reward_model=m)
    tr.train()
    return [("weights", weights(tr.agents)), ("reward_model", weights([tr.reward_model])),
            ("pairs", files([d / "pairs.json"])), ("metrics", metrics(d / "metrics.jsonl")),
            ("reward_metrics", metrics(d / "reward_model" / "metrics.jsonl"))]


ITER = dict(preference_pairs_per_sample=4, max_new_tokens=6, num_iterations=2)


def run_madpo_iter(d):
    m, tok = make_tiny_model(seed=0)
    cfg = MADPOIterConfig(**{**BASE, **ITER, "num_train_epochs": 2, "dpo_beta": 0.5, "comparator_policy": "history",
                             "preference_replay_mode": "lambda_decay", "preference_replay_lambda": 0.5,
                             "output_dir": str(d)})
    tr = MADPOIterTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, args=cfg, train_dataset=ITEMS,
                          eval_dataset=ITEMS)
    tr.train()
    return [("weights", weights(tr.agents)), ("replay", files((d / "preference_replay").glob("iteration_*.json"))),
            ("metrics", metrics(d / "metrics.jsonl"))]


def run_marlhf_iter(d):
    m, tok = make_tiny_model(seed=0)
    cfg = MARLHFIterConfig(**{**BASE, **ITER, "rollout_batch_size": 2, "num_generations": 4, "num_train_epochs": 1,
                              "reward_learning_rate": 1e-3, "reward_train_batch_size": 4, "reward_num_train_epochs": 1,
                              "output_dir": str(d), "preference_scoring_reward": "reward_model"})
    tr = MARLHFIterTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, args=cfg, train_dataset=ITEMS,
                           eval_dataset=ITEMS, reward_model=m)
    tr.train()
    pol = sorted((d / "policy").glob("iteration_*/metrics.jsonl"))
    return [("weights", weights(tr.agents)), ("reward_model", weights([tr.reward_model])),
            ("replay", files((d / "preference_replay").glob("iteration_*.json"))),
            ("metrics", metrics(d / "metrics.jsonl")), ("policy_metrics", ",".join(metrics(p) for p in pol))]


RUNS = {"madpo": run_madpo, "madpo_centralized": run_central, "marlhf": run_marlhf,
        "marlhf_marloo": lambda d: run_marlhf(d, rl_algorithm="marloo"), "madpo_iter": run_madpo_iter,
        "marlhf_iter": run_marlhf_iter}

if __name__ == "__main__":
    names = sys.argv[1:] or list(RUNS)
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            for what, fp in RUNS[name](Path(tmp) / name):
                print(f"{name:18s} {what:15s} {fp}", flush=True)
