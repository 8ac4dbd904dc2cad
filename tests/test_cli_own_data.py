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


# ------------------------------------------------------------------ every file a user hands over (S3)
BAD_FILES = {   # name -> (bytes, the argv that uses it, what the one-line error must say)
    "latin.csv": ("prompt,answer\nCaf\u00e9?,yes\n".encode("latin-1"), ["--dataset", "{f}"],
                  "{f}, line 2, column 4: byte 0xe9 is not UTF-8"),
    "badline.jsonl": (b'{"prompt": "a", "answer": "b"}\n{"prompt": "c", "answer": }\n', ["--dataset", "{f}"],
                      "{f}, line 2, column 27: not valid JSON (Expecting value); a JSONL file holds one JSON object"),
    "dupkey.jsonl": (b'{"prompt": "a", "answer": "b"}\n{"prompt": "c", "answer": "d", "prompt": "e"}\n',
                     ["--dataset", "{f}"], "{f}, line 2: the key 'prompt' is given twice, in one line"),
    "notobject.jsonl": (b'{"prompt": "a", "answer": "b"}\n"just text"\n', ["--dataset", "{f}"],
                        "{f}, line 2: row 1 is a str, not an object with named fields"),
    "ragged.csv": (b"prompt,answer\nSay yes.,yes\nSay, no,no\n", ["--dataset", "{f}"],
                   "{f}, line 3: this row has 3 field(s), the header 2; give every row one value per column"),
    "dupcol.csv": (b"prompt,answer,prompt\na,b,c\n", ["--dataset", "{f}"],
                   "{f}, line 1: the column 'prompt' is named twice in the header (columns 1 and 3)"),
    "quote.csv": (b'prompt,answer\n"never closed,yes\n', ["--dataset", "{f}"], "{f}, line 2: not valid CSV"),
    "empty.jsonl": (b"\n\n", ["--dataset", "{f}"], "{f}: holds no rows; a dataset needs at least one row"),
    "fake.parquet": (b"prompt\nhello\n", ["--dataset", "{f}"], "{f}: cannot be read as Parquet"),
    "two_lists.json": (b'{"train": [{"prompt": "a"}], "test": [{"prompt": "b"}]}', ["--dataset", "{f}"],
                       "{f}: a JSON object must hold exactly one list of rows, found 2 ('train', 'test')"),
    "missing_col.jsonl": (b'{"prompt": "a", "answer": "b"}\n\n{"answer": "d"}\n', ["--dataset", "{f}"],
                          "{f}, line 3 (row 1): the prompt of agent 1 (default_formatter) needs the column 'prompt'"),
    "syntax.py": (b"def says(a, b, batch_items=None)\n    return [0.0] * len(a)\n", ["--reward", "{f}:says"],
                  "{f}, line 1, column 33: SyntaxError: expected ':' in `def says(a, b, batch_items=None)`"),
    "indent.py": (b"def says(a, b, batch_items=None):\nreturn [0.0]\n", ["--reward", "{f}:says"],
                  "{f}, line 2, column 1: IndentationError: expected an indented block"),
    "imports.py": (b"import os\nfrom no_such_pkg_xyz import helper\ndef says(a, b, batch_items=None):\n    return a\n",
                   ["--reward", "{f}:says"], "{f}, line 2: `from no_such_pkg_xyz import helper` failed: no module "
                                             "named 'no_such_pkg_xyz' in this Python"),
    "badname.py": (b"from json import dumpz\ndef says(a, b, batch_items=None):\n    return a\n",
                   ["--reward", "{f}:says"], "{f}, line 1: `from json import dumpz` failed: ImportError: cannot "
                                             "import name 'dumpz'"),
    "crashes.py": (b"def says(a, b, batch_items=None):\n    return a\nCACHE = open('/no/such/cache.txt').read()\n",
                   ["--reward", "{f}:says"], "{f}, line 3: `CACHE = open('/no/such/cache.txt').read()` failed: "
                                             "FileNotFoundError"),
    "exits.py": (b"import sys\ndef says(a, b, batch_items=None):\n    return a\nsys.exit('usage: ...')\n",
                 ["--reward", "{f}:says"], "{f}, line 4: `sys.exit('usage: ...')` failed: the file exits when it is "
                                           "imported; put script code under `if __name__ == '__main__':`"),
    "latin1.py": ("# r\u00e9compense\ndef says(a, b, batch_items=None):\n    return a\n".encode("latin-1"),
                  ["--reward", "{f}:says"], "{f}, line 1, column 4: byte 0xe9 is not UTF-8"),
    "fmt_broken.py": (b"def fmt(item):\n    return 'Q: ' + item['prompt'\n", ["--formatters", "{f}:fmt"],
                      "{f}, line 2, column 24: SyntaxError: '[' was never closed"),
    "trans_broken.py": (b"import no_such_transition_dep\ndef revise(prompt, agent_completions, num_agents, **kw):\n"
                        b"    return [prompt] * num_agents\n", ["--transition", "{f}:revise"],
                        "{f}, line 1: `import no_such_transition_dep` failed"),
    "value.py": (b"def says(a, b, batch_items=None):\n    return a\n\nsays2 = 3\n", ["--reward", "{f}:says2"],
                 "{f}, line 4: says2 is a int, not a function; name a function (def says2(...)) as the reward"),
}


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_every_bad_user_file_is_one_line_naming_file_line_and_fix(files, name, capsys):
    data, argv, msg = BAD_FILES[name]
    f = files / name
    f.write_bytes(data)
    base = {"--dataset": str(files / "rows.jsonl"), "--reward": f"{files}/r.py:says"}
    for k, v in zip(argv[::2], argv[1::2]): base[k] = v.format(f=f)
    flat = [x for kv in base.items() for x in kv]
    assert main(["train", "--model", "tiny", "--output-dir", str(files / "out")] + flat) == 2
    err = capsys.readouterr().err
    assert msg.format(f=f) in err and err.count("\n") == 1, err
    assert not (files / "out").exists()                                 # refused before anything was written


def test_an_edited_reward_file_is_read_again(files):
    from comlrl_nb.own_data import load_object, own_task
    r = files / "live.py"
    r.write_text("def score(a, b, batch_items=None):\n    return [1.0] * len(a)\n")
    assert own_task(files / "rows.jsonl", f"{r}:score").reward_func(["x"], ["y"]) == [1.0]
    r.write_text("def score(a, b, batch_items=None):\n    return [7.0] * len(a)\n")      # same size, same second
    assert own_task(files / "rows.jsonl", f"{r}:score").reward_func(["x"], ["y"]) == [7.0]
    first = load_object(f"{r}:score")
    assert load_object(f"{r}:score") is first                                          # unchanged: not re-run
    r.write_text("def score(a, b, batch_items=None)\n    return a\n")
    with pytest.raises(ValueError, match=r"live.py, line 1, column \d+: SyntaxError"): load_object(f"{r}:score")


def test_an_edited_neighbour_module_is_read_again(files):
    from comlrl_nb.own_data import load_object
    (files / "weights_s3.py").write_text("W = 1.0\n")
    (files / "uses.py").write_text("import weights_s3\ndef score(a, b, batch_items=None):\n"
                                   "    return [weights_s3.W] * len(a)\n")
    assert load_object(f"{files}/uses.py:score")(["x"], ["y"]) == [1.0]
    (files / "weights_s3.py").write_text("W = 3.0\n")                                  # only the neighbour changed
    assert load_object(f"{files}/uses.py:score")(["x"], ["y"]) == [3.0]


def test_a_module_that_fails_to_import_names_its_file_and_line(files, monkeypatch, capsys):
    pkg = files / "mypkg_s3"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "rewards.py").write_text("import json\nRATE = 1 / 0\ndef says(a, b, batch_items=None):\n    return a\n")
    monkeypatch.syspath_prepend(str(files))
    assert main(["train", "--model", "tiny", "--dataset", str(files / "rows.jsonl"), "--reward",
                 "mypkg_s3.rewards:says"]) == 2
    err = capsys.readouterr().err
    assert f"{pkg / 'rewards.py'}, line 2: `RATE = 1 / 0` failed: ZeroDivisionError" in err and err.count("\n") == 1


# ------------------------------------------------------------------ every flag checked before models load (S3)
@pytest.mark.parametrize("argv, msg", [
    (["eval", "--model", "tiny", "--samples", "0"], "--samples 0 is invalid: give a whole number >= 1 (joint responses "
                                                    "per row; leave it out for the config's num_generations)"),
    (["eval", "--model", "tiny", "--samples", "-3"], "--samples -3 is invalid: give a whole number >= 1"),
    (["eval", "--model", "tiny", "--max-rows", "0"], "--max-rows 0 is invalid: give a whole number >= 1"),
    (["eval", "--model", "tiny", "--max-rows", "-2"], "--max-rows -2 is invalid"),
    (["eval", "--model", "tiny", "--samples", "two"], "argument --samples: invalid int value: 'two'"),
    (["eval", "--model", "./no/such/model"], "--model ./no/such/model: no such directory"),
    (["train", "--model", "tiny", "--heldout-samples", "-1"], "--heldout-samples -1 is invalid: give a whole number >= "
                                                              "0 (joint responses per held-out item before and after "
                                                              "training; 0 skips the held-out check)"),
    (["train", "--model", "tiny", "--threads", "0"], "--threads 0 is invalid: give a whole number >= 1"),
    (["train", "--model", "tiny", "--threads", "many"], "argument --threads: invalid int value: 'many'"),
    (["train", "--model", "tiny", "--num-agents", "0", "--dataset", "{d}/rows.jsonl", "--reward", "{d}/r.py:says"],
     "--num-agents 0 is invalid: give a whole number >= 1"),
    (["train", "--model", "tiny", "--allow-config-change", "seed"], "--allow-config-change applies only with --resume"),
    (["train", "--model", "tiny", "--resume", "--allow-config-change", "sed"],
     "--allow-config-change sed: MAGRPOConfig has no field 'sed'; did you mean 'seed'?"),
    (["train", "--model", "tiny", "--output-dir", "{d}/rows.jsonl"], "--output-dir {d}/rows.jsonl is a file"),
    (["train", "--model", "{d}/rows.jsonl"], "--model {d}/rows.jsonl is a file; give a model directory"),
    (["train", "--bogus-flag"], "unrecognized arguments: --bogus-flag"),
    (["comparator-query", "--prompt", "x", "--n", "0"], "--n 0 is invalid: give a whole number >= 1"),
    (["comparator-query", "--prompt", "x", "--top-p", "1.5"], "--top-p 1.5 is invalid: give a number in (0, 1]"),
    (["comparator-query", "--prompt", "x", "--temperature", "-1"], "--temperature -1.0 is invalid: give a number >= 0"),
])
def test_every_flag_is_checked_with_its_range_before_models_load(files, argv, msg, capsys, monkeypatch):
    import comlrl_nb.models as M
    monkeypatch.setattr(M, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    assert main([a.format(d=files) for a in argv]) == 2
    err = capsys.readouterr().err
    assert msg.format(d=files) in err and err.count("\n") == 1, err


@pytest.fixture(scope="module")
def saved_team(tmp_path_factory):
    from comlrl_nb.models import make_tiny_model
    d = tmp_path_factory.mktemp("team") / "final"
    m, tok = make_tiny_model()
    for i in range(2):
        m.save_pretrained(d / f"agent_{i}")
        tok.save_pretrained(d / f"agent_{i}")
    return d


def _damaged(saved_team, tmp_path, damage):
    import shutil
    d = tmp_path / "final"
    shutil.copytree(saved_team, d)
    damage(d)
    return d


def _truncate(f, keep=0.5):
    b = f.read_bytes()
    f.write_bytes(b[:int(len(b) * keep)])


def _config(d, **change):
    c = json.loads((d / "config.json").read_text())
    c.update(change)
    (d / "config.json").write_text(json.dumps(c))


DAMAGE = {
    "weights cut in half": (lambda d: _truncate(d / "agent_1" / "model.safetensors"),
                            r"agent_1 \(.*agent_1\): .*model.safetensors is truncated: \d+ of its \d+ bytes are there"),
    "weights cut inside the header": (lambda d: _truncate(d / "agent_0" / "model.safetensors", 0.001),
                                      r"agent_0 \(.*\): .*model.safetensors is truncated \(\d+ bytes, not even its "
                                      r"header\)"),
    "no weights": (lambda d: (d / "agent_1" / "model.safetensors").unlink(),
                   r"agent_1 \(.*\): .* has no weights \(model.safetensors or pytorch_model.bin\)"),
    "agent_1 missing": (lambda d: __import__("shutil").rmtree(d / "agent_1"),
                        r"agent_1/ is missing \(found agent_0\); the save was interrupted"),
    "a wider model's config": (lambda d: _config(d / "agent_1", hidden_size=64, head_dim=16),
                               r"agent_1 \(.*\): its weights do not fit its config.json \(LlamaForCausalLM\): "
                               r"model.embed_tokens.weight is \[320, 32\] in the weights, \[320, 64\] for the model"),
    "another architecture": (lambda d: (d / "agent_0" / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": 32, "n_layer": 2, "n_head": 4,
         "vocab_size": 320, "bos_token_id": 0, "eos_token_id": 0})),
        r"agent_0 \(.*\): the weights in .* are of another architecture than its config.json \(GPT2LMHeadModel\)"),
    "fewer layers in the weights": (lambda d: _config(d / "agent_1", num_hidden_layers=3),
                                    r"agent_1 \(.*\): its weights lack \d+ of the model's tensors \(e.g. "
                                    r"model.layers.2"),
    "config.json broken": (lambda d: (d / "agent_0" / "config.json").write_text('{"model_type": "llama",\n "x": }'),
                           r"agent_0/config.json, line 2, column 7: not valid JSON"),
    "no tokenizer": (lambda d: [f.unlink() for f in (d / "agent_1").glob("tokenizer*")],
                     r"agent_1 \(.*\): .* has no tokenizer"),
    "a stray agent_x": (lambda d: (d / "agent_x").mkdir(), r"agent_x/ is not agent_<number>/"),
}


@pytest.mark.parametrize("name", list(DAMAGE))
def test_eval_names_the_damaged_agent_before_loading_any(saved_team, tmp_path, name, capsys, monkeypatch):
    import re
    import comlrl_nb.models as M
    damage, msg = DAMAGE[name]
    d = _damaged(saved_team, tmp_path, damage)
    monkeypatch.setattr(M, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    assert main(["eval", "--agents", str(d), "--samples", "1", "--max-rows", "1"]) == 2
    err = capsys.readouterr().err
    assert re.search(msg, err) and err.count("\n") == 1, err


def test_an_intact_saved_team_still_evaluates(saved_team, capsys):
    assert main(["eval", "--agents", str(saved_team), "--samples", "1", "--max-rows", "2", "--set",
                 "max_new_tokens=4"]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 2


@pytest.mark.parametrize("name", ["weights cut in half", "agent_1 missing", "no tokenizer"])
def test_evaluate_agents_from_python_checks_the_saved_team_the_same_way(saved_team, tmp_path, name, monkeypatch):
    "evaluate_agents(task, agents=DIR) runs the command line's file-by-file checks (named `agents=`) before any load."
    import re
    import comlrl_nb.models as M
    from comlrl_nb.evaluate import evaluate_agents
    from comlrl_nb.tasks import get_task
    damage, msg = DAMAGE[name]
    d = _damaged(saved_team, tmp_path, damage)
    monkeypatch.setattr(M, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises((ValueError, FileNotFoundError)) as e:
        evaluate_agents(get_task("length_ratio"), agents=d, num_samples=1)
    assert re.search(msg, str(e.value)), str(e.value)
