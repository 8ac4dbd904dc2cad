"""The preference replay buffer: option validation, register/select semantics, sampling, file errors, state round
trip."""
import json
from collections import Counter

import numpy as np
import pytest

from comlrl_nb.preference import make_pair_record, validate_pair_record
from comlrl_nb.replay import (ReplayBuffer, check_replay_options, draw_sample, iteration_path, load_iteration_file,
                              replay_mix, replay_weights)
from comlrl_nb.trainers.iterative import MADPOIterConfig, MARLHFIterConfig


def pairs(it, m):
    "m distinct, valid two-agent records of round `it`."
    return [make_pair_record([f"p{it}", "q"], [f"w{it}.{j}", "x"], [f"l{it}.{j}", "y"], 0.9, 0.1, 0.5, iteration=it,
                             j=j)
            for j in range(m)]


def validate(rec, where):
    validate_pair_record(rec, 2, where)


def source_counts(sample):
    return Counter(r["iteration"] for r in sample)


# ------------------------------------------------------------------ validation messages
@pytest.mark.parametrize("kw, msg", [
    (dict(mode="recent"),
     "preference_replay_mode='recent' is invalid: use one of current, nearest_k, all_history, lambda_decay"),
    (dict(mode="current", sample_size=8), "preference_replay_sample_size is not used by mode 'current'"),
    (dict(mode="current", lam=0.5), "preference_replay_lambda is only for mode 'lambda_decay'; remove it"),
    (dict(mode="current", k=2), "preference_replay_k=2 does not fit mode 'current' (only None or 1)"),
    (dict(mode="nearest_k"), "preference_replay_k=None is invalid: a number is required"),
    (dict(mode="nearest_k", k=0), "preference_replay_k=0 is invalid: must be >= 1"),
    (dict(mode="nearest_k", k=1.5), "preference_replay_k=1.5 is invalid: expected an integer"),
    (dict(mode="nearest_k", k=2, lam=0.5), "preference_replay_lambda is only for mode 'lambda_decay'; remove it"),
    (dict(mode="all_history", k=2), "preference_replay_k is not used by mode 'all_history'"),
    (dict(mode="all_history", lam=0.3), "preference_replay_lambda is only for mode 'lambda_decay'; remove it"),
    (dict(mode="lambda_decay"), "preference_replay_lambda=None is invalid: a number is required"),
    (dict(mode="lambda_decay", lam=1.5), "preference_replay_lambda=1.5 is invalid: must be <= 1"),
    (dict(mode="lambda_decay", lam=-0.1), "preference_replay_lambda=-0.1 is invalid: must be >= 0"),
    (dict(mode="lambda_decay", lam=0.5, k=3), "preference_replay_k is not used by mode 'lambda_decay'"),
    (dict(mode="all_history", sample_size=0), "preference_replay_sample_size=0 is invalid: must be >= 1"),
    (dict(mode="lambda_decay", lam=0.5, sample_size=2.5),
     "preference_replay_sample_size=2.5 is invalid: expected an integer"),
])
def test_every_validation_message(kw, msg):
    with pytest.raises(ValueError) as e:
        check_replay_options(**kw)
    assert msg in str(e.value)
    with pytest.raises(ValueError) as e:                                  # the buffer checks the same way
        ReplayBuffer("unused", kw["mode"], kw.get("k"), kw.get("lam"), kw.get("sample_size"))
    assert msg in str(e.value)


def test_valid_options_and_owner_prefix():
    assert check_replay_options("current", k=1) == "current"
    assert check_replay_options("nearest_k", k=3, sample_size=5) == "nearest_k"
    assert check_replay_options("all_history") == "all_history"
    assert check_replay_options("lambda_decay", lam=0.0) == "lambda_decay"
    with pytest.raises(ValueError, match=r"MADPOIterConfig\.preference_replay_k=None is invalid"):
        MADPOIterConfig(preference_replay_mode="nearest_k")
    with pytest.raises(ValueError,
                       match="MARLHFIterConfig.preference_replay_sample_size is not used by mode 'current'"):
        MARLHFIterConfig(preference_replay_sample_size=4)
    c = MADPOIterConfig(preference_replay_mode="lambda_decay", preference_replay_lambda=0.7,
                        preference_replay_sample_size=9)
    assert (c.preference_replay_mode, c.preference_replay_lambda, c.preference_replay_sample_size) == \
        ("lambda_decay", 0.7, 9)


# ------------------------------------------------------------------ weights
def test_lambda_decay_weights():
    for K in range(1, 7):
        for lam in (0.0, 0.25, 0.5, 0.9, 1.0):
            w = replay_weights(K, "lambda_decay", lam)
            assert w.sum() == pytest.approx(1.0)
            expect = np.array([lam ** a if a else 1.0 for a in range(K)])
            np.testing.assert_allclose(w, expect / expect.sum())
            if 0 < lam < 1:
                np.testing.assert_allclose(w, (1 - lam) * lam ** np.arange(K) / (1 - lam ** K))
    np.testing.assert_array_equal(replay_weights(4, "lambda_decay", 0.0), [1, 0, 0, 0])
    np.testing.assert_allclose(replay_weights(4, "lambda_decay", 1.0), [0.25] * 4)
    np.testing.assert_allclose(replay_weights(5, "nearest_k", k=2), [0.5, 0.5, 0, 0, 0])
    np.testing.assert_allclose(replay_weights(2, "nearest_k", k=5), [0.5, 0.5])
    np.testing.assert_allclose(replay_weights(3, "all_history"), [1 / 3] * 3)
    assert replay_weights(0, "all_history").shape == (0,)


# ------------------------------------------------------------------ register / select
def test_files_and_empty_rounds(tmp_path):
    rb = ReplayBuffer(tmp_path, "all_history", seed=3, validate=validate)
    for it, m in {1: 3, 2: 0, 3: 2}.items():
        p = rb.register(it, pairs(it, m))
        assert p == iteration_path(tmp_path, it) and p.name == f"iteration_{it:04d}.json"
        data = json.loads(p.read_text())
        assert data == {"iteration": it, "num_pairs": m, "pairs": pairs(it, m)}
    assert [i for i, _ in rb.datasets()] == [3, 1]                       # the empty round is no dataset
    assert not list(tmp_path.glob(".*.tmp"))                              # atomic writes leave no temp files
    assert rb.select(2) != [] and source_counts(rb.select(2)).keys() <= {1, 3}  # an empty round still trains on history
    with pytest.raises(ValueError, match="round 4 has not been registered; call register\\(\\) before select\\(\\)"):
        rb.select(4)


def test_current_mode(tmp_path):
    rb = ReplayBuffer(tmp_path)
    rb.register(1, pairs(1, 3))
    rb.register(2, [])
    assert rb.select(1) == pairs(1, 3)                                    # all of them, in order
    assert rb.select(2) == []                                             # empty round: nothing, no history
    rb.register(3, pairs(3, 2))
    assert rb.select(3) == pairs(3, 2)


def test_default_sample_size_rule(tmp_path):
    rb = ReplayBuffer(tmp_path, "all_history", seed=0)
    rb.register(1, pairs(1, 7))
    rb.register(2, pairs(2, 3))
    assert len(rb.select(2)) == 3                                         # this round's pair count
    rb.register(3, [])
    assert len(rb.select(3)) == 3  # empty round: the newest non-empty dataset's size
    rb.register(4, [])
    assert len(rb.select(4)) == 3
    fixed = ReplayBuffer(tmp_path / "f", "all_history", sample_size=11)
    fixed.register(1, pairs(1, 2))
    assert len(fixed.select(1)) == 11
    none = ReplayBuffer(tmp_path / "n", "lambda_decay", lam=0.5)
    none.register(1, [])
    assert none.select(1) == []                                           # no dataset at all


def test_nearest_k_uses_the_last_k_nonempty_rounds_equally(tmp_path):
    rb = ReplayBuffer(tmp_path, "nearest_k", k=2, sample_size=6000, seed=1)
    for it, m in {1: 50, 2: 5, 3: 0, 4: 40}.items():
        rb.register(it, pairs(it, m))
    c = source_counts(rb.select(4))
    assert set(c) == {4, 2}                                               # round 3 is empty: 4 and 2 are the two newest
    assert abs(c[4] / 6000 - 0.5) < 4 * np.sqrt(0.25 / 6000)             # equal weights whatever their sizes
    assert set(r["j"] for r in rb.select(4) if r["iteration"] == 2) == set(range(5))


def test_all_history_and_lambda_decay_empirical_shares(tmp_path):
    sizes = {1: 30, 2: 10, 3: 0, 4: 4}
    for mode, kw, expect in [("all_history", {}, {4: 1 / 3, 2: 1 / 3, 1: 1 / 3}),
                             ("lambda_decay", {"lam": 0.5}, {4: 4 / 7, 2: 2 / 7, 1: 1 / 7}),
                             ("lambda_decay", {"lam": 0.0}, {4: 1.0}),
                             ("lambda_decay", {"lam": 1.0}, {4: 1 / 3, 2: 1 / 3, 1: 1 / 3})]:
        rb = ReplayBuffer(tmp_path / f"{mode}{kw}", mode, sample_size=20000, seed=5, **kw)
        for it, m in sizes.items():
            rb.register(it, pairs(it, m))
        c = source_counts(rb.select(4))
        assert set(c) == set(expect), (mode, kw, c)
        for it, w in expect.items():
            assert abs(c[it] / 20000 - w) < 4 * np.sqrt(w * (1 - w) / 20000) + 1e-12, (mode, kw, it, c)


def test_without_replacement_while_it_fits_then_cycling(tmp_path):
    rb = ReplayBuffer(tmp_path, "nearest_k", k=1, sample_size=5, seed=2)
    rb.register(1, pairs(1, 5))
    s = rb.select(1)
    assert sorted(r["j"] for r in s) == list(range(5))                    # fits: each pair once
    big = ReplayBuffer(tmp_path / "b", "nearest_k", k=1, sample_size=13, seed=2)
    big.register(1, pairs(1, 5))
    counts = Counter(r["j"] for r in big.select(1))
    assert sorted(counts) == list(range(5)) and sorted(counts.values()) == [2, 2, 3, 3, 3]   # 13 = 2 full copies + 3
    rng = np.random.default_rng(0)
    out = draw_sample([list(range(4))], [1.0], 10, rng)
    assert out.count(0) in (2, 3) and len(out) == 10 \
        and max(out.count(x) for x in range(4)) - min(out.count(x) for x in range(4)) <= 1


def test_combined_sample_is_shuffled(tmp_path):
    rb = ReplayBuffer(tmp_path, "all_history", sample_size=60, seed=4)
    rb.register(1, pairs(1, 30))
    rb.register(2, pairs(2, 30))
    its = [r["iteration"] for r in rb.select(2)]
    changes = sum(a != b for a, b in zip(its, its[1:]))
    assert changes > 10                                                   # not one block per dataset


def test_determinism_per_seed_and_round(tmp_path):
    def run(seed, d):
        rb = ReplayBuffer(tmp_path / d, "lambda_decay", lam=0.6, sample_size=12, seed=seed)
        out = []
        for it in (1, 2, 3):
            rb.register(it, pairs(it, 6))
            out.append([(r["iteration"], r["j"]) for r in rb.select(it)])
        return rb, out
    rb_a, a = run(0, "a")
    _, b = run(0, "b")
    _, c = run(1, "c")
    assert a == b                                                         # same seed: same selections
                                                                          # (directory irrelevant)
    assert a != c                                                         # another seed: other selections
    assert [(r["iteration"], r["j"]) for r in rb_a.select(3)] == a[2]     # select does not consume randomness
    other = ReplayBuffer(tmp_path / "d", "lambda_decay", lam=0.6, sample_size=12, seed=0)
    for it in (1, 2, 3):
        other.register(it, pairs(it, 6))
    other.register(4, [])
    assert [(r["iteration"], r["j"]) for r in other.select(4)] != a[2]    # the round is part of the key


def test_replay_mix_matches_the_weights():
    mix = replay_mix([4, 0, 3, 5], "lambda_decay", 0.5)
    assert mix[1] == {1: 1.0} and mix[3] == pytest.approx({4: 4 / 7, 3: 2 / 7, 1: 1 / 7})
    assert replay_mix([4, 0, 3], "nearest_k", None, 1)[2] == {3: 1.0}
    assert replay_mix([4, 0, 3], "current")[1] == {}


# ------------------------------------------------------------------ files on disk
def _write(path, text):
    path.write_text(text)
    return path


def test_malformed_files_name_the_file_and_the_record(tmp_path):
    good = {"iteration": 1, "num_pairs": 2, "pairs": pairs(1, 2)}
    p = _write(tmp_path / "iteration_0001.json", json.dumps(good))
    assert load_iteration_file(p, validate)["pairs"] == pairs(1, 2)
    text = json.dumps(good)
    cases = [
        (text[: len(text) // 2], "is not valid JSON (truncated?)"),
        (json.dumps({"iteration": 1, "pairs": []}), "missing field 'num_pairs'"),
        (json.dumps({"iteration": 1, "num_pairs": 0}), "missing field 'pairs'"),
        (json.dumps([1, 2]), "missing field 'iteration'"),
        (json.dumps({"iteration": 1, "num_pairs": 3, "pairs": pairs(1, 2)}), "num_pairs=3 but it holds 2 pairs"),
        (json.dumps({"iteration": 1, "num_pairs": 1, "pairs": "x"}), "num_pairs=1 but it holds no list of pairs"),
    ]
    for body, msg in cases:
        _write(p, body)
        with pytest.raises(ValueError) as e:
            load_iteration_file(p, validate)
        assert str(p) in str(e.value) and msg in str(e.value), str(e.value)
    bad = pairs(1, 2)
    bad[1]["loser_reward"] = "low"
    _write(p, json.dumps({"iteration": 1, "num_pairs": 2, "pairs": bad}))
    with pytest.raises(ValueError) as e:
        load_iteration_file(p, validate)
    assert f"{p}, record 1, field 'loser_reward': expected a finite number" in str(e.value)
    bad = pairs(1, 1)
    del bad[0]["winner_completions"]
    _write(p, json.dumps({"iteration": 1, "num_pairs": 1, "pairs": bad}))
    with pytest.raises(ValueError, match="record 0, field 'winner_completions': missing"):
        load_iteration_file(p, validate)
    with pytest.raises(FileNotFoundError, match="iteration_0009.json is missing"):
        load_iteration_file(tmp_path / "iteration_0009.json")


def test_select_reads_a_file_lazily_and_reports_its_damage(tmp_path):
    rb = ReplayBuffer(tmp_path, "all_history", validate=validate)
    rb.register(1, pairs(1, 3))
    rb.register(2, pairs(2, 3))
    index_only = {"index": rb.state_dict()["index"], "data": {}}
    lazy = ReplayBuffer(tmp_path, "all_history", validate=validate)
    lazy.load_state_dict(index_only, rewrite_files=False)                  # index restored, data read from the files
    assert source_counts(lazy.select(2)).keys() <= {1, 2}
    p = iteration_path(tmp_path, 1)
    p.write_text(p.read_text()[:40])
    damaged = ReplayBuffer(tmp_path, "all_history", validate=validate)
    damaged.load_state_dict(index_only, rewrite_files=False)
    with pytest.raises(ValueError, match=r"iteration_0001\.json is not valid JSON \(truncated\?\)"):
        damaged.select(2)


def test_state_dict_round_trip_rewrites_the_files(tmp_path):
    rb = ReplayBuffer(tmp_path, "lambda_decay", lam=0.5, seed=7, validate=validate)
    for it, m in {1: 4, 2: 0, 3: 5}.items():
        rb.register(it, pairs(it, m))
    state = rb.state_dict()
    original = {p.name: p.read_bytes() for p in tmp_path.glob("iteration_*.json")}
    sel = rb.select(3)
    rb.register(4, pairs(4, 2))                                            # a round after the "checkpoint"
    iteration_path(tmp_path, 1).unlink()                                   # a lost file
    iteration_path(tmp_path, 3).write_text("garbage")                      # a damaged one
    back = ReplayBuffer(tmp_path, "lambda_decay", lam=0.5, seed=7, validate=validate)
    back.load_state_dict(state)
    assert {p.name: p.read_bytes() for p in tmp_path.glob("iteration_*.json")} == original  # rewritten, round 4 removed
    assert back.select(3) == sel and back.index == rb.index[:3]
    assert [i for i, _ in back.datasets()] == [3, 1]


def test_an_earlier_runs_directory_is_not_imported(tmp_path):
    old = ReplayBuffer(tmp_path, "all_history")
    for it in (1, 2, 3):
        old.register(it, pairs(it, 4))
    new = ReplayBuffer(tmp_path, "all_history", sample_size=200)
    assert new.datasets() == []
    new.register(1, pairs(1, 2))
    assert source_counts(new.select(1)) == Counter({1: 200})              # rounds 2 and 3 of the old run are never read
    assert {r["j"] for r in new.select(1)} == {0, 1}
