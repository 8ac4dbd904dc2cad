"""Behaviour of the MAGRPO family trainer on the tiny model: schedule, joint modes, KL, evaluation, resume."""
import json

import numpy as np
import pytest
import torch

from comlrl_nb import MAGRPOConfig, MAGRPOTrainer, MARLOOTrainer, make_tiny_model, node_advantages, read_metrics

PROMPTS = [{"prompt": p} for p in ["Write a story", "Explain physics", "Create a recipe", "Describe a city"]]


def vowels(a, b):
    f = lambda s: sum(ch in "aeiou " for ch in s) / max(len(s), 1)
    return [0.5 * f(x) + 0.5 * f(y) for x, y in zip(a, b)]


def make(tmp, reward=vowels, data=PROMPTS, trainer_cls=MAGRPOTrainer, n=2, **kw):
    m, tok = make_tiny_model(seed=0)
    cfg = dict(num_agents=n, num_train_epochs=2, num_generations=4, max_new_tokens=8, temperature=1.0, top_p=1.0,
               top_k=None, agent_learning_rate=1e-2, rollout_batch_size=1, eval_interval=0, output_dir=str(tmp),
               progress_bar=False, save_steps=-1, logging_steps=1000)
    cfg.update(kw)
    return trainer_cls(agents=[m] * n, tokenizer=tok, reward_func=reward, args=MAGRPOConfig(**cfg), train_dataset=data)


def params(tr):
    return [p.detach().clone() for m in tr.agents for p in m.parameters()]


# The update schedule (buffer 3, mini-batch 2: steps at batch 3 and at the epoch's flush) and the crossed joint mode's
# returns are checked in nbs/30_reinforce.ipynb, under the cells they test (run by tests/test_notebooks.py).


def test_every_agent_changes_and_losses_finite(tmp_path):
    tr = make(tmp_path, num_train_epochs=1)
    before = [[p.detach().clone() for p in m.parameters()] for m in tr.agents]
    tr.train()
    for b, m in zip(before, tr.agents):
        assert any(not torch.equal(x, y) for x, y in zip(b, m.parameters()))
    losses = [r[k] for r in read_metrics(tmp_path / "metrics.jsonl") for k in r if k.endswith("/loss")]
    assert losses and all(np.isfinite(losses))


def test_reward_called_once_per_batch(tmp_path):
    n_calls = []

    def rec(a, b):
        n_calls.append(len(a))
        return vowels(a, b)

    tr = make(tmp_path, reward=rec, rollout_batch_size=2, num_train_epochs=1)
    tr.train()
    assert n_calls == [8, 8]                                              # 2 batches x (2 items x K=4)


def test_reference_kl_is_subtracted_before_the_baseline(tmp_path):
    tr = make(tmp_path, reference_kl_enabled=True, reference_kl_coef=0.5, advantage_normalization=False)
    ro = tr.rollout(PROMPTS[:2], [0, 1], ("t", 0))
    assert all(float(k.abs().max()) < 1e-5 for k in ro["kl"])            # policy == reference at the start
    with torch.no_grad():
        for p in tr.agents[0].parameters():
            p.add_(0.05 * torch.randn_like(p))
    ro = tr.rollout(PROMPTS[:2], [0, 1], ("t", 0))
    kl = ro["kl"][0]
    assert float(kl.min()) >= 0 and float(kl.max()) > 1e-3
    want = node_advantages(ro["returns"][0] - 0.5 * kl, "mean", normalize=False)
    assert torch.allclose(ro["advantages"][0], want, atol=1e-6)
    assert float(ro["kl"][1].abs().max()) < 1e-5                          # agent 1 untouched
    rows = None
    tr.args.num_train_epochs = 1
    tr.train()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert all("agent_0/kl" in r and "agent_1/kl" in r for r in rows)


def test_eval_logger_and_aggregator(tmp_path):
    seen = []

    def logger(agent_completions_turns, batch_items, prompts):
        seen.append((agent_completions_turns, batch_items, prompts))
        return [{"len0": len(agent_completions_turns[0][b][0])} for b in range(len(batch_items))]

    def aggregator(metrics, num_turns):
        return {"turn_1/mean_len0": float(np.mean([m["len0"] for m in metrics])), "n": len(metrics)}

    m, tok = make_tiny_model()
    tr = MAGRPOTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, train_dataset=PROMPTS, eval_dataset=PROMPTS,
                       eval_logger=logger, eval_aggregator=aggregator,
                       args=MAGRPOConfig(num_train_epochs=1, max_new_tokens=6, eval_interval=2, eval_num_samples=3,
                                         rollout_batch_size=1, eval_batch_size=2, output_dir=str(tmp_path),
                                         progress_bar=False, save_steps=-1))
    tr.train()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert ["eval/turn_1/reward_mean" in r for r in rows] == [True, False, True, False]   # batches 0 and 2 of the epoch
    assert all(r["eval/n"] == 3 for r in rows if "eval/n" in r)
    comps, items, prompts = seen[0]
    assert len(comps) == 2 and len(comps[0]) == 3 and isinstance(comps[0][0][0], str)   # [agent][item][turn]
    assert [len(s[1]) for s in seen] == [3, 3]          # one call per evaluation with every item (as the library)


def test_seed_determinism_and_batch_size_independence(tmp_path):
    a = make(tmp_path / "a").rollout(PROMPTS, [0, 1, 2, 3], ("train", 0))
    b = make(tmp_path / "b").rollout(PROMPTS, [0, 1, 2, 3], ("train", 0))
    assert a["comps"][0].texts == b["comps"][0].texts and torch.equal(a["rewards"], b["rewards"])
    c = make(tmp_path / "c").rollout(PROMPTS[2:3], [2], ("train", 0))     # the same item alone in its batch
    assert c["comps"][1].texts == a["comps"][1].texts[8:12]
    d = make(tmp_path / "d", seed=1).rollout(PROMPTS, [0, 1, 2, 3], ("train", 0))
    assert d["comps"][0].texts != a["comps"][0].texts


def test_resume_gives_the_same_result(tmp_path):
    full = make(tmp_path / "full", num_train_epochs=2, rollout_buffer_size=3, save_steps=2)
    full.train()
    part = make(tmp_path / "part", num_train_epochs=2, rollout_buffer_size=3, save_steps=2)
    st = part.train(stop_after_batch=5)                                    # mid-epoch, with a partly filled buffer
    assert st["stopped"] and st["global_batch"] == 5
    resumed = make(tmp_path / "part", num_train_epochs=2, rollout_buffer_size=3, save_steps=2)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state["global_batch"] == full.state["global_batch"] == 8
    for x, y in zip(params(full), params(resumed)):
        assert torch.equal(x, y)
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time") and not k.endswith("per_s")}
                          for r in rows]
    assert strip(read_metrics(tmp_path / "full" / "metrics.jsonl")) == \
        strip(read_metrics(tmp_path / "part" / "metrics.jsonl"))


def test_sampling_ahead_within_a_buffer_changes_nothing_but_the_number_of_sampling_loops(tmp_path, monkeypatch):
    """Batches that no update separates are sampled in one loop (same policy, same per-row keys): the run is
    bit-identical to sampling every batch on its own, with fewer generate calls."""
    import comlrl_nb.team as R                  # the team samples for every trainer
    calls = []
    real = R.generate_team
    monkeypatch.setattr(R, "generate_team", lambda *a, **kw: calls.append([len(p) for p in a[2]]) or real(*a, **kw))
    kw = dict(num_train_epochs=2, rollout_buffer_size=3, train_batch_size=2)
    ahead = make(tmp_path / "ahead", **kw)
    ahead.train()
    n_ahead, calls[:] = list(calls), []
    alone = make(tmp_path / "alone", **kw)
    alone._batches_ahead = lambda *a: []                                   # every batch samples on its own
    alone.train()
    assert all(torch.equal(x, y) for x, y in zip(params(ahead), params(alone)))
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time") and not k.endswith("per_s")}
                          for r in rows]
    assert strip(read_metrics(tmp_path / "ahead" / "metrics.jsonl")) == \
        strip(read_metrics(tmp_path / "alone" / "metrics.jsonl"))
    # per epoch of 4 one-item batches with a 3-sample buffer: batches 1-3 in one loop, batch 4 alone (both agents)
    assert n_ahead == [[3, 3], [1, 1]] * 2 and calls == [[1, 1]] * 8


def test_resume_via_environment_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("COMLRL_NB_STOP_AFTER_BATCH", "3")
    st = make(tmp_path, num_train_epochs=1).train()
    assert st["stopped"] and st["global_batch"] == 3
    monkeypatch.delenv("COMLRL_NB_STOP_AFTER_BATCH")
    tr = make(tmp_path, num_train_epochs=1)
    tr.train(resume_from_checkpoint=True)
    assert tr.state["global_batch"] == 4


def test_non_finite_loss_stops_with_a_message(tmp_path):
    tr = make(tmp_path, num_train_epochs=1)
    with torch.no_grad():
        next(tr.agents[1].parameters()).fill_(float("nan"))
    with pytest.raises(FloatingPointError, match="agent 1 optimizer step 1"):
        tr.train()


def test_save_model_roundtrip(tmp_path):
    from comlrl_nb import load_agents
    tr = make(tmp_path / "run", num_train_epochs=1)
    tr.train()
    tr.save_model(tmp_path / "out")
    ms, toks = load_agents(agents=[str(tmp_path / "out" / "agent_0"), str(tmp_path / "out" / "agent_1")])
    for a, b in zip(tr.agents[1].parameters(), ms[1].parameters()):
        assert torch.equal(a, b)


def test_variant_defaults(tmp_path):
    m, tok = make_tiny_model()
    tr = MARLOOTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels)
    assert tr.args.advantage_mode == "rloo" and tr.algo == "marloo"


@pytest.mark.parametrize("kw, msg", [
    (dict(num_agents=3), "2 agents were given but args.num_agents=3"),
    (dict(num_agents=3, args=MAGRPOConfig(num_agents=4)), "num_agents=3 but args.num_agents=4"),
    (dict(args={"num_generations": 4}), "args must be a MAGRPOConfig"),
    (dict(eval_logger=lambda **k: []), "eval_logger and eval_aggregator go together"),
    (dict(reward_func=None), "reward_func is required"),
    (dict(train_dataset=[]), "train_dataset is empty"),
    (dict(train_dataset=[{"question": "x"}]), "train_dataset[0] (row 1 of 1): formatter of agent 1"),
    (dict(train_dataset=["just a string"]), "items must be dicts"),
    (dict(formatters=[str, str, str]), "got 3 formatters for 2 agents"),
])
def test_constructor_errors(kw, msg):
    m, tok = make_tiny_model()
    base = dict(agents=[m, m], tokenizer=tok, reward_func=vowels, train_dataset=PROMPTS)
    base.update(kw)
    with pytest.raises((ValueError, TypeError, KeyError)) as e:
        MAGRPOTrainer(**base)
    assert msg in str(e.value)


def test_multi_turn_needs_a_transition():
    m, tok = make_tiny_model()
    with pytest.raises(ValueError, match="needs external_transition"):
        MAGRPOTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, args=MAGRPOConfig(num_turns=2))


def test_mp_placement_matches_sequential(tmp_path):
    seq = make(tmp_path / "seq", num_train_epochs=1)
    seq.train()
    mp = make(tmp_path / "mp", num_train_epochs=1, parallel_training="mp", agent_devices=["cpu", "cpu"])
    mp.train()
    for x, y in zip(params(seq), params(mp)):
        assert torch.equal(x, y)


def test_mp_reraises_an_agents_error_after_all_finish(tmp_path):
    tr = make(tmp_path, parallel_training="mp", agent_devices="cpu")
    done = []

    def work(i):
        if i == 0:
            raise RuntimeError("agent 0 failed")
        import time
        time.sleep(0.2)
        done.append(i)
        return i

    with pytest.raises(RuntimeError, match="agent 0 failed"):
        tr._map_agents(work)
    assert done == [1]
    assert tr._map_agents(lambda i: i * 10) == [0, 10]


# ---------------------------------------------------------------- multi-turn trees
def test_multi_turn_tree_counts_and_histories(tmp_path):
    seen = []

    def transition(prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent):
        seen.append((prompt, list(agent_completions), prompt_history_per_agent, response_history_per_agent))
        return [f"next {i}" for i in range(num_agents)]

    fmt = [lambda it: "A: " + it["prompt"], lambda it: "B: " + it["prompt"]]
    m, tok = make_tiny_model()
    tr = MAGRPOTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, formatters=fmt, external_transition=transition,
                       args=MAGRPOConfig(num_turns=3, num_generations=2, joint_mode="cross", max_new_tokens=4,
                                         early_termination_threshold=None, output_dir=str(tmp_path),
                                         progress_bar=False))
    ro = tr.rollout(PROMPTS[:1], [0], ("t", 0))
    assert [len(l) for l in ro["levels"]] == [1, 4, 16]                       # J = K^n = 4 branches per node
    assert len(seen) == 4 + 16 and len(ro["samples"][0]) == 21
    prompt, comps, ph, rh = seen[-1]
    assert prompt == "Write a story"                                           # the item's original prompt
    assert ph[0] == ["A: Write a story", "next 0"] and ph[1] == ["B: Write a story", "next 1"]
    assert len(rh[0]) == 2 and rh[0][1] == comps[0]                          # depth-1 branch: two responses so far
    child = ro["levels"][1][0]
    assert child.prompts == ["A: next 0", "B: next 1"]                         # formatter applied to transition output
    # the branch's history is its own: the child's responses are the root completions of joint response (0, 0)
    root = ro["levels"][0][0]
    assert child.response_history == [[root.completions[0][0]], [root.completions[1][0]]]


def test_prompt_passthrough_and_discount(tmp_path):
    m, tok = make_tiny_model()
    tr = MAGRPOTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, formatters=lambda it: "F: " + it["prompt"],
                       external_transition=lambda **kw: ["raw a", "raw b"],
                       args=MAGRPOConfig(num_turns=2, num_generations=2, max_new_tokens=4, discount=0.5,
                                         external_prompt_passthrough=True, early_termination_threshold=None,
                                         output_dir=str(tmp_path), progress_bar=False))
    ro = tr.rollout(PROMPTS[:1], [0], ("t", 0))
    root = ro["levels"][0][0]
    assert root.children[1].prompts == ["raw a", "raw b"]
    want = root.rewards + 0.5 * torch.stack([c.rewards.mean() for c in root.children])
    assert torch.allclose(root.returns, want)


def test_transition_errors_name_the_transition(tmp_path):
    def bad_transition(**kw):
        return "one prompt"

    m, tok = make_tiny_model()
    tr = MAGRPOTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, external_transition=bad_transition,
                       train_dataset=PROMPTS,
                       args=MAGRPOConfig(num_turns=2, max_new_tokens=4, early_termination_threshold=None,
                                         output_dir=str(tmp_path), progress_bar=False))
    with pytest.raises(ValueError,
                       match="external transition 'test_transition_errors_name_the_transition.<locals>.bad_transition' "
                             "returned str"):
        tr.train()


def test_early_termination_default_stops_every_root(tmp_path):
    calls = []
    m, tok = make_tiny_model()
    tr = MAGRPOTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels,
                       external_transition=lambda **kw: calls.append(1) or ["a", "b"],
                       args=MAGRPOConfig(num_turns=2, max_new_tokens=4, output_dir=str(tmp_path), progress_bar=False))
    ro = tr.rollout(PROMPTS[:2], [0, 1], ("t", 0))                            # threshold -0.2, rewards >= 0
    assert len(ro["levels"]) == 1 and not calls and all(nd.terminated for nd in ro["levels"][0])


def test_mp_runs_agents_concurrently(tmp_path):
    "Under mp, two agents' work overlaps: each waits at a barrier that only opens when both are inside at once."
    import threading
    tr = make(tmp_path, parallel_training="mp", agent_devices=["cpu", "cpu"])
    barrier, order = threading.Barrier(2, timeout=10), []

    def slow(i):
        barrier.wait()                       # would time out (BrokenBarrierError) if agents ran one after another
        order.append(i)
        return f"agent {i}"

    assert tr._map_agents(slow) == ["agent 0", "agent 1"]          # results in agent order whoever finished first
    assert sorted(order) == [0, 1]
