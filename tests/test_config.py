"""Configs from documented groups: every public field has help text, each config is exactly the union of its groups,
the kept-but-unused fields warn once (the porting rule), removed fields refuse values with a reason, and
`comlrl-nb options` prints it all."""
import contextlib
import dataclasses
import io
import logging
import re

import pytest

from comlrl_nb.api import APIComparatorConfig
from comlrl_nb.cli import ALGORITHMS, _algorithms, main
from comlrl_nb.config import GROUPS, TrainerConfig, config_groups
from comlrl_nb.trainers.iterative import IterativeFields, MADPOIterConfig, MARLHFIterConfig
from comlrl_nb.trainers.madpo import MADPOConfig
from comlrl_nb.trainers.marlhf import MARLHFConfig, map_backend_config, rl_backend
from comlrl_nb.trainers.reinforce import MAGRPOConfig

CONFIGS = sorted({c for c, _ in _algorithms().values()} | {APIComparatorConfig, IterativeFields},
                 key=lambda c: c.__name__)
GROUP_OF = {f.name: g for g in GROUPS.values() for f in dataclasses.fields(g)}


def test_every_field_is_declared_once_in_a_group_with_help():
    declared = [f.name for g in GROUPS.values() for f in dataclasses.fields(g)]
    assert len(declared) == len(set(declared)), "a field is declared in two groups"
    assert all(f.metadata["help"].strip() for g in GROUPS.values() for f in dataclasses.fields(g))


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_public_config_field_has_help(cls):
    bare = [f.name for f in dataclasses.fields(cls) if not str(f.metadata.get("help", "")).strip()]
    assert not bare, f"{cls.__name__}: fields without help text: {bare}"


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_each_config_is_the_union_of_its_groups(cls):
    union = {f.name for g in cls.config_groups for f in dataclasses.fields(g)}
    assert {f.name for f in dataclasses.fields(cls)} == union
    assert all(f.metadata["group"] == GROUP_OF[f.name].group_name for f in dataclasses.fields(cls))
    assert set(config_groups(cls)) == {g.group_name for g in cls.config_groups}


def test_the_configs_keep_their_public_shape():
    assert issubclass(MAGRPOConfig, TrainerConfig) and MAGRPOConfig(num_generations=4).num_generations == 4
    c = MAGRPOConfig()
    assert list(dataclasses.asdict(c))[:6] == ["num_agents", "num_turns", "num_train_epochs", "agent_learning_rate",
                                               "logging_steps", "num_generations"]
    assert repr(c).startswith("MAGRPOConfig(num_agents=2, num_turns=1, num_train_epochs=20,")
    madpo = [n for n in (f.name for f in dataclasses.fields(MADPOConfig))
             if n in {f.name for f in dataclasses.fields(MAGRPOConfig)}]
    assert madpo == [f.name for f in dataclasses.fields(MAGRPOConfig)
                     if f.name not in ("num_generations", "rollout_batch_size")]
    assert list(dataclasses.asdict(MADPOIterConfig()))[0] == "num_iterations"  # the iterative fields come first
    for cfg, parent in ((MADPOConfig(), MAGRPOConfig), (MARLHFConfig(), MAGRPOConfig), (MADPOIterConfig(), MADPOConfig),
                        (MARLHFIterConfig(), MARLHFConfig)):
        assert isinstance(cfg, parent)  # the trainers' isinstance checks still hold
    api = {f.name for f in dataclasses.fields(APIComparatorConfig)}
    assert len(api) == 15 and api <= {f.name for f in dataclasses.fields(MADPOIterConfig)}
    assert all(GROUP_OF[n].group_name == "comparator_api" for n in api)        # declared once, in one group


@pytest.mark.parametrize("kw, msg", [
    (dict(num_generations=4), "MADPOConfig: num_generations is not an option of MADPOConfig: MADPO samples"),
    (dict(rollout_batch_size=2), "rollout_batch_size is not an option of MADPOConfig"),
])
def test_madpo_refuses_what_it_never_reads(kw, msg):
    with pytest.raises(ValueError, match=msg.replace("(", "\\(")):
        MADPOConfig(**kw)
    with pytest.raises(ValueError, match="MADPOIterConfig"):
        MADPOIterConfig(**kw)


def test_madpo_keeps_accepting_the_defaults_of_comlrl_1_4_3():
    c = MADPOConfig(discount=1.0, advantage_mode="mean", early_termination_threshold=None, reference_kl_coef=0.1)
    assert c.early_termination_threshold is None


@pytest.mark.parametrize("kw, msg", [
    (dict(value_loss_coef=0.3), "value_loss_coef=0.3 is not used with rl_algorithm='magrpo' (only maac, iac read it)"),
    (dict(rl_algorithm="maac", use_separate_critic=False), "(only iac read it)"),
])
def test_marlhf_refuses_what_its_backend_never_reads(kw, msg):
    with pytest.raises(ValueError, match=msg.replace("(", "\\(").replace(")", "\\)")):
        MARLHFConfig(**kw)


@pytest.mark.parametrize("cls", [MARLHFConfig, MARLHFIterConfig])
def test_marlhf_actor_critic_backends_take_one_generation(cls):
    "num_generations=1 is the actor-critic default (one episode per item); the group baselines still need 2."
    assert cls(rl_algorithm="iac", num_generations=1).num_generations == 1
    with pytest.raises(ValueError, match="num_generations=1 is invalid: must be >= 2"):
        cls(rl_algorithm="marloo", num_generations=1)


@pytest.mark.parametrize("algo", ["maac", "iac"])
def test_marlhf_passes_reference_kl_to_actor_critic_backends(algo):
    "MAAC and IAC implement the reference KL (issue 15), so MARLHF hands the setting to them like to MAGRPO."
    cfg = MARLHFConfig(rl_algorithm=algo, reference_kl_enabled=True, reference_kl_coef=0.5)
    backend = map_backend_config(cfg, rl_backend(algo).config_class)
    assert backend.reference_kl_enabled is True and backend.reference_kl_coef == 0.5


@pytest.mark.parametrize("algo", ["maac", "iac"])
def test_centralized_marlhf_actor_critic_config_has_one_agent(algo):
    "Centralized: the backend's team is the one actor (its devices: the first of a per-role list); the rest is copied."
    from comlrl_nb.trainers.marlhf import central_ac_config
    cfg = MARLHFConfig(collaboration_mode="centralized", rl_algorithm=algo, num_generations=1, value_loss_coef=0.3,
                       agent_devices=["cpu", "cpu"], reference_kl_enabled=True, reference_devices=["cpu", "cpu"])
    backend = central_ac_config(cfg, rl_backend(algo))
    assert type(backend) is rl_backend(algo).config_class and backend.num_agents == 1
    assert (backend.agent_devices, backend.reference_devices, backend.value_loss_coef) == ("cpu", "cpu", 0.3)
    assert backend.reference_kl_enabled and backend.num_generations == 1


@pytest.mark.parametrize("algo", ["magrpo", "mareinforce", "marloo", "maremax", "maac", "iac"])
def test_map_backend_config_is_the_old_same_name_copy(algo):
    extra = {"value_loss_coef": 0.3} if algo in ("maac", "iac") else {"reference_kl_enabled": True}
    cfg = MARLHFConfig(rl_algorithm=algo, num_generations=6, rollout_buffer_size=4, agent_learning_rate=1e-2, **extra)
    cls = rl_backend(algo).config_class
    names = {f.name for f in dataclasses.fields(cls)} - {"advantage_mode"}
    assert map_backend_config(cfg, cls) == cls(**{k: getattr(cfg, k) for k in names if hasattr(cfg, k)})


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_options_prints_every_field_with_its_help(algo):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["options", "--algo", algo]) == 0
    text, cls = buf.getvalue(), _algorithms()[algo][0]
    assert text.startswith(f"{cls.__name__}: {len(dataclasses.fields(cls))} options")
    for f in dataclasses.fields(cls):
        assert f"  {f.name}: " in text and f.metadata["help"].split()[0] in text
    for g in config_groups(cls):
        assert f"[{g}] {GROUPS[g].__doc__.strip()}" in text


# ------------------------------------------------------------- fields and values of comlrl 1.4.3 (issue 14, SPEC 9)
from comlrl_nb.trainers.actor_critic import IACConfig, MAACConfig  # noqa: E402


ALL = [MAGRPOConfig, MAACConfig, IACConfig, MADPOConfig, MARLHFConfig, MADPOIterConfig, MARLHFIterConfig]


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_library_spellings_of_top_k_and_parallel_training(cls):
    assert cls(top_k=0).top_k is None                           # 0 = no top-k, as in HF generate
    with pytest.raises(ValueError, match=r"top_k=-1 is invalid: must be >= 0"):
        cls(top_k=-1)
    for spelling in (None, "null", " None "):
        assert cls(parallel_training=spelling).parallel_training == "none"
    for bad in ("auto", "invalid"):
        with pytest.raises(ValueError, match=f"parallel_training='{bad}' is invalid: use one of none, mp"):
            cls(parallel_training=bad)


@pytest.mark.parametrize("cls", [MAACConfig, IACConfig], ids=lambda c: c.__name__)
def test_actor_critic_mp_names_the_missing_device_field(cls):
    with pytest.raises(ValueError, match="needs agent_devices"):
        cls(parallel_training="mp", critic_devices="cpu")
    with pytest.raises(ValueError, match="needs critic_devices"):
        cls(parallel_training="mp", agent_devices="cpu")
    assert cls(parallel_training="mp", agent_devices="cpu", critic_devices="cpu").parallel_training == "mp"
    with pytest.raises(ValueError, match="critic_devices length 3"):
        cls(critic_devices=["cpu"] * 3)


@pytest.mark.parametrize("cls", [MAGRPOConfig, MAACConfig, IACConfig], ids=lambda c: c.__name__)
def test_reference_devices_longer_than_the_agents_is_refused(cls):
    with pytest.raises(ValueError, match="reference_devices length 3 does not fit 2 agents"):
        cls(reference_devices=["cpu"] * 3)
    if cls is MAGRPOConfig:
        assert cls(reference_devices=["cpu", "cpu"]).reference_devices == ["cpu", "cpu"]
    else:                                           # MAAC/IAC read the reference-KL fields too (issue 15, item 3)
        assert cls(reference_kl_enabled=True, reference_devices=["cpu", "cpu"]).reference_devices == ["cpu", "cpu"]
        with pytest.raises(ValueError, match="reference_kl_coef=-0.1"):
            cls(reference_kl_enabled=True, reference_kl_coef=-0.1)


def test_comparator_history_k_none_means_one():
    for cls in (MADPOIterConfig, MARLHFIterConfig):
        assert cls(comparator_history_k=None).comparator_history_k == 1


def test_madpo_environment_step_fields():
    for cls in (MADPOConfig, MADPOIterConfig):
        c = cls()
        assert (c.use_environment_step, c.environment_steps_per_pair) == (True, 2)       # comlrl 1.4.3's defaults
        assert cls(use_environment_step=False, environment_steps_per_pair=1).environment_steps_per_pair == 1
        with pytest.raises(ValueError, match="environment_steps_per_pair=0 is invalid: must be >= 1"):
            cls(environment_steps_per_pair=0)
        with pytest.raises(ValueError, match="use_environment_step='yes' is invalid"):
            cls(use_environment_step="yes")


@pytest.mark.parametrize("cls", [MARLHFConfig, MARLHFIterConfig], ids=lambda c: c.__name__)
def test_marlhf_collaboration_mode_and_dpo_beta(cls):
    c = cls()
    assert (c.collaboration_mode, c.dpo_beta) == ("decentralized", 0.1)
    assert cls(collaboration_mode="Decentralized".lower(), dpo_beta=0.1).collaboration_mode == "decentralized"
    assert cls(collaboration_mode="centralized").collaboration_mode == "centralized"     # one actor, centralized MAGRPO
    for algo in ("maac", "iac"):                                     # one actor, MAAC/IAC over a one-agent team
        assert cls(collaboration_mode="centralized", rl_algorithm=algo, num_generations=1).num_agents == 2
    with pytest.raises(ValueError, match="num_turns=2"):
        cls(collaboration_mode="centralized", rl_algorithm="iac", num_turns=2)
    with pytest.raises(ValueError, match="collaboration_mode='misspelled' is invalid"):
        cls(collaboration_mode="misspelled")
    assert cls(dpo_beta=0.5).dpo_beta == 0.5                     # accepted with a warning (the porting rule below)
    assert cls(environment_steps_per_pair=1).environment_steps_per_pair == 1


def test_log_reward_distribution_is_a_flag_of_the_iterative_configs():
    for cls in (MADPOIterConfig, MARLHFIterConfig):
        assert cls().log_reward_distribution is False and cls(log_reward_distribution=True).log_reward_distribution
        with pytest.raises(ValueError, match="log_reward_distribution=1 is invalid"):
            cls(log_reward_distribution=1)


# ------------------------------------------------------------------ the two that change what a run logs
ITEMS = [{"prompt": p} for p in ["Write a story", "Explain physics", "Create a recipe"]]
TINY = dict(preference_num_candidates=4, preference_pairs_per_sample=2, max_new_tokens=5, temperature=1.0, top_p=1.0,
            top_k=0, agent_learning_rate=1e-3, eval_interval=0, logging_steps=1000, progress_bar=False, save_plot=False,
            save_steps=-1, train_batch_size=2)


def _vowels(a, b):
    f = lambda s: sum(ch in "aeiou " for ch in s) / max(len(s), 1)
    return [0.5 * f(x) + 0.5 * f(y) for x, y in zip(a, b)]


def test_madpo_logs_environment_steps(tmp_path):
    import torch
    from comlrl_nb.engine import read_metrics
    from comlrl_nb.models import make_tiny_model
    from comlrl_nb.trainers.madpo import MADPOTrainer
    torch.set_num_threads(1)
    m, tok = make_tiny_model(seed=0)
    out = {}
    for steps in (True, False):
        cfg = MADPOConfig(**TINY, num_train_epochs=2, output_dir=str(tmp_path / str(steps)), use_environment_step=steps,
                          environment_steps_per_pair=3)
        tr = MADPOTrainer(agents=[m, m], tokenizer=tok, reward_func=_vowels, args=cfg, train_dataset=ITEMS)
        res = tr.train()
        out[steps] = [r for r in read_metrics(res["metrics_path"]) if "dpo/loss" in r]
    rows, pairs = out[True], res["num_pairs"]
    assert pairs > 0 and len(rows) == 2 * -(-pairs // 2)
    sizes = [len(range(s, min(pairs, s + 2))) for s in range(0, pairs, 2)] * 2      # pairs per batch, 2 epochs
    assert [r["env_step"] for r in rows] == [3 * sum(sizes[:i + 1]) for i in range(len(sizes))]
    assert all("env_step" not in r for r in out[False])
    d = str(tmp_path / "resumed")                                   # the count lives in the checkpointed state
    make = lambda: MADPOTrainer(agents=[m, m], tokenizer=tok, reward_func=_vowels, train_dataset=ITEMS,
                                args=MADPOConfig(**TINY, num_train_epochs=2, output_dir=d,
                                                 environment_steps_per_pair=3))
    assert make().train(stop_after_batch=2)["stopped"]
    path = make().train(resume_from_checkpoint=True)["metrics_path"]
    resumed = [r["env_step"] for r in read_metrics(path) if "dpo/loss" in r]
    assert resumed == [r["env_step"] for r in rows]


def test_iterative_reward_distribution_needs_a_range_and_logs_histograms(tmp_path):
    import torch
    from comlrl_nb.engine import read_metrics
    from comlrl_nb.models import make_tiny_model
    from comlrl_nb.porting import set_reward_range
    from comlrl_nb.trainers.iterative import MADPOIterTrainer
    torch.set_num_threads(1)
    m, tok = make_tiny_model(seed=0)
    reward = lambda a, b: _vowels(a, b)
    cfg = MADPOIterConfig(**TINY, num_iterations=1, output_dir=str(tmp_path), log_reward_distribution=True)
    with pytest.raises(ValueError, match="log_reward_distribution=True needs the reward's raw range"):
        MADPOIterTrainer(agents=[m, m], tokenizer=tok, reward_func=reward, args=cfg, train_dataset=ITEMS)
    set_reward_range(reward, 0, 1)
    tr = MADPOIterTrainer(agents=[m, m], tokenizer=tok, reward_func=reward, args=cfg, train_dataset=ITEMS)
    rows = read_metrics(tr.train()["metrics_path"])
    rnd = [r for r in rows if r.get("phase") == "round" and r.get("iteration", 0) >= 1][0]
    for side in ("target_raw", "comparator_raw"):
        hist = rnd[f"round/{side}_hist"]
        assert len(hist) == 10 and sum(hist) == len(ITEMS) * 4                      # every candidate's raw reward
        assert rnd[f"round/{side}_hist_edges"][0] == 0.0 and rnd[f"round/{side}_hist_edges"][-1] == 1.0
        assert 0 <= rnd[f"round/{side}_p10"] <= rnd[f"round/{side}_p50"] <= rnd[f"round/{side}_p90"] <= 1
    train = [r for r in rows if r.get("phase") == "train"]
    assert train and train[-1]["env_step"] == 2 * rnd["round/train_pairs"] * cfg.num_train_epochs     # 2 steps per pair


def test_yaml_numeric_strings_become_floats_in_every_config():
    "YAML 1.1 reads 5e-6 as a string: every config stores the float it spells (not the string), and refuses text."
    from comlrl_nb import MAACConfig, MADPOConfig, MAGRPOConfig
    for cls in (MAGRPOConfig, MAACConfig, MADPOConfig):
        c = cls(agent_learning_rate="5e-6")
        assert type(c.agent_learning_rate) is float and c.agent_learning_rate == 5e-6, cls.__name__
        with pytest.raises(ValueError, match="agent_learning_rate='fast' is invalid"):
            cls(agent_learning_rate="fast")


# ------------------------------------------------------------- the porting rule (issue P3, SPEC 10)
from comlrl_nb.trainers.centralized import CentralizedMAGRPOConfig  # noqa: E402

URL = "http://h/x"
NO_EFFECT = [
    (MADPOConfig, dict(reference_devices="cpu"), "reference_devices='cpu'", "MADPO is reference-free"),
    (MADPOIterConfig, dict(reference_devices=["cpu", "cpu"]), "reference_devices=['cpu', 'cpu']", "reference-free"),
    (MADPOConfig, dict(discount=0.9), "discount=0.9", "its episodes are single-turn"),
    (MADPOIterConfig, dict(advantage_mode="rloo"), "advantage_mode='rloo'", "there is no baseline"),
    (MADPOConfig, dict(reference_kl_coef=0.5), "reference_kl_coef=0.5", "MADPO is reference-free"),
    (MARLHFConfig, dict(advantage_mode="max"), "advantage_mode='max'", "baseline comes from rl_algorithm"),
    (MARLHFIterConfig, dict(dpo_beta=0.5), "dpo_beta=0.5", "there is no DPO loss"),
    (MARLHFConfig, dict(environment_steps_per_pair=1), "environment_steps_per_pair=1", "not by pairs"),
    (CentralizedMAGRPOConfig, dict(discount=0.5), "discount=0.5", "single-turn"),
    (CentralizedMAGRPOConfig, dict(joint_mode="cross"), "joint_mode='cross'", "one actor writes each joint response"),
    (MADPOIterConfig, dict(comparator_devices="cpu"), "comparator_devices='cpu'", "pick one of those"),
    (MARLHFIterConfig, dict(comparator_policy="api", comparator_api_url=URL, comparator_devices="cpu"),
     "comparator_devices='cpu'", "(this one is 'api')"),
    (MARLHFIterConfig, dict(comparator_api_url=URL), f"comparator_api_url='{URL}'", "set comparator_policy='api'"),
    (MADPOIterConfig, dict(comparator_policy="history", comparator_api_url=URL), "comparator_api_url=", "'history'"),
    (MADPOIterConfig, dict(comparator_policy="api", comparator_api_url=URL, comparator_model_name="m"),
     "comparator_model_name='m'", "set comparator_policy='model'"),
    (MADPOIterConfig, dict(comparator_policy="api", comparator_api_url=URL, comparator_agents=["a", "b"]),
     "comparator_agents=['a', 'b']", "compares with the remote model"),
    (IACConfig, dict(value_clip_range=0.3), "value_clip_range=0.3", "separate critics never read it"),
    (IACConfig, dict(value_head_hidden_dim=16), "value_head_hidden_dim=16", "value heads on the actors"),
]


@pytest.mark.parametrize("cls, kw, shown, why", NO_EFFECT, ids=lambda x: getattr(x, "__name__", None))
def test_a_field_the_library_accepts_that_changes_nothing_here_warns_once(cls, kw, shown, why, caplog):
    "What comlrl 1.4.3 accepts, we accept: the config builds, keeps the value, and says once that it is ignored."
    caplog.set_level(logging.WARNING, logger="comlrl_nb")
    name = shown.split("=")[0]
    cfg = cls(**kw)
    assert getattr(cfg, name) == kw[name]
    msgs = [r.getMessage() for r in caplog.records if r.name == "comlrl_nb" and r.levelno == logging.WARNING]
    assert len(msgs) == 1, msgs
    assert msgs[0].startswith(f"{cls.__name__}: {shown}") and " has no effect here: " in msgs[0], msgs[0]
    assert why in msgs[0] and msgs[0].endswith("it is accepted (comlrl 1.4.3 accepts it) and ignored"), msgs[0]


def test_the_warning_comes_once_per_field_and_construction(caplog):
    caplog.set_level(logging.WARNING, logger="comlrl_nb")
    MADPOConfig(discount=0.9, reference_devices="cpu")
    MADPOConfig(discount=0.9)
    fields_named = [r.getMessage().split(": ")[1].split("=")[0] for r in caplog.records if r.name == "comlrl_nb"]
    assert fields_named == ["discount", "reference_devices", "discount"]
    caplog.clear()
    MADPOConfig(discount=1.0, reference_devices=None, advantage_mode="mean")     # the defaults: silent
    assert not [r for r in caplog.records if r.name == "comlrl_nb"]


@pytest.mark.parametrize("cls, kw, msg", [
    (MADPOConfig, dict(rollout_batch_size=2), "rollout_batch_size is not an option of MADPOConfig"),   # ours
    (MAGRPOConfig, dict(autocast_dtype="int3"), "MAGRPOConfig: autocast_dtype='int3'"),                 # ours
    (MADPOIterConfig, dict(comparator_max_new_tokens=0), "comparator_max_new_tokens=0 is invalid: must be >= 1"),
    (MADPOIterConfig, dict(comparator_policy="current_copy", comparator_model_name="m"),   # the library refuses it too
     "only used with comparator_policy='model'"),
    (MADPOConfig, dict(reference_devices=3), "MADPOConfig.reference_devices=3 is invalid"),   # invalid, not ignored
])
def test_our_own_fields_and_what_the_library_refuses_stay_errors(cls, kw, msg):
    with pytest.raises(ValueError, match=re.escape(msg)):
        cls(**kw)
