"""Run by tests/test_distributed.py, once alone and once under `accelerate launch --cpu --num_processes 2`."""
import os
import sys

import torch

torch.set_num_threads(1)
from comlrl_nb import MAGRPOConfig, MAGRPOTrainer, make_tiny_model  # noqa: E402

out, turns, lr = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])


def vowels(a, b):
    f = lambda s: sum(ch in "aeiou " for ch in s) / max(len(s), 1)
    return [0.5 * f(x) + 0.5 * f(y) for x, y in zip(a, b)]


m, tok = make_tiny_model(seed=0)
data = [{"prompt": p} for p in ["Write a story", "Explain physics", "Create a recipe", "Describe a city", "Invent a holiday"]]
tr = MAGRPOTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, train_dataset=data,
                   external_transition=(lambda **kw: ["go on", "go on"]) if turns > 1 else None,
                   args=MAGRPOConfig(num_train_epochs=2, num_generations=3, max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=None,
                                     agent_learning_rate=lr, rollout_batch_size=3, rollout_buffer_size=4, train_batch_size=3,
                                     num_turns=turns, early_termination_threshold=None, eval_interval=0, output_dir=out,
                                     progress_bar=False, save_steps=2, logging_steps=1000))
init = [p.detach().clone() for m_ in tr.agents for p in m_.parameters()]
tr.train()
moved = max(float((p.detach() - q).abs().max()) for p, q in zip([p for m_ in tr.agents for p in m_.parameters()], init))
print("max parameter change", moved)
assert moved > 0
rank = int(os.environ.get("RANK", "0"))
torch.save([p.detach() for m_ in tr.agents for p in m_.parameters()], os.path.join(out, f"params_rank{rank}.pt"))
