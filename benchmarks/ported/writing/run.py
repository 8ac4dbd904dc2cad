"""Offline port of OpenMLRL/LLM_Collab_Writing (TLDR task): its training entry points, run on either library.

    python run.py --lib comlrl    --algo magrpo     # the existing library (comlrl 1.4.3)
    python run.py --lib comlrl_nb --algo magrpo     # this package; only the import prefix differs

Algorithms, as the project's scripts: magrpo (train_magrpo.py: 2 agents, MAGRPOTrainer), grpo (train_grpo.py: one
agent passed as a loaded model, MAGRPOTrainer num_agents=1), iac (train_iac.py: IACTrainer, separate critics), maac
(train_maac.py: MAACTrainer, one centralised critic), ac (train_ac.py: IACTrainer num_agents=1, one-argument reward).
What is written here follows the project's calling pattern (config keys, the trainer arguments it passes, its
reward/formatter/logger signatures) in our own words; see README.md for the stand-ins (data, model, reward).
"""
from __future__ import annotations

import argparse
import copy
import os
import re
import sys
import tempfile
from typing import Any, Callable, Dict, List, Optional, Tuple

import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from libselect import TINY_MODEL, add_lib_arg, finish, lib_import, set_lib  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


# ---------------------------------------------------------------- config (the project's config.py, in small)
class Config:
    "YAML config with dot-notation `get`, sections, deep-merge `update` (the project's Config)."

    def __init__(self, path: str, output_dir: str):
        with open(os.path.join(HERE, "configs", "_common.yaml")) as f:
            self.data = yaml.safe_load(f)
        with open(path) as f:
            self.update(yaml.safe_load(f))
        self._substitute(self.data, {"TINY_MODEL": TINY_MODEL, "OUTPUT": output_dir})

    def _substitute(self, node: Any, table: Dict[str, str]) -> None:
        for k, v in list(node.items()):
            if isinstance(v, dict):
                self._substitute(v, table)
            elif isinstance(v, str) and v in table:
                node[k] = table[v]

    def get(self, key: str, default: Any = None) -> Any:
        value: Any = self.data
        for k in key.split("."):
            if not isinstance(value, dict) or k not in value:
                return default
            value = value[k]
        return value

    def get_section(self, section: str) -> Dict[str, Any]:
        return self.data.get(section) or {}

    def update(self, updates: Dict[str, Any], base: Optional[dict] = None) -> None:
        base = self.data if base is None else base
        for k, v in updates.items():
            if isinstance(v, dict) and isinstance(base.get(k), dict):
                self.update(v, base[k])
            else:
                base[k] = v

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            yaml.safe_dump(self.data, f, sort_keys=False)


class ModelConfig:
    "The project's agent_model / critic_model section as an object (sampling fields are required for agents)."

    def __init__(self, section: Dict[str, Any]):
        self.name = section.get("name", "")
        self.temperature = section.get("temperature")
        self.top_p = section.get("top_p")
        self.top_k = section.get("top_k")
        self.special_tokens = section.get("special_tokens", {}) or {}
        self.torch_dtype = section.get("torch_dtype") or section.get("dtype")


# ---------------------------------------------------------------- data (stand-in for load_dataset("trl-lib/tldr"))
def load_dataset(name: str, split: str):
    "The project calls `datasets.load_dataset(name, split=...)`; offline, the same call on local JSONL files."
    import datasets
    files = {"train": os.path.join(HERE, "data", "tldr_train.jsonl"),
             "test": os.path.join(HERE, "data", "tldr_test.jsonl")}
    return datasets.load_dataset("json", data_files=files, split=split)


# ---------------------------------------------------------------- formatters (one per agent, item -> prompt)
def summary_agent_formatter(example: Dict[str, Any]) -> str:
    post = example.get("prompt", "")
    if not post:
        return "Error: No prompt provided."
    return f"Summarise this post briefly.\n\nQuery:\n{post}\n\nRules:\n- one short sentence\n- stay factual\n"


def elaboration_agent_formatter(example: Dict[str, Any]) -> str:
    post = example.get("prompt", "")
    if not post:
        return "Error: No prompt provided."
    return f"Summarise this post in detail.\n\nQuery:\n{post}\n\nRules:\n- varied words\n- use transitions\n"


def tldr_single_formatter(example: Dict[str, Any]) -> str:
    "train_grpo.py / train_ac.py: one agent writes both paragraphs, split on a blank line by the reward."
    post = example.get("prompt", "")
    return f"Write a brief summary, a blank line, then a detailed one.\n\nQuery:\n{post}\n"


def get_formatters(dataset_type: str) -> List[Callable[[Dict[str, Any]], str]]:
    if dataset_type != "tldr":
        raise ValueError(f"Unsupported dataset type '{dataset_type}' in this offline port.")
    return [summary_agent_formatter, elaboration_agent_formatter]


# ---------------------------------------------------------------- reward (stand-in for rewards/tldr_rewards.py)
STOP = {"a", "an", "and", "the", "to", "of", "in", "on", "is", "it", "my", "i", "for", "was", "but"}
TRANSITIONS = ("moreover", "however", "therefore", "also", "then", "because", "furthermore", "so")


def _words(text: str) -> List[str]:
    return re.findall(r"[a-z']+", text.lower())


def tldr_combined_reward(completions1: List[str], completions2: List[str]) -> List[float]:
    """Level reward on (brief, detailed) pairs, one float per pair: lengths in range (0.5), detailed/brief length
    ratio (up to 1), more distinct content words in the detailed one (up to 0.5), transition words (up to 0.5).
    Same shape and range (0..2.5) as the project's level reward; the levels are simpler."""
    rewards = []
    for c1, c2 in zip(completions1, completions2):
        n1, n2 = len(c1.split()), len(c2.split())
        if not (1 <= n1 <= 256 and 1 <= n2 <= 256):
            rewards.append(0.0)
            continue
        r = 0.5
        ratio = n2 / max(n1, 1)
        r += 1.0 if 1.6 <= ratio <= 3.2 else max(0.0, 1.0 - abs(ratio - 2.4) / 2.4)
        u1 = {w for w in _words(c1) if w not in STOP}
        u2 = {w for w in _words(c2) if w not in STOP}
        r += min(0.5, 0.25 * len(u2) / max(len(u1), 1))
        r += 0.5 * min(1.0, sum(t in c2.lower() for t in TRANSITIONS) / 2)
        rewards.append(float(r))
    return rewards


def tldr_combined_reward_logger(completions1: List[str], completions2: List[str]) -> List[Dict[str, Any]]:
    "loggers/tldr_logger.py shape: one metrics dict per evaluated sample."
    return [{"total_reward": r, "len1": len(a.split()), "len2": len(b.split())}
            for r, a, b in zip(tldr_combined_reward(completions1, completions2), completions1, completions2)]


def aggregate_tldr_metrics_for_logging(metrics: List[Dict[str, Any]]) -> Dict[str, float]:
    if not metrics:
        return {}
    keys = metrics[0].keys()
    return {f"eval/{k}": float(sum(m[k] for m in metrics) / len(metrics)) for k in keys}


def _adapt_eval_logger(base_logger):
    "The project's adapter: the trainer calls eval_logger(agent_completions_turns=...); take each agent's last turn."
    def logger(*, agent_completions_turns, **_: Any) -> List[Dict[str, Any]]:
        if not agent_completions_turns or len(agent_completions_turns) < 2:
            return []
        n = len(agent_completions_turns[0])
        c1 = [(agent_completions_turns[0][i] or [""])[-1] for i in range(n)]
        c2 = [(agent_completions_turns[1][i] or [""])[-1] for i in range(n)]
        return base_logger(c1, c2)
    return logger


def _adapt_eval_aggregator(base):
    def aggregator(metrics: List[Dict[str, Any]], num_turns: int = 1) -> Dict[str, float]:
        return base(metrics)
    return aggregator


def split_response_into_paragraphs(response: str) -> Tuple[str, str]:
    parts = [p.strip() for p in re.split(r"\n\s*\n", response) if p.strip()]
    if len(parts) >= 2:
        return parts[0], " ".join(parts[1:])
    words = response.split()
    half = max(1, len(words) // 3)
    return " ".join(words[:half]), " ".join(words[half:])


# ---------------------------------------------------------------- shared pieces of the entry points
def build_reward_processor(config: Config, RewardProcessors):
    "train_*.py: scale, then shift composed on top by a closure (the project's exact composition)."
    if not config.get("reward_processor.enabled", True):
        return None
    proc = RewardProcessors.scale(factor=config.get("reward_processor.scale_factor", 1.0))
    shift_val = config.get("reward_processor.shift", None)
    if shift_val is not None:
        shift_proc = RewardProcessors.shift(value=float(shift_val))
        prev = proc
        proc = (lambda p=prev, s=shift_proc: (lambda x: s(p(x))))()
    return proc


def build_wandb_config(config: Config, section: str, dataset_type: str) -> Dict[str, Any]:
    w = config.get_section("wandb")
    output_section = dict(config.get_section("output"))
    return {
        "project": w.get("project", "comlrl"),
        "entity": w.get("entity", "OpenMLRL"),
        "name": w.get("name") or w.get("run_name") or f"{dataset_type}-{section}",
        "dir": w.get("dir", os.path.join(config.get("output.base_dir"), "wandb")),
        "tags": w.get("tags", [section, dataset_type]),
        "config_sections": {
            "dataset": config.get_section("dataset"),
            "agent_model": config.get_section("agent_model"),
            "output": output_section,
            "trainer": config.get_section(section),
        },
    }


def load_tokenizers(config: Config, model_config: ModelConfig):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_config.name)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    if config.get("tokenizer.padding_side"):
        tok.padding_side = config.get("tokenizer.padding_side")
    if model_config.special_tokens:
        tok.add_special_tokens(model_config.special_tokens)
    return tok


def finish_training(trainer, config: Config, output_dir: str) -> None:
    trainer.verbose = bool(config.get("output.verbose", False))
    trainer.train()
    if config.get("output.save_final_model", True):
        trainer.save_model(config.get("output.save_path", os.path.join(output_dir, "final_model")))
    config.save(os.path.join(output_dir, "config.yaml"))
    try:                                  # the project imports wandb at the top; not every venv here has it
        import wandb
    except ImportError:
        return
    if wandb.run is not None:
        wandb.finish()


# ---------------------------------------------------------------- train_magrpo.py
def main_magrpo(config: Config, output_dir: str) -> None:
    MAGRPOConfig, MAGRPOTrainer = lib_import("comlrl.trainers.reinforce", "MAGRPOConfig", "MAGRPOTrainer")
    RewardProcessors = lib_import("comlrl.utils.reward_processor", "RewardProcessors")
    model_config = ModelConfig(config.get_section("agent_model"))
    dataset_type = config.get("dataset.type")
    train_dataset = load_dataset(config.get("dataset.name"), split=config.get("dataset.train_split"))
    eval_dataset = load_dataset(config.get("dataset.name"), split=config.get("dataset.eval_split"))
    num_agents = 2
    tokenizer = load_tokenizers(config, model_config)
    cfg = config.get_section("magrpo")
    args = MAGRPOConfig(
        num_turns=1,
        num_train_epochs=cfg.get("num_train_epochs", 2),
        agent_learning_rate=cfg.get("agent_learning_rate", 5e-6),
        logging_steps=cfg.get("logging_steps", 50),
        num_generations=cfg.get("num_generations", 4),
        max_new_tokens=cfg.get("max_new_tokens", 256),
        temperature=model_config.temperature,
        top_p=model_config.top_p,
        top_k=model_config.top_k,
        num_agents=num_agents,
        parallel_training=str(cfg.get("parallel_training", "none")).strip().lower(),
        agent_devices=cfg.get("agent_devices", ["cuda:0"]),
        early_termination_threshold=cfg.get("early_termination_threshold", -0.2),
        rollout_buffer_size=cfg.get("rollout_buffer_size", 1),
        train_batch_size=cfg.get("train_batch_size", 1),
        advantage_normalization=cfg.get("advantage_normalization", True),
        eval_interval=cfg.get("eval_interval", 20),
        eval_num_samples=cfg.get("eval_num_samples", 4),
        eval_batch_size=cfg.get("eval_batch_size", 1),
    )

    def reward_fn(*agent_completions, batch_items=None, prompts=None):
        if len(agent_completions) < 2:
            raise ValueError("Writing tasks expect two agent completions for reward calculation.")
        return tldr_combined_reward(agent_completions[0], agent_completions[1])

    trainer_kwargs: Dict[str, Any] = {
        "agent_model": model_config.name or None,
        "agents": None,
        "num_agents": num_agents,
        "model_config": {"torch_dtype": model_config.torch_dtype, "special_tokens": model_config.special_tokens},
        "reward_func": reward_fn,
        "formatters": get_formatters(dataset_type),
        "args": args,
        "train_dataset": train_dataset,
        "eval_dataset": eval_dataset,
        "tokenizer": tokenizer,
        "wandb_config": build_wandb_config(config, "magrpo", dataset_type),
        # the project's HEAD also passes "dataset_type": dataset_type, which comlrl 1.4.3 refuses (TypeError)
        "eval_logger": _adapt_eval_logger(tldr_combined_reward_logger),
        "eval_aggregator": _adapt_eval_aggregator(aggregate_tldr_metrics_for_logging),
    }
    processor = build_reward_processor(config, RewardProcessors)
    if processor is not None:
        trainer_kwargs["reward_processor"] = processor
    finish_training(MAGRPOTrainer(**trainer_kwargs), config, output_dir)


# ---------------------------------------------------------------- train_grpo.py
def main_grpo(config: Config, output_dir: str) -> None:
    from transformers import AutoModelForCausalLM
    MAGRPOConfig, MAGRPOTrainer = lib_import("comlrl.trainers.reinforce", "MAGRPOConfig", "MAGRPOTrainer")
    RewardProcessors = lib_import("comlrl.utils.reward_processor", "RewardProcessors")
    model_config = ModelConfig(config.get_section("agent_model"))
    dataset_type = config.get("dataset.type")
    train_dataset = load_dataset(config.get("dataset.name"), split=config.get("dataset.train_split"))
    eval_dataset = load_dataset(config.get("dataset.name"), split=config.get("dataset.eval_split"))
    tokenizer = load_tokenizers(config, model_config)
    model_kwargs: Dict[str, Any] = {}
    if model_config.torch_dtype is not None:
        model_kwargs["torch_dtype"] = model_config.torch_dtype
    model = AutoModelForCausalLM.from_pretrained(model_config.name, **model_kwargs)
    cfg = config.get_section("grpo")
    args = MAGRPOConfig(
        num_turns=1,
        num_train_epochs=cfg.get("num_train_epochs", 1),
        agent_learning_rate=cfg.get("agent_learning_rate", 5e-6),
        logging_steps=cfg.get("logging_steps", 10),
        num_generations=cfg.get("num_generations", 4),
        max_new_tokens=cfg.get("max_new_tokens", 512),
        temperature=model_config.temperature,
        top_p=model_config.top_p,
        top_k=model_config.top_k,
        num_agents=1,
        parallel_training=str(cfg.get("parallel_training", "none")).strip().lower(),
        agent_devices=cfg.get("agent_devices", None),
        early_termination_threshold=cfg.get("early_termination_threshold", -0.2),
        eval_interval=cfg.get("eval_interval", 4),
        eval_num_samples=cfg.get("eval_num_samples", 4),
        eval_batch_size=cfg.get("eval_batch_size", 1),
        train_batch_size=cfg.get("train_batch_size"),
        advantage_normalization=cfg.get("advantage_normalization", True),
    )

    def reward_fn(*agent_completions, batch_items=None, prompts=None):
        if not agent_completions:
            return []
        pairs = [split_response_into_paragraphs(r) for r in agent_completions[0]]
        return tldr_combined_reward([a for a, _ in pairs], [b for _, b in pairs])

    trainer_kwargs: Dict[str, Any] = {
        "agents": [model],
        "num_agents": 1,
        "reward_func": reward_fn,
        "formatters": tldr_single_formatter,
        "args": args,
        "train_dataset": train_dataset,
        "eval_dataset": eval_dataset,
        "tokenizer": tokenizer,
        "wandb_config": build_wandb_config(config, "grpo", dataset_type),
        # the project's HEAD also passes "dataset_type": dataset_type, which comlrl 1.4.3 refuses (TypeError)
    }
    processor = build_reward_processor(config, RewardProcessors)
    if processor is not None:
        trainer_kwargs["reward_processor"] = processor
    finish_training(MAGRPOTrainer(**trainer_kwargs), config, output_dir)


# ---------------------------------------------------------------- train_iac.py / train_maac.py / train_ac.py
def _ac_common(config: Config):
    model_config = ModelConfig(config.get_section("agent_model"))
    critic_section = config.get_section("critic_model")
    critic_config = ModelConfig(critic_section) if critic_section else None
    model_kwargs: Dict[str, Any] = {}
    if model_config.torch_dtype is not None:
        model_kwargs["torch_dtype"] = model_config.torch_dtype
    critic_model_kwargs = dict(model_kwargs)
    if critic_config is not None and critic_config.torch_dtype is not None:
        critic_model_kwargs["torch_dtype"] = critic_config.torch_dtype
    return model_config, critic_config, model_kwargs, critic_model_kwargs


def main_actor_critic(config: Config, output_dir: str, section: str) -> None:
    "train_iac.py (section iac), train_maac.py (maac) and train_ac.py (ac: IACTrainer with one agent)."
    IACConfig, IACTrainer, MAACConfig, MAACTrainer = lib_import(
        "comlrl.trainers.actor_critic", "IACConfig", "IACTrainer", "MAACConfig", "MAACTrainer")
    RewardProcessors = lib_import("comlrl.utils.reward_processor", "RewardProcessors")
    model_config, critic_config, model_kwargs, critic_model_kwargs = _ac_common(config)
    dataset_type = config.get("dataset.type")
    cfg = config.get_section(section)
    train_dataset = load_dataset(config.get("dataset.name"), split=config.get("dataset.train_split"))
    eval_dataset = load_dataset(config.get("dataset.name"), split=config.get("dataset.eval_split"))
    num_agents = int(cfg.get("num_agents", 1 if section == "ac" else 2))
    tokenizer = load_tokenizers(config, model_config)
    common = dict(
        num_turns=1,
        num_train_epochs=cfg.get("num_train_epochs", 20),
        agent_learning_rate=cfg.get("agent_learning_rate", 5e-6),
        critic_learning_rate=cfg.get("critic_learning_rate", 5e-6),
        value_loss_coef=cfg.get("value_loss_coef", 0.6),
        rollout_buffer_size=cfg.get("rollout_buffer_size", 4),
        max_new_tokens=cfg.get("max_new_tokens", 256),
        temperature=model_config.temperature,
        top_p=model_config.top_p,
        top_k=model_config.top_k,
        num_agents=num_agents,
        num_generations=cfg.get("num_generations", 1),
        parallel_training=str(cfg.get("parallel_training", "none")).strip().lower(),
        discount=cfg.get("discount", 0.9),
        eval_interval=cfg.get("eval_interval", 20),
        eval_num_samples=cfg.get("eval_num_samples", 4),
        eval_batch_size=cfg.get("eval_batch_size", 1),
        logging_steps=cfg.get("logging_steps", 50),
    )
    if section == "maac":
        args = MAACConfig(**common, agent_devices=cfg.get("agent_devices", ["cuda:0"]),
                          critic_devices=cfg.get("critic_devices", ["cuda:0"]),
                          critic_type=cfg.get("critic_type", "v"))
        Trainer = MAACTrainer
    else:
        args = IACConfig(
            **common,
            value_clip_range=cfg.get("value_clip_range", 0.2),
            use_separate_critic=bool(cfg.get("use_separate_critic", True)),
            agent_devices=cfg.get("agent_devices", ["cuda:0"] if section == "iac" else None),
            critic_devices=cfg.get("critic_devices", ["cuda:0"] if section == "iac" else None),
            critic_value_head_hidden_dim=cfg.get("critic_value_head_hidden_dim"),
            value_head_hidden_dim=cfg.get("value_head_hidden_dim"),
            **({"advantage_normalization": cfg.get("advantage_normalization", True)} if section == "ac" else {}),
        )
        Trainer = IACTrainer

    if section == "ac":
        def reward_fn(responses: List[str]) -> List[float]:
            pairs = [split_response_into_paragraphs(r) for r in responses]
            return tldr_combined_reward([a for a, _ in pairs], [b for _, b in pairs])
        formatters: Any = tldr_single_formatter
    else:
        def reward_fn(prompts, completions1, completions2):
            _ = prompts
            return tldr_combined_reward(completions1, completions2)
        formatters = get_formatters(dataset_type)

    trainer = Trainer(
        agent_model=model_config.name or None,
        **({} if section == "ac" else {"agents": None}),
        tokenizer=tokenizer,
        reward_func=reward_fn,
        reward_processor=build_reward_processor(config, RewardProcessors),
        formatters=formatters,
        metrics_callback=None,
        external_transition=None,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        model_config={
            "model_kwargs": model_kwargs,
            "critic_model_kwargs": critic_model_kwargs if critic_config is not None else model_kwargs,
        },
        wandb_config=build_wandb_config(config, section, dataset_type),
        critic_model=critic_config.name if critic_config is not None else None,
        critics=config.get("critics"),
    )
    finish_training(trainer, config, output_dir)


ALGOS = {
    "magrpo": ("magrpo_tldr_config.yaml", main_magrpo),
    "grpo": ("grpo_tldr_config.yaml", main_grpo),
    "iac": ("iac_tldr_config.yaml", lambda c, o: main_actor_critic(c, o, "iac")),
    "maac": ("maac_tldr_config.yaml", lambda c, o: main_actor_critic(c, o, "maac")),
    "ac": ("ac_tldr_config.yaml", lambda c, o: main_actor_critic(c, o, "ac")),
}


def main() -> None:
    parser = add_lib_arg(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--algo", choices=sorted(ALGOS), required=True)
    parser.add_argument("--output", default=None, help="output directory (default: a temporary one)")
    a = parser.parse_args()
    set_lib(a.lib)
    import torch
    torch.manual_seed(0)
    config_file, entry = ALGOS[a.algo]
    with tempfile.TemporaryDirectory() as tmp:
        output_dir = a.output or tmp
        os.makedirs(output_dir, exist_ok=True)
        config = Config(os.path.join(HERE, "configs", config_file), output_dir)
        entry(config, output_dir)
    finish(f"writing/{a.algo}")


if __name__ == "__main__":
    main()
