"""The fast paths of 02_generation (FastDecoder, fast_forward, fast_hidden) against the HF forward on a tiny random
Qwen2 (biases on q/k/v, grouped-query heads) and the tiny Llama: sampled tokens, logits and hidden states bit for bit;
the update's log-probs (last layer at the read positions only, `out=`) and their gradients to float rounding."""
import copy

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from comlrl_nb.core import autocast
from comlrl_nb.generation import encode_prompts, fast_decodable, fast_forward, fast_hidden, generate_completions
from comlrl_nb.models import make_tiny_model
from comlrl_nb.scoring import completion_logprobs

torch.set_num_threads(1)
PROMPTS = ["Write a story about a robot", "Hi", "Explain physics"]


def tiny_qwen2():
    _, tok = make_tiny_model("llama")
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).eval(), tok


@pytest.fixture(params=["qwen2", "llama"])
def model_tok(request):
    return tiny_qwen2() if request.param == "qwen2" else make_tiny_model("llama")


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_sampling_same_tokens(model_tok, dtype):
    model, tok = model_tok
    assert fast_decodable(model)
    kw = dict(k=3, max_new_tokens=20, temperature=0.9, top_p=0.95, top_k=40, keys=[(0, "t", j) for j in range(3)],
              autocast_dtype=dtype)
    a, b = generate_completions(model, tok, PROMPTS, fast=False, **kw), generate_completions(model, tok, PROMPTS, **kw)
    assert torch.equal(a.completion_ids, b.completion_ids) and a.texts == b.texts


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_logprobs_and_grads_close_to_hf(model_tok, dtype):
    model, tok = model_tok
    c = generate_completions(model, tok, PROMPTS, k=2, max_new_tokens=12, keys=[(1, j) for j in range(3)])
    slow = copy.deepcopy(model).train()
    hook = slow.register_forward_hook(lambda *a: None)          # a hooked model keeps the HF forward
    assert not fast_decodable(slow)
    model.train()
    a_tok, a_seq = completion_logprobs(model, c.prompt_ids, c.prompt_mask, c.completion_ids, c.completion_mask, dtype)
    b_tok, b_seq = completion_logprobs(slow, c.prompt_ids, c.prompt_mask, c.completion_ids, c.completion_mask, dtype)
    a_seq.sum().backward()
    b_seq.sum().backward()
    hook.remove()
    tol = 1e-5 if dtype is None else 1e-2                       # bf16: one rounding of a bf16 activation can differ
    assert float((a_tok - b_tok).detach().abs().max()) <= tol
    assert not torch.equal(a_tok, torch.zeros_like(a_tok))
    for p, q in zip(model.parameters(), slow.parameters()):
        assert float((p.grad - q.grad).abs().max()) <= (1e-5 if dtype is None else 1e-3) * float(q.grad.abs().max())


def test_body_hidden_states_right_padding(model_tok):
    model, tok = model_tok
    ids, mask = encode_prompts(tok, PROMPTS)
    shift = [int((m == 0).sum()) for m in mask]                  # to right padding, as the reward model encodes
    ids = torch.stack([torch.roll(r, -s) for r, s in zip(ids, shift)])
    mask = torch.stack([torch.roll(m, -s) for m, s in zip(mask, shift)])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ref = model.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).last_hidden_state
        assert torch.equal(fast_hidden(model.model, ids, mask, pos), ref)
        full = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False, logits_to_keep=3).logits
        assert torch.equal(fast_forward(model, ids, mask, pos, 3), full)


def test_other_models_keep_hf():
    gpt2, _ = make_tiny_model("gpt2")
    assert not fast_decodable(gpt2)
    m, _ = make_tiny_model("llama")
    m.config._attn_implementation = "eager"
    assert not fast_decodable(m)


def _perturbed(model, seed):
    other = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return other


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
@pytest.mark.parametrize("prompts", [PROMPTS, ["Write a story", "Explain this"]])   # left padding, and none
def test_team_decoding_equals_each_agent_alone(model_tok, dtype, prompts):
    """Three agents of one shape decode in one loop (stacked weights, batched GEMMs); each gets exactly the tokens,
    masks, texts and end flags it samples alone, including when one agent finishes early."""
    from comlrl_nb.generation import generate_team, stackable
    model, tok = model_tok
    team = [model, _perturbed(model, 1), _perturbed(model, 2)]
    assert stackable(team, [tok] * 3)
    keys = [[(7, b, a) for b in range(len(prompts))] for a in range(3)]
    kw = dict(k=2, max_new_tokens=16, temperature=1.2, top_p=0.95, top_k=30, autocast_dtype=dtype)
    together = generate_team(team, [tok] * 3, [prompts] * 3, keys=keys, **kw)
    for a, c in enumerate(together):
        alone = generate_completions(team[a], tok, prompts, keys=keys[a], **kw)
        for f in ("prompt_ids", "completion_ids", "completion_mask", "ended"):
            assert torch.equal(getattr(c, f), getattr(alone, f)), f
        assert c.texts == alone.texts


def test_team_decoding_falls_back_when_shapes_differ(model_tok):
    """Different prompt lengths per agent (other padding, other kernels) or different architectures: each agent
    decodes alone, with the same results as generate_completions."""
    from comlrl_nb.generation import generate_team, stackable
    model, tok = model_tok
    other = _perturbed(model, 3)
    kw = dict(k=2, max_new_tokens=8, temperature=1.0)
    res = generate_team([model, other], [tok, tok], [["Hi"], ["A much longer prompt than the other"]], **kw)
    assert res[1].texts == generate_completions(other, tok, ["A much longer prompt than the other"], **kw).texts
    gpt2, _ = make_tiny_model("gpt2")
    assert not stackable([model, gpt2], [tok, tok])


def test_shared_prompt_scoring_matches_whole_sequences(model_tok):
    """completion_logprobs with each prompt scored once (share_prompts=True): log-probs and gradients equal the
    whole-sequence forward to float rounding, with left-padded prompts and completions of different lengths."""
    model, tok = model_tok
    keys = [(2, j) for j in range(3)]
    c = generate_completions(model, tok, PROMPTS, k=3, max_new_tokens=10, temperature=1.3, keys=keys)
    mask = c.completion_mask.clone()
    mask[::2, 6:] = 0                                           # every other completion ends after 6 tokens
    one, two = copy.deepcopy(model).train(), copy.deepcopy(model).train()
    args = (c.prompt_ids, c.prompt_mask, c.completion_ids.masked_fill(mask == 0, tok.pad_token_id), mask)
    a_tok, a_seq = completion_logprobs(one, *args, share_prompts=False)
    b_tok, b_seq = completion_logprobs(two, *args, share_prompts=True)
    assert torch.allclose(a_tok, b_tok, atol=1e-5)
    a_seq.sum().backward()
    b_seq.sum().backward()
    for p, q in zip(one.parameters(), two.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-5, rtol=1e-4)
