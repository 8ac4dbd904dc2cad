"""The vLLM backend against our sampler and HF: greedy tokens, EOS, pushes (tied head, prefix cache), log-probs,
keyed seeds, two agents (two engines, or one engine with LoRA adapters), and the caller's state."""
import copy

import pytest
import torch
from conftest import ENGINE, agent, jittered

from comlrl_nb.generation import generate_completions
from comlrl_nb.models import TINY_CORPUS
from comlrl_nb.scoring import completion_logprobs
from comlrl_nb.vllm_engine import SampledCompletions, VLLMSampler

PROMPTS = ["Write a story about a robot", "Explain quantum physics to a child.", "Numbers 0 1 2"]
GREEDY = dict(max_new_tokens=12, temperature=0)


def same_rows(a, b):
    "Same tokens, masks, ended flags, texts and prompts."
    for f in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "ended"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    assert a.texts == b.texts


def test_greedy_matches_ours_and_hf(agent_a, sampler_a):
    model, tok = agent_a
    got = sampler_a(model, tok, PROMPTS, k=2, **GREEDY)
    assert isinstance(got, SampledCompletions) and got.completion_ids.shape == (6, 12)
    same_rows(got, generate_completions(model, tok, PROMPTS, k=2, **GREEDY))
    ids = tok(PROMPTS[0], return_tensors="pt", add_special_tokens=False).input_ids
    hf = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12,
                        pad_token_id=tok.pad_token_id)[0, ids.shape[1]:]
    assert got.completion_ids[0, :len(hf)].tolist() == hf.tolist()


def test_eos_kept_in_the_mask_and_ended(agent_a, sampler_a):
    "A token that the greedy run makes at step 4 becomes an EOS: both samplers stop there, EOS masked in, ended."
    model, tok = agent_a
    first = sampler_a(model, tok, PROMPTS[:1], **GREEDY).completion_ids[0].tolist()
    stop = first[3]
    eos_model = type(model)(model.config)
    eos_model.load_state_dict(model.state_dict())
    eos_model.generation_config.eos_token_id = [tok.eos_token_id, stop]
    got = sampler_a(eos_model, tok, PROMPTS, **GREEDY)
    ours = generate_completions(eos_model, tok, PROMPTS, **GREEDY)
    same_rows(got, ours)
    n = first.index(stop) + 1
    assert bool(got.ended[0]) and got.completion_mask[0].tolist() == [1] * n + [0] * (got.completion_ids.shape[1] - n)
    assert got.completion_ids[0, n - 1] == stop


def test_push_weights_then_back(agent_a, sampler_a):
    "After a push, greedy equals ours on the new weights; pushing the old ones back restores the old outputs."
    model, tok = agent_a
    before = sampler_a(model, tok, PROMPTS, **GREEDY)
    new = jittered(model, seed=5)
    want = generate_completions(new, tok, PROMPTS, **GREEDY)
    assert not torch.equal(want.completion_ids, before.completion_ids)
    pushes = sampler_a.pushes
    sampler_a.push_weights(new)
    assert sampler_a.pushes == pushes                       # lazy: nothing moves before the next sampling
    same_rows(sampler_a(new, tok, PROMPTS, **GREEDY), want)
    assert sampler_a.pushes == pushes + 1
    same_rows(sampler_a(new, tok, PROMPTS, **GREEDY), want)  # no push pending: none made
    assert sampler_a.pushes == pushes + 1
    sampler_a.push_weights(model)
    same_rows(sampler_a(model, tok, PROMPTS, **GREEDY), before)


def _head_gap(worker, x, embedding):
    "Worker side: the engine's LM head kernel on `x` against `x @ embedding.T` (the tied head of the pushed weights)."
    head = worker.model_runner.get_model().lm_head
    out = head.cpu_linear(x, head.weight, None) if hasattr(head, "cpu_linear") else x @ head.weight.T
    return float((out - x @ embedding.T).abs().max())


def test_tied_head_follows_the_embedding(agent_a, sampler_a):
    """The tied LM head's kernel computes with the pushed embedding, not a packed copy of the old one (the push
    re-packs it)."""
    model, tok = agent_a
    assert model.config.tie_word_embeddings
    x = torch.randn(4, model.config.hidden_size)
    new = jittered(model, seed=6)
    for m in (new, model):
        sampler_a.push_weights(m)
        sampler_a._sync()
        emb = m.model.embed_tokens.weight.detach()
        assert sampler_a.llm.collective_rpc(_head_gap, args=(x, emb)) == [pytest.approx(0, abs=1e-4)]
    assert sampler_a.llm.collective_rpc(_head_gap, args=(x, new.model.embed_tokens.weight.detach()))[0] > 1e-2


def test_prefix_cache_never_stale(agent_a, sampler_a):
    "A prompt longer than one KV-cache block, sampled before and after a push: the second run sees the new weights."
    model, tok = agent_a
    long = " ".join(TINY_CORPUS) * 2
    block = sampler_a.llm.llm_engine.vllm_config.cache_config.block_size
    assert len(tok(long, add_special_tokens=False).input_ids) > block + 16
    assert sampler_a.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching
    same_rows(sampler_a(model, tok, [long], **GREEDY), generate_completions(model, tok, [long], **GREEDY))
    new = jittered(model, seed=9)
    sampler_a.push_weights(new)
    same_rows(sampler_a(new, tok, [long], **GREEDY), generate_completions(new, tok, [long], **GREEDY))
    sampler_a.push_weights(model)
    same_rows(sampler_a(model, tok, [long], **GREEDY), generate_completions(model, tok, [long], **GREEDY))


def test_sampled_logprobs_match_ours(agent_a, sampler_a):
    model, tok = agent_a
    got = sampler_a(model, tok, PROMPTS, k=3, max_new_tokens=16, temperature=1.0, top_p=0.95,
                    keys=[(3, i) for i in range(3)])
    lp, _ = completion_logprobs(model, got.prompt_ids, got.prompt_mask, got.completion_ids, got.completion_mask)
    m = got.completion_mask.bool()
    assert m.sum() > 20
    diff = (lp - got.sample_logprobs)[m].abs().max()
    assert diff < 1e-4, diff
    assert torch.all(got.sample_logprobs[~m] == 0)


def test_seeds_follow_keys_not_batch_order(agent_a, sampler_a):
    model, tok = agent_a
    keys = [(11, i) for i in range(3)]
    kw = dict(k=2, max_new_tokens=10, temperature=1.0)
    fwd = sampler_a(model, tok, PROMPTS, keys=keys, **kw)
    rev = sampler_a(model, tok, PROMPTS[::-1], keys=keys[::-1], **kw)
    for b in range(3):
        assert fwd.texts[fwd.rows(b)] == rev.texts[rev.rows(2 - b)]
    assert fwd.texts[0] != fwd.texts[1]                     # the k samples of a prompt differ
    other = sampler_a(model, tok, PROMPTS, keys=[(12, 0)] + keys[1:], **kw)
    assert other.texts[2:] == fwd.texts[2:] and other.texts[:2] != fwd.texts[:2]


def test_two_agents_two_engines(agent_a, sampler_a):
    "A second engine with its own KV cache beside the first: each matches ours on its own model, and they differ."
    model_a, tok = agent_a
    model_b, _ = agent(1, tokenizer=tok)
    state, setter, threads = torch.get_rng_state(), torch.set_num_threads, torch.get_num_threads()
    sampler_b = VLLMSampler(model_b, tok, **ENGINE)
    assert torch.equal(torch.get_rng_state(), state) and torch.set_num_threads is setter
    assert torch.get_num_threads() == threads
    try:
        a, b = sampler_a(model_a, tok, PROMPTS, **GREEDY), sampler_b(model_b, tok, PROMPTS, **GREEDY)
        same_rows(a, generate_completions(model_a, tok, PROMPTS, **GREEDY))
        same_rows(b, generate_completions(model_b, tok, PROMPTS, **GREEDY))
        assert a.texts != b.texts
    finally:
        sampler_b.close()
    same_rows(sampler_a(model_a, tok, PROMPTS, **GREEDY), a)   # closing one engine leaves the other working


def test_caller_state_survives_a_call(agent_a, sampler_a):
    model, tok = agent_a
    torch.manual_seed(42)
    want = torch.rand(4)
    torch.manual_seed(42)
    setter, threads = torch.set_num_threads, torch.get_num_threads()
    sampler_a(model, tok, PROMPTS, k=2, max_new_tokens=8, temperature=1.0)
    assert torch.equal(torch.rand(4), want)
    assert torch.set_num_threads is setter and torch.get_num_threads() == threads


def _lora(base, seed: int):
    "A PEFT LoRA (r=8, every projection) over a copy of `base`, with random B so that it changes the outputs."
    from peft import LoraConfig, get_peft_model
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    peft = get_peft_model(copy.deepcopy(base), LoraConfig(r=8, lora_alpha=16, target_modules=targets))
    set_lora_b(peft, seed)
    return peft


def set_lora_b(peft, seed: int):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in peft.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)


def merged(peft):
    "The base with the adapter folded in (what the engine's base + adapter must compute)."
    return copy.deepcopy(peft).merge_and_unload()


def test_two_agents_as_lora_adapters(agent_a):
    """One engine, one base, two agents as LoRA adapters: each matches ours on its merged model, they differ; an
    updated adapter pushed under a new id is what the next sampling uses."""
    base, tok = agent_a
    a0, a1 = _lora(base, 0), _lora(base, 1)
    sampler = VLLMSampler(base, tok, lora=True, max_loras=2, max_lora_rank=8, **ENGINE)
    try:
        sampler.push_adapter("a0", a0)
        sampler.push_adapter("a1", a1)
        got0, got1 = (sampler(base, tok, PROMPTS, adapter=n, **GREEDY) for n in ("a0", "a1"))
        same_rows(got0, generate_completions(merged(a0), tok, PROMPTS, **GREEDY))
        same_rows(got1, generate_completions(merged(a1), tok, PROMPTS, **GREEDY))
        assert got0.texts != got1.texts
        same_rows(sampler(base, tok, PROMPTS, **GREEDY), generate_completions(base, tok, PROMPTS, **GREEDY))
        ids = sampler.adapters["a0"].lora_int_id
        set_lora_b(a0, 7)                                   # an optimizer step on agent 0's adapter
        sampler.push_adapter("a0", a0)
        same_rows(sampler(base, tok, PROMPTS, adapter="a0", **GREEDY),
                  generate_completions(merged(a0), tok, PROMPTS, **GREEDY))
        assert sampler.adapters["a0"].lora_int_id != ids
    finally:
        sampler.close()


def test_adapter_agents_sample_with_their_own_adapter(agent_a, tmp_path):
    "LoRAAgents of the team: called with an `AdapterAgent`, the engine samples with that agent's adapter."
    from comlrl_nb.adapters import LoRAAgents
    from comlrl_nb.vllm_engine import save_for_engine
    base, tok = agent_a
    path = save_for_engine(base, tok, tmp_path / "base")
    agents, _ = LoRAAgents(base=str(path), tokenizer=tok).build()
    for i, a in enumerate(agents):
        g = torch.Generator().manual_seed(20 + i)
        with torch.no_grad():
            for n, p in a.named_parameters():
                if "lora_B" in n:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    sampler = VLLMSampler(str(path), lora=True, max_loras=2, max_lora_rank=8, **ENGINE)
    try:
        got = [sampler(a, tok, PROMPTS, **GREEDY) for a in agents]
        for a, g in zip(agents, got):
            same_rows(g, generate_completions(a, tok, PROMPTS, **GREEDY))
        assert got[0].texts != got[1].texts
    finally:
        sampler.close()
