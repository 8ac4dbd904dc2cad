"""Centralized collaboration in iterative MADPO (one actor writes every role, the comparator writes joint text from the
same prompt), the centralized comparator adapter argument (`centralized_comparator_adapter=`) and its validation."""
import json
from pathlib import Path

import pytest
import torch

from comlrl_nb.models import make_tiny_model
from comlrl_nb.porting import CentralizedComparatorParseError, TaggedCentralizedComparatorAdapter
from comlrl_nb.trainers.iterative import MADPOIterConfig, MADPOIterTrainer
from comlrl_nb.trainers.madpo import MADPOConfig, MADPOTrainer, tokenize_centralized

torch.set_num_threads(1)
ITEMS = [{"prompt": p, "id": i} for i, p in enumerate(["Write a story", "Explain physics", "Create a recipe"])]
BASE = dict(preference_num_candidates=4, preference_pairs_per_sample=4, max_new_tokens=8, temperature=1.0, top_p=1.0,
            top_k=None, agent_learning_rate=3e-3, dpo_beta=0.5, eval_interval=0, logging_steps=1000, progress_bar=False,
            collaboration_mode="centralized")


def vowels(a, b):
    f = lambda s: sum(ch in "aeiou " for ch in s) / max(len(s), 1)
    return [0.5 * f(x) + 0.5 * f(y) for x, y in zip(a, b)]


halves = lambda text, n: [text[: len(text) // 2], text[len(text) // 2:]]


class HalvesAdapter:
    "A domain adapter: a fixed joint prompt per item; halves of the completion; an empty completion does not parse."
    def __init__(self): self.parsed_items = []
    def build_prompt(self, batch_item, agent_prompts): return f"joint {batch_item['id']}: " + " | ".join(agent_prompts)
    def parse_completion(self, completion, batch_item, num_agents):
        self.parsed_items.append(batch_item["id"])
        if not completion: raise CentralizedComparatorParseError("empty completion")
        return halves(completion, num_agents)


def central_iter(tmp, trainer_kw=None, **kw):
    m, tok = make_tiny_model(seed=0)
    cfg = MADPOIterConfig(**{**BASE, "output_dir": str(tmp), "num_iterations": 2, **kw})
    kw = trainer_kw if trainer_kw is not None else {"centralized_parser": halves}
    return MADPOIterTrainer(agents=[m], tokenizer=tok, reward_func=vowels, args=cfg, train_dataset=ITEMS,
                            eval_dataset=ITEMS, **kw)


def test_config_centralized_comparator_and_actor_index():
    c = MADPOIterConfig(collaboration_mode="centralized", num_agents=3)
    assert (c.comparator_generation_mode, c.comparator_centralized_agent_index, c.num_agents) == ("centralized", 0, 3)
    assert MADPOIterConfig().comparator_generation_mode == "decentralized"
    with pytest.raises(ValueError, match="actor index 0"):
        MADPOIterConfig(collaboration_mode="centralized", comparator_centralized_agent_index=1)
    with pytest.raises(ValueError, match="collaboration_mode='solo' is invalid"):
        MADPOIterConfig(collaboration_mode="solo")


def test_one_actor_only(tmp_path):
    m, tok = make_tiny_model(seed=0)
    cfg = MADPOIterConfig(**{**BASE, "output_dir": str(tmp_path)})
    with pytest.raises(ValueError, match="exactly one actor for all 2 roles but 2 agents were given"):
        MADPOIterTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, args=cfg)


def test_rounds_train_the_actor_on_raw_joint_texts(tmp_path):
    tr = central_iter(tmp_path)
    assert (tr.n, len(tr.agents), len(tr.optimizers)) == (2, 1, 1)
    before = [p.detach().clone() for p in tr.agents[0].parameters()]
    out = tr.train()
    assert not all(torch.equal(a, b) for a, b in zip(before, tr.agents[0].parameters()))
    recs = json.loads((tmp_path / "preference_replay" / "iteration_0001.json").read_text())["pairs"]
    assert recs and {r["winner_side"] for r in recs} <= {"agents", "comparator"}
    for r in recs:
        c = r["centralized"]
        assert r["winner_completions"] == halves(c["winner"], 2) and r["loser_completions"] == halves(c["loser"], 2)
        assert c["prompt"] in [tr._central_prompt(it)[1] for it in ITEMS]
        side = "target_raw_reward" if r["winner_side"] == "agents" else "comparator_raw_reward"
        assert vowels(*[[x] for x in r["winner_completions"]])[0] == r[side]
    assert tr.state["optimizer_steps"] == [out["global_batch"]]
    assert tr.state["env_step"] == 2 * sum(r["round/train_pairs"] for r in out["rounds"])
    ev = tr.evaluate()
    assert ev["eval/unparsed_rate"] == 0.0 and 0 <= ev["eval/turn_1/reward_mean"] <= 1


def test_the_margin_is_the_whole_joint_completion(tmp_path):
    tr = central_iter(tmp_path, num_iterations=1)
    tr.train()
    (p, w, l), = tokenize_centralized(tr.pairs[:1], tr.tokenizers[0])
    assert torch.equal(tr._tokens[0][0][0], p) and torch.equal(tr._tokens[0][0][1], w) and len(tr._tokens) == 1


@pytest.mark.parametrize("policy", ["current", "history"])
def test_resume_after_a_stop_gives_the_same_weights(tmp_path, policy):
    kw = dict(num_iterations=3, comparator_policy=policy, preference_replay_mode="all_history")
    full = central_iter(tmp_path / "a", **kw)
    full.train()
    part = central_iter(tmp_path / "b", **kw)
    assert part.train(stop_after_round=1)["stopped"]
    again = central_iter(tmp_path / "b", **kw)
    again.train(resume_from_checkpoint=True)
    for f in ("iteration_0001.json", "iteration_0002.json", "iteration_0003.json"):
        a, b = (tmp_path / d / "preference_replay" / f for d in ("a", "b"))
        assert a.read_bytes() == b.read_bytes()
    assert all(torch.equal(a, b) for a, b in zip(full.agents[0].parameters(), again.agents[0].parameters()))


def test_adapter_builds_the_prompt_and_parses_with_the_item(tmp_path):
    ad = HalvesAdapter()
    tr = central_iter(tmp_path, trainer_kw={"centralized_comparator_adapter": ad}, num_iterations=1)
    assert tr._central_prompt(ITEMS[1])[1] == "joint 1: Explain physics | Explain physics"
    tr.train()
    joint = {f"joint {it['id']}: {it['prompt']} | {it['prompt']}" for it in ITEMS}
    assert {r["centralized"]["prompt"] for r in tr.pairs} <= joint
    assert set(ad.parsed_items) == {0, 1, 2}                # the actor's and the comparator's completions, per item
    for r in tr.pairs:
        it = next(i for i in ITEMS if r["centralized"]["prompt"].startswith(f"joint {i['id']}:"))
        assert r["prompts"] == [it["prompt"]] * 2
    assert tr._split("", ITEMS[0]) is None                   # the adapter's parse error: unparsed, not a crash


def test_adapter_in_madpo_and_the_tagged_default(tmp_path):
    m, tok = make_tiny_model(seed=0)
    cfg = MADPOConfig(**{**BASE, "output_dir": str(tmp_path)})
    tr = MADPOTrainer(agents=[m], tokenizer=tok, reward_func=vowels, args=cfg,
                      centralized_comparator_adapter=TaggedCentralizedComparatorAdapter())
    assert "Agent 1 original prompt:\nWrite a story" in tr._central_prompt(ITEMS[0])[1]
    assert tr._split("<agent_0>a</agent_0><agent_1>b</agent_1>") == ["a", "b"] and tr._split("plain") is None


def test_adapter_validation(tmp_path):
    m, tok = make_tiny_model(seed=0)
    dec = MADPOConfig(output_dir=str(tmp_path))
    cen = MADPOConfig(collaboration_mode="centralized", output_dir=str(tmp_path))
    ad = TaggedCentralizedComparatorAdapter()
    with pytest.raises(ValueError, match="applies only with collaboration_mode='centralized'"):
        MADPOTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, args=dec, centralized_comparator_adapter=ad)
    with pytest.raises(ValueError, match="not both"):
        MADPOTrainer(agents=[m], tokenizer=tok, reward_func=vowels, args=cen, centralized_comparator_adapter=ad,
                     centralized_parser=halves)
    with pytest.raises(TypeError, match="lacks parse_completion"):
        MADPOTrainer(agents=[m], tokenizer=tok, reward_func=vowels, args=cen,
                     centralized_comparator_adapter=type("A", (), {"build_prompt": lambda s, i, p: "x"})())
    bad = type("Bad", (HalvesAdapter,), {"parse_completion": lambda s, c, i, n: [c]})()
    tr = MADPOTrainer(agents=[m], tokenizer=tok, reward_func=vowels, args=cen, centralized_comparator_adapter=bad)
    with pytest.raises(ValueError, match="exactly 2 outputs"):
        tr._split("text", ITEMS[0])


def test_adapter_drives_a_centralized_comparator_of_decentralized_agents(tmp_path):
    seen = []
    def gen(agent_idx, prompts, k, items, ids, round_key):
        seen.extend(prompts)
        return ["abcdefgh"] * (len(prompts) * k)
    m, tok = make_tiny_model(seed=0)
    cfg = MADPOIterConfig(**{**BASE, "collaboration_mode": "decentralized", "comparator_generation_mode": "centralized",
                             "num_iterations": 1, "output_dir": str(tmp_path)})
    ad = HalvesAdapter()
    tr = MADPOIterTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, args=cfg, train_dataset=ITEMS,
                          comparator_generator=gen, centralized_comparator_adapter=ad)
    recs, st = tr._collect_round(1)
    assert seen == [f"joint {it['id']}: {it['prompt']} | {it['prompt']}" for it in ITEMS]
    assert st["unparsed_candidates"] == 0 and sorted(set(ad.parsed_items)) == [0, 1, 2]
    assert all("centralized" not in r for r in recs)         # the agents are per-role models: no joint text to keep
    assert any(r["winner_side"] == "comparator" and r["winner_completions"] == ["abcd", "efgh"] for r in recs)


def test_a_comparator_that_never_parses_names_the_actor_hooks(tmp_path):
    from comlrl_nb.comparators import CentralizedParseError
    tr = central_iter(tmp_path, trainer_kw={}, num_iterations=1)     # tagged default; the tiny model writes no tags
    with pytest.raises(CentralizedParseError, match="centralized_parser= or centralized_comparator_adapter="):
        tr.train()
