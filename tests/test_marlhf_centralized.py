"""Centralized MARLHF (one actor writes every role; centralized MAGRPO on a reward model of the joint text): resume,
the CLI, and the errors of agent counts and modes."""
import json

import pytest
import torch

from comlrl_nb.cli import main
from comlrl_nb.engine import read_metrics
from comlrl_nb.models import make_tiny_model
from comlrl_nb.preference import load_pairs
from comlrl_nb.trainers.centralized import CentralizedMAGRPOTrainer
from comlrl_nb.trainers.marlhf import MARLHFConfig, MARLHFTrainer

torch.set_num_threads(1)
ITEMS = [{"prompt": p} for p in ["Write a story", "Explain physics", "Create a recipe", "Describe a city"]]


def vowels(a, b):
    f = lambda s: sum(ch in "aeiou " for ch in s) / max(len(s), 1)
    return [0.5 * f(x) + 0.5 * f(y) for x, y in zip(a, b)]


def halves(text, n):
    return [text[: len(text) // 2], text[len(text) // 2:]]


BASE = dict(collaboration_mode="centralized", num_train_epochs=2, num_generations=4, preference_num_candidates=4,
            preference_pairs_per_sample=2, max_new_tokens=8, temperature=1.0, top_p=1.0, top_k=None,
            agent_learning_rate=1e-2, reward_learning_rate=1e-3, reward_num_train_epochs=2, reward_train_batch_size=2,
            rollout_batch_size=2, logging_steps=1000, progress_bar=False, save_steps=-1, eval_interval=0)


def central(tmp, **kw):
    m, tok = make_tiny_model(seed=0)
    cfg = MARLHFConfig(**{**BASE, "output_dir": str(tmp), **kw})
    return MARLHFTrainer(agent_model=m, tokenizer=tok, reward_func=vowels, args=cfg, train_dataset=ITEMS,
                         eval_dataset=ITEMS, reward_model=m, centralized_parser=halves)


def params(models):
    return [p.detach().clone() for m in models for p in m.parameters()]


def test_centralized_marlhf_trains_one_actor_on_the_joint_text(tmp_path):
    tr = central(tmp_path)
    assert type(tr.policy_trainer) is CentralizedMAGRPOTrainer and len(tr.agents) == len(tr.team.optimizers) == 1
    before = params(tr.agents)
    out = tr.train()
    assert out["num_pairs"] == 8 and out["global_batch"] == 4
    pairs = load_pairs(tmp_path / "pairs.json", 2)
    assert all(set(r["centralized"]) >= {"prompt", "winner", "loser"} for r in pairs)
    assert any(not torch.equal(a, b) for a, b in zip(before, params(tr.agents)))
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert rows[-1]["agent_0/optimizer_steps"] == 4 and "agent_1/optimizer_steps" not in rows[-1]
    # the learned reward of training is the reward model's score of the actor's prompt and raw joint completion
    ro = tr.policy_trainer.rollout(ITEMS[:1], [0], ("check", 0))
    prompt = tr.policy_trainer.joint_prompt(ITEMS[0])[1]
    torch.testing.assert_close(ro.rewards[0], torch.tensor(tr.reward_model.score([[prompt] * 4], [ro.comps.texts])),
                               atol=1e-5, rtol=0)


def test_centralized_marlhf_resume_gives_the_same_weights(tmp_path):
    full = central(tmp_path / "full", save_steps=2)
    full.train()
    part = central(tmp_path / "part", save_steps=2)
    st = part.train(stop_after_batch=3)
    assert st["stopped"] and st["global_batch"] == 3
    resumed = central(tmp_path / "part", save_steps=2)
    assert resumed.train(resume_from_checkpoint=True)["global_batch"] == 4
    assert resumed.pairs == full.pairs
    for x, y in zip(params(full.agents) + params([full.reward_model]),
                    params(resumed.agents) + params([resumed.reward_model])):
        assert torch.equal(x, y)


def test_centralized_marlhf_modes_and_agent_counts(tmp_path):
    m, tok = make_tiny_model(seed=0)
    with pytest.raises(ValueError, match="rl_algorithm='maac' has no centralized backend"):
        MARLHFConfig(collaboration_mode="centralized", rl_algorithm="maac")
    with pytest.raises(ValueError, match="exactly one actor"):
        MARLHFTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, reward_model=m,
                      args=MARLHFConfig(collaboration_mode="centralized"))
    with pytest.raises(ValueError, match="apply only with MARLHFConfig"):
        MARLHFTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, reward_model=m, centralized_parser=halves)
    with pytest.raises(ValueError, match="collaboration_mode='solo' is invalid"):
        MARLHFConfig(collaboration_mode="solo")
    assert MARLHFConfig(collaboration_mode="centralized", rl_algorithm="maremax").num_agents == 2


def test_cli_trains_centralized_marlhf(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["train", "--algo", "marlhf", "--model", "tiny", "--output-dir", str(out), "--heldout-samples", "2",
               "--set", "progress_bar=false", "num_train_epochs=1", "collaboration_mode=centralized"])
    assert rc == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["algo"] == "marlhf" and rep["config"]["collaboration_mode"] == "centralized"
    assert "unparsed" in rep["heldout_before"]                       # measured on the one actor's parsed roles
    assert (out / "final" / "agent_0").is_dir() and not (out / "final" / "agent_1").exists()


# ---------------------------------------------------------------- iterative MARLHF, centralized

def central_iter(tmp, **kw):
    from comlrl_nb.trainers.iterative import MARLHFIterConfig, MARLHFIterTrainer
    m, tok = make_tiny_model(seed=0)
    cfg = dict(collaboration_mode="centralized", num_iterations=2, num_train_epochs=1, num_generations=4,
               preference_num_candidates=4, preference_pairs_per_sample=4, max_new_tokens=6, temperature=1.0, top_p=1.0,
               top_k=None, reward_learning_rate=1e-3, reward_num_train_epochs=1, reward_train_batch_size=4,
               rollout_batch_size=2, eval_interval=0, logging_steps=1000, progress_bar=False, save_steps=1,
               output_dir=str(tmp), **kw)
    return MARLHFIterTrainer(agent_model=m, tokenizer=tok, reward_func=vowels, args=MARLHFIterConfig(**cfg),
                             train_dataset=ITEMS, eval_dataset=ITEMS, reward_model=m, centralized_parser=halves)


def test_centralized_marlhf_iter_rounds_and_resume(tmp_path):
    full = central_iter(tmp_path / "full")
    assert type(full.policy_trainer) is CentralizedMAGRPOTrainer and len(full.agents) == 1
    assert full.args.comparator_generation_mode == "centralized"
    out = full.train()
    rows = [r for r in out["rounds"] if r.get("iteration", 0) >= 1]
    assert len(rows) == 2 and all(r["round/pairs"] > 0 and r["policy/batches"] == 2 for r in rows)
    recs = json.loads((tmp_path / "full" / "preference_replay" / "iteration_0001.json").read_text())["pairs"]
    assert all(set(r["centralized"]) >= {"prompt", "winner", "loser"} for r in recs)
    part = central_iter(tmp_path / "part")
    assert part.train(stop_after_round=1)["stopped"]
    resumed = central_iter(tmp_path / "part")
    resumed.train(resume_from_checkpoint=True)
    for x, y in zip(params(full.agents) + params([full.reward_model]),
                    params(resumed.agents) + params([resumed.reward_model])):
        assert torch.equal(x, y)
    with pytest.raises(ValueError, match="use preference_scoring_reward='task'"):
        central_iter(tmp_path / "x", preference_scoring_reward="reward_model")
