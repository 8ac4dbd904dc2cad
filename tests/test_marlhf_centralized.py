"""Centralized MARLHF (one actor writes every role, trained on a reward model of the joint text by centralized MAGRPO,
or by MAAC/IAC over a one-agent team): resume, the CLI, and the errors of agent counts and modes."""
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


def test_centralized_marlhf_resume_gives_the_same_weights(tmp_path, stopped_and_resumed):
    full, resumed, out = stopped_and_resumed(lambda d: central(d, save_steps=2), tmp_path)
    assert out["global_batch"] == 4
    assert resumed.pairs == full.pairs
    for x, y in zip(params(full.agents) + params([full.reward_model]),
                    params(resumed.agents) + params([resumed.reward_model])):
        assert torch.equal(x, y)


def test_centralized_marlhf_modes_and_agent_counts(tmp_path):
    m, tok = make_tiny_model(seed=0)
    assert MARLHFConfig(collaboration_mode="centralized", rl_algorithm="maac", num_generations=1).num_agents == 2
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

def central_iter(tmp, trainer_kw=None, **kw):
    from comlrl_nb.trainers.iterative import MARLHFIterConfig, MARLHFIterTrainer
    m, tok = make_tiny_model(seed=0)
    cfg = dict(collaboration_mode="centralized", num_iterations=2, num_train_epochs=1, num_generations=4,
               preference_num_candidates=4, preference_pairs_per_sample=4, max_new_tokens=6, temperature=1.0, top_p=1.0,
               top_k=None, reward_learning_rate=1e-3, reward_num_train_epochs=1, reward_train_batch_size=4,
               rollout_batch_size=2, eval_interval=0, logging_steps=1000, progress_bar=False, save_steps=1,
               output_dir=str(tmp))
    cfg.update(kw)
    return MARLHFIterTrainer(agent_model=m, tokenizer=tok, reward_func=vowels, args=MARLHFIterConfig(**cfg),
                             train_dataset=ITEMS, eval_dataset=ITEMS, reward_model=m, centralized_parser=halves,
                             **(trainer_kw or {}))


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


# ---------------------------------------------------------------- the actor-critic backends (maac, iac), centralized

def central_ac(tmp, algo="maac", **kw):
    m, tok = make_tiny_model(seed=0)
    critic, _ = make_tiny_model(seed=5)
    cfg = MARLHFConfig(**{**BASE, "rl_algorithm": algo, "num_generations": 1, "output_dir": str(tmp), **kw})
    return MARLHFTrainer(agent_model=m, tokenizer=tok, reward_func=vowels, args=cfg, train_dataset=ITEMS,
                         eval_dataset=ITEMS, reward_model=m, centralized_parser=halves,
                         backend_kwargs={"critic_model": critic})


def critic_params(tr):
    return [p.detach().clone() for c in tr.policy_trainer.critics for p in c.parameters()]


@pytest.mark.parametrize("algo", ["maac", "iac"])
def test_centralized_marlhf_actor_critic_trains_one_actor_and_its_critic(tmp_path, algo):
    from comlrl_nb.trainers.actor_critic import IACTrainer, MAACTrainer
    from comlrl_nb.trainers.marlhf import CentralActor
    tr = central_ac(tmp_path, algo, reference_kl_enabled=True, reference_devices="cpu")
    pt = tr.policy_trainer
    assert type(pt) is {"maac": MAACTrainer, "iac": IACTrainer}[algo] and type(tr.central) is CentralActor
    assert pt.n == len(tr.agents) == len(pt.critics) == len(pt.team.ref_agents) == 1 and tr.args.num_agents == 2
    seen = []
    generate = pt.team.generate
    pt.team.generate = lambda i, prompts, *a, **k: seen.extend(prompts) or generate(i, prompts, *a, **k)
    actor, critic, rm = params(tr.agents), critic_params(tr), params([tr.reward_model])
    out = tr.train()
    assert out["num_pairs"] == 8 and out["global_batch"] == 4
    joint = {tr.central.joint_prompt(it)[1] for it in ITEMS}
    assert seen and set(seen) == joint                          # collection and training: the actor's joint prompt
    assert any(not torch.equal(a, b) for a, b in zip(actor, params(tr.agents)))
    assert any(not torch.equal(a, b) for a, b in zip(critic, critic_params(tr)))
    assert any(not torch.equal(a, b) for a, b in zip(rm, params([tr.reward_model])))           # fitted, then frozen
    assert all(torch.isfinite(p).all() for p in tr.agents[0].parameters())
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert "agent_0/kl" in rows[-1] and "agent_1/loss" not in rows[-1]
    # training reward: r_phi(x, z) of the actor's joint text; evaluation: the task reward of the parsed roles
    e = pt.rollout(ITEMS[:1], [0], ("check", 0)).episodes[0]
    learned = tr.reward_model.score([e.inputs[0]], [e.responses[0]])
    torch.testing.assert_close(torch.tensor(e.rewards), torch.tensor(learned), atol=1e-5, rtol=0)
    ev = tr.evaluate(2)
    x = tr.central_sample(ITEMS[:2], [(tr.args.seed, "eval", j, "actor") for j in range(2)], 1)
    assert ev["eval/turn_1/reward_mean"] == pytest.approx(sum(vowels(*x["texts"])) / 2, abs=1e-12)
    assert ev["eval/unparsed_rate"] == 0.0


@pytest.mark.parametrize("algo", ["maac", "iac"])
def test_centralized_marlhf_actor_critic_resume_gives_the_same_weights(tmp_path, algo):
    full = central_ac(tmp_path / "full", algo, save_steps=2)
    full.train()
    part = central_ac(tmp_path / "part", algo, save_steps=2)
    st = part.train(stop_after_batch=3)
    assert st["stopped"] and st["global_batch"] == 3
    resumed = central_ac(tmp_path / "part", algo, save_steps=2)
    assert resumed.train(resume_from_checkpoint=True)["global_batch"] == 4
    assert resumed.pairs == full.pairs
    for x, y in zip(params(full.agents) + critic_params(full) + params([full.reward_model]),
                    params(resumed.agents) + critic_params(resumed) + params([resumed.reward_model])):
        assert torch.equal(x, y)


def test_centralized_marlhf_actor_critic_agent_counts(tmp_path):
    m, tok = make_tiny_model(seed=0)
    args = MARLHFConfig(collaboration_mode="centralized", rl_algorithm="iac", num_generations=1)
    with pytest.raises(ValueError, match="exactly one actor model for 2 roles"):
        MARLHFTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, reward_model=m, args=args,
                      backend_kwargs={"critic_model": m})
    with pytest.raises(ValueError, match="one critic"):
        MARLHFTrainer(agents=[m], tokenizer=tok, reward_func=vowels, reward_model=m, args=args,
                      backend_kwargs={"critics": [m, m]})
    with pytest.raises(ValueError, match="critic"):                  # no critic source: the backend names the options
        MARLHFTrainer(agents=[m], tokenizer=tok, reward_func=vowels, reward_model=m, args=args)
    with pytest.raises(ValueError, match="num_turns=2"):
        MARLHFConfig(collaboration_mode="centralized", rl_algorithm="maac", num_turns=2)
    heads = MARLHFTrainer(agents=[m], tokenizer=tok, reward_func=vowels, reward_model=m, args=MARLHFConfig(
        collaboration_mode="centralized", rl_algorithm="iac", num_generations=1, use_separate_critic=False))
    assert heads.policy_trainer.critics[0].shared and heads.policy_trainer.critics[0].backbone is heads.agents[0]


@pytest.mark.parametrize("algo", ["maac", "iac"])
def test_cli_trains_centralized_marlhf_with_an_actor_critic_backend(tmp_path, algo):
    out = tmp_path / "run"
    rc = main(["train", "--algo", "marlhf", "--model", "tiny", "--output-dir", str(out), "--heldout-samples", "2",
               "--set", "progress_bar=false", "num_train_epochs=1", "collaboration_mode=centralized",
               f"rl_algorithm={algo}"])
    assert rc == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["config"]["collaboration_mode"] == "centralized" and rep["config"]["rl_algorithm"] == algo
    assert "unparsed" in rep["heldout_before"]
    assert (out / "final" / "agent_0").is_dir() and not (out / "final" / "agent_1").exists()
    from types import SimpleNamespace
    from comlrl_nb.cli import _algo_overrides                        # a real model is its own critic's backbone
    ov = _algo_overrides("marlhf", MARLHFConfig, SimpleNamespace(num_turns=1), "org/model", {"rl_algorithm": algo})
    assert ov["critic_model_name"] == ov["reward_model_name"] == "org/model"


@pytest.mark.parametrize("algo", ["maac", "iac"])
def test_centralized_marlhf_iter_actor_critic_rounds_and_resume(tmp_path, algo):
    def make(d):
        return central_iter(d, rl_algorithm=algo, num_generations=1,
                            trainer_kw={"backend_kwargs": {"critic_model": make_tiny_model(seed=5)[0]}})
    full = make(tmp_path / "full")
    assert full.policy_trainer.algo == algo and full.policy_trainer.n == 1 and full.n == 2
    critic = critic_params(full)
    out = full.train()
    rows = [r for r in out["rounds"] if r.get("iteration", 0) >= 1]
    assert len(rows) == 2 and all(r["round/pairs"] > 0 and r["policy/batches"] == 2 for r in rows)
    assert any(not torch.equal(a, b) for a, b in zip(critic, critic_params(full)))
    part = make(tmp_path / "part")
    assert part.train(stop_after_round=1)["stopped"]
    resumed = make(tmp_path / "part")
    resumed.train(resume_from_checkpoint=True)
    for x, y in zip(params(full.agents) + critic_params(full) + params([full.reward_model]),
                    params(resumed.agents) + critic_params(resumed) + params([resumed.reward_model])):
        assert torch.equal(x, y)
