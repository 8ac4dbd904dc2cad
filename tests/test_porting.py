"""Two ports shaped like real projects written for the existing library: only the import changes (`comlrl.` ->
`comlrl_nb.`).

Each reads a YAML file whose sections become configs via `Config(**section)`, passes the library's `model_config`
and `wandb_config` dictionaries (a stand-in `wandb` module with the real `wandb.init` signature records the run),
and uses a reward in the library's form (prompts first) that looks its task item up by prompt, as the authors'
projects do. Tiny models are built in-process and saved to a directory, so the scripts load them by path.
"""
import importlib.machinery
import json
import sys
import types

import pytest
import torch
import yaml

from comlrl_nb.models import make_tiny_model
# --- what a ported script imports (the library's paths with comlrl_nb in front) ---
from comlrl_nb.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
from comlrl_nb.trainers.actor_critic import MAACConfig, MAACTrainer
from comlrl_nb.utils.reward_processor import RewardProcessors

ITEMS = [{"task_id": "t0", "question": "add two and three"}, {"task_id": "t1", "question": "name a color"}]


def formatter(role):
    return lambda item: f"[{role}] {item['question']}"


FORMATTERS = [formatter("writer"), formatter("critic")]
PROMPT_TO_ITEM = {f(it): it for it in ITEMS for f in FORMATTERS}


class StandInWandb(types.ModuleType):
    "A `wandb` module whose init has the real signature; it records what a run receives."
    def __init__(self):
        super().__init__("wandb")
        self.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
        self.inits, self.logged = [], []

    def init(self, entity=None, project=None, dir=None, id=None, name=None, notes=None, tags=None, config=None,
             config_exclude_keys=None, config_include_keys=None, allow_val_change=None, group=None, job_type=None,
             mode=None, force=None, anonymous=None, reinit=None, resume=None, resume_from=None, fork_from=None,
             save_code=None, tensorboard=None, sync_tensorboard=None, monitor_gym=None, settings=None):
        self.inits.append(dict(entity=entity, project=project, dir=dir, name=name, tags=tags, config=config, mode=mode,
                               id=id, resume=resume))
        logged = self.logged
        return types.SimpleNamespace(id=id or f"run-{len(self.inits)}", project=project, entity=entity,
                                     log=lambda data, step=None, commit=None: logged.append(dict(data)),
                                     finish=lambda exit_code=None, quiet=None: None)


@pytest.fixture
def wandb(monkeypatch):
    mod = StandInWandb()
    monkeypatch.setitem(sys.modules, "wandb", mod)
    return mod


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-agent")
    model, tok = make_tiny_model(seed=0)
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


def load_project_yaml(tmp_path, text):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return yaml.safe_load(path.read_text())


MAGRPO_YAML = """
model:
  dtype: float32
  special_tokens:
    additional_special_tokens: ["<feedback>"]
dataset:
  name: toy-questions
  type: qa
external:
  mode: feedback
magrpo:
  num_agents: 2
  num_turns: 2
  num_train_epochs: 1
  num_generations: 2
  max_new_tokens: 4
  agent_learning_rate: 1.0e-4
  temperature: 0.8
  top_p: 0.9
  discount: 0.9
  logging_steps: 1
  rollout_buffer_size: 2
  eval_interval: 1
  eval_num_samples: 2
  early_termination_threshold: null
wandb:
  project: port-test
  name: two-turn-magrpo
  tags: [magrpo, two-turn]
  mode: offline
"""


@pytest.fixture(scope="module")
def magrpo_run(tmp_path_factory, model_dir):
    "Run the two-turn MAGRPO project once; the tests below read what it did."
    torch.set_num_threads(1)
    tmp_path = tmp_path_factory.mktemp("magrpo-project")
    cfg = load_project_yaml(tmp_path, MAGRPO_YAML)
    args = MAGRPOConfig(**cfg["magrpo"], output_dir=str(tmp_path / "run"))
    seen = {"looked_up": [], "transitions": [], "eval_turns": []}

    def reward(prompts, writer, critic):                    # the library's form: prompts first
        assert isinstance(prompts, list) and all(isinstance(p, str) for p in prompts), prompts
        item = PROMPT_TO_ITEM.get(prompts[0], {})
        seen["looked_up"].append(item.get("task_id"))
        return [float(len(a) < len(b)) + 0.1 * (item.get("task_id") == "t0") for a, b in zip(writer, critic)]

    def transition(prompt, agent_completions, num_agents, prompt_history_per_agent=None,
                   response_history_per_agent=None, **_):
        seen["transitions"].append(prompt)
        return [f"<feedback> revise: {prompt_history_per_agent[i][-1]}" for i in range(num_agents)]

    def eval_logger(agent_completions_turns, batch_items, prompts):
        seen["eval_turns"].extend(len(agent_completions_turns[0][j]) for j in range(len(batch_items)))
        return [{"turns": len(agent_completions_turns[0][j])} for j in range(len(batch_items))]

    def eval_aggregator(metrics, num_turns=1):
        return {"turn_2/items_reached": sum(m["turns"] >= 2 for m in metrics) / max(len(metrics), 1)}

    wandb, saved = StandInWandb(), sys.modules.get("wandb")
    sys.modules["wandb"] = wandb
    try:
        trainer = MAGRPOTrainer(
            agent_model=model_dir, reward_func=reward, reward_processor=RewardProcessors.scale(2.0),
            formatters=FORMATTERS, args=args, train_dataset=ITEMS, eval_dataset=ITEMS, external_transition=transition,
            eval_logger=eval_logger, eval_aggregator=eval_aggregator,
            model_config={"dtype": cfg["model"]["dtype"], "special_tokens": cfg["model"]["special_tokens"]},
            wandb_config={**cfg["wandb"],
                          "config_sections": {k: cfg[k] for k in ("dataset", "model", "external", "magrpo")}})
        trainer.train()
    finally:
        if saved is None: sys.modules.pop("wandb", None)
        else: sys.modules["wandb"] = saved
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    return dict(seen, cfg=cfg, trainer=trainer, wandb=wandb,
                evals=[r for r in rows if any(k.startswith("eval/") for k in r)])


def test_two_turn_magrpo_project(magrpo_run):
    r, cfg = magrpo_run, magrpo_run["cfg"]
    assert r["trainer"].num_agents == 2
    assert all("<feedback>" in t.all_special_tokens for t in r["trainer"].tokenizers)
    # the reward always found its item: the library form got [agent 1's prompt] as plain strings
    assert r["looked_up"] and None not in r["looked_up"]
    assert r["transitions"], "the external transition never ran"
    run = r["wandb"].inits[0]
    assert (run["project"], run["name"], run["tags"], run["mode"]) == ("port-test", "two-turn-magrpo",
                                                                      ["magrpo", "two-turn"], "offline")
    assert run["config"]["dataset"] == cfg["dataset"] and run["config"]["magrpo"] == cfg["magrpo"]
    assert run["config"]["dataset_name"] == "toy-questions" and run["config"]["num_turns"] == 2
    assert r["evals"], "no evaluation was logged"


def test_two_turn_magrpo_evaluates_every_turn(magrpo_run):
    assert set(magrpo_run["eval_turns"]) == {2}
    assert all(r.get("eval/turn_2/items_reached") == 1.0 for r in magrpo_run["evals"])
    assert all("eval/turn_2/reward_mean" in r and "eval/turn_2/expected_return" in r for r in magrpo_run["evals"])


MAAC_YAML = """
model:
  torch_dtype: float32
critic:
  torch_dtype: float32
maac:
  num_agents: 2
  num_turns: 1
  num_train_epochs: 2
  num_generations: 1
  max_new_tokens: 4
  agent_learning_rate: 1.0e-4
  critic_learning_rate: 1.0e-4
  rollout_buffer_size: 2
  logging_steps: 1
  eval_interval: 0
wandb:
  project: port-test
  run_name: maac-lookup
"""


def test_actor_critic_reward_looks_its_item_up_by_prompt(tmp_path, wandb, model_dir):
    torch.set_num_threads(1)
    cfg = load_project_yaml(tmp_path, MAAC_YAML)
    args = MAACConfig(**cfg["maac"], output_dir=str(tmp_path / "run"))
    calls = []

    def lookup(prompts):
        for p in prompts:
            if p in PROMPT_TO_ITEM:
                return PROMPT_TO_ITEM[p]
        return {}

    def reward(prompts, writer, critic):                    # the shape of the class-completion project's reward
        item = lookup(prompts)
        calls.append((list(prompts), item.get("task_id"), len(writer)))
        return [1.0 if item.get("task_id") == "t0" else 0.0 for _ in writer]

    trainer = MAACTrainer(
        agent_model=model_dir, critics=[model_dir], reward_func=reward, formatters=FORMATTERS, args=args,
        train_dataset=ITEMS,
        model_config={"model_kwargs": {"torch_dtype": cfg["model"]["torch_dtype"]},
                      "critic_model_kwargs": {"torch_dtype": cfg["critic"]["torch_dtype"]}},
        wandb_config=cfg["wandb"])
    trainer.train()

    assert calls, "the reward was never called"
    for prompts, task_id, n in calls:
        # the library's actor-critic layout: a flat list with every agent's prompt, one call per task item
        assert len(prompts) == 2 and all(isinstance(p, str) for p in prompts), prompts
        assert task_id is not None, f"the reward could not find its item from {prompts}"
        assert PROMPT_TO_ITEM[prompts[0]] is PROMPT_TO_ITEM[prompts[1]]
        assert n == 1
    assert {t for _, t, _ in calls} == {"t0", "t1"}
    assert wandb.inits[0]["name"] == "maac-lookup" and wandb.inits[0]["config"]["num_agents"] == 2
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rewards = [r[k] for r in rows for k in r if k.endswith("reward_mean") and not k.startswith("eval/")]
    assert rewards and all(0.0 <= x <= 1.0 for x in rewards)
    assert any(x > 0 for x in rewards)                     # the items were found, so t0 scores 1


@pytest.mark.parametrize("algo", ["magrpo", "maac", "iac"])
def test_keyword_prompts_reward_finds_its_item_in_every_trainer(tmp_path, model_dir, algo):
    """A reward taking `prompts=` (and `batch_items=`) by keyword, as the library's own helpers do, gets what the
    library passes: MAGRPO [agent 1's prompt] per joint response, MAAC/IAC [every agent's prompt] per item, with
    `batch_items=[item]`, also when a batch holds several items; so looking the item up by prompt scores the right
    item."""
    from comlrl_nb.trainers.actor_critic import IACConfig, IACTrainer
    torch.set_num_threads(1)
    calls = []

    def reward(writer, critic, *, prompts, batch_items):
        item = next((PROMPT_TO_ITEM[p] for p in prompts if p in PROMPT_TO_ITEM), {})
        calls.append((list(prompts), item.get("task_id"), batch_items[0]["task_id"], len(batch_items), len(writer)))
        return [1.0 if item.get("task_id") == "t0" else 0.0 for _ in writer]

    common = dict(num_train_epochs=1, max_new_tokens=3, rollout_batch_size=2, logging_steps=1,
                  output_dir=str(tmp_path / "run"))
    if algo == "magrpo":
        trainer = MAGRPOTrainer(agent_model=model_dir, reward_func=reward, formatters=FORMATTERS, train_dataset=ITEMS,
                                args=MAGRPOConfig(num_agents=2, num_generations=2, rollout_buffer_size=4, **common))
    else:
        cfg, cls = (MAACConfig, MAACTrainer) if algo == "maac" else (IACConfig, IACTrainer)
        trainer = cls(agent_model=model_dir, critics=[model_dir] * (1 if algo == "maac" else 2), reward_func=reward,
                      formatters=FORMATTERS, train_dataset=ITEMS,
                      args=cfg(num_agents=2, num_generations=2, rollout_buffer_size=4, eval_interval=0, **common))
    trainer.train()

    assert {c[1] for c in calls} == {"t0", "t1"}, calls           # both items of the one batch were found
    for prompts, found, given, n_items, n in calls:
        assert found == given and n_items == 1, (prompts, found, given)
        assert all(isinstance(p, str) for p in prompts)
        assert len(prompts) == (1 if algo == "magrpo" else 2)
        assert prompts[0] == FORMATTERS[0](PROMPT_TO_ITEM[prompts[0]])
        assert n == (1 if algo == "magrpo" else 2)      # as the library: per joint response / per item


@pytest.mark.parametrize("algo", ["magrpo", "maac"])
def test_batch_items_first_entry_is_the_scored_item_with_several_items_per_batch(tmp_path, model_dir, algo):
    """A library reward reading `batch_items[0]` (no prompts) is called per item, so it never scores another item's
    answers."""
    torch.set_num_threads(1)
    calls = []

    def reward(writer, critic, batch_items=None):
        calls.append([it["task_id"] for it in batch_items])
        return [1.0 if batch_items[0]["task_id"] == "t0" else 0.0 for _ in writer]

    common = dict(num_agents=2, num_train_epochs=1, max_new_tokens=3, num_generations=2, rollout_batch_size=2,
                  rollout_buffer_size=4, logging_steps=1, output_dir=str(tmp_path / "run"))
    if algo == "magrpo":
        trainer = MAGRPOTrainer(agent_model=model_dir, reward_func=reward, formatters=FORMATTERS, train_dataset=ITEMS,
                                args=MAGRPOConfig(**common))
    else:
        trainer = MAACTrainer(agent_model=model_dir, critics=[model_dir], reward_func=reward, formatters=FORMATTERS,
                              train_dataset=ITEMS, args=MAACConfig(eval_interval=0, **common))
    trainer.train()
    assert sorted(c[0] for c in calls) == ["t0", "t1"]                  # one call per item of the batch
    assert all(len(set(c)) == 1 and len(c) == 2 for c in calls)          # each with that item's two joint responses


def test_per_agent_prompt_lists_come_by_agent_prompts_and_a_mismatch_is_an_error():
    from comlrl_nb.rewards import RewardError, RewardFunction
    comps, items = [["a", "b"], ["c", "d"]], [ITEMS[0], ITEMS[1]]
    prompts = [[FORMATTERS[0](it) for it in items], [FORMATTERS[1](it) for it in items]]
    seen = []
    rf = RewardFunction(lambda w, c, agent_prompts: seen.append(agent_prompts) or [0.0, 1.0], 2)
    assert rf(comps, items, prompts) == [0.0, 1.0] and seen == [prompts]       # one batched call, per-agent lists
    # written for per-agent lists but taking prompts=: the library layout arrives, and the error names the fix
    rf = RewardFunction(lambda w, c, prompts: [float(p in PROMPT_TO_ITEM) for p in prompts[0]], 2)
    with pytest.raises(RewardError, match="take agent_prompts= instead"):
        rf(comps, items, prompts)


def test_library_form_reward_without_prompts_is_an_error_not_a_silent_value():
    from comlrl_nb.rewards import RewardFunction
    rf = RewardFunction(lambda prompts, a, b: [1.0] * len(a), 2)
    with pytest.raises(ValueError, match="needs the trainer to pass batch_items and prompts"):
        rf([["x"], ["y"]])


# ------------------------------------------------------------------ what the library's own suite asked for
def test_centralized_magrpo_takes_the_library_adapter_and_evaluate_argument(tmp_path):
    """`centralized_adapter=`, `num_agents` = the one actor, `evaluate(num_eval_samples=)`, as a ported script calls
    them."""
    from comlrl_nb.trainers.reinforce import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer
    from comlrl_nb.trainers.preference import TaggedCentralizedComparatorAdapter
    torch.set_num_threads(1)

    class Adapter(TaggedCentralizedComparatorAdapter):
        def __init__(self): self.built = []
        def build_prompt(self, item, agent_prompts):
            self.built.append(list(agent_prompts))
            return "joint: " + " | ".join(agent_prompts)

    m, tok = make_tiny_model(seed=0)
    ad = Adapter()
    tr = CentralizedMAGRPOTrainer(agents=[m], num_agents=2, tokenizer=tok, formatters=FORMATTERS,
                                  reward_func=lambda a, b: [float(len(x) + len(y)) for x, y in zip(a, b)],
                                  args=CentralizedMAGRPOConfig(num_generations=2, max_new_tokens=4, eval_num_samples=4,
                                                               output_dir=str(tmp_path)),
                                  train_dataset=ITEMS, eval_dataset=ITEMS, centralized_adapter=ad)
    assert (tr.num_agents, tr.args.num_agents, len(tr.agents)) == (1, 2, 1)
    out = tr.evaluate(num_eval_samples=1)
    assert ad.built == [[FORMATTERS[0](ITEMS[0]), FORMATTERS[1](ITEMS[0])]]          # one item, both roles' prompts
    assert "eval/turn_1/reward_mean" in out
    assert tr.split("<agent_0>a</agent_0><agent_1>b</agent_1>") == ["a", "b"]       # the adapter's parser
    assert tr.split("no tags") is None                                             # its parse error: unparsed
    with pytest.raises(ValueError, match="disagree"):
        tr.evaluate(2, num_eval_samples=1)
    from comlrl_nb.trainers.preference import MADPOConfig, MADPOTrainer
    joint = MADPOTrainer(agents=[m], tokenizer=tok, reward_func=lambda a, b: [0.0] * len(a),
                         args=MADPOConfig(collaboration_mode="centralized"))
    assert (joint.num_agents, joint.args.num_agents) == (1, 2)                  # the library's count: trained models
    with pytest.raises(TypeError, match="takes no centralized_adapter"):
        MAGRPOTrainer(agents=[m, m], tokenizer=tok, reward_func=lambda a, b: [0.0] * len(a), centralized_adapter=ad)


def test_iac_critic_arguments_are_checked_as_the_library_does():
    from comlrl_nb.trainers.actor_critic import IACConfig, IACTrainer
    m, tok = make_tiny_model(seed=0)
    c, _ = make_tiny_model(seed=1, tokenizer=tok)
    reward = lambda a, b: [0.0] * len(a)
    with pytest.raises(ValueError, match="critics length 1 does not match num_agents=2"):
        IACTrainer(agents=[m, m], tokenizer=tok, reward_func=reward, critics=[c])
    with pytest.raises(ValueError, match="critics must be provided"):
        IACTrainer(agents=[m, m], tokenizer=tok, reward_func=reward)
    with pytest.raises(ValueError, match="use_separate_critic=False"):           # found before the model id is loaded
        IACTrainer(agent_model="no/such-model", critics=[c, c], reward_func=reward,
                   args=IACConfig(use_separate_critic=False))
    with pytest.raises(ValueError, match="agents length 1 does not match"):
        IACTrainer(agents=[m], tokenizer=tok, reward_func=reward, critic_model=c, args=IACConfig(num_agents=2))
    tr = IACTrainer(agents=[m, m], tokenizer=tok, reward_func=reward, critic_model=c)   # one model: a copy per agent
    assert len(tr.critics) == 2 and tr.critics[0].backbone is not tr.critics[1].backbone


def test_reference_kl_utilities_and_trainer_references():
    from comlrl_nb.utils import reference_kl_for_sequence, resolve_reference_devices
    from comlrl_nb.utils.reference_kl import clone_reference_models, validate_reference_kl_config
    m, tok = make_tiny_model(seed=0)
    tr = MAGRPOTrainer(agents=[m, m], tokenizer=tok, reward_func=lambda a, b: [0.0] * len(a),
                       args=MAGRPOConfig(reference_kl_enabled=True))
    refs = tr.reference_models
    assert len(refs) == 2 and refs[0] is not m and not any(p.requires_grad for p in refs[0].parameters())
    assert MAGRPOTrainer(agents=[m, m], tokenizer=tok, reward_func=lambda a, b: [0.0] * len(a)).reference_models == []
    seq, att = torch.tensor([[5, 6, 7, 8]]), torch.ones(1, 4, dtype=torch.long)
    assert torch.allclose(reference_kl_for_sequence(m, refs[0], seq, att, 2, 2), torch.zeros(1), atol=1e-6)
    other = clone_reference_models([make_tiny_model(seed=5)[0]], devices=["cpu"])[0]
    assert reference_kl_for_sequence(m, other, seq, att, 2, 2).item() > 0
    ns = types.SimpleNamespace
    assert resolve_reference_devices(ns(reference_devices="cpu"), [], 2) == [torch.device("cpu")] * 2
    with pytest.raises(ValueError, match="got 3 devices for 2"):
        validate_reference_kl_config(ns(reference_kl_enabled=True, reference_devices=["cpu"] * 3), 2)


def test_iterative_trainers_call_metrics_callback(tmp_path):
    "MADPOIter: once per round with the round's pairs, in the round line; MARLHFIter: its backend gets the callback."
    from comlrl_nb.trainers.preference import MADPOIterConfig, MADPOIterTrainer, MARLHFIterConfig, MARLHFIterTrainer
    torch.set_num_threads(1)
    m, tok = make_tiny_model(seed=0)
    seen = []

    def callback(pairs):
        seen.append(pairs)
        return {"custom/winner_len": sum(len(p["winner_completions"][0]) for p in pairs) / max(len(pairs), 1)}

    cfg = MADPOIterConfig(num_iterations=2, preference_num_candidates=2, preference_pairs_per_sample=1,
                          max_new_tokens=3, eval_interval=0, progress_bar=False, output_dir=str(tmp_path / "madpo"))
    out = MADPOIterTrainer(agents=[m, m], tokenizer=tok, reward_func=lambda a, b: [float(len(x)) for x in a], args=cfg,
                           train_dataset=ITEMS, formatters=FORMATTERS, metrics_callback=callback).train()
    assert len(seen) == 2 and seen[0] and all(isinstance(p, dict) and "winner_completions" in p for p in seen[0])
    trained = [r for r in out["rounds"] if r.get("iteration", 0) > 0]
    assert len(trained) == 2 and all(isinstance(r["custom/winner_len"], float) for r in trained)
    tr = MARLHFIterTrainer(agents=[m, m], tokenizer=tok, reward_func=lambda a, b: [1.0] * len(a), formatters=FORMATTERS,
                           reward_model=make_tiny_model(seed=3, tokenizer=tok)[0], metrics_callback=callback,
                           args=MARLHFIterConfig(rl_algorithm="iac", use_separate_critic=False,
                                                 output_dir=str(tmp_path / "marlhf")))
    assert tr.policy_trainer.metrics_callback is callback


def test_the_library_resume_workflow(tmp_path, wandb, monkeypatch):
    """The library's documented resume example: checkpoint_dir per epoch, the W&B identity from the checkpoint, more
    epochs."""
    import math
    from pathlib import Path
    from comlrl_nb.utils import read_checkpoint_metadata
    torch.set_num_threads(1)
    monkeypatch.chdir(tmp_path)
    m, tok = make_tiny_model(seed=0)
    train_dataset = [{"prompt": p}
                     for p in ["Describe a city:", "Invent a holiday:", "Tell a story:", "Design a park:"]]

    def length_ratio_reward(completions1, completions2):
        return [math.exp(-abs(len(b) / max(len(a), 1) - 2)) for a, b in zip(completions1, completions2)]

    def build_trainer(num_train_epochs, wandb_config):
        config = MAGRPOConfig(num_turns=1, num_train_epochs=num_train_epochs, num_generations=2, max_new_tokens=4,
                              logging_steps=1, progress_bar=False)
        return MAGRPOTrainer(agents=[make_tiny_model(seed=0)[0] for _ in range(2)], tokenizer=tok,
                             reward_func=length_ratio_reward, train_dataset=train_dataset, args=config,
                             wandb_config=wandb_config)

    wandb_config, checkpoint_dir = {"project": "comlrl-examples", "name": "resume-demo"}, "./checkpoints/resume-demo"
    build_trainer(2, wandb_config).train(checkpoint_dir=checkpoint_dir, checkpoint_interval=1)
    assert sorted(p.name for p in Path(checkpoint_dir).glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    checkpoint = max(Path(checkpoint_dir).glob("checkpoint-*"), key=lambda path: int(path.name.rsplit("-", 1)[1]))
    identity = read_checkpoint_metadata(checkpoint)["wandb"]
    assert identity == {"id": "run-1", "project": "comlrl-examples"}
    wandb_config = {**wandb_config, **identity, "resume": "allow"}
    trainer = build_trainer(4, wandb_config)                      # more epochs than the checkpoint's config: allowed
    trainer.train(resume_from_checkpoint=str(checkpoint), checkpoint_dir=checkpoint_dir, checkpoint_interval=1)
    assert (wandb.inits[1]["id"], wandb.inits[1]["resume"]) == ("run-1", "allow")       # the same W&B run continues
    assert sorted(p.name for p in Path(checkpoint_dir).glob("checkpoint-*")) == [f"checkpoint-{i}" for i in range(1, 5)]
    straight = build_trainer(4, None)
    straight.train()                                              # the same four epochs without a break
    assert all(torch.equal(p, q) for a, b in zip(trainer.agents, straight.agents)
               for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("algo", ["magrpo", "maac"])
def test_save_checkpoint_and_load_checkpoint_as_the_library_names_them(tmp_path, model_dir, algo):
    """`trainer.save_checkpoint(dir)` after training, `load_checkpoint(dir)` into a fresh trainer: the same weights and
    position."""
    torch.set_num_threads(1)

    def build():
        common = dict(num_agents=2, num_train_epochs=1, max_new_tokens=3, num_generations=2, rollout_buffer_size=2,
                      logging_steps=1, output_dir=str(tmp_path / "run"))
        reward = lambda a, b: [float(len(x) < len(y)) for x, y in zip(a, b)]
        if algo == "magrpo":
            return MAGRPOTrainer(agent_model=model_dir, reward_func=reward, formatters=FORMATTERS, train_dataset=ITEMS,
                                 args=MAGRPOConfig(**common))
        return MAACTrainer(agent_model=model_dir, critics=[model_dir], reward_func=reward, formatters=FORMATTERS,
                           train_dataset=ITEMS, args=MAACConfig(eval_interval=0, **common))

    trained = build()
    trained.train()
    with torch.no_grad():                                          # weights that differ from a fresh trainer's for sure
        for p in trained.agents[0].parameters():
            p.add_(0.01)
    saved = trained.save_checkpoint(tmp_path / "saved")
    from comlrl_nb.porting import read_checkpoint_metadata
    assert read_checkpoint_metadata(saved)["sequence"] == trained.state["global_batch"] > 0
    fresh = build()
    w = lambda t: torch.cat([p.detach().flatten() for p in t.agents[0].parameters()])
    assert not torch.equal(w(fresh), w(trained))
    position = fresh.load_checkpoint(saved)
    assert position["global_batch"] == trained.state["global_batch"] == fresh.state["global_batch"]
    assert torch.equal(w(fresh), w(trained))
    with pytest.raises(FileExistsError, match="is not a checkpoint"):
        trained.save_checkpoint(tmp_path / "run")                  # a run directory is not overwritten


@pytest.mark.parametrize("algo", ["magrpo", "maac"])
def test_eval_logger_is_called_once_and_its_dict_reaches_the_aggregator_unchanged(tmp_path, model_dir, algo):
    "As the library: one eval_logger call with every evaluated item (eval_batch_size=1 here), its return value as is."
    torch.set_num_threads(1)
    calls, received = [], []

    def eval_logger(agent_completions_turns, batch_items, prompts):
        calls.append(([it["task_id"] for it in batch_items], [len(a) for a in agent_completions_turns], prompts))
        return {"items": len(batch_items), "short": sum(len(t[0]) < 50 for t in agent_completions_turns[0])}

    def eval_aggregator(logged, num_turns=1):
        received.append(logged)
        return {"turn_1/short_rate": logged["short"] / logged["items"]}

    common = dict(num_agents=2, max_new_tokens=3, eval_batch_size=1, eval_num_samples=2,
                  output_dir=str(tmp_path / "run"))
    hooks = dict(reward_func=lambda a, b: [1.0] * len(a), formatters=FORMATTERS, train_dataset=ITEMS,
                 eval_dataset=ITEMS, eval_logger=eval_logger, eval_aggregator=eval_aggregator)
    if algo == "magrpo":
        trainer = MAGRPOTrainer(agent_model=model_dir, args=MAGRPOConfig(**common), **hooks)
    else:
        trainer = MAACTrainer(agent_model=model_dir, critics=[model_dir], args=MAACConfig(**common), **hooks)
    out = trainer.evaluate(num_eval_samples=2)
    assert [c[0] for c in calls] == [["t0", "t1"]]                     # one call, both items
    assert calls[0][1] == [2, 2]                                        # [agent][item][turn]: 2 items per agent
    assert [[FORMATTERS[i](it) in p for it, p in zip(ITEMS, calls[0][2][i])] for i in range(2)] == [[True] * 2] * 2
    assert received == [{"items": 2, "short": received[0]["short"]}]   # the dict itself, not its keys
    assert out["eval/turn_1/short_rate"] == received[0]["short"] / 2


def test_marlhf_takes_the_library_critic_arguments(tmp_path):
    "`MARLHFTrainer(critics=[...])` / `critic_model=` (the library's arguments) reach its actor-critic backend."
    from comlrl_nb.trainers.marlhf import MARLHFConfig, MARLHFTrainer
    torch.set_num_threads(1)
    m, tk = make_tiny_model(seed=0)
    critic = make_tiny_model(seed=2, tokenizer=tk)[0]
    common = dict(agents=[m, m], tokenizer=tk, reward_func=lambda a, b: [1.0] * len(a), train_dataset=ITEMS,
                  formatters=FORMATTERS,
                  reward_model=make_tiny_model(seed=3, tokenizer=tk)[0])
    maac = MARLHFTrainer(critics=[critic], args=MARLHFConfig(rl_algorithm="maac", output_dir=str(tmp_path / "a")),
                         **common)
    assert type(maac.policy_trainer).__name__ == "MAACTrainer" and maac.policy_trainer.critics[0].backbone is critic
    iac = MARLHFTrainer(critic_model=critic, args=MARLHFConfig(rl_algorithm="iac", output_dir=str(tmp_path / "b")),
                        **common)
    crit = iac.policy_trainer.critics  # one separate critic per agent, from critic_model
    assert len(crit) == 2 and crit[0].backbone is critic and not any(c.shared for c in crit)


def test_madpo_env_step_is_the_library_counter(tmp_path):
    """MADPO's `trainer.env_step`: environment_steps_per_pair per pair trained on (the library's step axis); MAGRPO:
    none."""
    from comlrl_nb.trainers.madpo import MADPOConfig, MADPOTrainer
    torch.set_num_threads(1)
    m, tk = make_tiny_model(seed=0)
    pairs = []
    tr = MADPOTrainer(agents=[m, m], tokenizer=tk, formatters=FORMATTERS, train_dataset=ITEMS,
                      reward_func=lambda a, b: [float(len(x)) for x in a],
                      metrics_callback=lambda p: pairs.append(len(p)) or {},
                      args=MADPOConfig(preference_num_candidates=2, preference_pairs_per_sample=1, max_new_tokens=3,
                                       environment_steps_per_pair=3, eval_interval=0, output_dir=str(tmp_path / "run")))
    assert tr.env_step == 0
    tr.train()
    assert sum(pairs) > 0 and tr.env_step == 3 * sum(pairs) == tr.state["env_step"]
    mg = MAGRPOTrainer(agents=[m, m], tokenizer=tk, reward_func=lambda a, b: [1.0] * len(a), formatters=FORMATTERS,
                       train_dataset=ITEMS, args=MAGRPOConfig(num_agents=2, output_dir=str(tmp_path / "mg")))
    with pytest.raises(AttributeError):                          # not the same counter: not provided
        mg.env_step


@pytest.mark.parametrize("algo", ["magrpo", "maac"])
def test_formatter_with_external_prompts_gets_the_transition_prompt_at_turn_two(tmp_path, model_dir, algo):
    "A library formatter `f(item, external_prompts=None)`: f(item) at turn 1, the transition's prompt by keyword after."
    torch.set_num_threads(1)
    seen = []

    def fmt(item, external_prompts=None):
        seen.append(external_prompts)
        return external_prompts if external_prompts is not None else f"[writer] {item['question']}"

    def transition(prompt, agent_completions, num_agents, **_):
        return [f"<revise {i}> {prompt}" for i in range(num_agents)]

    common = dict(num_agents=2, num_turns=2, num_train_epochs=1, max_new_tokens=3, rollout_buffer_size=2,
                  early_termination_threshold=None,
                  logging_steps=1, output_dir=str(tmp_path / "run"))
    hooks = dict(reward_func=lambda a, b: [1.0] * len(a), formatters=[fmt, FORMATTERS[1]], train_dataset=ITEMS,
                 external_transition=transition)
    if algo == "magrpo":
        trainer = MAGRPOTrainer(agent_model=model_dir, args=MAGRPOConfig(num_generations=2, **common), **hooks)
    else:
        trainer = MAACTrainer(agent_model=model_dir, critics=[model_dir], **hooks,
                              args=MAACConfig(num_generations=1, eval_interval=0, **common))
    trainer.train()
    later = [s for s in seen if s is not None]
    assert None in seen and later, seen                                  # turn 1: f(item); turn 2: external_prompts=
    assert all(s.startswith("<revise 0> ") for s in later), later        # agent 1's own prompt from the transition


# ------------------------------------------------------------------ a script's own trainer subclass
class ScriptTrainer(MAGRPOTrainer):
    "A trainer subclass as a ported script (or a notebook cell) writes one: nothing wraps it at import."
    def __init__(self, *args, label="mine", **kwargs):
        super().__init__(*args, **kwargs)
        self.label = label


def test_a_script_subclass_has_the_library_keywords_and_attributes(tmp_path):
    import inspect
    assert "metrics_callback" in inspect.signature(MAGRPOTrainer.__init__).parameters
    assert inspect.signature(MAGRPOTrainer.__init__).parameters["metrics_callback"].default is None
    m, tok = make_tiny_model(seed=0)
    seen = []
    tr = ScriptTrainer(agents=[m, m], tokenizer=tok, reward_func=lambda a, b: [float(len(x)) for x in a],
                       formatters=FORMATTERS, train_dataset=ITEMS, label="ported",
                       metrics_callback=lambda rollouts: seen.append(len(rollouts)) or {"custom/n": len(rollouts)},
                       args=MAGRPOConfig(num_agents=2, num_generations=2, max_new_tokens=3, rollout_batch_size=2,
                                         eval_interval=0, output_dir=str(tmp_path / "run"), progress_bar=False,
                                         save_plot=False))
    assert (tr.label, tr.num_agents, tr.model_name) == ("ported", 2, "llama")
    tr.train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert seen and [r["custom/n"] for r in rows if "custom/n" in r] == [float(s) for s in seen]
    saved = tr.save_checkpoint(tmp_path / "ck")
    assert (saved / "trainer_state.json").is_file()
    assert tr.load_checkpoint(saved)["global_batch"] == tr.state["global_batch"] > 0
    with pytest.raises(TypeError, match="metrics_callback must be a function"):
        ScriptTrainer(agents=[m, m], tokenizer=tok, reward_func=lambda a, b: [0.0] * len(a), metrics_callback=3)


def test_a_reward_written_for_the_library_trains_unchanged(caplog):
    "comlrl calls the reward once per joint response and takes one value back: the same code trains here (P3)."
    import logging
    from comlrl_nb import MAGRPOConfig, MAGRPOTrainer, make_tiny_model
    seen = []

    def per_response(c1, c2, **kwargs):                                # the library's shape, reading prompts=
        seen.append((len(c1), len(c2), kwargs.get("prompts")))
        return [float(len(c1[0]) > len(c2[0]))]
    m, tok = make_tiny_model(seed=0)
    cfg = MAGRPOConfig(num_train_epochs=1, num_generations=2, max_new_tokens=3, rollout_batch_size=1, eval_interval=0,
                       progress_bar=False, save_steps=-1, save_plot=False, output_dir=None)
    tr = MAGRPOTrainer(agents=[m, m], tokenizer=tok, reward_func=per_response, args=cfg,
                       formatters=[lambda it: "a " + it["prompt"], lambda it: "b " + it["prompt"]],
                       train_dataset=[{"prompt": "x"}, {"prompt": "y"}])
    caplog.set_level(logging.WARNING, logger="comlrl_nb")
    tr.train()
    assert seen and all(a == b == 1 for a, b, _ in seen)                # one joint response per call
    assert {p[0] for _, _, p in seen if p} <= {"a x", "a y"} and any(p for _, _, p in seen)   # agent 1's prompt
    assert min(tr.state["optimizer_steps"]) >= 1                         # and both agents were trained


def test_a_reward_returning_one_value_per_batch_switches_once(caplog):
    import logging
    from comlrl_nb.rewards import RewardFunction
    caplog.set_level(logging.WARNING, logger="comlrl_nb")
    rf = RewardFunction(lambda a, b: [float(len(a[0]))], 2)
    assert rf([["ab", "c", "def"], ["x", "y", "z"]]) == [2.0, 1.0, 3.0]
    assert rf([["ab", "c"], ["x", "y"]]) == [2.0, 1.0]
    msgs = [r.getMessage() for r in caplog.records if "returned one value for" in r.getMessage()]
    assert len(msgs) == 1 and "once per joint response" in msgs[0] and "3 calls" in msgs[0], msgs


def test_library_attributes_and_the_trainers_agent_count(caplog):
    "reward_func, reward_processor, tokenizer, device as the library names them; num_agents= over a default config."
    import logging
    import torch
    from comlrl_nb import MAACConfig, MAACTrainer, MADPOConfig, MADPOTrainer, MAGRPOConfig, MAGRPOTrainer, make_tiny_model
    m, tok = make_tiny_model(seed=0)
    f = lambda *cs: [0.0] * len(cs[0])
    for T, C, kw in ((MAGRPOTrainer, MAGRPOConfig, {}), (MAACTrainer, MAACConfig, {"critics": [m]}),
                     (MADPOTrainer, MADPOConfig, {})):
        tr = T(agents=[m], num_agents=1, tokenizer=tok, reward_func=f, reward_processor=abs, args=C(output_dir=None),
               train_dataset=[{"prompt": "x"}], **kw)
        assert (tr.args.num_agents, tr.n, tr.num_agents) == (1, 1, 1), T     # the config was left at its default 2
        assert tr.reward_func is f and tr.reward_processor is abs and tr.tokenizer is tok, T
        assert tr.device == torch.device("cpu"), T
    with pytest.raises(ValueError, match="num_agents=1 but args.num_agents=3; make them agree"):
        MAGRPOTrainer(agents=[m], num_agents=1, tokenizer=tok, reward_func=f, args=MAGRPOConfig(num_agents=3))
    caplog.set_level(logging.WARNING, logger="comlrl_nb")
    MAGRPOTrainer(agents=[m, m], tokenizer=tok, reward_func=f, args=MAGRPOConfig(output_dir=None),
                  external_transition=lambda *a, **k: None, train_dataset=[{"prompt": "x"}])
    assert any("external_transition is given but num_turns=1" in r.getMessage() for r in caplog.records)


def test_unknown_model_config_keys_warn_once_and_train(caplog):
    "comlrl reads the model_config keys it knows and ignores the rest: so does this package, and says so once (P3)."
    import logging
    from comlrl_nb import MAGRPOConfig, MAGRPOTrainer, make_tiny_model
    from comlrl_nb.models import check_model_config, from_pretrained_kwargs
    caplog.set_level(logging.WARNING, logger="comlrl_nb")
    mc = {"dtype": "float32", "value_head_hidden_dim_p3": 64}
    for _ in range(3):
        assert check_model_config(mc) == mc
    assert "value_head_hidden_dim_p3" not in from_pretrained_kwargs(mc)
    msgs = [r.getMessage() for r in caplog.records if "value_head_hidden_dim_p3" in r.getMessage()]
    assert len(msgs) == 1 and "no effect here" in msgs[0], msgs
    m, tok = make_tiny_model(seed=0)
    MAGRPOTrainer(agents=[m, m], tokenizer=tok, reward_func=lambda a, b: [0.0] * len(a), model_config=mc,
                  args=MAGRPOConfig(output_dir=None))


def test_saved_agent_config_carries_the_tokenizers_pad_and_eos_ids(tmp_path):
    "comlrl writes the tokenizer's pad/eos ids into each saved agent's config.json; a model config lacking them gets them."
    import json
    from comlrl_nb import MAGRPOConfig, MAGRPOTrainer, make_tiny_model
    m, tok = make_tiny_model(seed=0)
    m.config.pad_token_id = m.config.eos_token_id = None
    tr = MAGRPOTrainer(agents=[m, m], tokenizer=tok, reward_func=lambda a, b: [0.0] * len(a),
                       args=MAGRPOConfig(output_dir=None))
    tr.save_model(tmp_path / "out")
    for i in (0, 1):
        cfg = json.loads((tmp_path / "out" / f"agent_{i}" / "config.json").read_text())
        assert (cfg["pad_token_id"], cfg["eos_token_id"]) == (tok.pad_token_id, tok.eos_token_id), cfg
