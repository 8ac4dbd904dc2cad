"""A tracker's run config holds no secret (issue S3): one scrubbed record of the config feeds report.json, checkpoints
and every tracker. A stand-in `wandb` module records what `wandb.init` receives."""
import json
import sys
import types

from comlrl_nb.api import APIComparatorConfig
from comlrl_nb.engine import MetricsLogger
from comlrl_nb.porting import wandb_init_kwargs

SECRET = "sk-FAKE-tracker-0123456789abcdef"
HEADER_SECRET = "tok-FAKE-header-9876543210"


def _stand_in_wandb(monkeypatch) -> dict:
    seen = {}

    def init(**kw):
        seen.update(kw)
        return types.SimpleNamespace(id="run1", project=kw.get("project"), entity=None,
                                     log=lambda *a, **k: None, finish=lambda: None)
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    return seen


def _config():
    "A trainer-like config dataclass carrying the comparator's key, a secret header and a key in the URL."
    return APIComparatorConfig(comparator_api_url=f"https://api.example.com/v1/chat?key={SECRET}",
                               comparator_api_key=SECRET, comparator_api_model="m",
                               comparator_api_headers={"X-Api-Token": HEADER_SECRET, "X-Trace": "t1"})


def test_wandb_run_config_holds_no_secret(tmp_path, monkeypatch):
    seen = _stand_in_wandb(monkeypatch)
    sections = {"iterative": {"comparator_api_key": SECRET, "num_rounds": 2}}
    kw = wandb_init_kwargs({"project": "p", "config_sections": sections}, _config())   # what a trainer keeps
    MetricsLogger(tmp_path, 1, kw).close()                                               # what the tracker sends
    sent = json.dumps(seen, default=str)
    for secret in (SECRET, HEADER_SECRET):
        assert secret not in sent and secret not in repr(kw)
    cfg = seen["config"]
    assert cfg["comparator_api_key"] == "***" and cfg["iterative"]["comparator_api_key"] == "***"
    assert cfg["comparator_api_headers"] == {"X-Api-Token": "***", "X-Trace": "t1"}
    assert cfg["comparator_api_url"] == "https://api.example.com/v1/chat?key=***"
    assert cfg["comparator_api_model"] == "m" and cfg["iterative"]["num_rounds"] == 2     # the rest is kept


def test_tracker_and_checkpoint_keep_the_same_record(tmp_path, monkeypatch):
    from comlrl_nb.engine import config_json
    seen = _stand_in_wandb(monkeypatch)
    record = {"comparator_api_key": SECRET, "comparator_api_headers": {"Authorization": f"Bearer {SECRET}"}, "lr": 0.1}
    MetricsLogger(tmp_path, 1, {"project": "p", "config": dict(record)}).close()
    assert seen["config"] == config_json(record)
    assert SECRET not in json.dumps(seen, default=str)
