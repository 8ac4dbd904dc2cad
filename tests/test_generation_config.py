"""The sampler honours the model's generation_config (SPEC 10, issue P3) in every path: the fast decoder, the HF
forward (`fast=False`) and the stacked team loop. Stop ids, suppressed and banned tokens, the repetition penalty,
n-gram bans and minimum lengths change the tokens as `model.generate` does; anything else that would change them
gets one warning per model naming it."""
import copy
import logging

import pytest
import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from comlrl_nb.generation import (GenerationSettings, LogitRules, encode_prompts, generate_completions, generate_team,
                                  generation_settings, stackable)
from comlrl_nb.models import make_tiny_model

PROMPTS = ["Write a story about", "Hi"]
KEYS = [(0, "gc", 0), (0, "gc", 1)]
PATHS = ["fast", "hf", "team"]


def tiny(**settings):
    model, tok = make_tiny_model()
    for name, value in settings.items(): setattr(model.generation_config, name, value)
    return model, tok


def sample(model, tok, path, k=4, max_new_tokens=12, **kw):
    "k completions of PROMPTS through one of the three paths (the team: this model and a perturbed copy)."
    kw = dict(k=k, max_new_tokens=max_new_tokens, temperature=1.0, **kw)
    if path != "team": return generate_completions(model, tok, PROMPTS, keys=KEYS, fast=path == "fast", **kw)
    other = copy.deepcopy(model)                        # the same generation_config, other weights
    with torch.no_grad():
        for p in other.parameters(): p.add_(0.02 * torch.randn_like(p))
    assert stackable([model, other], [tok, tok])
    return generate_team([model, other], [tok, tok], [PROMPTS, PROMPTS], keys=[KEYS, KEYS], **kw)[0]


def sampled(c) -> list[list[int]]:
    return [ids[m.bool()].tolist() for ids, m in zip(c.completion_ids, c.completion_mask)]


@pytest.mark.parametrize("path", PATHS)
def test_suppressed_tokens_never_sampled(path):
    free = sampled(sample(*tiny(), path))
    common = sorted({t for row in free for t in row} - {0})[::2]        # half of what the rows sample (0 is EOS)
    got = sampled(sample(*tiny(suppress_tokens=common), path))
    assert {t for row in free for t in row} & set(common)                 # the ban bites
    assert not {t for row in got for t in row} & set(common)


@pytest.mark.parametrize("path", PATHS)
def test_suppressing_all_but_eos_gives_empty_completions(path):
    model, tok = tiny()
    model.generation_config.suppress_tokens = [i for i in range(len(tok)) if i != tok.eos_token_id]
    c = sample(model, tok, path)
    assert c.texts == [""] * 8 and bool(c.ended.all())
    assert c.completion_ids.tolist() == [[tok.eos_token_id]] * 8 and bool(c.completion_mask.all())   # EOS kept
    ids, am = encode_prompts(tok, PROMPTS)                               # what model.generate gives: empty too
    ref = model.generate(ids, attention_mask=am, do_sample=True, max_new_tokens=12, num_return_sequences=4,
                         pad_token_id=tok.pad_token_id)
    assert tok.batch_decode(ref[:, ids.shape[1]:], skip_special_tokens=True) == [""] * 8


@pytest.mark.parametrize("path", PATHS)
def test_a_list_of_eos_ids_stops_on_each(path):
    model, tok = tiny()
    free = sampled(sample(model, tok, path))
    stops = sorted({row[2] for row in free[:3] if len(row) > 3} - {tok.eos_token_id})
    assert len(stops) >= 2
    model.generation_config.eos_token_id = [tok.eos_token_id, *stops]
    c = sample(model, tok, path)
    ends = set(stops) | {tok.eos_token_id}
    def cut(row):
        first = next((i for i, t in enumerate(row) if t in ends), None)
        return row if first is None else row[:first + 1]
    assert sampled(c) == [cut(row) for row in free]                     # the same draws, cut at the first stop id
    assert c.ended.tolist() == [row[-1] in ends for row in sampled(c)]
    assert {row[-1] for row in sampled(c)} >= set(stops)                # each stop id ended a row


@pytest.mark.parametrize("path", PATHS)
def test_bad_words_never_appear(path):
    model, tok = tiny()
    free = sampled(sample(model, tok, path, max_new_tokens=16))
    single = free[0][1]
    pair = next(row[i:i + 2] for row in free[1:] for i in range(1, len(row) - 1) if single not in row[i:i + 2])
    model.generation_config.bad_words_ids = [[single], pair]
    c = sample(model, tok, path, max_new_tokens=16)
    last = encode_prompts(tok, PROMPTS)[0][:, -1].repeat_interleave(4).tolist()   # a pair may start in the prompt
    for row, before in zip(sampled(c), last):
        seq = [before] + row
        assert single not in row
        assert all(seq[i:i + 2] != pair for i in range(len(seq) - 1))
    assert sampled(c) != free


def test_repetition_penalty_equals_hf_processor():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(2, 50, (3, 7), generator=g)
    mask = torch.ones_like(ids)
    rules = LogitRules(GenerationSettings(repetition_penalty=1.35), torch.tensor([0]), ids, mask, 3)
    hf = RepetitionPenaltyLogitsProcessor(1.35)
    context = ids
    for t in range(3):
        logits = 3 * torch.randn(3, 60, generator=g)
        assert torch.equal(rules.apply(logits, t), hf(context, logits.clone()))
        nxt = torch.randint(2, 60, (3,), generator=g)
        rules.push(nxt)
        context = torch.cat([context, nxt[:, None]], 1)


@pytest.mark.parametrize("settings", [dict(repetition_penalty=1.8), dict(no_repeat_ngram_size=2),
                                      dict(begin_suppress_tokens=None, min_new_tokens=14),
                                      dict(repetition_penalty=1.25, no_repeat_ngram_size=3)])
@pytest.mark.parametrize("fast", [True, False])
def test_greedy_matches_model_generate(settings, fast):
    prompt = ["The quick brown fox jumps over the"]
    plain_model, tok = tiny()
    plain = generate_completions(plain_model, tok, prompt, max_new_tokens=16, temperature=0).completion_ids
    model, _ = tiny(**settings)
    if "begin_suppress_tokens" in settings: model.generation_config.begin_suppress_tokens = [int(plain[0, 0])]
    ids, am = encode_prompts(tok, prompt)
    ref = model.generate(ids, attention_mask=am, do_sample=False, max_new_tokens=16, pad_token_id=tok.pad_token_id)
    c = generate_completions(model, tok, prompt, max_new_tokens=16, temperature=0, fast=fast)
    assert c.completion_ids[0].tolist() == ref[0, ids.shape[1]:].tolist()
    assert c.completion_ids[0].tolist() != plain[0].tolist()           # the setting changed the tokens


def test_min_new_tokens_keeps_stop_ids_out():
    model, tok = tiny(suppress_tokens=list(range(2, 320)), min_new_tokens=5)   # only EOS (0) and pad (1) are left
    c = generate_completions(model, tok, PROMPTS, k=2, max_new_tokens=8, keys=KEYS)
    assert (c.completion_ids[:, :5] == tok.pad_token_id).all() and (c.lengths >= 6).all()
    assert c.ended.any()                                                  # EOS does come once it is allowed


@pytest.mark.parametrize("fast", [True, False])
def test_min_length_counts_each_rows_own_prompt(fast):
    model, tok = tiny(suppress_tokens=list(range(2, 320)))                # only EOS (0) and pad (1) are left
    ids, am = encode_prompts(tok, PROMPTS)
    real = am.sum(-1).tolist()
    assert real[0] != real[1]
    model.generation_config.min_length = max(real) + 3
    c = generate_completions(model, tok, PROMPTS, k=4, max_new_tokens=12, keys=KEYS, fast=fast)
    for r, n in enumerate(c.lengths.tolist()):                           # no stop id before the row is that long
        first_eos = c.completion_ids[r].tolist().index(0) if bool(c.ended[r]) else n
        assert first_eos >= max(real) + 3 - real[r // 4]
    for p in PROMPTS:                                                    # greedy, one prompt: as model.generate
        one, a1 = encode_prompts(tok, [p])
        ref = model.generate(one, attention_mask=a1, do_sample=False, max_new_tokens=12, pad_token_id=1)
        got = generate_completions(model, tok, [p], max_new_tokens=12, temperature=0, fast=fast)
        assert got.completion_ids[0].tolist() == ref[0, one.shape[1]:].tolist()


def test_unsupported_settings_warn_once_per_model(caplog):
    caplog.set_level(logging.WARNING, logger="comlrl_nb")
    model, tok = tiny(num_beams=3, min_p=0.1, temperature=0.3, top_k=7, do_sample=True)   # the last three: the caller's
    for path in ("fast", "fast", "hf"): sample(model, tok, path, k=1, max_new_tokens=2)
    msgs = [r.getMessage() for r in caplog.records if "generation_config" in r.getMessage()]
    assert len(msgs) == 1 and "num_beams=3" in msgs[0] and "min_p=0.1" in msgs[0]
    assert not any(word in msgs[0] for word in ("temperature=", "top_k=", "do_sample="))
    other, _ = tiny(num_beams=3)                                          # another model: its own warning
    generate_completions(other, tok, PROMPTS, max_new_tokens=2)
    assert sum("generation_config" in r.getMessage() for r in caplog.records) == 2


def test_default_config_has_no_rules():
    "A default generation_config (every tiny test model) adds no work to the loop: no rules object at all."
    model, tok = tiny()
    assert generation_settings(model, [tok.eos_token_id]) is None


def test_team_with_different_settings_decodes_each_with_its_own():
    a, tok = tiny()
    b = copy.deepcopy(a)
    b.generation_config.suppress_tokens = list(range(2, 200))
    kw = dict(k=2, max_new_tokens=10, keys=[KEYS, KEYS])
    together = generate_team([a, b], [tok, tok], [PROMPTS, PROMPTS], **kw)
    for m, c in zip((a, b), together):
        alone = generate_completions(m, tok, PROMPTS, k=2, max_new_tokens=10, keys=KEYS)
        assert torch.equal(c.completion_ids, alone.completion_ids)
    assert not any(2 <= t < 200 for row in sampled(together[1]) for t in row)
