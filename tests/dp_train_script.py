"""Run by tests/test_distributed.py, once alone and once under `accelerate launch --cpu --num_processes 2`."""
import os
import sys

import torch

torch.set_num_threads(1)
from comlrl_nb import MAACConfig, MAACTrainer, MAGRPOConfig, MAGRPOTrainer, make_tiny_model  # noqa: E402

out, turns, lr = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
algo = sys.argv[4] if len(sys.argv) > 4 else "magrpo"


def vowels(a, b):
    f = lambda s: sum(ch in "aeiou " for ch in s) / max(len(s), 1)
    return [0.5 * f(x) + 0.5 * f(y) for x, y in zip(a, b)]


m, tok = make_tiny_model(seed=0)
data = [{"prompt": p} for p in ["Write a story", "Explain physics", "Create a recipe", "Describe a city",
                                "Invent a holiday"]]
common = dict(num_train_epochs=2, max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=lr,
              rollout_batch_size=3, rollout_buffer_size=4, train_batch_size=3, num_turns=turns,
              early_termination_threshold=None, eval_interval=0, output_dir=out, progress_bar=False, save_steps=2,
              logging_steps=1000)
transition = (lambda **kw: ["go on", "go on"]) if turns > 1 else None
if algo in ("maac", "maac_kl"):                     # maac_kl: with the reference-KL penalty in the TD targets
    cm, _ = make_tiny_model(seed=3, tokenizer=tok)
    if algo == "maac_kl": common.update(reference_kl_enabled=True, reference_kl_coef=0.5)
    tr = MAACTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, train_dataset=data,
                     external_transition=transition, critic_model=cm,
                     args=MAACConfig(num_generations=2 if turns == 1 else 1, critic_learning_rate=lr, **common))
else:
    tr = MAGRPOTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, train_dataset=data,
                       external_transition=transition, args=MAGRPOConfig(num_generations=3, **common))
whole = lambda p: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()   # torch's DTensors whole
init = [whole(p) for m_ in tr.agents for p in m_.parameters()]
tr.train()
moved = max(float((whole(p) - q).abs().max()) for p, q in zip([p for m_ in tr.agents for p in m_.parameters()], init))
print("max parameter change", moved)
assert moved > 0
rank = int(os.environ.get("RANK", "0"))
extra = [p for c in getattr(tr, "critics", []) for p in c.parameters()]
torch.save([whole(p) for m_ in tr.agents for p in m_.parameters()] + [whole(p) for p in extra],
           os.path.join(out, f"params_rank{rank}.pt"))
