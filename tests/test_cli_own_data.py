"""`comlrl-nb train --dataset/--reward ...` and `comlrl-nb eval`: bad input is one clear line (exit 2) before any model
loads; a tiny run trains on a user's rows, writes final/agent_i/, and eval prints one JSON line."""
import json

import pytest
import torch

from comlrl_nb.cli import main

torch.set_num_threads(1)


@pytest.fixture
def files(tmp_path):
    rows = [{"prompt": f"Say {w}.", "answer": w} for w in ("yes", "no", "maybe", "ok")]
    (tmp_path / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "rows.csv").write_text("question,answer\nSay yes.,yes\n")
    (tmp_path / "r.py").write_text(
        "def says(a, b, batch_items=None):\n    return [float(it['answer'] in x + y) for x, y, it in zip(a, b, "
        "batch_items)]\ndef lonely(batch_items=None):\n    return []\n"
        "def fmt(item):\n    return 'Q: ' + item['question']\n"
        "NOT_A_FUNCTION = 3\n")
    return tmp_path


@pytest.mark.parametrize("argv, msg", [
    (["--dataset", "{d}/missing.jsonl", "--reward", "{d}/r.py:says"], "does not exist"),
    (["--dataset", "{d}/rows.jsonl", "--reward", "{d}/nope.py:says"], "the file {d}/nope.py does not exist"),
    (["--dataset", "{d}/rows.jsonl", "--reward", "{d}/r.py:sayz"], "has no 'sayz'. Did you mean 'says'?"),
    (["--dataset", "{d}/rows.jsonl", "--reward", "no_such_pkg_xyz.rewards:f"],
     "cannot import module 'no_such_pkg_xyz.rewards'"),
    (["--dataset", "{d}/rows.jsonl", "--reward", "{d}/r.py:NOT_A_FUNCTION"], "is a int, not a function"),
    (["--dataset", "{d}/rows.jsonl", "--reward", "{d}/r.py:lonely"],
     "takes 0 positional parameter(s) but there are 2 agents"),
    (["--dataset", "{d}/rows.csv", "--reward", "{d}/r.py:says"],
     "needs the column 'prompt', which the row lacks; its columns are ['answer', 'question']"),
    (["--dataset", "{d}/rows.jsonl", "--reward", "{d}/r.py:says", "--formatters", "{d}/r.py:fmt"],
     "needs the column 'question'"),
    (["--dataset", "{d}/rows.jsonl", "--reward", "{d}/r.py:says", "--task", "code"],
     "either --task NAME or --dataset PATH"),
    (["--dataset", "{d}/rows.jsonl"], "--dataset needs --reward"),
    (["--task", "code", "--num-agents", "3"], "task 'code' has 2 agents"),
    (["--transition", "{d}/r.py:says"], "--transition need --dataset PATH"),
])
def test_own_data_errors_are_one_line(files, argv, msg, capsys):
    argv = [a.format(d=files) for a in argv]
    assert main(["train", "--model", "tiny"] + argv) == 2
    err = capsys.readouterr().err
    assert msg.format(d=files) in err and err.count("\n") == 1, err


def test_csv_with_formatters_checks_and_eval_errors(files, capsys):
    assert main(["eval", "--task", "length_ratio"]) == 2
    assert "--agents DIR (saved agents) or --model SPEC" in capsys.readouterr().err
    assert main(["eval", "--agents", str(files / "nowhere")]) == 2
    assert "no such directory" in capsys.readouterr().err


def test_train_on_rows_then_eval_the_final_agents(files, capsys):
    out = files / "run"
    assert main(["train", "--model", "tiny", "--dataset", str(files / "rows.jsonl"), "--reward", f"{files}/r.py:says",
                 "--output-dir", str(out), "--set", "progress_bar=false", "num_train_epochs=1"]) == 0
    capsys.readouterr()
    rep = json.loads((out / "report.json").read_text())
    assert rep["task"] == "rows" and rep["final_agents"].endswith("final")
    assert sorted(p.name for p in (out / "final").iterdir()) == ["agent_0", "agent_1"]
    assert main(["eval", "--agents", str(out / "final"), "--dataset", str(files / "rows.jsonl"), "--reward",
                 f"{files}/r.py:says", "--samples", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    res = json.loads(lines[0])
    assert (res["n"], res["rows"], res["samples_per_row"]) == (8, 4, 2) and 0 <= res["mean"] <= 1 \
        and res["se"] is not None
