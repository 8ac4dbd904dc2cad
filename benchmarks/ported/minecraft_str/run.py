"""Offline port of OpenMLRL/LLM_Collab_Minecraft, task str_build (agents write /setblock commands that draw a
letter): its training entry points, multi-turn with an external transition, run on either library.

    python run.py --lib comlrl    --algo magrpo     # the existing library (comlrl 1.4.3)
    python run.py --lib comlrl_nb --algo magrpo     # this package; only the import prefix differs

Algorithms, as the project's scripts (str_build/train/train_*.py): magrpo (2 agents, 2 turns, position feedback),
grpo (the same script with magrpo.num_agents=1: the trainer gets num_agents=1, the MAGRPOConfig built by the
project's trainer-args helper never receives num_agents), iac and maac (2 agents, 2 turns; the reward receives the
prompts and looks its task item up by prompt, the transition registers the next turn's prompts).
The Minecraft world is a stand-in (see README.md): commands are parsed and simulated on a small grid here.
"""
from __future__ import annotations

import argparse
import copy
import csv
import inspect
import json
import os
import re
import sys
import tempfile
from typing import Any, Callable, Dict, List, Mapping, Optional

import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from libselect import TINY_MODEL, add_lib_arg, finish, lib_import, set_lib  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
VERBOSE = False


# ---------------------------------------------------------------- config (utils/config.py, in small)
def load_yaml(path: str, output_dir: str) -> Dict[str, Any]:
    with open(os.path.join(HERE, "configs", "_common.yaml")) as f:
        cfg = yaml.safe_load(f)
    with open(path) as f:
        _merge(cfg, yaml.safe_load(f))
    _substitute(cfg, {"TINY_MODEL": TINY_MODEL, "OUTPUT": output_dir})
    return cfg


def _merge(base: dict, upd: dict) -> None:
    for k, v in upd.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _merge(base[k], v)
        else:
            base[k] = v


def _substitute(node: dict, table: Dict[str, str]) -> None:
    for k, v in list(node.items()):
        if isinstance(v, dict):
            _substitute(v, table)
        elif isinstance(v, str) and v in table:
            node[k] = table[v]


def resolve_path(config_path: str, rel: str) -> str:
    return os.path.normpath(os.path.join(os.path.dirname(config_path), rel))


def _map_dtype(value: Any) -> Any:
    import torch
    table = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
             "fp32": torch.float32, "float32": torch.float32, "auto": "auto"}
    return table.get(str(value).strip().lower()) if isinstance(value, str) else None


# ---------------------------------------------------------------- tasks (utils/str_builder.py: letters on a grid)
GLYPHS = {  # 3 wide x 3 high, top row first
    "I": ["###", ".#.", "###"], "L": ["#..", "#..", "###"], "T": ["###", ".#.", ".#."],
    "O": ["###", "#.#", "###"], "H": ["#.#", "###", "#.#"], "U": ["#.#", "#.#", "###"],
}


def load_tasks_from_csv(path: str, *, spacing: int, local_z: int) -> List[Dict[str, Any]]:
    tasks = []
    with open(path) as f:
        for i, row in enumerate(csv.DictReader(f)):
            rows = GLYPHS[row["string"]]
            tasks.append({
                "task_id": f"str_{i}_{row['string']}", "csv_row_index": i, "text": row["string"],
                "difficulty": int(row["difficulty"]), "local_bbox_from": [0, 0, local_z],
                "local_bbox_to": [len(rows[0]) - 1, len(rows) - 1, local_z], "target_rows_topdown": rows,
            })
    return tasks


def _slice_items(items: List[Dict[str, Any]], split_expr: Any) -> List[Dict[str, Any]]:
    m = re.search(r"\[\s*(-?\d*)\s*:\s*(-?\d*)\s*\]", str(split_expr or ""))
    if not m:
        return items
    start, end = (int(g) if g else None for g in m.groups())
    return items[start:end]


# ---------------------------------------------------------------- prompts (train_*.py _build_formatters)
def _blocks(v: Any) -> List[str]:
    return [str(x).strip() for x in (v or []) if str(x).strip()]


def _render_prompt(tokenizer: Any, system_prompt: str, user_prompt: str, use_chat_template: bool) -> str:
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": user_prompt}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return (system_prompt + "\n\n" + user_prompt) if system_prompt else user_prompt


def _fmt_kwargs(item: Mapping[str, Any], cfg: Dict[str, Any]) -> Dict[str, Any]:
    task = cfg.get("task") or {}
    provide_graph = bool((cfg.get("prompt") or {}).get("provide_graph", True))
    return {
        "task_id": str(item.get("task_id") or ""), "text": str(item.get("string") or ""),
        "difficulty": int(item.get("difficulty") or 0),
        "world_bbox_from": json.dumps(item.get("local_bbox_from") or [0, 0, 0], separators=(",", ":")),
        "world_bbox_to": json.dumps(item.get("local_bbox_to") or [0, 0, 0], separators=(",", ":")),
        "target_ascii": "\n".join(item.get("target_rows_topdown") or []) if provide_graph else "",
        "block_agent1_lines": "\n".join(f"- {b}" for b in _blocks(task.get("block_agent1"))),
        "block_agent2_lines": "\n".join(f"- {b}" for b in _blocks(task.get("block_agent2"))),
    }


def build_formatters(cfg: Dict[str, Any], *, num_agents: int, tokenizer: Any) -> List[Callable]:
    p = cfg.get("prompt") or {}
    system = str(p.get("system") or "")
    use_chat = bool(p.get("use_chat_template", False))
    templates = [p.get("user_template_agent1") or p.get("user_template"),
                 p.get("user_template_agent2") or p.get("user_template")]
    if num_agents == 1:
        templates = [p.get("user_template")]

    def make(tmpl: str) -> Callable[[Dict[str, Any]], str]:
        def fmt(item: Dict[str, Any]) -> str:
            user = tmpl.format(**_fmt_kwargs(item, cfg))
            return _render_prompt(tokenizer, system, user, use_chat)
        return fmt
    return [make(t) for t in templates]


# ---------------------------------------------------------------- reward (rewards/str_builder_reward.py, stand-in)
CMD = re.compile(r"/setblock\s+(-?\d+)\s+(-?\d+)\s+(-?\d+)\s+(\w+)")


def _placed(completion: str, allowed: List[str], item: Mapping[str, Any], limit: int) -> Dict[tuple, str]:
    "Parse /setblock lines, keep those inside the bbox with an allowed block (the world simulator stand-in)."
    lo, hi = item.get("local_bbox_from") or [0, 0, 0], item.get("local_bbox_to") or [0, 0, 0]
    out: Dict[tuple, str] = {}
    for x, y, z, block in CMD.findall(completion or "")[:limit]:
        pos = (int(x), int(y), int(z))
        if block in allowed and all(lo[i] <= pos[i] <= hi[i] for i in range(3)):
            out[pos] = block
    return out


def _score(item: Mapping[str, Any], world: Dict[tuple, str]) -> float:
    "IoU of the non-air blocks with the target's '#' cells (the project's level scores, in one number)."
    rows = item.get("target_rows_topdown") or []
    z = (item.get("local_bbox_from") or [0, 0, 0])[2]
    target = {(x, len(rows) - 1 - r, z) for r, line in enumerate(rows) for x, ch in enumerate(line) if ch == "#"}
    built = {pos for pos, b in world.items() if b != "air"}
    union = target | built
    return float(len(target & built)) / len(union) if union else 0.0


def get_reward_function(*, cfg: Dict[str, Any], num_agents: int) -> Callable[..., List[float]]:
    task = cfg.get("task") or {}
    a1, a2 = _blocks(task.get("block_agent1")), _blocks(task.get("block_agent2"))
    total = int(task.get("max_commands") or 600)

    if num_agents == 1:
        def reward_fn(agent1_completions: List[str], *, batch_items: Optional[List[Mapping]] = None) -> List[float]:
            CALLS["reward"] += 1
            item = (batch_items or [{}])[0]
            c1 = agent1_completions[0] if agent1_completions else ""
            return [_score(item, _placed(c1, a1, item, total))]
        return reward_fn

    def reward_fn(agent1_completions: List[str], agent2_completions: List[str], *,
                  batch_items: Optional[List[Mapping]] = None) -> List[float]:
        CALLS["reward"] += 1
        item = (batch_items or [{}])[0]
        c1 = agent1_completions[0] if agent1_completions else ""
        c2 = agent2_completions[0] if agent2_completions else ""
        world = _placed(c1, a1, item, total // 2)
        world.update(_placed(c2, a2, item, total // 2))       # agent 2 writes after agent 1
        return [_score(item, world)]
    return reward_fn


# ---------------------------------------------------------------- external transition (external/*.py, stand-in)
_context_resolver: Optional[Callable[[str], Optional[Dict[str, Any]]]] = None
CALLS = {"transition": 0, "reward": 0}


def set_context_resolver(fn: Callable[[str], Optional[Dict[str, Any]]]) -> None:
    global _context_resolver
    _context_resolver = fn


def get_external_transition(prompt: str, agent_completions: Any, num_agents: int = 2, mode: str = "perfect_feedback",
                            *, prompt_history_per_agent: Optional[List[List[str]]] = None,
                            response_history_per_agent: Optional[List[List[str]]] = None, **kwargs) -> List[str]:
    "position_feedback: each agent's next prompt = feedback on the joint build + its original prompt + last answer."
    CALLS["transition"] += 1
    n = int(num_agents)
    if not isinstance(agent_completions, (list, tuple)) or len(agent_completions) != n:
        raise ValueError(f"Expected {n} agent completions, got {agent_completions!r}")
    if mode not in ("position_feedback", "perfect_feedback", "score_feedback"):
        raise NotImplementedError("External mode not implemented: " + str(mode))
    ctx = (_context_resolver(prompt) if _context_resolver else None) or {}
    allowed = [ctx.get("allowed_blocks_agent1") or [], ctx.get("allowed_blocks_agent2") or []]
    world: Dict[tuple, str] = {}
    for i, c in enumerate(agent_completions):
        world.update(_placed(c, allowed[min(i, 1)], ctx, int(ctx.get("max_commands_total") or 600)))
    score = _score(ctx, world) if ctx else 0.0
    out = []
    for i in range(n):
        first = (prompt_history_per_agent or [[]] * n)[i][:1]
        parts = [f"Feedback: IoU {score:.2f}, {len(world)} blocks placed."]
        if kwargs.get("original_prompt", True) and first:
            parts.append(first[0])
        if kwargs.get("previous_response", False):
            parts.append("Previous: " + str(agent_completions[i])[:40])
        out.append("\n".join(parts))
    return out


# ---------------------------------------------------------------- trainer args (utils/trainer_args.py)
def _filtered(cls: Any, candidate: Dict[str, Any]) -> Any:
    "The project keeps only the keys the config class's __init__ declares (so it runs on several library versions)."
    params = set(inspect.signature(cls.__init__).parameters) - {"self", "args", "kwargs"}
    return cls(**{k: v for k, v in candidate.items() if k in params})


def get_trainer_args(cfg: Dict[str, Any], MAGRPOConfig: Any) -> Any:
    tr = cfg.get("magrpo") or {}
    candidate = {
        "num_turns": int(tr.get("num_turns", 1)), "num_train_epochs": int(tr.get("num_train_epochs", 3)),
        "agent_learning_rate": float(tr.get("agent_learning_rate", 3e-5)),
        "logging_steps": int(tr.get("logging_steps", 50)), "num_generations": int(tr.get("num_generations", 4)),
        "max_new_tokens": int(tr.get("max_new_tokens", 512)), "temperature": float(tr.get("temperature", 0.2)),
        "top_p": float(tr.get("top_p", 0.95)),
    }
    if "top_k" in tr:
        candidate["top_k"] = tr.get("top_k")
    candidate.update({"discount": float(tr.get("discount", 0.9)),
                      "joint_mode": str(tr.get("joint_mode") or "aligned").strip().lower()})
    if "early_termination_threshold" in tr:
        candidate["early_termination_threshold"] = tr.get("early_termination_threshold")
    candidate.update({
        "rollout_buffer_size": int(tr.get("rollout_buffer_size", 2)),
        "train_batch_size": tr.get("train_batch_size"),
        "advantage_normalization": bool(tr.get("advantage_normalization", True)),
        "eval_interval": int(tr.get("eval_interval", 16)), "eval_num_samples": int(tr.get("eval_num_samples", 4)),
        "eval_batch_size": int(tr.get("eval_batch_size", 1)),
    })
    return _filtered(MAGRPOConfig, candidate)


def _ac_candidate(tr: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "num_turns": int(tr.get("num_turns", 1)), "num_train_epochs": int(tr.get("num_train_epochs", 40)),
        "agent_learning_rate": float(tr.get("agent_learning_rate", 5e-6)),
        "critic_learning_rate": float(tr.get("critic_learning_rate", 5e-6)),
        "rollout_buffer_size": int(tr.get("rollout_buffer_size", 8)),
        "value_loss_coef": float(tr.get("value_loss_coef", 0.6)),
        "advantage_normalization": bool(tr.get("advantage_normalization", tr.get("normalize_advantage", True))),
        "max_new_tokens": int(tr.get("max_new_tokens", 256)), "temperature": float(tr.get("temperature", 0.6)),
        "top_p": float(tr.get("top_p", 0.6)), "top_k": tr.get("top_k"),
        "num_agents": int(tr.get("num_agents", 2)), "num_generations": int(tr.get("num_generations", 1)),
        "discount": float(tr.get("discount", 0.9)),
        "early_termination_threshold": tr.get("early_termination_threshold"),
        "eval_interval": int(tr.get("eval_interval", 16)), "eval_num_samples": int(tr.get("eval_num_samples", 4)),
        "eval_batch_size": int(tr.get("eval_batch_size", 1)), "logging_steps": int(tr.get("logging_steps", 1)),
    }


def get_iac_args(cfg: Dict[str, Any], IACConfig: Any) -> Any:
    tr = cfg.get("iac") or {}
    candidate = _ac_candidate(tr)
    candidate.update({"value_clip_range": tr.get("value_clip_range", 0.05),
                      "use_separate_critic": bool(tr.get("use_separate_critic", True)),
                      "critic_value_head_hidden_dim": tr.get("critic_value_head_hidden_dim"),
                      "value_head_hidden_dim": tr.get("value_head_hidden_dim")})
    return _filtered(IACConfig, candidate)


def get_maac_args(cfg: Dict[str, Any], MAACConfig: Any) -> Any:
    tr = cfg.get("maac") or {}
    candidate = _ac_candidate(tr)
    candidate["critic_type"] = str(tr.get("critic_type", "v"))
    return _filtered(MAACConfig, candidate)


# ---------------------------------------------------------------- shared setup of the train_*.py scripts
def _normalize_key(s: str) -> str:
    return " ".join((s or "").split()).strip()


def setup(cfg: Dict[str, Any], config_path: str):
    ds_cfg = cfg.get("dataset") or {}
    tasks = load_tasks_from_csv(resolve_path(config_path, ds_cfg.get("csv_path")),
                                spacing=int(ds_cfg.get("spacing") or 1), local_z=int(ds_cfg.get("local_z") or 0))
    items = [{"task_id": t["task_id"], "csv_row_index": t["csv_row_index"], "string": t["text"],
              "difficulty": t["difficulty"], "local_bbox_from": t["local_bbox_from"],
              "local_bbox_to": t["local_bbox_to"], "target_rows_topdown": t["target_rows_topdown"],
              "prompt": f"str_build:{t['task_id']}"} for t in tasks]
    return _slice_items(items, ds_cfg.get("train_split", "[:]")), _slice_items(items, ds_cfg.get("eval_split"))


def reward_processor_from(cfg: Dict[str, Any], RewardProcessors: Any):
    rp = cfg.get("reward_processor") or {}
    if not rp.get("enabled", False):
        return None
    proc = RewardProcessors.scale(factor=float(rp["scale_factor"])) if rp.get("scale_factor") is not None else None
    if rp.get("shift") is not None:
        shift_proc = RewardProcessors.shift(value=float(rp["shift"]))
        if proc is None:
            proc = shift_proc
        else:
            prev = proc
            proc = (lambda p=prev, s=shift_proc: (lambda x: s(p(x))))()
    return proc


def wandb_config_from(cfg: Dict[str, Any], section: str, num_agents: int, num_turns: int) -> Dict[str, Any]:
    w = cfg.get("wandb") or {}
    return {
        "project": w.get("project", "str_build"), "entity": w.get("entity"),
        "name": w.get("name") or w.get("run_name") or f"str_build-{section}", "dir": str(w.get("dir")),
        "tags": w.get("tags", [section, "str_build", f"agents_{num_agents}", f"turns_{num_turns}"]),
        "config_sections": {"dataset": cfg.get("dataset"), "agent_model": cfg.get("agent_model"),
                            "output": cfg.get("output"), "external": cfg.get("external"),
                            "trainer": cfg.get(section)},
    }


def context_map_for(cfg: Dict[str, Any], splits: List[List[Dict[str, Any]]], formatters: List[Callable],
                    num_agents: int) -> Dict[str, Any]:
    "Every prompt (the dataset key and each formatted prompt) -> the task context the transition needs."
    task = cfg.get("task") or {}
    context: Dict[str, Any] = {}
    for items in splits:
        for item in items:
            payload = dict(item, allowed_blocks_agent1=_blocks(task.get("block_agent1")),
                           allowed_blocks_agent2=_blocks(task.get("block_agent2")),
                           max_commands_total=int(task.get("max_commands") or 600))
            context[_normalize_key(item["prompt"])] = payload
            for fmt in formatters:
                context[_normalize_key(fmt(item))] = payload
    return context


def run_trainer(trainer: Any, cfg: Dict[str, Any]) -> None:
    trainer.verbose = bool((cfg.get("output") or {}).get("verbose", False))
    trainer.train()
    out = cfg.get("output") or {}
    if out.get("save_final_model", False):
        trainer.save_model(out.get("save_path") or os.path.join(str(out.get("base_dir")), "final_model"))


# ---------------------------------------------------------------- train_magrpo.py
def main_magrpo(cfg: Dict[str, Any], config_path: str) -> None:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    MAGRPOConfig, MAGRPOTrainer = lib_import("comlrl.trainers.reinforce", "MAGRPOConfig", "MAGRPOTrainer")
    RewardProcessors = lib_import("comlrl.utils.reward_processor", "RewardProcessors")
    num_agents = int((cfg.get("magrpo") or {}).get("num_agents") or 1)
    train_items, eval_items = setup(cfg, config_path)
    train_ds, eval_ds = Dataset.from_list(train_items), (Dataset.from_list(eval_items) if eval_items else None)
    model_cfg = cfg.get("agent_model") or {}
    model_name = str(model_cfg.get("name") or "")
    model_kwargs: Dict[str, Any] = {}
    dtype = _map_dtype(model_cfg.get("dtype") or model_cfg.get("torch_dtype"))
    if dtype is not None:
        model_kwargs["torch_dtype"] = dtype
    tokenizer = AutoTokenizer.from_pretrained(model_name)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    agents = [AutoModelForCausalLM.from_pretrained(model_name, **model_kwargs) for _ in range(num_agents)]
    magrpo_args = get_trainer_args(cfg, MAGRPOConfig)
    formatters = build_formatters(cfg, num_agents=num_agents, tokenizer=tokenizer)
    trainer_kwargs: Dict[str, Any] = {
        # the project's HEAD (2026-02-13) also passes "agent_model": model_name next to the loaded agents; comlrl
        # 1.4.3 compares it with each agent's config.model_type ("qwen2") and refuses the pair, so this is the
        # project's previous form (str_builder/train/train_magrpo.py at d9251ba): the loaded agents alone
        "agents": agents,
        "num_agents": num_agents,
        "reward_func": get_reward_function(cfg=cfg, num_agents=num_agents),
        "formatters": formatters,
        "args": magrpo_args,
        "train_dataset": train_ds,
        "eval_dataset": eval_ds,
        "tokenizer": tokenizer,
        "wandb_config": wandb_config_from(cfg, "magrpo", num_agents, magrpo_args.num_turns),
        # the project's HEAD also passes "dataset_type": "str_build", which comlrl 1.4.3 refuses (TypeError)
    }
    processor = reward_processor_from(cfg, RewardProcessors)
    if processor is not None:
        trainer_kwargs["reward_processor"] = processor
    if int(magrpo_args.num_turns) > 1:
        context = context_map_for(cfg, [train_items, eval_items], formatters, num_agents)
        set_context_resolver(lambda p: context.get(_normalize_key(p)))
        ext = cfg.get("external") or {}

        def external_transition_wrapper(prompt: str, agent_completions: Any, num_agents: Optional[int] = None,
                                        **_kwargs: Any) -> Any:
            n_agents = int(num_agents) if num_agents is not None else len(agents)
            return get_external_transition(
                prompt=prompt, agent_completions=agent_completions, num_agents=n_agents,
                mode=str(ext.get("mode") or "perfect_feedback"),
                original_prompt=bool(ext.get("original_prompt", True)),
                previous_response=bool(ext.get("previous_response", False)),
                prompt_history_per_agent=_kwargs.get("prompt_history_per_agent"),
                response_history_per_agent=_kwargs.get("response_history_per_agent"))
        trainer_kwargs["external_transition"] = external_transition_wrapper
    run_trainer(MAGRPOTrainer(**trainer_kwargs), cfg)


# ---------------------------------------------------------------- train_iac.py / train_maac.py
def main_actor_critic(cfg: Dict[str, Any], config_path: str, section: str) -> None:
    from datasets import Dataset
    from transformers import AutoTokenizer
    IACConfig, IACTrainer, MAACConfig, MAACTrainer = lib_import(
        "comlrl.trainers.actor_critic", "IACConfig", "IACTrainer", "MAACConfig", "MAACTrainer")
    RewardProcessors = lib_import("comlrl.utils.reward_processor", "RewardProcessors")
    sec = cfg.get(section) or {}
    num_agents = int(sec.get("num_agents") or 1)
    train_items, eval_items = setup(cfg, config_path)
    train_ds, eval_ds = Dataset.from_list(train_items), (Dataset.from_list(eval_items) if eval_items else None)
    model_cfg, critic_cfg = cfg.get("agent_model") or {}, cfg.get("critic_model") or {}
    model_name = str(model_cfg.get("name") or "")
    model_kwargs: Dict[str, Any] = {}
    dtype = _map_dtype(model_cfg.get("dtype") or model_cfg.get("torch_dtype"))
    if dtype is not None:
        model_kwargs["torch_dtype"] = dtype
    critic_model_kwargs: Dict[str, Any] = {}
    critic_dtype = _map_dtype(critic_cfg.get("dtype") or critic_cfg.get("torch_dtype"))
    if critic_dtype is not None:
        critic_model_kwargs["torch_dtype"] = critic_dtype
    tokenizer = AutoTokenizer.from_pretrained(model_name)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    args = get_iac_args(cfg, IACConfig) if section == "iac" else get_maac_args(cfg, MAACConfig)
    formatters = build_formatters(cfg, num_agents=num_agents, tokenizer=tokenizer)

    prompt_to_item: Dict[str, Dict[str, Any]] = {}
    dataset_prompt_map: Dict[str, Dict[str, Any]] = {}

    def _register_prompt(prompt: str, item: Mapping[str, Any], turn_idx: int) -> None:
        if _normalize_key(prompt):
            prompt_to_item[_normalize_key(prompt)] = dict(item, _str_build_turn=int(turn_idx))

    for items in (train_items, eval_items):
        for item in items:
            dataset_prompt_map.setdefault(_normalize_key(item["prompt"]), dict(item))
            for fmt in formatters:
                _register_prompt(fmt(item), item, 1)

    def _lookup_item(prompts: List[str]) -> Dict[str, Any]:
        for p in prompts or []:
            if _normalize_key(p) in prompt_to_item:
                return prompt_to_item[_normalize_key(p)]
        return {}

    reward_base = get_reward_function(cfg=cfg, num_agents=num_agents)
    if num_agents == 1:
        def reward_func(prompts: List[str], agent1_completions: List[str]) -> List[float]:
            return reward_base(agent1_completions, batch_items=[_lookup_item(prompts)])
    else:
        def reward_func(prompts: List[str], agent1_completions: List[str],
                        agent2_completions: List[str]) -> List[float]:
            return reward_base(agent1_completions, agent2_completions, batch_items=[_lookup_item(prompts)])

    model_config = {"model_kwargs": model_kwargs, "critic_model_kwargs": critic_model_kwargs,
                    "critic_value_head_hidden_dim": sec.get("critic_value_head_hidden_dim")}
    if section == "iac":
        model_config["value_head_hidden_dim"] = sec.get("value_head_hidden_dim")
    trainer_kwargs: Dict[str, Any] = {
        "tokenizer": tokenizer,
        "reward_func": reward_func,
        "formatters": formatters,
        "args": args,
        "train_dataset": train_ds,
        "eval_dataset": eval_ds,
        "model_config": model_config,
        "wandb_config": wandb_config_from(cfg, section, num_agents, args.num_turns),
    }
    trainer_kwargs["agent_model"] = model_name or None
    critic_name = str(critic_cfg.get("name") or "").strip() or None
    if critic_name:
        trainer_kwargs["critic_model"] = critic_name
    processor = reward_processor_from(cfg, RewardProcessors)
    if processor is not None:
        trainer_kwargs["reward_processor"] = processor
    if int(args.num_turns) > 1:
        context = context_map_for(cfg, [train_items, eval_items], formatters, num_agents)
        set_context_resolver(lambda p: context.get(_normalize_key(p)))
        ext = cfg.get("external") or {}

        def external_transition_wrapper(prompt: str, agent_completions: Any, num_agents: Optional[int] = None,
                                        **_kwargs: Any) -> Any:
            n_agents = int(num_agents) if num_agents is not None else len(formatters)
            prompt_history = _kwargs.get("prompt_history_per_agent")
            prompts = get_external_transition(
                prompt=prompt, agent_completions=agent_completions, num_agents=n_agents,
                mode=str(ext.get("mode") or "perfect_feedback"),
                original_prompt=bool(ext.get("original_prompt", True)),
                previous_response=bool(ext.get("previous_response", False)),
                prompt_history_per_agent=prompt_history,
                response_history_per_agent=_kwargs.get("response_history_per_agent"))
            turn_idx = int(len(prompt_history[0]) + 1) if prompt_history else 2
            item = dataset_prompt_map.get(_normalize_key(str(prompt or "")))
            if item and isinstance(prompts, (list, tuple)):
                for p in prompts:
                    _register_prompt(str(p), item, turn_idx)
            return prompts
        trainer_kwargs["external_transition"] = external_transition_wrapper
    Trainer = IACTrainer if section == "iac" else MAACTrainer
    run_trainer(Trainer(**trainer_kwargs), cfg)


ALGOS = {
    "magrpo": ("str_build_magrpo_config.yaml", main_magrpo),
    "grpo": ("str_build_grpo_config.yaml", main_magrpo),
    "iac": ("str_build_iac_config.yaml", lambda c, p: main_actor_critic(c, p, "iac")),
    "maac": ("str_build_maac_config.yaml", lambda c, p: main_actor_critic(c, p, "maac")),
}


def main() -> None:
    parser = add_lib_arg(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--algo", choices=sorted(ALGOS), required=True)
    a = parser.parse_args()
    set_lib(a.lib)
    import torch
    torch.manual_seed(0)
    config_file, entry = ALGOS[a.algo]
    config_path = os.path.join(HERE, "configs", config_file)
    with tempfile.TemporaryDirectory() as tmp:
        entry(load_yaml(config_path, tmp), config_path)
    print(f"calls transition={CALLS['transition']} reward={CALLS['reward']}")
    finish(f"minecraft_str/{a.algo}")


if __name__ == "__main__":
    main()
