"""Offline port of OpenMLRL/LLM_Collab_Code_Completion (ClassEval: agents complete the methods of a class skeleton,
each its assigned share): train/train_magrpo.py, 2 agents, 2 turns with a code-feedback transition.

    python run.py --lib comlrl    --algo magrpo     # the existing library (comlrl 1.4.3)
    python run.py --lib comlrl_nb --algo magrpo     # this package; only the import prefix differs

The reward and the transition run the class's tests; the project does it in a sandboxed subprocess, here a small
in-process stand-in executes the merged class and its asserts (see README.md).
"""
from __future__ import annotations

import argparse
import ast
import inspect
import os
import re
import sys
import tempfile
from typing import Any, Callable, Dict, List, Optional

import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from libselect import TINY_MODEL, add_lib_arg, finish, lib_import, set_lib  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CALLS = {"transition": 0, "reward": 0}


def load_yaml(path: str, output_dir: str) -> Dict[str, Any]:
    with open(path) as f:
        text = f.read().replace("TINY_MODEL", TINY_MODEL).replace("OUTPUT", output_dir)
    return yaml.safe_load(text)


def load_dataset(name: str, split: str):
    "Stand-in for datasets.load_dataset('FudanSELab/ClassEval', split=...): the same call on a local JSONL file."
    import datasets
    return datasets.load_dataset("json", data_files={"test": os.path.join(HERE, "data", "classeval_test.jsonl")},
                                 split=split)


# ---------------------------------------------------------------- skeleton helpers (utils/parse_completion.py, ...)
def extract_incomplete_methods(skeleton: str) -> List[str]:
    tree = ast.parse(skeleton)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    return [f.name for f in cls.body if isinstance(f, ast.FunctionDef) and f.name != "__init__"
            and len(f.body) == 1 and isinstance(f.body[0], ast.Pass)]


def extract_method_snippets(text: str, allowed_methods: set) -> Dict[str, str]:
    "`def name(...)` blocks of a completion, for the allowed method names, that parse on their own."
    out: Dict[str, str] = {}
    for m in re.finditer(r"^\s*def (\w+)\(.*?(?=^\s*def |\Z)", text or "", flags=re.S | re.M):
        name, code = m.group(1), m.group(0)
        if name in allowed_methods:
            try:
                ast.parse(code.strip())
                out[name] = code.strip()
            except SyntaxError:
                pass
    return out


def merge_methods_into_skeleton(skeleton: str, method_to_code: Dict[str, str]) -> str:
    lines = skeleton.splitlines()
    for name, code in method_to_code.items():
        body = "\n".join("        " + ln for ln in code.splitlines()[1:]) or "        pass"
        for i, ln in enumerate(lines):
            if ln.strip().startswith(f"def {name}(") and i + 1 < len(lines) and lines[i + 1].strip() == "pass":
                lines[i + 1] = body
    return "\n".join(lines) + "\n"


def run_unittests_with_details(code: str, test_code: str) -> Dict[str, Any]:
    "Stand-in for the project's sandboxed unittest run: exec the class, then each assert line; counts passes."
    try:
        compile(code, "<candidate>", "exec")
    except SyntaxError:
        return {"syntax_ok": False, "testsRun": 0, "passed": 0}
    env: Dict[str, Any] = {}
    try:
        exec(code, env)
    except Exception:
        return {"syntax_ok": True, "testsRun": 1, "passed": 0}
    asserts = [ln for ln in test_code.splitlines() if ln.startswith("assert")]
    setup = "\n".join(ln for ln in test_code.splitlines() if not ln.startswith("assert"))
    passed = 0
    for a in asserts:
        try:
            exec(setup + "\n" + a, dict(env))
            passed += 1
        except Exception:
            pass
    return {"syntax_ok": True, "testsRun": len(asserts), "passed": passed}


# ---------------------------------------------------------------- strategy and formatters (train/strategies.py)
class ParamCountStrategy:
    "Assign the incomplete methods to agents round-robin (the project balances by parameter count)."

    def __init__(self, num_agents: int, seed: int) -> None:
        self.num_agents, self.seed, self.self_select = num_agents, seed, False

    def partition(self, example: Dict[str, Any]) -> Dict[str, int]:
        names = extract_incomplete_methods(example.get("skeleton", ""))
        return {m: i % self.num_agents for i, m in enumerate(names)}


def build_agent_formatters(strategy: ParamCountStrategy) -> List[Callable[[Dict[str, Any]], str]]:
    def make_fmt(agent_idx: int):
        def _fmt(example: Dict[str, Any]) -> str:
            assigned = [m for m, a in strategy.partition(example).items() if a == agent_idx]
            return (f"Complete methods {', '.join(assigned)} of class {example.get('class_name')}:\n"
                    f"{example.get('skeleton', '')}")
        return _fmt
    return [make_fmt(i) for i in range(strategy.num_agents)]


# ---------------------------------------------------------------- reward (rewards/CE_reward.py shape)
def get_reward_function(strategy: ParamCountStrategy, num_agents: int) -> Callable[..., List[float]]:
    def reward_wrapper(*agent_completions, batch_items=None, prompts=None):
        CALLS["reward"] += 1
        if not agent_completions:
            return []
        rewards: List[float] = []
        for i in range(len(agent_completions[0])):
            example = batch_items[i] if batch_items is not None else {}
            skeleton, test_code = example.get("skeleton", ""), example.get("test", "")
            methods = extract_incomplete_methods(skeleton)
            sets, merged = [], {}
            for agent_idx in range(num_agents):
                snippets = extract_method_snippets(agent_completions[agent_idx][i], set(methods))
                sets.append(set(snippets))
                merged.update(snippets)
            hits = [m for m in methods if sum(m in s for s in sets) > 1]
            lv3 = -len(hits) / len(methods) if methods else 0.0
            lv1 = 2.0 * len(merged) / len(methods) if methods else 0.0
            res = run_unittests_with_details(merge_methods_into_skeleton(skeleton, merged), test_code)
            if not res["syntax_ok"]:
                rewards.append(0.0)
                continue
            lv2 = 4.0 * res["passed"] / res["testsRun"] if res["testsRun"] else 0.0
            rewards.append(float(lv1 + lv2 + lv3))
        return rewards
    return reward_wrapper


# ---------------------------------------------------------------- external transition (external/__init__.py shape)
_context_resolver: Optional[Callable[[str], Optional[Dict[str, Any]]]] = None


def set_context_resolver(fn) -> None:
    global _context_resolver
    _context_resolver = fn


def get_external_transition(prompt: str, agent_completions, num_agents: int = 2, mode: str = "code_feedback", *,
                            prompt_history_per_agent: Optional[List[List[str]]] = None,
                            response_history_per_agent: Optional[List[List[str]]] = None, **kwargs) -> List[str]:
    CALLS["transition"] += 1
    n = int(num_agents)
    if not isinstance(agent_completions, (list, tuple)) or len(agent_completions) != n:
        raise ValueError(f"Expected {n} agent completions, got {agent_completions!r}")
    if mode not in ("code_feedback", "plain"):
        raise NotImplementedError(f"External mode not implemented: {mode}")
    ctx = (_context_resolver(prompt) if _context_resolver else None) or {}
    merged: Dict[str, str] = {}
    for c in agent_completions:
        merged.update(extract_method_snippets(c, set(ctx.get("method_names", []))))
    res = run_unittests_with_details(merge_methods_into_skeleton(ctx.get("skeleton", ""), merged),
                                     ctx.get("tests_sandbox", ""))
    history = prompt_history_per_agent or [[] for _ in range(n)]
    out = []
    for i in range(n):
        parts = [f"Tests passed {res['passed']}/{res['testsRun']}." if mode == "code_feedback" else "Revise."]
        if kwargs.get("original_prompt", True) and history[i]:
            parts.append(history[i][0])
        if kwargs.get("previous_response", True):
            parts.append("Previous: " + str(agent_completions[i])[:40])
        out.append("\n".join(parts))
    return out


# ---------------------------------------------------------------- trainer args (utils/trainer_args.py)
def get_trainer_args(cfg: Dict[str, Any], MAGRPOConfig: Any, *, sampling_cfg: Dict[str, Any]) -> Any:
    tr, ext = cfg.get("magrpo", {}), cfg.get("external", {})
    candidate = {
        "num_turns": int(tr.get("num_turns", 2)), "num_train_epochs": int(tr.get("num_train_epochs", 13)),
        "agent_learning_rate": float(tr.get("agent_learning_rate", 1e-5)),
        "logging_steps": int(tr.get("logging_steps", 1)), "num_generations": int(tr.get("num_generations", 2)),
        "max_new_tokens": int(tr.get("max_new_tokens", 600)),
        "temperature": float(sampling_cfg.get("temperature", 0.6)), "top_p": float(sampling_cfg.get("top_p", 0.6)),
        "top_k": sampling_cfg.get("top_k"),
        "num_agents": int(tr.get("num_agents", 2)),
        "parallel_training": str(tr.get("parallel_training", "none")).strip().lower(),
        "agent_devices": tr.get("agent_devices", ["cuda:0"]),
        "discount": float(tr.get("discount", 0.9)), "joint_mode": str(tr.get("joint_mode", "aligned")),
        "early_termination_threshold": tr.get("early_termination_threshold", -0.2),
        "rollout_buffer_size": int(tr.get("rollout_buffer_size", 1)),
        "train_batch_size": tr.get("train_batch_size", 1),
        "advantage_normalization": bool(tr.get("advantage_normalization", True)),
        "eval_interval": int(tr.get("eval_interval", 10)), "eval_num_samples": int(tr.get("eval_num_samples", 4)),
        "eval_batch_size": int(tr.get("eval_batch_size", 1)),
        "external_prompt_passthrough": bool(ext.get("external_prompt_passthrough", False)),
    }
    params = set(inspect.signature(MAGRPOConfig.__init__).parameters) - {"self", "args", "kwargs"}
    return MAGRPOConfig(**{k: v for k, v in candidate.items() if k in params})


# ---------------------------------------------------------------- train/train_magrpo.py
def main_magrpo(cfg: Dict[str, Any]) -> None:
    import torch
    from transformers import AutoTokenizer
    MAGRPOTrainer = lib_import("comlrl.trainers.reinforce", "MAGRPOTrainer")
    MAGRPOConfig = lib_import("comlrl.trainers.reinforce", "MAGRPOConfig")
    RewardProcessors = lib_import("comlrl.utils.reward_processor", "RewardProcessors")
    model_cfg, magrpo_cfg = cfg.get("agent_model", {}), cfg.get("magrpo", {})
    dataset_cfg, external_cfg = cfg.get("dataset", {}), cfg.get("external", {})
    num_agents = int(magrpo_cfg.get("num_agents", 2))
    train_ds = load_dataset(dataset_cfg["name"], split=dataset_cfg["train_split"])
    eval_ds = load_dataset(dataset_cfg["name"], split=dataset_cfg["eval_split"])
    train_ds = train_ds.map(lambda _, i: {"phase": "train", "prompt": f"classeval:train:{i}"}, with_indices=True)
    eval_ds = eval_ds.map(lambda _, i: {"phase": "eval", "prompt": f"classeval:eval:{i}"}, with_indices=True)
    model_name = model_cfg.get("name")
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "auto": "auto"}.get(model_cfg.get("dtype"))
    tokenizer = AutoTokenizer.from_pretrained(model_name)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    strategy = ParamCountStrategy(num_agents=num_agents, seed=int(cfg.get("seed", 42)))
    sampling_cfg = {k: model_cfg.get(k) for k in ("temperature", "top_p", "top_k")}
    magrpo_args = get_trainer_args(cfg, MAGRPOConfig, sampling_cfg=sampling_cfg)
    formatters = build_agent_formatters(strategy)
    w = cfg.get("wandb", {})
    wandb_config = {"project": w.get("project"), "entity": w.get("entity"), "name": w.get("name"),
                    "dir": w.get("dir"), "tags": w.get("tags"),
                    "config_sections": {"dataset": dataset_cfg, "agent_model": model_cfg,
                                        "output": cfg.get("output", {}), "external": external_cfg,
                                        "trainer": magrpo_cfg}}
    rp = cfg.get("reward_processor", {}) or {}
    reward_processor = None
    if rp.get("enabled", True):
        reward_processor = RewardProcessors.scale(factor=rp.get("scale_factor", 1.0))
        if rp.get("shift") is not None:
            shift_proc = RewardProcessors.shift(value=float(rp["shift"]))
            prev = reward_processor
            reward_processor = (lambda p=prev, s=shift_proc: (lambda x: s(p(x))))()
    trainer_kwargs = {
        "agent_model": model_name or None,
        "agents": None,
        "num_agents": num_agents,
        "model_config": {"torch_dtype": torch_dtype, "special_tokens": model_cfg.get("special_tokens", {})},
        "reward_func": get_reward_function(strategy=strategy, num_agents=num_agents),
        "formatters": formatters,
        "args": magrpo_args,
        "train_dataset": train_ds,
        "eval_dataset": eval_ds,
        "tokenizer": tokenizer,
        "wandb_config": wandb_config,
        # the project's HEAD also passes "dataset_type": "classeval", which comlrl 1.4.3 refuses (TypeError)
    }
    if reward_processor is not None:
        trainer_kwargs["reward_processor"] = reward_processor
    if int(magrpo_args.num_turns) > 1:
        norm = lambda s: " ".join((s or "").split()).strip()  # noqa: E731
        context_map: Dict[str, Any] = {}
        for split_name, ds in (("train", train_ds), ("eval", eval_ds)):
            for item in ds:
                payload = {"skeleton": item["skeleton"], "class_name": item["class_name"],
                           "tests_eval": item["test"], "tests_sandbox": item["test"],
                           "method_names": extract_incomplete_methods(item["skeleton"]),
                           "assignments": strategy.partition(item)}
                context_map[norm(item["prompt"])] = payload
                for fmt in formatters:
                    context_map[norm(fmt(item))] = payload
        set_context_resolver(lambda p: context_map.get(norm(p)))

        def external_transition_wrapper(prompt, agent_completions, num_agents=None, prompt_history_per_agent=None,
                                        response_history_per_agent=None, _default_num_agents=num_agents, **_kwargs):
            return get_external_transition(
                prompt=prompt, agent_completions=agent_completions,
                num_agents=num_agents if num_agents is not None else _default_num_agents,
                mode=str(external_cfg.get("mode", "code_feedback")),
                prompt_history_per_agent=prompt_history_per_agent,
                response_history_per_agent=response_history_per_agent,
                original_prompt=bool(external_cfg.get("original_prompt", True)),
                previous_response=bool(external_cfg.get("previous_response", True)))
        trainer_kwargs["external_transition"] = external_transition_wrapper
    trainer = MAGRPOTrainer(**trainer_kwargs)
    trainer.verbose = bool(cfg.get("output", {}).get("verbose", False))
    trainer.train()
    out_cfg = cfg.get("output", {})
    if bool(out_cfg.get("save_final_model", False)):
        trainer.save_model(out_cfg.get("save_path") or os.path.join(out_cfg["base_dir"], "final_model"))


ALGOS = {"magrpo": ("magrpo_classeval_config.yaml", main_magrpo)}


def main() -> None:
    parser = add_lib_arg(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--algo", choices=sorted(ALGOS), required=True)
    a = parser.parse_args()
    set_lib(a.lib)
    import torch
    torch.manual_seed(0)
    config_file, entry = ALGOS[a.algo]
    with tempfile.TemporaryDirectory() as tmp:
        entry(load_yaml(os.path.join(HERE, "configs", config_file), tmp))
    print(f"calls transition={CALLS['transition']} reward={CALLS['reward']}")
    finish(f"code_completion/{a.algo}")


if __name__ == "__main__":
    main()
