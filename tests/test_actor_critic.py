"""MAAC and IAC on the tiny model: TD targets, multi-turn episodes, critic sources, value clipping, training, resume."""
import numpy as np
import pytest
import torch

from comlrl_nb.engine import read_metrics
from comlrl_nb.models import make_tiny_model
from comlrl_nb.rollout import TransitionError
from comlrl_nb.trainers.actor_critic import (ActorSample, IACConfig, IACTrainer, MAACConfig, MAACTrainer, ValueSample,
                                             discounted_returns, history_text, kl_td_targets, normalize_advantages,
                                             td_advantages, td_targets, value_loss)

PROMPTS = [{"prompt": p} for p in ["Write a story", "Explain physics", "Create a recipe", "Describe a city"]]


def vowels(a, b):
    f = lambda s: sum(ch in "aeiou " for ch in s) / max(len(s), 1)
    return [0.5 * f(x) + 0.5 * f(y) for x, y in zip(a, b)]


def revise(prompt, agent_completions, num_agents, prompt_history_per_agent=None, response_history_per_agent=None):
    return [f"{prompt} | revise {len(prompt_history_per_agent[i])}: {c[:5]}" for i, c in enumerate(agent_completions)]


def make(tmp, cls=MAACTrainer, reward=vowels, data=PROMPTS, transition=None, critic="model", **kw):
    m, tok = make_tiny_model(seed=0)
    cm, _ = make_tiny_model(seed=3, tokenizer=tok)
    cfg_cls = MAACConfig if cls is MAACTrainer else IACConfig
    cfg = dict(num_train_epochs=1, max_new_tokens=6, temperature=1.0, top_p=1.0, agent_learning_rate=1e-2,
               critic_learning_rate=1e-2, rollout_buffer_size=2, eval_interval=0, output_dir=str(tmp),
               progress_bar=False, save_steps=-1, logging_steps=1000)
    cfg.update(kw)
    extra = {"critic_model": cm} if critic == "model" else {}
    return cls(agents=[m, m], tokenizer=tok, reward_func=reward, args=cfg_cls(**cfg), train_dataset=data,
               external_transition=transition, **extra)


def params(models):
    return [p.detach().clone() for m in models for p in m.parameters()]


def changed(before, models):
    return any(not torch.equal(a, b) for a, b in zip(before, params(models)))


# ---------------------------------------------------------------- TD math
def test_td_targets_with_and_without_bootstrap_and_discount():
    r, v = [0.2, 0.5, 1.0], [0.6, 0.9, 0.8]
    assert torch.allclose(td_targets(r, v, discount=0.9), torch.tensor([1.01, 1.22, 1.0]))
    assert torch.allclose(td_targets(r, v, discount=1.0), torch.tensor([1.1, 1.3, 1.0]))
    assert torch.allclose(td_targets(r, v, discount=0.0), torch.tensor(r))                   # no bootstrap at all
    # an early-terminated turn is terminal: no bootstrap from a value that does not exist
    assert torch.allclose(td_targets(r, next_values=[0.9, 0.8, 0.0], dones=[0, 1, 1], discount=0.9),
                          torch.tensor([1.01, 0.5, 1.0]))
    y = td_targets(r[:2], v[:2], discount=0.9)
    assert torch.allclose(y, torch.tensor([1.01, 0.5])) and torch.allclose(td_advantages(y, v[:2]),
                                                                           torch.tensor([0.41, -0.4]))
    G = discounted_returns(r, 0.9)  # perfect critic -> zero advantages
    assert torch.allclose(td_advantages(td_targets(r, G, discount=0.9), G), torch.zeros(3), atol=1e-6)
    a = normalize_advantages([1.0, 2.0, 6.0])
    assert abs(float(a.mean())) < 1e-6 and abs(float(a.std(unbiased=False)) - 1) < 1e-5
    with pytest.raises(ValueError, match="values shape"):
        td_targets(r, v[:2])


def test_value_loss_clipping_formula():
    v = torch.tensor([1.0, 0.5])
    assert value_loss(v, [2.0, 0.0], 0.6).item() == pytest.approx(0.375)
    assert value_loss(v, [2.0, 0.0], 0.6, old_values=[0.5, 0.5], clip_range=0.2).item() == pytest.approx(0.582)


# ---------------------------------------------------------------- episodes
def test_episode_collection_with_toy_transition(tmp_path):
    calls = []

    def rec(prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent):
        calls.append(dict(prompt=prompt, comps=list(agent_completions), n=num_agents, ph=prompt_history_per_agent,
                          rh=response_history_per_agent))
        return [f"next {len(calls)} for agent {i}" for i in range(num_agents)]

    m, tok = make_tiny_model(seed=0)
    fmt = [lambda it: "A: " + it["prompt"], lambda it: "B: " + it["prompt"]]
    tr = MAACTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, formatters=fmt, critic_model=m,
                     external_transition=rec,
                     args=MAACConfig(num_turns=3, early_termination_threshold=None, max_new_tokens=5, temperature=1.0,
                                     top_p=1.0, output_dir=str(tmp_path)))
    eps = tr.rollout(PROMPTS[:2], [0, 1], ("train", 0))["episodes"]
    assert len(calls) == 2 * 2                                     # 2 episodes x (3 turns - 1)
    assert [e.num_turns for e in eps] == [3, 3]
    e0 = eps[0]
    first, second = calls[0], calls[1]                             # both calls of episode 0 (episodes run turn by turn)
    assert [c["prompt"] for c in calls] == ["Write a story", "Explain physics"] * 2
    assert first["n"] == 2 and first["comps"] == [e0.responses[0][0], e0.responses[1][0]]
    assert first["ph"] == [["A: Write a story"], ["B: Write a story"]]
    assert first["rh"] == [[e0.responses[0][0]], [e0.responses[1][0]]]
    third = calls[2]                                               # episode 0, after turn 2
    assert third["ph"] == [["A: Write a story", "next 1 for agent 0"], ["B: Write a story", "next 1 for agent 1"]]
    assert third["rh"] == [e0.responses[0][:2], e0.responses[1][:2]]
    # through the formatter
    assert e0.prompts[0] == ["A: Write a story", "A: next 1 for agent 0", "A: next 3 for agent 0"]
    assert second["ph"][0] == ["A: Explain physics"]
    # targets bootstrap from the next turn's value, except on the last turn
    v = e0.values[0]
    want = torch.tensor([e0.rewards[0] + float(v[1]), e0.rewards[1] + float(v[2]), e0.rewards[2]])
    assert torch.allclose(e0.targets[0], want, atol=1e-6)
    # passthrough: the transition's output is the prompt
    calls.clear()
    tr.args.external_prompt_passthrough = True
    e = tr.rollout(PROMPTS[:1], [0], ("train", 0))["episodes"][0]
    assert e.prompts[0][1] == "next 1 for agent 0" and e.inputs[1][2] == "next 2 for agent 1"


def test_early_termination_stops_the_episode(tmp_path):
    n_calls = []

    def count(**kw):
        n_calls.append(1)
        return revise(**kw)

    def reward(a, b, agent_prompts):                                    # 1.0 once the prompt has been revised
        return [1.0 if "revise" in p else 0.0 for p in agent_prompts[0]]

    tr = make(tmp_path, reward=reward, transition=count, num_turns=3, early_termination_threshold=0.5, discount=0.9)
    eps = tr.rollout(PROMPTS[:2], [0, 1], ("t", 0))["episodes"]
    assert [e.num_turns for e in eps] == [2, 2] and all(e.early_stop for e in eps)
    assert len(n_calls) == 2                                        # one transition per episode, none after the stop
    for e in eps:
        v = e.values[0]
        # no bootstrap at the stop
        assert torch.allclose(e.targets[0], torch.tensor([0.0 + 0.9 * float(v[1]), 1.0]), atol=1e-6)
    # the default threshold with non-negative rewards ends every episode after turn 1
    tr = make(tmp_path, transition=count, num_turns=3)
    assert [e.num_turns for e in tr.rollout(PROMPTS[:2], [0, 1], ("t", 0))["episodes"]] == [1, 1]
    # without early termination every episode runs all turns
    tr = make(tmp_path, transition=count, num_turns=3, early_termination_threshold=None)
    assert [e.num_turns for e in tr.rollout(PROMPTS[:2], [0, 1], ("t", 0))["episodes"]] == [3, 3]


def test_multi_turn_rejects_several_generations():
    for cfg in (MAACConfig, IACConfig):
        with pytest.raises(ValueError, match="num_generations=4 with num_turns=2 is invalid"):
            cfg(num_turns=2, num_generations=4)
    assert MAACConfig(num_turns=1, num_generations=4).num_generations == 4        # single turn: K episodes per item


def test_single_turn_with_several_generations(tmp_path):
    tr = make(tmp_path, num_generations=3)
    eps = tr.rollout(PROMPTS[:2], [0, 1], ("t", 0))["episodes"]
    assert [(e.item_id, e.candidate) for e in eps] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert all(e.num_turns == 1 and torch.allclose(e.targets[0], torch.tensor(e.rewards)) for e in eps)


@pytest.mark.parametrize("bad, msg", [
    (lambda **k: "one string", "returned str"),
    (lambda **k: ["only one"], "returned 1 prompts for 2 agents"),
    (lambda **k: 1 / 0, "raised ZeroDivisionError"),
])
def test_transition_errors_name_the_transition(tmp_path, bad, msg):
    tr = make(tmp_path, transition=bad, num_turns=2, early_termination_threshold=None)
    with pytest.raises(TransitionError, match=msg) as e:
        tr.rollout(PROMPTS[:1], [0], ("t", 0))
    assert "'<lambda>'" in str(e.value) and str(e.value).endswith("(after turn 1 of item 0)")


# ---------------------------------------------------------------- critic sources
def test_critic_source_errors(tmp_path):
    m, tok = make_tiny_model(seed=0)
    base = dict(agents=[m, m], tokenizer=tok, reward_func=vowels)
    with pytest.raises(ValueError) as e:
        MAACTrainer(**base)
    for opt in ("critics=", "critic_model=", "critic_model_name", "critic_devices", "critic_value_head_hidden_dim"):
        assert opt in str(e.value)
    with pytest.raises(ValueError) as e:
        IACTrainer(**base)
    for opt in ("critics=", "critic_model=", "IACConfig.critic_model_name", "use_separate_critic=False",
                "value_head_hidden_dim"):
        assert opt in str(e.value)
    with pytest.raises(ValueError, match="exactly 1 model, got 2"):
        MAACTrainer(**base, critics=[m, m])
    with pytest.raises(ValueError, match="not both"):
        MAACTrainer(**base, critics=[m], critic_model=m)
    with pytest.raises(ValueError, match="critics length 3 does not match num_agents=2"):
        IACTrainer(**base, critics=[m, m, m])
    with pytest.raises(ValueError, match="critics length 1 does not match num_agents=2"):   # as comlrl: one per agent
        IACTrainer(**base, critics=[m])
    with pytest.raises(ValueError, match="are not used"):
        IACTrainer(**base, args=IACConfig(use_separate_critic=False, critic_model_name="x"))
    with pytest.raises(TypeError, match="a critic must be a model object or an id/path"):
        MAACTrainer(**base, critic_model=3.5)


def test_critic_from_a_model_name(tmp_path):
    cm, tok = make_tiny_model(seed=7)
    cm.save_pretrained(tmp_path / "critic")
    tok.save_pretrained(tmp_path / "critic")
    m, _ = make_tiny_model(seed=0, tokenizer=tok)
    tr = IACTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels,
                    args=IACConfig(critic_model_name=str(tmp_path / "critic")))
    a, b = tr.critics[0].backbone, tr.critics[1].backbone
    assert a is not b and all(torch.equal(x, y) for x, y in zip(a.parameters(), cm.parameters()))


# ---------------------------------------------------------------- updates
def test_value_clip_applies_only_to_value_heads(tmp_path):
    def one(tr):
        e = tr.rollout(PROMPTS[:1], [0], ("t", 0))["episodes"][0]
        v = float(e.values[0][0])
        return [ActorSample(e.prompt_ids[0][0], e.completion_ids[0][0], 0.5)], \
            [ValueSample(e.critic_ids[0][0], v + 10.0, v - 5.0)]

    head = make(tmp_path, cls=IACTrainer, critic=None, use_separate_critic=False, value_clip_range=0.2)
    act, val = one(head)
    _, vl = head._update_agent(0, act, val)
    assert vl[0] == pytest.approx(0.6 * 14.8 ** 2, rel=1e-4)        # clipped: V_old + 0.2 is 14.8 from the target
    head = make(tmp_path, cls=IACTrainer, critic=None, use_separate_critic=False, value_clip_range=None)
    act, val = one(head)
    assert head._update_agent(0, act, val)[1][0] == pytest.approx(60.0, rel=1e-4)
    sep = make(tmp_path, cls=IACTrainer, value_clip_range=0.2)      # separate critics: never clipped
    act, val = one(sep)
    assert sep._update_critic(0, val)[0] == pytest.approx(60.0, rel=1e-4)


@pytest.mark.parametrize("separate", [True, False])
def test_iac_trains(tmp_path, separate):
    tr = make(tmp_path, cls=IACTrainer, critic="model" if separate else None, use_separate_critic=separate,
              num_turns=2, transition=revise, early_termination_threshold=None)
    a0, c0 = params(tr.agents), [p.detach().clone() for c in tr.critics for p in c.parameters()]
    tr.train()
    assert changed(a0, tr.agents)
    assert any(not torch.equal(x, y) for x, y in zip(c0, [p for c in tr.critics for p in c.parameters()]))
    rows = read_metrics(tmp_path / "metrics.jsonl")
    losses = [r[k] for r in rows for k in r if k.endswith("loss")]
    assert losses and all(np.isfinite(losses))
    assert any("agent_0/critic_loss" in r and "agent_1/critic_loss" in r and "critic/loss" in r for r in rows)
    assert tr.state["optimizer_steps"] == [4, 4]                    # 4 episodes x 2 turns, buffer 2
    assert tr.state["critic_steps"] == ([4, 4] if separate else [0, 0])


@pytest.mark.parametrize("critic_type", ["v", "q"])
def test_maac_v_and_q_train(tmp_path, critic_type):
    tr = make(tmp_path, critic_type=critic_type, num_turns=2, transition=revise, early_termination_threshold=None,
              discount=0.9)
    a0, c0 = params(tr.agents), params([tr.critics[0].backbone, tr.critics[0].head])
    e = tr.rollout(PROMPTS[:1], [0], ("t", 0))["episodes"][0]
    text = tr._critic_text(0, e, 1)
    assert ("Turn 2, agent 2 response:" in text) == (critic_type == "q") and "Turn 1, agent 1 response:" in text
    tr.train()
    assert changed(a0, tr.agents) and changed(c0, [tr.critics[0].backbone, tr.critics[0].head])
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert all(np.isfinite(r[k]) for r in rows for k in r if k.endswith("loss"))
    assert tr.state["critic_steps"] == [4]


def test_metrics_lines(tmp_path):
    tr = make(tmp_path, num_turns=2, transition=revise, early_termination_threshold=None, rollout_buffer_size=4,
              rollout_batch_size=1)
    tr.train()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert len(rows) == 4 and [r["batch"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        for k in ("turn_1/reward_mean", "turn_2/reward_mean", "turn_1/expected_return", "turn_2/value_mean",
                  "turn_1/td_target_mean", "episode/turns_mean", "agent_0/adv_mean", "agent_1/completion_len"):
            assert k in r, k
    upd = [r for r in rows if "agent_0/loss" in r]
    assert len(upd) == 2 and all("agent_1/loss" in r and "critic/loss" in r for r in upd)   # 2 samples/batch, buffer 4


def test_learning_signal_maac(tmp_path):
    m, tok = make_tiny_model(seed=0)
    cm, _ = make_tiny_model(seed=1, tokenizer=tok)
    cfg = MAACConfig(num_train_epochs=10, num_generations=4, max_new_tokens=12, temperature=1.0, top_p=1.0,
                     agent_learning_rate=1e-2, critic_learning_rate=1e-2, rollout_batch_size=2, eval_interval=0,
                     output_dir=str(tmp_path), progress_bar=False, save_steps=-1, logging_steps=1000)
    tr = MAACTrainer(agents=[m, m], tokenizer=tok, critic_model=cm, reward_func=vowels, args=cfg,
                     train_dataset=PROMPTS * 2)
    tr.train()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    r = [x["turn_1/reward_mean"] for x in rows]
    cl = [x["critic/loss"] for x in rows]
    assert np.mean(r[-5:]) > np.mean(r[:5]) + 0.1
    assert np.mean(cl[-5:]) < np.mean(cl[:5])


# ---------------------------------------------------------------- resume, mp, saving, evaluation
@pytest.mark.parametrize("cls, kw", [(MAACTrainer, {}), (IACTrainer, {"use_separate_critic": False, "critic": None}),
                                     (MAACTrainer, {"reference_kl_enabled": True, "reference_kl_coef": 0.5})])
def test_resume_gives_the_same_result(tmp_path, cls, kw):
    cfg = dict(cls=cls, num_train_epochs=2, rollout_buffer_size=3, save_steps=2, num_turns=2, transition=revise,
               early_termination_threshold=None, **kw)
    full = make(tmp_path / "full", **cfg)
    full.train()
    part = make(tmp_path / "part", **cfg)
    st = part.train(stop_after_batch=3)                               # mid-epoch, with partly filled buffers
    assert st["stopped"] and st["global_batch"] == 3 and any(b.items for b in part.buffers)
    resumed = make(tmp_path / "part", **cfg)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state == full.state
    for x, y in zip(params(full.agents) + [p for c in full.critics for p in c.parameters()],
                    params(resumed.agents) + [p for c in resumed.critics for p in c.parameters()]):
        assert torch.equal(x, y)
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time") and k != "tokens_per_s"}
                          for r in rows]
    assert strip(read_metrics(tmp_path / "full" / "metrics.jsonl")) == \
        strip(read_metrics(tmp_path / "part" / "metrics.jsonl"))


@pytest.mark.parametrize("cls", [MAACTrainer, IACTrainer])
def test_sampling_ahead_is_bit_identical_and_resumes(tmp_path, cls, monkeypatch):
    """Single-turn batches that no update separates share one sampling loop; weights, metrics and a resume through a
    checkpoint taken mid-buffer are exactly those of sampling every batch alone."""
    import comlrl_nb.team as A                   # the team samples for every trainer
    calls, real = [], A.generate_team
    monkeypatch.setattr(A, "generate_team", lambda *a, **kw: calls.append([len(p) for p in a[2]]) or real(*a, **kw))
    cfg = dict(cls=cls, num_train_epochs=2, num_generations=1, rollout_buffer_size=3, save_steps=1)
    ahead = make(tmp_path / "ahead", **cfg)
    ahead.train()
    assert calls == [[3, 3], [1, 1]] * 2                   # per epoch: batches 1-3 in one loop, batch 4 alone
    alone = make(tmp_path / "alone", **cfg)
    alone._batches_ahead = lambda *a: []
    alone.train()
    part = make(tmp_path / "part", **cfg)
    assert part.train(stop_after_batch=2)["stopped"] and part._sample_cache  # batch 3's completions wait in the cache
    resumed = make(tmp_path / "part", **cfg)
    resumed.train(resume_from_checkpoint=True)
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time") and k != "tokens_per_s"}
                          for r in rows]
    for other, d in ((alone, "alone"), (resumed, "part")):
        for x, y in zip(params(ahead.agents) + [p for c in ahead.critics for p in c.parameters()],
                        params(other.agents) + [p for c in other.critics for p in c.parameters()]):
            assert torch.equal(x, y)
        assert strip(read_metrics(tmp_path / "ahead" / "metrics.jsonl")) == \
            strip(read_metrics(tmp_path / d / "metrics.jsonl"))


def test_mp_matches_sequential(tmp_path):
    seq = make(tmp_path / "seq", cls=IACTrainer)
    seq.train()
    mp = make(tmp_path / "mp", cls=IACTrainer, parallel_training="mp", agent_devices=["cpu", "cpu"],
              critic_devices="cpu")
    mp.train()
    for x, y in zip(params(seq.agents) + [p for c in seq.critics for p in c.parameters()],
                    params(mp.agents) + [p for c in mp.critics for p in c.parameters()]):
        assert torch.equal(x, y)


def test_save_model_writes_agents_and_critics(tmp_path):
    from comlrl_nb.models import load_agents
    tr = make(tmp_path / "run")
    tr.save_model(tmp_path / "maac")
    assert (tmp_path / "maac" / "critic" / "value_head.pt").exists()
    ms, _ = load_agents(agents=[str(tmp_path / "maac" / "critic")])
    assert all(torch.equal(a, b) for a, b in zip(ms[0].parameters(), tr.critics[0].backbone.parameters()))
    tr = make(tmp_path / "run2", cls=IACTrainer, critic=None, use_separate_critic=False)
    tr.save_model(tmp_path / "iac")
    head = torch.load(tmp_path / "iac" / "agent_1" / "value_head.pt")
    assert torch.equal(head["net.weight"], tr.critics[1].head.net.weight)


def test_multi_turn_evaluation_and_logger(tmp_path):
    seen = []

    def logger(agent_completions_turns, batch_items, prompts):
        seen.append(agent_completions_turns)
        return [{"turns": len(agent_completions_turns[0][b])} for b in range(len(batch_items))]

    def aggregator(metrics, num_turns):
        return {"turns_mean": float(np.mean([x["turns"] for x in metrics])), "num_turns": num_turns}

    m, tok = make_tiny_model(seed=0)
    tr = MAACTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, critic_model=m, external_transition=revise,
                     eval_dataset=PROMPTS, eval_logger=logger, eval_aggregator=aggregator,
                     args=MAACConfig(num_turns=2, early_termination_threshold=None, max_new_tokens=5,
                                     eval_num_samples=3, eval_batch_size=2, output_dir=str(tmp_path)))
    out = tr.evaluate()
    assert {"eval/turn_1/reward_mean", "eval/turn_2/reward_mean"} <= set(out)
    assert out["eval/turns_mean"] == 2 and out["eval/num_turns"] == 2
    assert [len(s[0]) for s in seen] == [3] and all(isinstance(t, str) for t in seen[0][1][0])   # one call, every item
    assert tr.evaluate() == out                                       # eval sampling does not depend on when it runs


def test_constructor_checks():
    m, tok = make_tiny_model(seed=0)
    with pytest.raises(ValueError, match="needs external_transition"):
        MAACTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, critic_model=m, args=MAACConfig(num_turns=2))
    with pytest.raises(TypeError, match="args must be a IACConfig"):
        IACTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, critic_model=m, args=MAACConfig())
    with pytest.raises(ValueError, match="reward_func is required"):
        MAACTrainer(agents=[m, m], tokenizer=tok, critic_model=m)
    with pytest.raises(ValueError, match="eval_logger and eval_aggregator go together"):
        MAACTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, critic_model=m, eval_logger=lambda **k: [])
    assert "Turn 1, agent 2 prompt:\nb" in history_text([["a"], ["b"]], [[], []])


# ---------------------------------------------------------------- reference KL (issue 15, item 3)
def _k3(tr, i, e, t, ref):
    from comlrl_nb.scoring import collate, completion_logprobs, k3_kl
    args = collate([e.prompt_ids[i][t]], [e.completion_ids[i][t]], tr.tokenizers[i].pad_token_id or 0)
    with torch.no_grad():
        lp, _ = completion_logprobs(tr.agents[i], *args)
        lr, _ = completion_logprobs(tr.ref_agents[i] if ref else tr.agents[i], *args)
    return float(k3_kl(lr, lp, args[3])[0])


@pytest.mark.parametrize("cls, kw", [(MAACTrainer, {}), (IACTrainer, {}), (IACTrainer, {"use_separate_critic": False,
                                                                                        "critic": None})])
def test_reference_kl_enters_each_agents_td_target(tmp_path, cls, kw):
    beta, gamma = 0.5, 0.9
    tr = make(tmp_path, cls=cls, num_turns=2, transition=revise, early_termination_threshold=None, discount=gamma,
              reference_kl_enabled=True, reference_kl_coef=beta, **kw)
    assert tr.reference_models is tr.ref_agents and len(tr.ref_agents) == 2
    for r, a in zip(tr.ref_agents, tr.agents):
        assert r is not a and not any(p.requires_grad for p in r.parameters())
    with torch.no_grad():                                  # agent 1 moves away from its reference; agent 0 stays on it
        for p in tr.agents[1].parameters(): p.add_(0.05 * torch.randn_like(p))
    eps = tr.rollout(PROMPTS[:2], [0, 1], ("t", 0)).episodes
    for e in eps:
        assert e.kl[0] == [0.0, 0.0] and all(x > 0 for x in e.kl[1])
        for t in range(2):                                 # the k3 estimate of the stored completion, recomputed
            assert e.kl[1][t] == pytest.approx(_k3(tr, 1, e, t, True), rel=1e-4, abs=1e-6)
        for i in range(2):
            c = tr.critic_of[i]
            y = kl_td_targets(e.rewards, e.values[c], e.kl[i], beta, gamma)
            # the penalty is in the reward, before the TD target: y_it = r_t - beta KL_it + gamma V(h_t+1)
            assert torch.allclose(y, td_targets(e.rewards, e.values[c], discount=gamma) - beta * torch.tensor(e.kl[i]))
            assert torch.allclose(e.advantages[i], td_advantages(y, e.values[c]))
        ys = [kl_td_targets(e.rewards, e.values[tr.critic_of[i]], e.kl[i], beta, gamma) for i in range(2)]
        if cls is MAACTrainer: assert torch.allclose(e.targets[0], (ys[0] + ys[1]) / 2)       # the critic: the mean
        else: assert all(torch.allclose(e.targets[i], ys[i]) for i in range(2))
    assert tr.rollout(PROMPTS[:1], [0], "eval", k=1, with_values=False).episodes[0].kl == {}    # not in evaluation


def test_reference_kl_off_or_zero_coef_leaves_targets_alone(tmp_path):
    off = make(tmp_path / "off", num_turns=2, transition=revise, early_termination_threshold=None)
    zero = make(tmp_path / "zero", num_turns=2, transition=revise, early_termination_threshold=None,
                reference_kl_enabled=True, reference_kl_coef=0.0)
    assert off.reference_models is None
    a, b = (tr.rollout(PROMPTS[:2], [0, 1], ("t", 0)).episodes for tr in (off, zero))
    for x, y in zip(a, b):
        assert x.kl == {} and set(y.kl) == {0, 1}
        assert torch.equal(x.targets[0], y.targets[0])
        assert all(torch.equal(x.advantages[i], y.advantages[i]) for i in (0, 1))


@pytest.mark.parametrize("cls", [MAACTrainer, IACTrainer])
def test_reference_kl_metrics(tmp_path, cls):
    tr = make(tmp_path, cls=cls, reference_kl_enabled=True, reference_kl_coef=1.0, rollout_batch_size=1)
    tr.train()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert rows and all({"agent_0/kl", "agent_1/kl", "time/kl"} <= set(r) for r in rows)
    assert rows[0]["agent_0/kl"] == 0.0 and max(r["agent_0/kl"] for r in rows) > 0     # the policy leaves its reference
    plain = make(tmp_path / "plain", cls=cls)
    plain.train()
    assert not any("agent_0/kl" in r or "time/kl" in r for r in read_metrics(tmp_path / "plain" / "metrics.jsonl"))


def test_cli_maac_with_reference_kl():
    from comlrl_nb.cli import build_config
    for cls in (MAACConfig, IACConfig):
        c = build_config(cls, {"reference_kl_enabled": True, "reference_kl_coef": "0.5", "reference_devices": "cpu"})
        assert (c.reference_kl_enabled, c.reference_kl_coef, c.reference_devices) == (True, 0.5, "cpu")


def test_separate_critics_load_with_critic_model_kwargs(tmp_path):
    "model_config['critic_model_kwargs'] reaches the critic models loaded from an id or path (the library's key)."
    from comlrl_nb import MAACConfig, MAACTrainer, make_tiny_model
    m, tok = make_tiny_model(seed=0)
    m.save_pretrained(tmp_path / "critic")
    tok.save_pretrained(tmp_path / "critic")
    tr = MAACTrainer(agents=[m, m], tokenizer=tok, critics=[str(tmp_path / "critic")],
                     reward_func=lambda a, b: [0.0] * len(a), args=MAACConfig(output_dir=None),
                     model_config={"critic_model_kwargs": {"dtype": "bfloat16"}})
    assert next(tr.critics[0].backbone.parameters()).dtype == torch.bfloat16
    assert next(tr.agents[0].parameters()).dtype == torch.float32               # the agents keep theirs
