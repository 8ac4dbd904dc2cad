"""The one line that differs between the two libraries: where `comlrl.*` names are imported from.

A ported project's runner writes its imports as the project does (`comlrl.trainers.reinforce`, ...) through
`lib_import`; `--lib comlrl` (the existing library, 1.4.3) imports them verbatim, `--lib comlrl_nb` replaces the
leading `comlrl` by `comlrl_nb`, which is the whole porting change a user makes. Nothing else in a runner depends on
the library.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TINY_MODEL = os.environ.get("TINY_MODEL", "/work/main/.peer/tiny-model")
LIB = "comlrl"


def add_lib_arg(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--lib", choices=["comlrl", "comlrl_nb"], default="comlrl_nb")
    return parser


def set_lib(name: str) -> None:
    global LIB
    LIB = name
    os.environ.setdefault("WANDB_MODE", "disabled")      # runs never reach a W&B server
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch
    torch.set_num_threads(1)
    _wandb_standin()


def _wandb_standin() -> None:
    """Stand-in: the projects pass `wandb_config` and comlrl 1.4.3 depends on wandb; where wandb is not installed
    (this package's venv) a module with `init`/`log`/`finish`/`run` takes its place, recording calls, no network.
    Where wandb is installed, WANDB_MODE=disabled keeps it offline."""
    try:
        import wandb  # noqa: F401
        return
    except ImportError:
        pass
    import importlib.machinery
    import types

    wandb = types.ModuleType("wandb")
    wandb.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    wandb.calls = []

    class Run:
        def __init__(self, **kwargs):
            self.kwargs, self.config, self.id = kwargs, dict(kwargs.get("config") or {}), "offline"

        def log(self, data, step=None, commit=None):
            wandb.calls.append(("log", dict(data), step))

        def finish(self, *a, **k):
            wandb.calls.append(("finish",))

    def init(**kwargs):
        wandb.run = Run(**kwargs)
        wandb.calls.append(("init", sorted(kwargs)))
        return wandb.run

    def log(data, step=None, commit=None):
        if wandb.run is not None:
            wandb.run.log(data, step, commit)

    def finish(*a, **k):
        if wandb.run is not None:
            wandb.run.finish()
        wandb.run = None

    wandb.init, wandb.log, wandb.finish, wandb.run, wandb.Run = init, log, finish, None, Run
    sys.modules["wandb"] = wandb


def lib_import(module: str, *names: str):
    "`lib_import('comlrl.trainers.reinforce', 'MAGRPOConfig')`: the import line, with the chosen library."
    assert module == "comlrl" or module.startswith("comlrl."), module
    mod = importlib.import_module(LIB + module[len("comlrl"):])
    got = tuple(getattr(mod, n) for n in names)
    return got[0] if len(got) == 1 else got


def finish(tag: str) -> None:
    print(f"RESULT ok {tag} lib={LIB}", flush=True)
    sys.stdout.flush()
