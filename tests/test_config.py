"""Configs from documented groups: every public field has help text, each config is exactly the union of its groups,
the kept-but-unused and removed fields refuse values with a reason, and `comlrl-nb options` prints it all."""
import contextlib
import dataclasses
import io

import pytest

from comlrl_nb.api import APIComparatorConfig
from comlrl_nb.cli import ALGORITHMS, _algorithms, main
from comlrl_nb.config import GROUPS, TrainerConfig, config_groups
from comlrl_nb.trainers.iterative import IterativeFields, MADPOIterConfig, MARLHFIterConfig
from comlrl_nb.trainers.madpo import MADPOConfig
from comlrl_nb.trainers.marlhf import MARLHFConfig, map_backend_config, rl_backend
from comlrl_nb.trainers.reinforce import MAGRPOConfig

CONFIGS = sorted({c for c, _ in _algorithms().values()} | {APIComparatorConfig, IterativeFields}, key=lambda c: c.__name__)
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
    madpo = [n for n in (f.name for f in dataclasses.fields(MADPOConfig)) if n in {f.name for f in dataclasses.fields(MAGRPOConfig)}]
    assert madpo == [f.name for f in dataclasses.fields(MAGRPOConfig) if f.name not in ("num_generations", "rollout_batch_size")]
    assert list(dataclasses.asdict(MADPOIterConfig()))[0] == "num_iterations"            # the iterative fields come first
    for cfg, parent in ((MADPOConfig(), MAGRPOConfig), (MARLHFConfig(), MAGRPOConfig), (MADPOIterConfig(), MADPOConfig),
                        (MARLHFIterConfig(), MARLHFConfig)):
        assert isinstance(cfg, parent)                                       # the trainers' isinstance checks still hold
    api = {f.name for f in dataclasses.fields(APIComparatorConfig)}
    assert len(api) == 15 and api <= {f.name for f in dataclasses.fields(MADPOIterConfig)}
    assert all(GROUP_OF[n].group_name == "comparator_api" for n in api)        # declared once, in one group


@pytest.mark.parametrize("kw, msg", [
    (dict(num_generations=4), "MADPOConfig: num_generations is not an option of MADPOConfig: MADPO samples"),
    (dict(rollout_batch_size=2), "rollout_batch_size is not an option of MADPOConfig"),
    (dict(discount=0.9), "discount=0.9 is not used by MADPOConfig: its episodes are single-turn"),
    (dict(advantage_mode="rloo"), "advantage_mode='rloo' is not used by MADPOConfig"),
    (dict(reference_kl_coef=0.5), "reference_kl_coef=0.5 is not used by MADPOConfig: MADPO is reference-free"),
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
    (dict(advantage_mode="max"), "the policy phase's baseline comes from rl_algorithm"),
    (dict(value_loss_coef=0.3), "value_loss_coef=0.3 is not used with rl_algorithm='magrpo' (only maac, iac read it)"),
    (dict(rl_algorithm="maac", use_separate_critic=False), "(only iac read it)"),
    (dict(rl_algorithm="iac", reference_kl_coef=0.5), "(only magrpo, mareinforce, marloo, maremax read it)"),
])
def test_marlhf_refuses_what_its_backend_never_reads(kw, msg):
    with pytest.raises(ValueError, match=msg.replace("(", "\\(").replace(")", "\\)")):
        MARLHFConfig(**kw)


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
