"""Memory settings (MemoryFields): each one checked against the plain path on tiny models."""
import copy
import math

import pytest
import torch

from comlrl_nb.core import micro_backward, micro_chunks
from comlrl_nb.models import make_tiny_model
from comlrl_nb.trainers.actor_critic import MAACConfig, MAACTrainer
from comlrl_nb.trainers.centralized import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer
from comlrl_nb.trainers.madpo import MADPOConfig, MADPOTrainer
from comlrl_nb.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer

torch.set_num_threads(1)
ITEMS = [{"prompt": p} for p in ["Write a story", "Explain physics"]]
RUN = dict(num_train_epochs=1, max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=1e-2,
           eval_interval=0, progress_bar=False, save_steps=-1, logging_steps=1000, seed=3)


def vowels(a, b):
    f = lambda s: sum(ch in "aeiou " for ch in s) / max(len(s), 1)
    return [0.5 * f(x) + 0.5 * f(y) for x, y in zip(a, b)]


def weights(models):
    return [p.detach().clone() for m in models for p in m.parameters()]


def assert_close(a, b, rtol=1e-6, atol=1e-8):
    for x, y in zip(a, b): torch.testing.assert_close(x, y, rtol=rtol, atol=atol)


def sgd(tr, lr=1e-2):
    """Plain SGD for the comparison: a step is lr * gradient, so equal gradients give equal weights (AdamW divides by
    |g| + eps, which magnifies float noise on gradients near eps)."""
    tr.team.optimizers[:] = [torch.optim.SGD(m.parameters(), lr=lr) for m in tr.team.agents]
    for c, crit in enumerate(getattr(tr, "critics", None) or []):
        tr.critic_optimizers[c] = torch.optim.SGD(crit.parameters(), lr=lr)
    return tr


def magrpo(tmp, **kw):
    m, tok = make_tiny_model(seed=0)
    cfg = MAGRPOConfig(**RUN, num_generations=4, rollout_batch_size=2, rollout_buffer_size=2, train_batch_size=2,
                       output_dir=str(tmp), **kw)
    return sgd(MAGRPOTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, args=cfg, train_dataset=ITEMS))


def test_micro_chunks_and_accumulation():
    assert micro_chunks(range(7), 3) == [[0, 1, 2], [3, 4, 5], [6]] and micro_chunks([], 2) == []
    w, x = torch.nn.Parameter(torch.randn(4, generator=torch.Generator().manual_seed(0))), torch.randn(9, 4)
    loss = lambda rows: torch.tanh(x[rows] @ w).pow(2).mean()
    full = loss(list(range(9)))
    full.backward()
    g, w.grad = w.grad.clone(), None
    assert math.isclose(micro_backward(loss, range(9), 9, 4), float(full.detach()), rel_tol=1e-6)
    torch.testing.assert_close(w.grad, g, rtol=1e-6, atol=0)


def test_magrpo_micro_batches_make_the_same_step(tmp_path):
    plain, micro = magrpo(tmp_path / "a"), magrpo(tmp_path / "b", micro_batch_size=3)   # 8 rows: chunks 3, 3, 2
    before = weights(plain.agents)
    plain.train()
    micro.train()
    assert plain.state["optimizer_steps"] == micro.state["optimizer_steps"] == [1, 1]
    assert not all(torch.equal(a, b) for a, b in zip(before, weights(plain.agents)))
    assert_close(weights(micro.agents), weights(plain.agents))


def test_centralized_micro_batches_make_the_same_step(tmp_path):
    def make(d, **kw):
        m, tok = make_tiny_model(seed=0)
        cfg = CentralizedMAGRPOConfig(**RUN, num_generations=3, rollout_batch_size=2, rollout_buffer_size=2,
                                      train_batch_size=2, output_dir=str(d), **kw)
        return sgd(CentralizedMAGRPOTrainer(agents=[m], tokenizer=tok, reward_func=vowels, train_dataset=ITEMS,
                                            args=cfg, formatters=[lambda it: "left", lambda it: "right"],
                                            centralized_prompt_builder=lambda roles, item: "joint " + " ".join(roles)))
    plain, micro = make(tmp_path / "a"), make(tmp_path / "b", micro_batch_size=4)
    plain.train()
    micro.train()
    assert plain.state["optimizer_steps"] == micro.state["optimizer_steps"] == [1]
    assert_close(weights(micro.agents), weights(plain.agents))


def test_actor_critic_micro_batches_make_the_same_step(tmp_path):
    def make(d, **kw):
        m, tok = make_tiny_model(seed=0)
        cm, _ = make_tiny_model(seed=3, tokenizer=tok)
        cfg = MAACConfig(**RUN, critic_learning_rate=1e-2, rollout_batch_size=4, rollout_buffer_size=4,
                         train_batch_size=4, output_dir=str(d), **kw)
        return sgd(MAACTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, args=cfg, critic_model=cm,
                               train_dataset=ITEMS * 2))
    plain, micro = make(tmp_path / "a"), make(tmp_path / "b", micro_batch_size=3)
    plain.train()
    micro.train()
    assert plain.state["optimizer_steps"] == micro.state["optimizer_steps"] == [1, 1]
    assert plain.state["critic_steps"] == micro.state["critic_steps"] == [1]
    assert_close(weights(micro.agents + list(micro.critics)), weights(plain.agents + list(plain.critics)))


def test_madpo_micro_batches_follow_the_plain_run(tmp_path):
    def make(d, **kw):
        m, tok = make_tiny_model(seed=0)
        cfg = MADPOConfig(**{**RUN, "agent_learning_rate": 3e-3}, preference_num_candidates=4,
                          preference_pairs_per_sample=2, dpo_beta=0.5, output_dir=str(d), **kw)
        return sgd(MADPOTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, args=cfg, train_dataset=ITEMS * 2))
    plain, micro = make(tmp_path / "a"), make(tmp_path / "b", micro_batch_size=1)
    plain.train()
    micro.train()
    assert plain.state["optimizer_steps"] == micro.state["optimizer_steps"] and plain.state["optimizer_steps"][0] > 0
    assert_close(weights(micro.agents), weights(plain.agents), rtol=1e-5, atol=1e-8)
