"""JointRewardModel names its parts as the library does (`backbone`, `reward_head`; issue P3): the state-dict keys
are the library's, a state dict saved under the old names (`body.*`, `head.*`) still loads, a given backbone is used
as given, and the trainers fit a copy of the backbone object a user hands them."""
import pytest
import torch

from comlrl_nb.models import make_tiny_model
from comlrl_nb.reward_model import JointRewardModel, joint_text
from comlrl_nb.trainers.marlhf import MARLHFConfig, MARLHFTrainer

TEXTS = [joint_text(["Write", "Expand"], ["A robot.", "A robot paints a city."]), joint_text(["x"], ["y"])]


def old_layout(rm: JointRewardModel) -> dict:
    "The state dict as the class saved it before the rename: `body.` (the transformer) and `head.` keys, no LM head."
    inner = "backbone." + rm.backbone.base_model_prefix + "."
    out = {}
    for k, v in rm.state_dict().items():
        if k.startswith(inner): out["body." + k[len(inner):]] = v.clone()
        elif k.startswith("reward_head."): out["head." + k[len("reward_head."):]] = v.clone()
    return out


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_state_dict_with_old_key_names_loads(arch, tmp_path):
    m, tok = make_tiny_model(arch, seed=4)
    trained = JointRewardModel(m, tok, seed=3)
    with torch.no_grad():
        for p in trained.parameters(): p.add_(0.1 * torch.randn_like(p))
    torch.save(old_layout(trained), tmp_path / "state.pt")                  # a checkpoint of the old layout
    fresh = JointRewardModel(make_tiny_model(arch, seed=0)[0], tok, seed=0)
    res = fresh.load_state_dict(torch.load(tmp_path / "state.pt"))         # strict
    assert not res.missing_keys and not res.unexpected_keys
    for (k, a), (k2, b) in zip(trained.state_dict().items(), fresh.state_dict().items()):
        assert k == k2 and torch.equal(a, b)
    with torch.no_grad():
        assert torch.equal(fresh(*fresh.encode(TEXTS)), trained(*trained.encode(TEXTS)))


def test_library_names_and_the_given_backbone():
    m, tok = make_tiny_model()
    rm = JointRewardModel(m, tok)
    keys = list(rm.state_dict())
    assert "reward_head.weight" in keys and "backbone.model.embed_tokens.weight" in keys    # the library's keys
    assert all(k.startswith(("backbone.", "reward_head.")) for k in keys)
    assert rm.backbone is m and rm.body is m.model and rm.head is rm.reward_head             # used as given
    with pytest.raises(AttributeError):
        rm.body = m                                                                        # the old names: read-only
    copy = JointRewardModel(m, tok, copy_backbone=True)
    assert copy.backbone is not m and torch.equal(copy.body.embed_tokens.weight, m.model.embed_tokens.weight)
    with torch.no_grad():                               # the state read equals the library's hidden_states[-1]
        ids, mask = rm.encode(TEXTS, "right")
        lib = m(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False).hidden_states[-1]
        last = mask.sum(-1) - 1
        want = rm.reward_head(lib[torch.arange(len(last)), last]).squeeze(-1)
        torch.testing.assert_close(rm(ids, mask, fast=False), want, atol=0, rtol=0)
        torch.testing.assert_close(rm(ids, mask, fast=True), want, atol=1e-5, rtol=0)


def test_untied_lm_head_of_an_owned_backbone_gets_no_gradient():
    from transformers import LlamaConfig, LlamaForCausalLM
    _, tok = make_tiny_model()
    m = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False))
    owned = JointRewardModel(m, tok, copy_backbone=True)
    assert not owned.backbone.lm_head.weight.requires_grad and owned.body.embed_tokens.weight.requires_grad
    assert m.lm_head.weight.requires_grad                                   # the caller's model is left alone
    owned.freeze()
    owned.requires_grad_(True)                                              # what the trainers call before a fit
    assert not owned.backbone.lm_head.weight.requires_grad and owned.reward_head.weight.requires_grad
    as_given = JointRewardModel(m, tok)
    assert as_given.backbone.lm_head.weight.requires_grad                   # nor changed when used as given


def test_trainer_fits_a_copy_of_the_agent_it_is_handed():
    m, tok = make_tiny_model()
    before = [p.detach().clone() for p in m.parameters()]
    items = [{"prompt": p} for p in ["Write a story", "Explain physics", "Create a recipe", "Describe a city"]]
    vowels = lambda a, b: [sum(ch in "aeiou" for ch in x + y) / max(len(x + y), 1) for x, y in zip(a, b)]
    tr = MARLHFTrainer(agents=[m, m], tokenizer=tok, reward_func=vowels, train_dataset=items, reward_model=m,
                       args=MARLHFConfig(num_train_epochs=1, num_generations=2, max_new_tokens=4, progress_bar=False,
                                         reward_learning_rate=1e-2, save_steps=0, save_plot=False, eval_interval=0,
                                         logging_steps=1000))
    rm = tr.reward_model
    assert rm.backbone is not m and not {p.data_ptr() for p in rm.parameters()} & {p.data_ptr() for p in m.parameters()}
    rm.fit_texts(["good answer", "fine"], ["bad", "x"], learning_rate=1e-2)
    assert not all(torch.equal(a, b) for a, b in zip(before, rm.body.parameters()))     # the fit moved the copy
    assert all(torch.equal(a, b) for a, b in zip(before, m.parameters()))               # and left the agent alone
