"""Preference learning on the tiny model: records, pair selection, the joint reward model, MADPO and MARLHF."""
import importlib.util
import json
import logging
import random

import numpy as np
import pytest
import torch

from comlrl_nb.engine import read_metrics
from comlrl_nb.losses import madpo_loss
from comlrl_nb.models import make_tiny_model
from comlrl_nb.preference import (load_pairs, make_pair_record, save_pairs, select_pairs, tokenize_pairs, untied_pairs,
                                  validate_pair_record)
from comlrl_nb.reward_model import JointRewardModel, joint_text
from comlrl_nb.trainers.preference import MADPOConfig, MADPOTrainer, MARLHFConfig, MARLHFTrainer
from comlrl_nb.trainers.reinforce import MAGRPOTrainer, MARLOOTrainer

ITEMS = [{"prompt": p} for p in ["Write a story", "Explain physics", "Create a recipe", "Describe a city"]]


def vowels(a, b):
    f = lambda s: sum(ch in "aeiou " for ch in s) / max(len(s), 1)
    return [0.5 * f(x) + 0.5 * f(y) for x, y in zip(a, b)]


BASE = dict(num_train_epochs=2, preference_num_candidates=4, preference_pairs_per_sample=2, max_new_tokens=8,
            temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=3e-3, eval_interval=0,
            logging_steps=1000, progress_bar=False, save_steps=-1)


def madpo(tmp, data=ITEMS, **kw):
    m, tok = make_tiny_model(seed=0)
    cfg = {**BASE, "dpo_beta": 0.5, "output_dir": str(tmp), **kw}
    oracle = cfg.pop("oracle", None)
    return MADPOTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, args=MADPOConfig(**cfg), train_dataset=data,
                        oracle=oracle)


def marlhf(tmp, data=ITEMS, **kw):
    m, tok = make_tiny_model(seed=0)
    cfg = {**BASE, "num_generations": 4, "rollout_batch_size": 2, "reward_learning_rate": 1e-3,
           "reward_num_train_epochs": 2, "reward_train_batch_size": 2, "agent_learning_rate": 1e-2,
           "output_dir": str(tmp), **kw}
    extra = {k: cfg.pop(k) for k in ("oracle", "eval_logger", "eval_aggregator", "eval_dataset") if k in cfg}
    return MARLHFTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, args=MARLHFConfig(**cfg), train_dataset=data,
                         reward_model=m, **extra)


def params(models):
    return [p.detach().clone() for m in models for p in m.parameters()]


# ---------------------------------------------------------------- records and selection
# (the record layout, round trip and malformed-file checks live in nbs/40_preference.ipynb)

def test_pair_selection_modes_caps_and_ties():
    s = [0.5, 0.1, 0.5, 0.9, 0.1]
    allp = untied_pairs(s)
    assert (0, 2) not in allp and (2, 0) not in allp and (1, 4) not in allp and (4, 1) not in allp   # ties dropped
    assert len(allp) == 10 - 2 and all(s[w] > s[l] for w, l in allp)
    assert select_pairs(s, "all", None) == allp                                         # index order
    gap = select_pairs(s, "reward_gap", None)
    gaps = [s[w] - s[l] for w, l in gap]
    assert gaps == sorted(gaps, reverse=True) and gap[:2] == [(3, 1), (3, 4)]           # stable among equal gaps
    assert select_pairs(s, "reward_gap", 3) == gap[:3]
    r = select_pairs(s, "random", 4, key=(0, "x", 1))
    assert len(r) == 4 and set(r) <= set(allp) and r == select_pairs(s, "random", 4, key=(0, "x", 1))
    assert sorted(select_pairs(s, "random", None, key=(5,))) == sorted(allp)
    assert select_pairs([0.3] * 5, "reward_gap", 16) == []
    with pytest.raises(ValueError,
                       match="pair_selection='all' keeps every untied pair.*preference_pairs_per_sample must be None"):
        select_pairs(s, "all", 2)
    with pytest.raises(ValueError) as e:
        MADPOConfig(pair_selection="all")
    assert "pair_selection" in str(e.value) and "preference_pairs_per_sample" in str(e.value)
    assert MARLHFConfig(pair_selection="all", preference_pairs_per_sample=None).pair_selection == "all"
    assert MADPOConfig(preference_pairs_per_sample=None).preference_pairs_per_sample is None     # None: no cap


# ---------------------------------------------------------------- the joint reward model

@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_reward_model_left_and_right_padding(arch):
    m, tok = make_tiny_model(arch)
    rm = JointRewardModel(m, tok)
    texts = [joint_text(["Write", "Expand"], ["A robot.", "A robot paints a city in the clouds."]),
             joint_text(["Explain", "Expand"], ["Physics.", "Quantum."]), joint_text(["x"], ["y"])]
    with torch.no_grad():
        alone = torch.cat([rm(*rm.encode([t])) for t in texts])
        left, right = rm(*rm.encode(texts, "left")), rm(*rm.encode(texts, "right"))
        ids, mask = rm.encode(texts, "left")
    assert mask[:, 0].tolist() != mask[:, -1].tolist()                                   # really padded
    torch.testing.assert_close(left, alone, atol=1e-5, rtol=0)
    torch.testing.assert_close(right, alone, atol=1e-5, rtol=0)
    short = JointRewardModel(m, tok, max_length=5)
    ids, mask = short.encode(texts[:1])
    assert ids.shape[1] == 5 and ids[0].tolist() == tok(texts[0], add_special_tokens=False).input_ids[-5:]


def test_reward_model_default_backbone_is_agent_one_id(tmp_path):
    m, tok = make_tiny_model(seed=3)
    m.save_pretrained(tmp_path / "agent")
    tok.save_pretrained(tmp_path / "agent")
    tr = MARLHFTrainer(agent_model=str(tmp_path / "agent"), reward_func=vowels, train_dataset=ITEMS,
                       args=MARLHFConfig(output_dir=str(tmp_path / "run"), progress_bar=False))
    assert torch.equal(tr.reward_model.body.get_input_embeddings().weight, m.get_input_embeddings().weight)
    assert tr.reward_model.device == tr.devices[0]
    m2, _ = make_tiny_model()
    with pytest.raises(ValueError, match="reward_model_name"):
        MARLHFTrainer(agents=[m2, m2], tokenizer=tok, reward_func=vowels, args=MARLHFConfig(progress_bar=False))


def test_bradley_terry_training_recovers_a_hidden_ranking():
    words = ["robot", "paint", "story", "city", "cake", "fox", "dog", "village"]
    def pairs(n, seed):
        rng, W, L = random.Random(seed), [], []
        while len(W) < n:
            a, b = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 7))) for _ in range(2)]
            sa, sb = a.split().count("robot") - a.split().count("dog"), \
                b.split().count("robot") - b.split().count("dog")
            if sa != sb:
                w, l = (a, b) if sa > sb else (b, a)
                W.append(joint_text(["Write"], [w]))
                L.append(joint_text(["Write"], [l]))
        return W, L
    m, tok = make_tiny_model()
    rm = JointRewardModel(m, tok)
    (tw, tl), (hw, hl) = pairs(200, 0), pairs(80, 1)
    rm.fit_texts(tw, tl, num_train_epochs=5, batch_size=8, learning_rate=3e-3)
    assert rm.preference_accuracy(hw, hl) >= 0.85


# ---------------------------------------------------------------- MADPO

def test_madpo_gradient_is_the_closed_form_through_own_margin_only(tmp_path):
    tr = madpo(tmp_path, dpo_beta=0.3)
    tr.agents[1].load_state_dict(make_tiny_model(seed=1)[0].state_dict())
    tr.pairs = [make_pair_record(["Write a story", "Explain"], [" a robot paints", " it is small"], [" dog", " 1 2"],
                                 1.0, 0.0, 0.5),
                make_pair_record(["Describe", "Create"], [" clouds", " a cake"], [" the fox", " lazy"], 0.7, 0.2, 0.4,
                                 winner_eos=[False, True], loser_eos=[True, False])]
    tr._tokens = [tokenize_pairs(tr.pairs, i, tr.tokenizers[i]) for i in range(2)]
    with torch.no_grad():
        M = torch.stack([tr._margins(i, [0, 1]) for i in range(2)])
    expected = []
    for i in range(2):
        ps = list(tr.agents[i].parameters())
        g = [torch.zeros_like(p) for p in ps]
        for b in range(2):
            for acc, gb in zip(g, torch.autograd.grad(tr._margins(i, [b])[0], ps)):
                acc -= 0.3 * torch.sigmoid(-0.3 * M.sum(0)[b]) * gb / 2
        expected.append(g)
    before = [params([m]) for m in tr.agents]
    tr.optimizers = [torch.optim.SGD(m.parameters(), lr=1.0) for m in tr.agents]      # delta = -grad
    out = tr._update([0, 1])
    torch.testing.assert_close(out["margins"], M, atol=1e-5, rtol=0)
    assert out["loss"] == pytest.approx(float(madpo_loss(M, 0.3)), abs=1e-5)
    for i in range(2):
        for b0, p, g in zip(before[i], tr.agents[i].parameters(), expected[i]):
            torch.testing.assert_close(b0 - p.detach(), g, atol=2e-5, rtol=1e-3)
    ms = [M[0].clone().requires_grad_(), M[1].clone().requires_grad_()]
    madpo_loss(ms, 0.3, agent=1).backward()
    assert ms[0].grad is None and ms[1].grad is not None


def test_madpo_run_raises_the_margin_and_stores_pairs(tmp_path):
    tr = madpo(tmp_path, num_train_epochs=3)
    out = tr.train()
    assert out["num_pairs"] == 8 == len(tr.pairs)
    stored = load_pairs(tmp_path / "pairs.json", 2)
    assert stored == tr.pairs                                                            # trained on the stored text
    assert all(r["raw_rewards"] == [] and r["target_raw_reward"] is None and r["comparator_raw_reward"] is None
               for r in stored)
    assert [t[1].tolist() for t in tr._tokens[0]] == [t[1].tolist()
                                                      for t in tokenize_pairs(stored, 0, tr.tokenizers[0])]
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert rows[0]["phase"] == "collection" and rows[0]["collection/pairs"] == 8
    dpo = [r for r in rows if "dpo/loss" in r]
    assert len(dpo) == 12 \
        and all(k in dpo[0] for k in ("dpo/accuracy", "dpo/margin_mean", "dpo/reward_gap", "agent_0/margin",
                                      "agent_1/margin", "turn_1/reward_mean", "turn_1/expected_return"))
    first = [tr.pairs[int(j)] for j in tr._pair_order(0)[:2]]  # collection-time candidate rewards
    assert dpo[0]["turn_1/reward_mean"] == pytest.approx(np.mean([r["candidate_reward_mean"] for r in first]))
    assert dpo[0]["dpo/reward_gap"] == pytest.approx(np.mean([r["winner_reward"] - r["loser_reward"] for r in first]))
    fresh = madpo(tmp_path / "fresh")
    m0, m1 = fresh.margins(tr.pairs), tr.margins()
    assert float(m1.sum(0).mean()) > float(m0.sum(0).mean()) + 1.0
    assert tr.state["optimizer_steps"] == [12, 12]


def test_no_untied_pair_ends_without_updates(tmp_path, caplog):
    tr = madpo(tmp_path / "madpo", oracle=lambda a, b: [0.5] * len(a))
    before = params(tr.agents)
    with caplog.at_level(logging.WARNING, logger="comlrl_nb"):
        out = tr.train()
    assert out["num_pairs"] == 0 and tr.state["optimizer_steps"] == [0, 0]
    assert all(torch.equal(a, b) for a, b in zip(before, params(tr.agents)))
    assert "without updating the policies" in caplog.text
    assert json.loads((tmp_path / "madpo" / "pairs.json").read_text()) == []
    tr = marlhf(tmp_path / "marlhf", oracle=lambda a, b: [0.0] * len(a))
    before, rm0 = params(tr.agents), params([tr.reward_model])
    out = tr.train()
    assert out["num_pairs"] == 0 and all(torch.equal(a, b) for a, b in zip(before, params(tr.agents)))
    assert all(torch.equal(a, b) for a, b in zip(rm0, params([tr.reward_model])))


def test_custom_oracle_chooses_pairs_but_eval_uses_the_task_reward(tmp_path):
    longer = lambda a, b: [float(len(x) + len(y)) for x, y in zip(a, b)]
    tr = madpo(tmp_path, oracle=longer, num_train_epochs=1, eval_interval=4, eval_num_samples=2)
    tr.eval_dataset = ITEMS
    tr.train()
    for r in tr.pairs:
        assert r["winner_reward"] == len("".join(r["winner_completions"])) > r["loser_reward"]
    ev = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "eval/turn_1/reward_mean" in r]
    assert ev and all(0 <= r["eval/turn_1/reward_mean"] <= 1 for r in ev)                # vowel share, not a length


def test_madpo_resume_gives_the_same_result(tmp_path):
    full = madpo(tmp_path / "full", num_train_epochs=2, save_steps=3)
    full.train()
    part = madpo(tmp_path / "part", num_train_epochs=2, save_steps=3)
    st = part.train(stop_after_batch=5)
    assert st["stopped"] and st["global_batch"] == 5
    resumed = madpo(tmp_path / "part", num_train_epochs=2, save_steps=3)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state["global_batch"] == full.state["global_batch"] == 8
    assert resumed.pairs == full.pairs
    for x, y in zip(params(full.agents), params(resumed.agents)):
        assert torch.equal(x, y)
    for a, b in zip(full.optimizers, resumed.optimizers):
        sa, sb = a.state_dict()["state"], b.state_dict()["state"]
        assert all(torch.equal(sa[k]["exp_avg"], sb[k]["exp_avg"]) for k in sa)
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time") and k != "pairs_per_s"} for r in rows]
    assert strip(read_metrics(tmp_path / "full" / "metrics.jsonl")) == \
        strip(read_metrics(tmp_path / "part" / "metrics.jsonl"))


def central(tmp, parser=lambda t, n: [t[: len(t) // 2], t[len(t) // 2:]], **kw):
    m, tok = make_tiny_model(seed=0)
    cfg = {**BASE, "dpo_beta": 0.5, "output_dir": str(tmp), "collaboration_mode": "centralized", **kw}
    return MADPOTrainer(agent_model=m, tokenizer=tok, reward_func=vowels, args=MADPOConfig(**cfg), train_dataset=ITEMS,
                        centralized_parser=parser)


def test_centralized_madpo_resume_gives_the_same_result(tmp_path):
    full = central(tmp_path / "full", save_steps=3)
    full.train()
    assert len(full.agents) == 1 and full.state["optimizer_steps"] == [full.state["global_batch"]] and full.pairs
    part = central(tmp_path / "part", save_steps=3)
    assert part.train(stop_after_batch=3)["stopped"]
    resumed = central(tmp_path / "part", save_steps=3)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.pairs == full.pairs and all("centralized" in r for r in resumed.pairs)
    assert all(torch.equal(x, y) for x, y in zip(params(full.agents), params(resumed.agents)))
    assert load_pairs(tmp_path / "full" / "pairs.json", 2) == full.pairs          # the extra field survives the file


def test_centralized_madpo_with_a_tag_writing_actor(tmp_path):
    """The actor's text goes through the default prompt builder and tag parser: a scripted sampler stands in for a model
    that follows the format (the tiny model never does), and a reward that reads the parsed roles picks the winners."""
    tr = central(tmp_path, parser=None, num_train_epochs=1)
    seen = []

    def scripted(trainer, chunk, ids, K, round_key):
        texts = [f"<agent_0>\n{'a' * (k + 1)}\n</agent_0>\n<agent_1>\n{'b' * (2 * k + 1)}\n</agent_1>" if k % 2 == 0
                 else "no tags" for _ in chunk for k in range(K)]
        roles, prompts = zip(*[trainer._central_prompt(it) for it in chunk])
        seen.extend(prompts)
        parts = [trainer._split(t) for t in texts]
        ex = lambda b, w, l: {"centralized": {"prompt": prompts[b], "winner": texts[b * K + w],
                                              "loser": texts[b * K + l], "winner_eos": True, "loser_eos": True}}
        return {"prompts": [[r[i] for r in roles] for i in range(2)],
                "texts": [[p[i] if p else "" for p in parts] for i in range(2)],
                "ended": [[True] * len(texts)] * 2, "extra": ex, "unparsed": sum(p is None for p in parts)}

    tr.preference_sampler = scripted
    out = tr.train()
    rows = read_metrics(out["metrics_path"])
    assert rows[0]["collection/unparsed"] == 2 * len(ITEMS)                         # candidates 1 and 3 of every item
    assert "Agent 0 task:\nWrite a story" in seen[0] and "<agent_1>" in seen[0]
    w = tr.pairs[0]
    assert w["winner_completions"][0].startswith("a") and w["loser_completions"] == ["", ""]    # parsed beats unparsed
    assert w["centralized"]["winner"].startswith("<agent_0>") and w["centralized"]["loser"] == "no tags"
    assert out["num_pairs"] == 2 * len(ITEMS) and rows[-1]["agent_0/optimizer_steps"] == out["global_batch"]


def test_madpo_errors_and_reference_free(tmp_path, caplog):
    m, tok = make_tiny_model()
    with pytest.raises(ValueError, match="dpo_beta=-0.1 is invalid: must be > 0"):
        MADPOConfig(dpo_beta=-0.1)
    with pytest.raises(ValueError, match="num_turns=2 is invalid"):
        MADPOConfig(num_turns=2)
    with pytest.raises(ValueError, match="use joint_mode='aligned'"):
        MADPOConfig(joint_mode="crossed")
    with pytest.raises(TypeError, match="args must be a MADPOConfig"):
        MADPOTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, args=MARLHFConfig())
    with pytest.raises(ValueError, match="exactly one actor for all 2 roles"):
        MADPOTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels,
                     args=MADPOConfig(collaboration_mode="centralized"))
    with caplog.at_level(logging.WARNING, logger="comlrl_nb"):
        tr = madpo(tmp_path, reference_kl_enabled=True)
    assert tr.ref_agents is None and "reference-free" in caplog.text
    assert MADPOTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels).args.train_batch_size == 2


# ---------------------------------------------------------------- MARLHF

def test_marlhf_end_to_end_magrpo_backend_eval_with_task_reward(tmp_path):
    seen = []
    def eval_logger(agent_completions_turns, batch_items, prompts):
        seen.append([[t[0] for t in a] for a in agent_completions_turns])
        return [{} for _ in batch_items]
    tr = marlhf(tmp_path, eval_dataset=ITEMS, eval_interval=2, eval_num_samples=2, eval_batch_size=2,
                eval_logger=eval_logger, eval_aggregator=lambda metrics, num_turns: {})
    assert type(tr.policy_trainer) is MAGRPOTrainer and tr.policy_trainer.args.advantage_mode == "mean"
    assert all(a is b for a, b in zip(tr.policy_trainer.agents, tr.agents))
    before = params(tr.agents)
    out = tr.train()
    assert out["num_pairs"] == 8 and (tmp_path / "pairs.json").exists()
    assert not (tmp_path / "reward_model" / "state.pt").exists()                          # save_steps=-1: nothing saved
    rm_rows = read_metrics(tmp_path / "reward_model" / "metrics.jsonl")
    assert [r["step"] for r in rm_rows if r["phase"] == "reward_model"] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert not any(p.requires_grad for p in tr.reward_model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, params(tr.agents)))
    rows = read_metrics(tmp_path / "metrics.jsonl")
    ev = [r for r in rows if "eval/turn_1/reward_mean" in r]
    assert len(ev) == 2 and len(seen) == 2
    for r, comps in zip(ev, seen):
        assert r["eval/turn_1/reward_mean"] == pytest.approx(float(np.mean(vowels(*comps))), abs=1e-12)
    ro = tr.policy_trainer.rollout(ITEMS[:1], [0], ("check", 0))  # training reward: the learned one
    want = tr.reward_model.score([[ITEMS[0]["prompt"]] * 4] * 2, [c.texts for c in ro["comps"]])
    torch.testing.assert_close(ro["rewards"][0], torch.tensor(want), atol=1e-5, rtol=0)


@pytest.mark.parametrize("final", [False, True])
def test_marlhf_fit_summary_running_accuracy_and_the_optional_final_pass(tmp_path, final):
    from comlrl_nb.trainers.marlhf import reward_texts
    tr = marlhf(tmp_path, reward_final_accuracy=final)
    tr.train(stop_after_batch=1)
    rows = read_metrics(tmp_path / "reward_model" / "metrics.jsonl")
    steps = [r for r in rows if r["phase"] == "reward_model"]
    summary = next(r for r in rows if r["phase"] == "reward_model_summary")
    last = [r["reward_model/accuracy"] for r in steps if r["epoch"] == 1]       # 2 epochs of 4 steps of 2 pairs
    assert len(steps) == 8 and len(last) == 4
    assert summary["reward_model/running_accuracy"] == pytest.approx(float(np.mean(last)), abs=1e-12)
    assert ("reward_model/train_accuracy" in summary) is final                   # the extra pass only when asked
    if final:
        assert summary["reward_model/train_accuracy"] == tr.reward_model.preference_accuracy(*reward_texts(tr.pairs))


def test_marlhf_backends_reference_kl_and_actor_critic(tmp_path):
    tr = marlhf(tmp_path / "a", rl_algorithm="marloo", reference_kl_enabled=True)
    assert type(tr.policy_trainer) is MARLOOTrainer and tr.policy_trainer.args.advantage_mode == "rloo"
    assert tr.ref_agents is None and tr.policy_trainer.ref_agents is not None  # KL in the policy phase only
    assert tr.args.reference_kl_enabled
    if importlib.util.find_spec("comlrl_nb.trainers.actor_critic") is None:
        for name in ("maac", "iac"):
            with pytest.raises(ImportError, match="needs the actor-critic trainers"):
                marlhf(tmp_path / name, rl_algorithm=name)


@pytest.mark.skipif(importlib.util.find_spec("comlrl_nb.trainers.actor_critic") is None,
                    reason="actor-critic trainers not present")
@pytest.mark.parametrize("algo", ["maac", "iac"])
def test_marlhf_actor_critic_backends(tmp_path, algo):
    critic, _ = make_tiny_model(seed=5)
    with pytest.raises(ValueError, match="critic"):  # no critic source: the backend says so
        marlhf(tmp_path / "none", rl_algorithm=algo)
    m, tok = make_tiny_model(seed=0)
    kw = {"critic_model": critic} if algo == "maac" else {"critics": [critic, critic]}
    tr = MARLHFTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, train_dataset=ITEMS, reward_model=m,
                       backend_kwargs=kw,
                       args=MARLHFConfig(**{**BASE, "rollout_batch_size": 2, "rl_algorithm": algo,
                                            "value_loss_coef": 0.3, "output_dir": str(tmp_path / algo)}))
    assert tr.policy_trainer.algo == algo and tr.policy_trainer.args.value_loss_coef == 0.3
    before = params(tr.agents)
    out = tr.train()
    assert out["num_pairs"] == 8 and out["global_batch"] == 4
    assert any(not torch.equal(a, b) for a, b in zip(before, params(tr.agents)))


def test_marlhf_resume_gives_the_same_result(tmp_path, stopped_and_resumed):
    full, resumed, out = stopped_and_resumed(lambda d: marlhf(d, save_steps=2), tmp_path)
    assert out["global_batch"] == 4
    for x, y in zip(params(full.agents) + params([full.reward_model]),
                    params(resumed.agents) + params([resumed.reward_model])):
        assert torch.equal(x, y)
