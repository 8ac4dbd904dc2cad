"""Iterative preference training on the tiny model: configs, comparisons and records, every comparator policy,
centralized parsing, MADPOIter and MARLHFIter rounds, replay directories, API secrets, and a real kill-and-resume."""
import json
import logging
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from comlrl_nb.comparators import CentralizedParseError, select_comparisons
from comlrl_nb.engine import wait_for_plots
from comlrl_nb.engine import CheckpointManager, read_metrics
from comlrl_nb.models import make_tiny_model
from comlrl_nb.trainers.iterative import MADPOIterConfig, MADPOIterTrainer, MARLHFIterConfig, MARLHFIterTrainer
from comlrl_nb.trainers.madpo import MADPOConfig

ITEMS = [{"prompt": p} for p in ["Write a story", "Explain physics", "Create a recipe", "Describe a city"]]
BASE = dict(preference_num_candidates=4, preference_pairs_per_sample=4, max_new_tokens=6, temperature=1.0, top_p=1.0,
            top_k=None, agent_learning_rate=3e-3, eval_interval=0, logging_steps=1000, progress_bar=False)


def vowels(a, b):
    f = lambda s: sum(ch in "aeiou " for ch in s) / max(len(s), 1)
    return [0.5 * f(x) + 0.5 * f(y) for x, y in zip(a, b)]


def madpo(tmp, items=ITEMS, trainer_kw=None, **kw):
    m, tok = make_tiny_model(seed=0)
    cfg = MADPOIterConfig(**{**BASE, "dpo_beta": 0.5, "output_dir": str(tmp), **kw})
    return MADPOIterTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, args=cfg, train_dataset=items,
                            **(trainer_kw or {}))


def marlhf(tmp, items=ITEMS, trainer_kw=None, **kw):
    m, tok = make_tiny_model(seed=0)
    cfg = MARLHFIterConfig(**{**BASE, "num_generations": 4, "rollout_batch_size": 2, "num_train_epochs": 1,
                              "reward_learning_rate": 1e-3, "reward_train_batch_size": 4, "reward_num_train_epochs": 1,
                              "output_dir": str(tmp), **kw})
    return MARLHFIterTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, args=cfg, train_dataset=items,
                             reward_model=m, **(trainer_kw or {}))


def params(models):
    return [p.detach().clone() for m in models for p in m.parameters()]


def replay_files(d):
    return {p.name: p.read_bytes() for p in sorted((Path(d) / "preference_replay").glob("iteration_*.json"))}


def scripted(agent_idx, prompts, k, items, item_ids, round_key):
    "A deterministic comparator: candidate j of a prompt is j letters 'a' (more vowels for larger j)."
    return [f"{'a' * (j + 1)} {p[:3]}" for p in prompts for j in range(k)]


# ------------------------------------------------------------------ configs
@pytest.mark.parametrize("kw, msg", [
    (dict(num_iterations=0), "MADPOIterConfig.num_iterations=0 is invalid: must be >= 1"),
    (dict(comparator_policy="self"),
     "comparator_policy='self' is invalid: use one of current, current_copy, model, history, api"),
    (dict(comparator_num_candidates=0), "comparator_num_candidates=0 is invalid: must be >= 1"),
    (dict(comparator_generation_mode="joint"),
     "comparator_generation_mode='joint' is invalid: use one of decentralized, centralized"),
    (dict(comparator_centralized_agent_index=2), "comparator_centralized_agent_index=2 is invalid: must be <= 1"),
    (dict(comparator_history_k=-1), "comparator_history_k=-1 is invalid: must be >= 0"),
    (dict(comparator_max_new_tokens=0), "comparator_max_new_tokens=0 is invalid: must be >= 1"),
    (dict(comparator_devices="tpu"), "comparator_devices='tpu' is invalid"),
    (dict(comparator_policy="model"), "needs exactly one of comparator_model_name"),
    (dict(comparator_policy="model", comparator_model_name="x", comparator_agents=["a", "b"]), ", not both"),
    (dict(comparator_policy="model", comparator_agents="abc"),
     "comparator_agents must be a list with one model per agent (2), got str"),
    (dict(comparator_agents=["a", "b"]), "only used with comparator_policy='model'"),
    (dict(comparator_policy="api"), "comparator_api_url=None is invalid"),
    (dict(comparator_policy="api", comparator_api_url="ftp://h/x"), "expected an http:// or https:// URL"),
    (dict(comparator_policy="api", comparator_api_url="http://h/x", comparator_api_format="grpc"),
     "use one of generic, openai, anthropic, openai_responses"),
    (dict(preference_scoring_reward="oracle"),
     "preference_scoring_reward='oracle' is invalid: use one of task, reward_model"),
    (dict(preference_scoring_reward="reward_model"), "only MARLHFIterConfig has"),
    (dict(pair_selection="best"), "use one of reward_gap, all, random, comparator_reward"),
    (dict(pair_selection="all"), "preference_pairs_per_sample must be None (got 4)"),
    (dict(preference_replay_mode="lambda_decay"), "MADPOIterConfig.preference_replay_lambda=None is invalid"),
    (dict(preference_replay_k=3), "preference_replay_k=3 does not fit mode 'current'"),
    (dict(policy_checkpoint_dir=5), "policy_checkpoint_dir=5 is invalid: use a directory path or None"),
    (dict(num_turns=2), "num_turns=2 is invalid"),
    (dict(joint_mode="cross"), "use joint_mode='aligned'"),
])
def test_config_messages(kw, msg):
    with pytest.raises(ValueError) as e:
        MADPOIterConfig(**kw)
    assert msg in str(e.value), str(e.value)


def test_config_defaults_and_base_configs_keep_their_choices():
    c, r = MADPOIterConfig(), MARLHFIterConfig()
    assert (c.num_iterations, c.preference_num_candidates, c.preference_pairs_per_sample, c.pair_selection,
            c.num_train_epochs, c.comparator_num_candidates, c.preference_scoring_reward, c.comparator_generation_mode,
            c.comparator_policy, c.comparator_history_k, c.preference_replay_mode) == \
                (6, 20, 4, "comparator_reward", 1, None, "task", "decentralized", "current", 1, "current")
    assert (r.num_train_epochs, r.reward_num_train_epochs, r.num_iterations,
            r.pair_selection) == (2, 2, 6, "comparator_reward")
    assert MARLHFIterConfig(preference_scoring_reward="reward_model").preference_scoring_reward == "reward_model"
    with pytest.raises(ValueError, match="use one of reward_gap, all, random"):
        MADPOConfig(pair_selection="comparator_reward")
    assert MADPOIterConfig(comparator_policy="api", comparator_api_url="http://h/x",
                           comparator_api_format="codex").comparator_api_format \
        == "openai_responses"


def test_trainer_rejects_a_base_config(tmp_path):
    m, tok = make_tiny_model()
    with pytest.raises(TypeError, match="args must be a MADPOIterConfig, got MADPOConfig"):
        MADPOIterTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, args=MADPOConfig(output_dir=str(tmp_path)))
    with pytest.raises(TypeError, match="args must be a MARLHFIterConfig"):
        MARLHFIterTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels,
                          args=MADPOIterConfig(output_dir=str(tmp_path)))


# ------------------------------------------------------------------ comparisons and records
def test_comparator_reward_selection_does_not_assume_the_comparator_wins():
    comps = [(0, 0.2, 0.6), (1, 0.5, 0.5), (2, 0.7, 0.1), (3, 0.9, 0.8), (4, 0.3, 0.8)]
    kept = select_comparisons(comps, "comparator_reward", None)
    assert [k for k, *_ in kept] == [4, 3, 0, 2]                           # comparator score desc; then the larger gap
    assert any(t > c for _, t, c in kept) and any(c > t for _, t, c in kept)
    assert [k for k, *_ in select_comparisons(comps, "comparator_reward", 2)] == [4, 3]
    assert select_comparisons([(0, 1.0, 1.0), (1, 2.0, 2.0)], "reward_gap", None) == []


def test_records_carry_raw_and_processed_rewards(tmp_path):
    tr = madpo(tmp_path, items=ITEMS[:3], trainer_kw={"reward_processor": lambda r: 3 * r - 1}, pair_selection="all",
               preference_pairs_per_sample=None)
    recs, st = tr._collect_round(1)
    assert st["comparisons"] == 12 and len(recs) == 12 - st["ties"] and st["items"] == 3
    for r in recs:
        assert list(r)[:9] == ["prompts", "winner_completions", "loser_completions", "winner_reward", "loser_reward",
                               "candidate_reward_mean", "raw_rewards", "target_raw_reward", "comparator_raw_reward"]
        assert r["winner_reward"] > r["loser_reward"]
        assert r["winner_reward"] == pytest.approx(3 * r["raw_rewards"][0] - 1) \
            and r["loser_reward"] == pytest.approx(3 * r["raw_rewards"][1] - 1)
        w_raw, l_raw = (r["target_raw_reward"],
                        r["comparator_raw_reward"])[:: 1 if r["winner_side"] == "agents" else -1]
        assert r["raw_rewards"] == [w_raw, l_raw]
        assert vowels(*[[c] for c in r["winner_completions"]])[0] == pytest.approx(w_raw)
        assert r["iteration"] == 1 and 0 <= r["candidate_index"] < 4 and r["comparator_policy"] == "current"
    item0 = [r for r in recs if r["prompts"][0] == "Write a story"]
    both = {r["candidate_index"]: r for r in item0}
    sides = [3 * x - 1 for r in both.values() for x in (r["target_raw_reward"], r["comparator_raw_reward"])]
    if len(both) == 4:  # no tie on this item: the mean over both sides
        assert item0[0]["candidate_reward_mean"] == pytest.approx(sum(sides) / len(sides))
    assert {r["winner_side"] for r in recs} == {"agents", "comparator"}
    assert st["comparator_wins"] == sum(r["winner_side"] == "comparator" for r in recs)


def test_current_comparator_uses_live_weights_with_another_stream(tmp_path):
    tr = madpo(tmp_path)
    gen = tr.comparator.begin_round(1)
    assert all(g is a for g, a in zip(gen.models, tr.agents))              # same weights (the same objects)
    prompts = [tr._prompt(ITEMS[0], 0)]
    own = tr._agent_candidates(1, [prompts, prompts], [0], 4)[0].texts
    theirs, _ = gen(0, prompts, 4, ITEMS[:1], [0], 1)
    assert all(a != b for a, b in zip(own, theirs))                        # different samples


def test_current_copy_equals_current_and_frees_the_copies(tmp_path):
    a = madpo(tmp_path / "a", pair_selection="all", preference_pairs_per_sample=None)
    b = madpo(tmp_path / "b", comparator_policy="current_copy", comparator_devices="cpu", pair_selection="all",
              preference_pairs_per_sample=None)
    ra, rb = a._collect_round(1)[0], b._collect_round(1)[0]
    strip = lambda rs: [{k: v for k, v in r.items() if k != "comparator_policy"} for r in rs]
    assert strip(ra) == strip(rb) and b.comparator._copies is None
    gen = b.comparator.begin_round(2)
    assert all(g is not x and torch.equal(next(g.parameters()), next(x.parameters()))
               for g, x in zip(gen.models, b.agents))
    b.comparator.end_round()
    assert b.comparator._copies is None


@pytest.mark.parametrize("K, Kc", [(4, 2), (3, 6)])
def test_index_aligned_comparisons_with_different_counts(tmp_path, K, Kc):
    tr = madpo(tmp_path, preference_num_candidates=K, comparator_num_candidates=Kc, pair_selection="all",
               preference_pairs_per_sample=None, trainer_kw={"comparator_generator": scripted})
    recs, st = tr._collect_round(1)
    assert st["comparisons"] == len(ITEMS) * min(K, Kc)
    assert {r["candidate_index"] for r in recs} <= set(range(min(K, Kc)))
    for r in recs:  # the comparator's side is candidate k of the script
        comp = r["winner_completions"] if r["winner_side"] == "comparator" else r["loser_completions"]
        assert comp[0] == "a" * (r["candidate_index"] + 1) + " " + r["prompts"][0][:3]


def test_centralized_parsing_drops_and_counts(tmp_path):
    seen = []

    def central(agent_idx, prompts, k, items, item_ids, round_key):
        seen.append((agent_idx, prompts[0]))
        return [f"<agent_0>aaa {j}</agent_0>" + ("" if j == 1 else f"<agent_1>ee {j}</agent_1>") for _ in prompts
                for j in range(k)]

    tr = madpo(tmp_path, comparator_generation_mode="centralized", comparator_centralized_agent_index=1,
               num_iterations=1, pair_selection="all", preference_pairs_per_sample=None,
               trainer_kw={"comparator_generator": central})
    out = tr.train()
    row = out["rounds"][-1]
    assert row["round/unparsed_candidates"] == len(ITEMS) and row["round/comparisons"] == 3 * len(ITEMS)
    assert seen[0][0] == 1 and "Agent 0 task:\nWrite a story" in seen[0][1] and "<agent_1>" in seen[0][1]
    pairs = json.loads((tmp_path / "preference_replay" / "iteration_0001.json").read_text())["pairs"]
    assert all(p["candidate_index"] != 1 for p in pairs)
    comp = [p["winner_completions"] if p["winner_side"] == "comparator" else p["loser_completions"] for p in pairs]
    assert all(c == [f"aaa {p['candidate_index']}", f"ee {p['candidate_index']}"] for c, p in zip(comp, pairs))


def test_centralized_custom_builder_and_parser(tmp_path):
    tr = madpo(tmp_path, comparator_generation_mode="centralized", pair_selection="all",
               preference_pairs_per_sample=None,
               trainer_kw={"comparator_generator": lambda i, ps, k, *a: [f"{p}||x{j}||y{j}" for p in ps
                                                                         for j in range(k)],
                           "comparator_prompt_builder": lambda roles, item: "#".join(roles),
                           "comparator_parser": lambda text, n: text.split("||")[1:]})
    recs, st = tr._collect_round(1)
    assert st["unparsed_candidates"] == 0 and st["comparisons"] == 16
    r = recs[0]
    assert (r["winner_completions"] if r["winner_side"] == "comparator" else r["loser_completions"]) == \
        [f"x{r['candidate_index']}", f"y{r['candidate_index']}"]


def test_centralized_nothing_parses_is_a_clear_error(tmp_path):
    m, tok = make_tiny_model(seed=0)                                       # a random tiny model never writes tags
    tr = MADPOIterTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, train_dataset=ITEMS[:2],
                          args=MADPOIterConfig(**{**BASE, "output_dir": str(tmp_path),
                                                  "comparator_generation_mode": "centralized",
                                                  "comparator_max_new_tokens": 8}))
    with pytest.raises(CentralizedParseError) as e:
        tr.train()
    msg = str(e.value)
    assert "none of the 8 centralized comparator responses could be parsed into 2 role responses" in msg
    assert "<agent_0>\n(agent 0's response)\n</agent_0>\n<agent_1>\n(agent 1's response)\n</agent_1>" in msg
    assert not (tmp_path / "preference_replay" / "iteration_0001.json").exists()


def test_model_comparator_from_objects_and_from_a_local_path(tmp_path):
    other, tok = make_tiny_model(seed=5)
    other.save_pretrained(tmp_path / "cmp")
    tok.save_pretrained(tmp_path / "cmp")
    by_path = madpo(tmp_path / "a", comparator_policy="model", comparator_model_name=str(tmp_path / "cmp"),
                    pair_selection="all", preference_pairs_per_sample=None)
    o2, _ = make_tiny_model(seed=5, tokenizer=tok)
    by_obj = madpo(tmp_path / "b", comparator_policy="model", comparator_agents=[other, o2], pair_selection="all",
                   preference_pairs_per_sample=None)
    assert by_obj.comparator.models[0] is other and by_obj.comparator.toks[0] is by_obj.tokenizers[0]
    assert all(not p.requires_grad for p in by_obj.comparator.models[0].parameters())
    ra, rb = by_path._collect_round(1)[0], by_obj._collect_round(1)[0]
    assert ra == rb and ra                                                 # the same weights, whether loaded or given
    m, tok2 = make_tiny_model(seed=0)
    tr = MADPOIterTrainer(agents=[m, m], tokenizer=tok2, reward_func=vowels, train_dataset=ITEMS,
                          args=MADPOIterConfig(**{**BASE, "output_dir": str(tmp_path / "d"),
                                                  "comparator_policy": "model", "comparator_model_name": m,
                                                  "num_iterations": 1}))
    assert tr.comparator.models[0] is not m                                # the agent object itself is copied
    before = params(tr.comparator.models)
    tr.train()
    assert all(torch.equal(a, b) for a, b in zip(before, params(tr.comparator.models)))   # training never moves it
    assert not all(torch.equal(a, b) for a, b in zip(before, params([tr.agents[0]])))


@pytest.mark.parametrize("k, expect", [(1, [0, 0, 1]), (0, [0, 1, 2]), (4, [0, 0, 0])])
def test_history_comparator_uses_snapshot_nu_minus_1_minus_k(tmp_path, k, expect, monkeypatch):
    tr = madpo(tmp_path, comparator_policy="history", comparator_history_k=k, num_iterations=3,
               preference_num_candidates=2, preference_pairs_per_sample=2)
    used, checked = [], []
    orig = tr.comparator.begin_round

    def spy(nu):
        g = orig(nu)
        used.append(tr.comparator._loaded)
        snap = torch.load(tr.comparator.snapshots.path(tr.comparator._loaded), weights_only=True)
        checked.append(all(torch.equal(v, g.models[0].state_dict()[n]) for n, v in snap[0].items()))
        return g
    monkeypatch.setattr(tr.comparator, "begin_round", spy)
    tr.train()
    assert used == expect and all(checked)
    assert sorted(p.name for p in (tmp_path / "policy_checkpoints").iterdir()) == \
        [f"policy_000{j}.pt" for j in range(4)]
    s0 = torch.load(tmp_path / "policy_checkpoints" / "policy_0000.pt", weights_only=True)
    fresh, _ = make_tiny_model(seed=0)
    assert all(torch.equal(v, fresh.state_dict()[n]) for n, v in s0[0].items())       # S_0 is the initial policy


def test_policy_checkpoint_dir_option(tmp_path):
    tr = madpo(tmp_path / "out", comparator_policy="history", num_iterations=1,
               policy_checkpoint_dir=str(tmp_path / "snaps"), preference_num_candidates=2)
    tr.train()
    assert sorted(p.name for p in (tmp_path / "snaps").iterdir()) == ["policy_0000.pt", "policy_0001.pt"]
    assert not (tmp_path / "out" / "policy_checkpoints").exists()


# ------------------------------------------------------------------ MADPOIter / MARLHFIter runs
def test_madpo_iter_rounds(tmp_path):
    tr = madpo(tmp_path, num_iterations=2, num_train_epochs=2, preference_replay_mode="all_history", eval_interval=1,
               trainer_kw={"eval_dataset": ITEMS[:2]}, eval_num_samples=2, eval_batch_size=2)
    before = params(tr.agents)
    out = tr.train()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    rounds = [r for r in rows if r.get("phase") == "round"]
    assert [r["iteration"] for r in rounds] == [0, 1, 2] and "eval/turn_1/reward_mean" in rounds[0]
    for r in rounds[1:]:
        nu, m = r["iteration"], r["round/train_pairs"]
        train = [x for x in rows if x.get("phase") == "train" and x["iteration"] == nu]
        assert len(train) == 2 * -(-m // 2)  # num_train_epochs x ceil(pairs / train_batch_size)
        assert {x["epoch"] for x in train} == {0, 1} and "dpo/loss" in train[0] and "eval/turn_1/reward_mean" in r
        data = json.loads((tmp_path / "preference_replay" / f"iteration_{nu:04d}.json").read_text())
        assert data["iteration"] == nu and data["num_pairs"] == r["round/pairs"] == len(data["pairs"])
        assert 0 <= r["round/comparator_win_rate"] <= 1
    assert out["global_batch"] == len([x for x in rows if x.get("phase") == "train"])
    assert set(rounds[2]["round/train_pairs_from"]) <= {"1", "2"}
    wait_for_plots()                                   # the run plot is drawn in the background (issue T)
    assert (tmp_path / "rounds.png").exists()
    assert [p.name for p in CheckpointManager(tmp_path / "checkpoints").complete()] == \
        ["checkpoint-0000001", "checkpoint-0000002"]
    assert not all(torch.equal(a, b) for a, b in zip(before, params(tr.agents)))


def test_a_round_without_pairs_leaves_the_agents(tmp_path):
    tr = madpo(tmp_path, num_iterations=1, trainer_kw={"oracle": lambda a, b: [0.5] * len(a)})
    before = params(tr.agents)
    out = tr.train()
    assert out["rounds"][-1]["round/pairs"] == 0 and out["rounds"][-1]["round/ties"] == 16
    assert json.loads((tmp_path / "preference_replay" / "iteration_0001.json").read_text()) == \
        {"iteration": 1, "num_pairs": 0, "pairs": []}
    assert all(torch.equal(a, b) for a, b in zip(before, params(tr.agents)))


def test_marlhf_iter_fresh_reward_model_scoring_and_resume(tmp_path, monkeypatch):
    full = marlhf(tmp_path / "full", num_iterations=2, preference_scoring_reward="reward_model")
    init = {k: v.clone() for k, v in full.reward_model.state_dict().items()}
    starts, orig_fit = [], full.reward_model.fit

    def spy(records, **kw):
        starts.append(all(torch.equal(v, init[k]) for k, v in full.reward_model.state_dict().items()))
        return orig_fit(records, **kw)
    monkeypatch.setattr(full.reward_model, "fit", spy)
    out = full.train()
    assert starts == [True, True]                                          # each round's reward model starts fresh...
    # ...though fitting moves it
    assert not all(torch.equal(v, init[k]) for k, v in full.reward_model.state_dict().items())
    rows = out["rounds"]
    assert [r["iteration"] for r in rows] == [1, 2] and all(r["policy/batches"] == 2 for r in rows)
    assert all(0 <= r["reward_model/running_accuracy"] <= 1 and "reward_model/train_accuracy" not in r for r in rows)
    for nu in (1, 2):
        assert len(read_metrics(tmp_path / "full" / "policy" / f"iteration_{nu:04d}" / "metrics.jsonl")) == 2
        assert (tmp_path / "full" / "reward_model" / f"iteration_{nu:04d}" / "metrics.jsonl").exists()
    assert full.policy_trainer.state["optimizer_steps"] == [4, 4]  # 2 per round; the backend's optimizers persist:
    assert int(next(iter(full.policy_trainer.optimizers[0].state.values()))["step"]) == 4
    # round 1 is scored by the task reward, round 2 by the reward
    # model fitted in round 1 (kept in the round-1 checkpoint)
    r1 = json.loads((tmp_path / "full" / "preference_replay" / "iteration_0001.json").read_text())["pairs"]
    r2 = json.loads((tmp_path / "full" / "preference_replay" / "iteration_0002.json").read_text())["pairs"]
    assert all(p["winner_reward"] == pytest.approx(vowels(*[[c] for c in p["winner_completions"]])[0]) for p in r1)
    _, ck = CheckpointManager(tmp_path / "full" / "checkpoints").load(tmp_path / "full" / "checkpoints"
                                                                      / "checkpoint-0000001")
    rm = full.reward_model
    rm.load_state_dict(ck["reward_model"])
    w = rm.score([[p["prompts"][i] for p in r2] for i in range(2)],
                 [[p["winner_completions"][i] for p in r2] for i in range(2)])
    assert w == pytest.approx([p["winner_reward"] for p in r2], abs=1e-5)
    # stop after round 1, resume in a new trainer: the same files and weights as the uninterrupted run
    part = marlhf(tmp_path / "part", num_iterations=2, preference_scoring_reward="reward_model")
    assert part.train(stop_after_round=1)["stopped"]
    again = marlhf(tmp_path / "part", num_iterations=2, preference_scoring_reward="reward_model")
    again.train(resume_from_checkpoint=True)
    assert replay_files(tmp_path / "full") == replay_files(tmp_path / "part")
    assert all(torch.equal(a, b) for a, b in zip(params(full.agents), params(again.agents)))


def test_replay_dir_of_an_earlier_run_is_not_imported(tmp_path, caplog):
    shared = tmp_path / "replay"
    first = madpo(tmp_path / "a", num_iterations=2, preference_replay_dir=str(shared), preference_num_candidates=2)
    first.train()
    old2 = (shared / "iteration_0002.json").read_bytes()
    second = madpo(tmp_path / "b", num_iterations=1, preference_replay_dir=str(shared),
                   preference_replay_mode="all_history", preference_replay_sample_size=50, seed=3)
    with caplog.at_level(logging.WARNING, logger="comlrl_nb"):
        out = second.train()
    assert "already holds 2 replay files from an earlier run: they are not imported" in caplog.text
    assert out["rounds"][-1]["round/train_pairs_from"] == {"1": 50}
    assert (shared / "iteration_0002.json").read_bytes() == old2           # untouched, and never read
    new1 = json.loads((shared / "iteration_0001.json").read_text())["pairs"]
    assert new1 == second.replay.state_dict()["data"][1]
    assert not (tmp_path / "b" / "preference_replay").exists()


# ------------------------------------------------------------------ API comparator
class FakeClient:
    def __init__(self):
        self.calls = []

    def generate(self, prompt, n, agent_idx=0, batch_item=None, max_new_tokens=None, temperature=None, top_p=None,
                 top_k=None):
        self.calls.append({"prompt": prompt, "n": n, "agent_idx": agent_idx, "item": batch_item,
                           "max_new_tokens": max_new_tokens})
        return [f"api {agent_idx} {j} aeiou" for j in range(n)]


def test_api_comparator_through_an_injected_client(tmp_path):
    fake = FakeClient()
    tr = madpo(tmp_path, comparator_policy="api", comparator_api_url="http://127.0.0.1:9/never",
               comparator_num_candidates=3, num_iterations=1, pair_selection="all", preference_pairs_per_sample=None,
               trainer_kw={"comparator_client": fake})
    tr.train()
    assert len(fake.calls) == 2 * len(ITEMS)                               # one request per agent and item
    assert {c["n"] for c in fake.calls} == {3} and {c["agent_idx"] for c in fake.calls} == {0, 1}
    assert fake.calls[0]["item"] == ITEMS[0] and fake.calls[0]["prompt"] == "Write a story" \
        and fake.calls[0]["max_new_tokens"] == 6
    pairs = json.loads((tmp_path / "preference_replay" / "iteration_0001.json").read_text())["pairs"]
    assert pairs and all((p["winner_completions"] if p["winner_side"] == "comparator" else p["loser_completions"])
                         == [f"api 0 {p['candidate_index']} aeiou", f"api 1 {p['candidate_index']} aeiou"]
                         for p in pairs)


SECRET = "sk-FAKE-comlrl-0123456789abcdef"


def _all_bytes(d):
    return [(p, p.read_bytes()) for p in Path(d).rglob("*") if p.is_file()]


def test_api_key_never_leaks(tmp_path, caplog, monkeypatch):
    from comlrl_nb.api import MockAPIServer
    monkeypatch.setenv("COMLRL_TEST_FAKE_KEY", SECRET)
    with MockAPIServer() as srv, caplog.at_level(logging.DEBUG, logger="comlrl_nb"):
        for src in ({"comparator_api_key": SECRET}, {"comparator_api_key_env": "COMLRL_TEST_FAKE_KEY"}):
            out_dir = tmp_path / ("cfg" if "comparator_api_key" in src else "env")
            tr = madpo(out_dir, comparator_policy="api", comparator_api_url=srv.url("/generic"), num_iterations=2,
                       comparator_api_max_retries=0, preference_num_candidates=2, **src)
            tr.train()
            assert srv.requests[-1]["headers"]["authorization"] == f"Bearer {SECRET}"   # it was sent...
            assert SECRET not in repr(tr.args) and SECRET not in repr(tr.comparator.client)
            for p, data in _all_bytes(out_dir):                              # ...and written nowhere
                assert SECRET.encode() not in data, p
            pairs = json.loads((out_dir / "preference_replay" / "iteration_0001.json").read_text())["pairs"]
            # the server's text
            assert any(": Write a story" in " ".join(p["winner_completions"] + p["loser_completions"]) for p in pairs)
            ck = torch.load(CheckpointManager(out_dir / "checkpoints").latest() / "state.pt", weights_only=False)
            assert ck["config"]["comparator_api_key"] in (None, "***")
        # failures: an authentication error and a server that keeps failing; neither message shows the key
        for status, times in ((401, 1), (503, 5)):
            srv.script(status, {"error": f"bad key {SECRET}"}, times=times)
            tr = madpo(tmp_path / f"fail{status}", comparator_policy="api", comparator_api_url=srv.url("/generic"),
                       comparator_api_key=SECRET, comparator_api_max_retries=1, comparator_api_backoff=0.0,
                       num_iterations=1)
            with pytest.raises(OSError) as e:
                tr.train()
            assert SECRET not in str(e.value) and SECRET not in repr(e.value) and f"HTTP {status}" in str(e.value)
            for p, data in _all_bytes(tmp_path / f"fail{status}"):
                assert SECRET.encode() not in data, p
    assert caplog.records and SECRET not in caplog.text


# ------------------------------------------------------------------ SIGKILL in the middle of round 3, then resume
SCRIPT = textwrap.dedent('''
    import sys, time, torch
    torch.set_num_threads(1)
    from pathlib import Path
    from comlrl_nb.models import make_tiny_model
    from comlrl_nb.trainers.iterative import MADPOIterConfig, MADPOIterTrainer
    out, mode = sys.argv[1], sys.argv[2]
    def vowels(a, b):
        f = lambda s: sum(ch in "aeiou " for ch in s) / max(len(s), 1)
        return [0.5 * f(x) + 0.5 * f(y) for x, y in zip(a, b)]
    items = [{"prompt": p} for p in ["Write a story", "Explain physics", "Create a recipe", "Describe a city"]]
    if mode == "slow":                       # pause in round 3, after its first update, and say so
        orig = MADPOIterTrainer._update
        def slow(self, idx):
            res = orig(self, idx)
            if self.state["iteration"] == 2:
                Path(out, "IN_ROUND_3").touch(); time.sleep(600)
            return res
        MADPOIterTrainer._update = slow
    m, tok = make_tiny_model(seed=0)
    tr = MADPOIterTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, train_dataset=items,
                          args=MADPOIterConfig(num_iterations=3, comparator_policy="history",
                                               preference_replay_mode="lambda_decay", preference_replay_lambda=0.5,
                                               preference_num_candidates=4, max_new_tokens=6, temperature=1.0,
                                               top_p=1.0, top_k=None, agent_learning_rate=3e-3, dpo_beta=0.5,
                                               num_train_epochs=2, progress_bar=False, output_dir=out))
    tr.train(resume_from_checkpoint=True if mode == "resume" else None)
    torch.save([a.state_dict() for a in tr.agents], Path(out) / "final.pt")
    print("DONE", tr.state["iteration"], tr.state["global_batch"])
''')


def test_sigkill_in_round_3_then_resume_matches_an_uninterrupted_run(tmp_path):
    script = tmp_path / "iter_script.py"
    script.write_text(SCRIPT)
    ref, killed = tmp_path / "ref", tmp_path / "killed"
    run = lambda out, mode: subprocess.Popen([sys.executable, str(script), str(out), mode], stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE, text=True)
    p_ref, p_kill = run(ref, "plain"), run(killed, "slow")
    deadline = time.time() + 180
    while time.time() < deadline and not (killed / "IN_ROUND_3").exists() and p_kill.poll() is None:
        time.sleep(0.05)
    assert (killed / "IN_ROUND_3").exists(), p_kill.communicate()[1][-2000:] if p_kill.poll() is not None else "timeout"
    p_kill.send_signal(signal.SIGKILL)
    p_kill.wait()
    assert CheckpointManager(killed / "checkpoints").latest().name == "checkpoint-0000002"
    assert (killed / "preference_replay" / "iteration_0003.json").exists()          # round 3 had stored its pairs
    assert not (killed / "policy_checkpoints" / "policy_0003.pt").exists()
    r = subprocess.run([sys.executable, str(script), str(killed), "resume"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out_ref, err_ref = p_ref.communicate(timeout=300)
    assert p_ref.returncode == 0, err_ref[-2000:]
    assert out_ref.split()[-3:] == r.stdout.split()[-3:] and r.stdout.split()[-2] == "3"
    assert replay_files(ref) == replay_files(killed) and len(replay_files(ref)) == 3     # byte-identical JSON
    a, b = torch.load(ref / "final.pt"), torch.load(killed / "final.pt")
    assert all(torch.equal(a[i][k], b[i][k]) for i in range(2) for k in a[i])
    rows = lambda d: [(x.get("phase"), x.get("iteration"), x.get("batch"), x.get("dpo/loss"))
                      for x in read_metrics(d / "metrics.jsonl")]
    assert rows(ref) == rows(killed)                                       # nothing lost, nothing twice


def test_marlhf_iter_actor_critic_backend_resumes_with_its_critic(tmp_path):
    def make(d):
        critic, _ = make_tiny_model(seed=5)
        return marlhf(d, num_iterations=2, rl_algorithm="maac", value_loss_coef=0.3,
                      trainer_kw={"backend_kwargs": {"critic_model": critic}})
    full = make(tmp_path / "full")
    out = full.train()
    assert full.policy_trainer.algo == "maac" and all(r["policy/batches"] == 2 for r in out["rounds"])
    part = make(tmp_path / "part")
    part.train(stop_after_round=1)
    again = make(tmp_path / "part")
    again.train(resume_from_checkpoint=True)
    crit = lambda t: [p for c in t.policy_trainer.critics for p in c.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(params(full.agents) + crit(full), params(again.agents) + crit(again)))
    assert replay_files(tmp_path / "full") == replay_files(tmp_path / "part")


def test_stop_after_round_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("COMLRL_NB_STOP_AFTER_ROUND", "1")
    out = madpo(tmp_path, num_iterations=3, preference_num_candidates=2, save_steps=-1).train()
    assert out["stopped"] and out["iteration"] == 1 and [r["iteration"] for r in out["rounds"]] == [1]
    # even with save_steps=-1
    assert [p.name for p in CheckpointManager(tmp_path / "checkpoints").complete()] == ["checkpoint-0000001"]
    monkeypatch.delenv("COMLRL_NB_STOP_AFTER_ROUND")
    back = madpo(tmp_path, num_iterations=3, preference_num_candidates=2,
                 save_steps=-1).train(resume_from_checkpoint=True)
    assert not back["stopped"] and back["iteration"] == 3 and [r["iteration"] for r in back["rounds"]] == [1, 2, 3]
    assert sorted(replay_files(tmp_path)) == [f"iteration_000{i}.json" for i in (1, 2, 3)]
