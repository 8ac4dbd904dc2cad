"""Run by tests/test_sharding.py: a small MAGRPO run alone or under torchrun, with `distributed` = none/ddp/fsdp.

argv: out_dir strategy [stop N | resume] (N: a batch; a round for the *_iter families); the family from $SHARD_ALGO
(magrpo, centralized, maac, iac, madpo, marlhf, madpo_iter, marlhf_iter, lora, lora_history; magrpo_kl, maac_kl,
centralized_kl: with the reference KL); $SHARD_MICRO: micro_batch_size; $SHARD_EVAL:
evaluation during training;
$SHARD_SAVE_CHECKPOINT=1: a resumed run also writes and reads back trainer.save_checkpoint(out/saved_checkpoint).
Writes params.pt (the full weights, main process), mem_rank<r>.json (this process' parameter / optimizer / reference /
critic bytes, its own shards) and the run's metrics.jsonl / checkpoints."""
import json
import os
import sys
import time

import torch

torch.set_num_threads(1)
import comlrl_nb as C  # noqa: E402
from comlrl_nb import make_tiny_model  # noqa: E402
from comlrl_nb.distributed import process_bytes  # noqa: E402

out, strategy = sys.argv[1], sys.argv[2]
mode = sys.argv[3] if len(sys.argv) > 3 else "full"
algo = os.environ.get("SHARD_ALGO", "magrpo")
kl = algo.endswith("_kl")                        # magrpo_kl, maac_kl, centralized_kl: with the reference-KL penalty
algo = algo.removesuffix("_kl")
micro = int(os.environ["SHARD_MICRO"]) if os.environ.get("SHARD_MICRO") else None
evals = bool(os.environ.get("SHARD_EVAL"))       # evaluate 3 held-out items (batches of 1) at every batch / round


def vowels(a, b):
    f = lambda s: sum(ch in "aeiou " for ch in s) / max(len(s), 1)
    return [0.5 * f(x) + 0.5 * f(y) for x, y in zip(a, b)]


m0, tok = make_tiny_model(seed=0)
m1, _ = make_tiny_model(seed=1, tokenizer=tok)
data = [{"prompt": p} for p in ["Write a story", "Explain physics", "Create a recipe", "Describe a city"]]
ev = dict(eval_interval=1, eval_num_samples=3, eval_batch_size=1) if evals else dict(eval_interval=0)
common = dict(num_train_epochs=2, max_new_tokens=5, temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=1e-5,
              num_generations=2, rollout_batch_size=2, rollout_buffer_size=2, train_batch_size=2,
              early_termination_threshold=None, **ev, output_dir=out, progress_bar=False, save_steps=1,
              logging_steps=1000, save_plot=False, distributed=strategy, micro_batch_size=micro,
              **(dict(reference_kl_enabled=True, reference_kl_coef=0.5) if kl else {}))
kw = dict(tokenizer=tok, reward_func=vowels, train_dataset=data)
if evals: kw["eval_dataset"] = [{"prompt": p} for p in ["Name a color", "Sing a song", "Count to three"]]
if algo == "centralized":
    halves = lambda t, n: [t[: len(t) // 2], t[len(t) // 2:]]              # the joint text split in two
    tr = C.CentralizedMAGRPOTrainer(agents=[m0], args=C.CentralizedMAGRPOConfig(**common), centralized_parser=halves,
                                    **kw)
elif algo in ("maac", "iac"):
    cm, _ = make_tiny_model(seed=3, tokenizer=tok)
    cls, cfg = (C.MAACTrainer, C.MAACConfig) if algo == "maac" else (C.IACTrainer, C.IACConfig)
    extra, heads = ({"critic_model": cm}, {}) if algo == "maac" else ({}, {"use_separate_critic": False})
    tr = cls(agents=[m0, m1], args=cfg(critic_learning_rate=1e-5, **heads, **common), **extra, **kw)
elif algo in ("madpo", "marlhf", "madpo_iter", "marlhf_iter"):
    pref = dict(max_new_tokens=5, temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=1e-5,
                preference_num_candidates=3, preference_pairs_per_sample=2, collection_batch_size=2, train_batch_size=3,
                rollout_buffer_size=3, **ev, output_dir=out, progress_bar=False, logging_steps=1000,
                save_plot=False, save_steps=1, distributed=strategy, micro_batch_size=micro)
    if algo == "madpo_iter":        # rounds against the history comparator (snapshots S_j of the sharded agents)
        tr = C.MADPOIterTrainer(agents=[m0, m1], **kw, args=C.MADPOIterConfig(
            num_iterations=2, num_train_epochs=1, dpo_beta=0.5, comparator_policy="history",
            preference_replay_mode="lambda_decay", preference_replay_lambda=0.5, **pref))
    elif algo == "marlhf_iter":     # rounds against the current agents; a reward model fitted per round, then MAGRPO
        rm, _ = make_tiny_model(seed=3, tokenizer=tok)
        tr = C.MARLHFIterTrainer(agents=[m0, m1], reward_model=rm, **kw, args=C.MARLHFIterConfig(
            num_iterations=2, num_train_epochs=1, num_generations=2, reward_num_train_epochs=1,
            reward_train_batch_size=3, reward_learning_rate=1e-5, **pref))
    elif algo == "madpo":
        tr = C.MADPOTrainer(agents=[m0, m1], args=C.MADPOConfig(num_train_epochs=2, dpo_beta=0.5, **pref), **kw)
    else:
        rm, _ = make_tiny_model(seed=3, tokenizer=tok)
        tr = C.MARLHFTrainer(agents=[m0, m1], reward_model=rm, **kw,
                             args=C.MARLHFConfig(num_train_epochs=1, num_generations=2, reward_num_train_epochs=2,
                                                 reward_train_batch_size=3, reward_learning_rate=1e-5, **pref))
elif algo == "lora_history":        # MADPOIter's history comparator needs whole copies: refused for adapters under DP
    from comlrl_nb.adapters import LoRAAgents
    tr = C.MADPOIterTrainer(agents=LoRAAgents(m0, num_agents=2, r=4, tokenizer=tok), **kw, args=C.MADPOIterConfig(
        num_iterations=1, num_train_epochs=1, comparator_policy="history", max_new_tokens=5, output_dir=out,
        preference_num_candidates=3, collection_batch_size=2, train_batch_size=2, progress_bar=False, save_plot=False,
        distributed=strategy))
elif algo == "lora":                # LoRA adapters on one base: the base handed to torch once, each adapter trained
    from comlrl_nb.adapters import LoRAAgents
    tr = C.MAGRPOTrainer(agents=LoRAAgents(m0, num_agents=2, r=4, tokenizer=tok),
                         args=C.MAGRPOConfig(**{**common, "agent_learning_rate": 1e-3}), **kw)
    if strategy == "none" and mode == "full":               # the adapters' initial weights, for the test's comparison
        torch.save(tr.team.state_dict()["agents"], os.path.join(out, "init.pt"))
else:
    tr = C.MAGRPOTrainer(agents=[m0, m1], args=C.MAGRPOConfig(**common), **kw)
t0 = time.perf_counter()
if mode == "stop":                  # the iterative families stop after round N, the others after batch N
    tr.train(**{"stop_after_round" if algo.endswith("_iter") else "stop_after_batch": int(sys.argv[4])})
else: tr.train(resume_from_checkpoint=True if mode == "resume" else None)
seconds = time.perf_counter() - t0
rank = int(os.environ.get("RANK", "0"))
with open(os.path.join(out, f"mem_rank{rank}.json"), "w") as f:
    critics = [c.backbone for c in getattr(tr, "critics", []) if not c.shared]   # MAAC's separate critic
    rm = [tr.reward_model] if hasattr(tr, "reward_model") else []                  # MARLHF's
    json.dump({**tr.team.memory(), "critic_bytes": process_bytes(critics)["parameter_bytes"],
               "reward_model_bytes": process_bytes(rm)["parameter_bytes"], "train_seconds": seconds}, f)
full = tr.team.state_dict()["agents"]                 # every process takes part; the main one holds the full weights
if rank == 0: torch.save([{k: v.detach().cpu() for k, v in sd.items()} for sd in full], os.path.join(out, "params.pt"))
if mode == "resume" and os.environ.get("SHARD_SAVE_CHECKPOINT"):   # the library's trainer.save/load_checkpoint
    saved = tr.save_checkpoint(os.path.join(out, "saved_checkpoint"))
    assert tr.load_checkpoint(saved)["global_batch"] == tr.state["global_batch"]
tr.save_model(os.path.join(out, "final"))
