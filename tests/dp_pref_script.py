"""Run by tests/test_distributed.py (preference trainers), once alone and once under `accelerate launch`.

argv: output directory, algo (madpo, madpo_central, madpo_iter, reward_model, marlhf, marlhf_central), optional
stop-after and resume flags."""
import json
import os
import sys

import torch

torch.set_num_threads(1)
from comlrl_nb import (JointRewardModel, MADPOConfig, MADPOIterConfig, MADPOIterTrainer,  # noqa: E402
                       MADPOTrainer, MARLHFConfig, MARLHFTrainer, make_tiny_model)
from comlrl_nb.distributed import DistContext  # noqa: E402

out, algo = sys.argv[1], sys.argv[2]
stop = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3] != "-" else None
resume = len(sys.argv) > 4 and sys.argv[4] == "resume"
rank = int(os.environ.get("RANK", "0"))


def vowels(a, b):
    f = lambda s: sum(ch in "aeiou " for ch in s) / max(len(s), 1)
    return [0.5 * f(x) + 0.5 * f(y) for x, y in zip(a, b)]


halves = lambda text, n: [text[: len(text) // 2], text[len(text) // 2:]]
data = [{"prompt": p} for p in ["Write a story", "Explain physics", "Create a recipe", "Describe a city", "A poem"]]
m, tok = make_tiny_model(seed=0)
# A small learning rate: Adam's first steps are ~lr * sign(g), so float-level differences in g (other padding in a
# process' share) move a weight by at most ~2 lr a step; MADPOIter's second round then samples the same candidates.
common = dict(max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=1e-5, dpo_beta=0.5,
              preference_num_candidates=3, preference_pairs_per_sample=2, collection_batch_size=2, train_batch_size=3,
              rollout_buffer_size=3,
              eval_interval=0, output_dir=out, progress_bar=False, logging_steps=1000,
              distributed=os.environ.get("DP_STRATEGY", "none"))
if algo == "reward_model":                      # the MARLHF reward fit: 7 pairs, batches of 3 (the last one a single)
    rm = JointRewardModel(m, tok, seed=0)
    w = ["good answer " * (j % 3 + 1) for j in range(7)]
    lo = ["bad " * (j % 2 + 1) + str(j) for j in range(7)]
    hist = rm.fit_texts(w, lo, num_train_epochs=2, batch_size=3, learning_rate=1e-5, seed=0, dist=DistContext())
    os.makedirs(out, exist_ok=True)
    params = list(rm.parameters())
    if rank == 0: json.dump(hist, open(os.path.join(out, "history.json"), "w"))
elif algo in ("marlhf", "marlhf_central"):    # the whole run: collection, reward fit, (centralized) MAGRPO phase
    central = algo == "marlhf_central"
    tr = MARLHFTrainer(agents=[m] if central else [m, m], tokenizer=tok, reward_func=vowels, train_dataset=data,
                       reward_model=m, centralized_parser=halves if central else None,
                       args=MARLHFConfig(num_train_epochs=1, num_generations=2, reward_num_train_epochs=2,
                                         collaboration_mode="centralized" if central else "decentralized",
                                         reward_train_batch_size=3, reward_learning_rate=1e-5, save_steps=1,
                                         **{k: v for k, v in common.items() if k != "dpo_beta"}))
    res = tr.train(resume_from_checkpoint=True if resume else None, stop_after_batch=stop)
    params = [p for a in tr.agents for p in a.parameters()] + list(tr.reward_model.parameters())
elif algo == "madpo_iter":
    tr = MADPOIterTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, train_dataset=data,
                          args=MADPOIterConfig(num_iterations=2, num_train_epochs=1, comparator_policy="history",
                                               preference_replay_mode="lambda_decay", preference_replay_lambda=0.5,
                                               **{**common, "pair_selection": "comparator_reward"}))
    res = tr.train(resume_from_checkpoint=True if resume else None, stop_after_round=stop)
    params = [p for a in tr.agents for p in a.parameters()]
else:
    central = algo == "madpo_central"
    tr = MADPOTrainer(agents=[m] if central else [m, m], tokenizer=tok, reward_func=vowels, train_dataset=data,
                      centralized_parser=halves if central else None,
                      args=MADPOConfig(num_train_epochs=2, save_steps=2,
                                       collaboration_mode="centralized" if central else "decentralized", **common))
    res = tr.train(resume_from_checkpoint=True if resume else None, stop_after_batch=stop)
    params = [p for a in tr.agents for p in a.parameters()]
from torch.distributed.tensor import DTensor  # noqa: E402
whole = lambda p: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()   # handed to torch: DTensors
torch.save([whole(p) for p in params], os.path.join(out, f"params_rank{rank}.pt"))
if torch.distributed.is_initialized():          # leave together: a process exiting mid-collective aborts its peer
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
