"""The house in floors: every module of the package imports only from its own floor or below, and no modules import
each other in a circle. The order is declared here, once (DESIGN.md and 00_core point at this file).

Imports are read from the source with `ast`, including the ones inside functions, so a lazy import that runs up the
house fails here as well as a top-level one."""
import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "comlrl_nb"

# Bottom to top. A module may import from its own floor or any floor below it, never from a floor above.
FLOORS = [
    # 1. vocabulary and pure math: seeds, devices, tasks, baselines, losses, the centralized actor's text format
    ["core", "distributed", "tasks", "advantages", "losses", "site", "centralized_text"],
    # 2. the reward call contract, loading models, sampling (ours and vLLM's), run directories, the sandbox,
    #    metrics and trackers
    ["rewards", "models", "generation", "vllm_engine", "runs", "sandbox", "tracking"],
    # 3. configs, the memory planner, data, scoring, rollouts, checkpoints, the sampler, the run engine, reward
    #    models, LoRA agents
    ["config", "plan", "dataset", "scoring", "rollout", "checkpoints", "sampling", "engine", "reward_model",
     "adapters"],
    # 4. the team of agents, preference records, replay, API clients
    ["team", "preference", "replay", "api"],
    # 5. comparators (a snapshot, another model or an API)
    ["comparators"],
    # 6. trainers
    ["trainers", "trainers.*"],
    # 7. the comlrl 1.4.3 compatibility layer, config files and the user's own files (one reading path that names the
    #    file and line), evaluation of saved agents: nothing below imports these
    ["porting", "config_files", "own_data", "evaluate"],
    # 8. the flat namespace, the command line, the shipped environments
    ["__init__", "cli", "__main__", "envs", "envs.*"],
]


def _name(path: Path) -> str:
    rel = path.relative_to(PKG).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1] or ["__init__"]
    return ".".join(parts)


MODULES = {_name(p): p for p in sorted(PKG.rglob("*.py")) if p.name != "_modidx.py" and "__pycache__" not in p.parts}


def floor_of(module: str):
    "The floor number of a module (1 = bottom), or None when the order does not declare it."
    for i, names in enumerate(FLOORS, 1):
        for n in names:
            if n == module or (n.endswith(".*") and module.startswith(n[:-1])):
                return i
    return None


def _module(dotted: str):
    "The package module `comlrl_nb.x.y` names (walking up to the module that holds a name), or None outside it."
    if dotted != "comlrl_nb" and not dotted.startswith("comlrl_nb."):
        return None
    name = dotted[len("comlrl_nb."):] if dotted != "comlrl_nb" else "__init__"
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name if name in MODULES else None


def _targets(module: str, node) -> set:
    "The package modules that one import statement of `module` reads from."
    if isinstance(node, ast.Import):
        dotted = [a.name for a in node.names]
    else:
        here = [] if module == "__init__" else module.split(".")
        if MODULES[module].name != "__init__.py":
            here = here[:-1]                                   # a plain module's package
        base = here[: len(here) - node.level + 1] if node.level else None
        mod = ".".join(["comlrl_nb", *base, *([node.module] if node.module else [])]) if node.level else node.module
        dotted = [f"{mod}.{a.name}" if f"{mod}.{a.name}"[len("comlrl_nb."):] in MODULES else mod for a in node.names]
    return {t for t in map(_module, dotted) if t is not None and t != module}


def imports() -> dict:
    "{module: {imported module: first line number}} over the whole package."
    out = {}
    for m, p in MODULES.items():
        found = {}
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for t in sorted(_targets(m, node)):
                    found.setdefault(t, node.lineno)
        out[m] = found
    return out


def circles(edges: dict) -> list[list[str]]:
    "Strongly connected groups of more than one module (Tarjan)."
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_every_module_has_a_floor():
    missing = [m for m in MODULES if floor_of(m) is None]
    assert not missing, f"modules without a floor: {missing}; add each to FLOORS in tests/test_floors.py"


def test_no_import_runs_up():
    bad = []
    for m, targets in imports().items():
        for t, line in targets.items():
            if floor_of(m) is not None and floor_of(t) is not None and floor_of(t) > floor_of(m):
                bad.append(f"comlrl_nb/{MODULES[m].relative_to(PKG)}:{line}: {m} (floor {floor_of(m)}) imports {t} "
                           f"(floor {floor_of(t)})")
    assert not bad, "imports that run up the house:\n" + "\n".join(bad)


def test_no_import_circle():
    found = circles({m: set(t) for m, t in imports().items()})
    assert not found, "modules that import each other in a circle: " + "; ".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize("edges, expected", [({"a": {"b"}, "b": {"a"}, "c": {"a"}}, [["a", "b"]]),
                                              ({"a": {"b"}, "b": {"c"}}, [])])
def test_the_circle_finder_finds_circles(edges, expected):
    assert circles(edges) == expected


def test_the_reader_sees_imports_inside_functions(tmp_path):
    "The check reads lazy imports too: the porting layer's imports of the trainers are inside functions."
    found = imports()
    assert "core" in found["rewards"] and "core" in found["generation"]
    lazy = [m for m, p in MODULES.items() for node in ast.walk(ast.parse(p.read_text()))
            if isinstance(node, ast.FunctionDef) and any(isinstance(x, ast.ImportFrom) for x in ast.walk(node))]
    assert lazy, "no module has an import inside a function: the reader's nested case is not exercised"
