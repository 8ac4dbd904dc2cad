"""API comparator clients (comlrl_nb.api) against real local HTTP servers on 127.0.0.1: every format, retries,
timeouts, malformed answers, and the API key kept out of every message, repr and log line."""
import contextlib
import io
import json
import logging
import os
import socket
import threading
import time

import pytest

from comlrl_nb.api import (APIComparatorClient, APIComparatorConfig, APIError, MockAPIServer, backoff_schedule,
                           redact, resolve_format, safe_url, scrub_secrets)

FAKE_KEY = "sk-TESTKEY-do-not-leak-7f3a9c"
FAST = dict(comparator_api_backoff=0.01, comparator_api_backoff_cap=0.05, comparator_api_timeout=2.0)


@pytest.fixture
def server():
    srv = MockAPIServer(max_requests=60)
    yield srv
    srv.close()


@pytest.fixture
def key_env(monkeypatch):
    monkeypatch.setenv("COMLRL_TEST_API_KEY", FAKE_KEY)
    return "COMLRL_TEST_API_KEY"


class Sleeps(list):
    "A recording stand-in for time.sleep."
    def __call__(self, s):
        self.append(s)


def client(srv, path="/generic", sleep=None, **kw):
    kw = {**FAST, **kw}
    return APIComparatorClient(comparator_api_url=srv.url(path), sleep=sleep if sleep is not None else Sleeps(), **kw)


def assert_no_key(*texts):
    for t in texts:
        assert FAKE_KEY not in str(t), f"key leaked in: {t}"
        assert FAKE_KEY[:12] not in str(t)


# ---------------------------------------------------------------- formats

def test_generic_body_dotted_field_extra_body_and_headers(key_env):
    with MockAPIServer(generic_field="data.outputs") as srv:
        c = client(srv, "/gen", comparator_api_response_field="data.outputs", comparator_api_key_env=key_env,
                   comparator_api_model="my-model", comparator_api_extra_body={"seed": 11, "stop": ["\n"]},
                   comparator_api_headers={"X-Team": "blue"})
        out = c.generate("Name a fruit.", 3, agent_idx=1, batch_item={"id": 7, "topic": "food"},
                         max_new_tokens=12, temperature=0.7, top_p=0.9, top_k=40)
        assert out == ["1.0: Name a fruit.", "1.1: Name a fruit.", "1.2: Name a fruit."]
        (req,) = srv.requests
        assert req["body"] == {"prompt": "Name a fruit.", "agent_idx": 1, "num_return_sequences": 3,
                               "max_new_tokens": 12, "temperature": 0.7, "top_p": 0.9, "top_k": 40,
                               "batch_item": {"id": 7, "topic": "food"}, "model": "my-model", "seed": 11,
                               "stop": ["\n"]}
        h = req["headers"]
        assert h["authorization"] == f"Bearer {FAKE_KEY}" and h["x-team"] == "blue"
        assert h["content-type"] == "application/json"
        assert_no_key(repr(c), repr(c.config))


def test_generic_list_index_paths_and_item_objects(server):
    server.script(200, {"results": [{"texts": [{"text": "a"}, {"completion": "b"}]}]}, times=2)
    for field in ("results[0].texts", "results.0.texts"):
        c = client(server, comparator_api_response_field=field)
        assert c.generate("p", 2) == ["a", "b"]


def test_generic_key_header_and_prefix_configurable(server, key_env):
    c = client(server, comparator_api_key_env=key_env, comparator_api_key_header="api-key",
               comparator_api_key_prefix="")
    c.generate("p", 1)
    h = server.requests[-1]["headers"]
    assert h["api-key"] == FAKE_KEY and "authorization" not in h
    c = client(server, comparator_api_key=FAKE_KEY, comparator_api_key_prefix="Token")
    c.generate("p", 1)
    assert server.requests[-1]["headers"]["authorization"] == f"Token {FAKE_KEY}"


def test_openai_n_split_body_and_truncation(server):
    c = client(server, "/v1/chat/completions", comparator_api_format="openai", comparator_api_model="gpt-x",
               comparator_api_max_n_per_request=2)
    out = c.generate("Hi", 5, max_new_tokens=9, temperature=0.5, top_p=0.8, top_k=3)
    assert len(out) == 5 and len(set(out)) == 5
    assert [r["body"]["n"] for r in server.requests] == [2, 2, 1]
    body = server.requests[0]["body"]
    assert body == {"model": "gpt-x", "messages": [{"role": "user", "content": "Hi"}], "n": 2, "max_tokens": 9,
                    "temperature": 0.5, "top_p": 0.8}  # no top_k in Chat Completions
    # no cap: one request; a server returning more than asked is cut to n
    server.script(200, {"choices": [{"message": {"content": str(i)}} for i in range(4)]})
    c2 = client(server, "/v1/chat/completions", comparator_api_format="chat")
    assert c2.generate("Hi", 3) == ["0", "1", "2"]


def test_openai_max_completion_tokens_and_deepseek(server):
    c = client(server, "/v1/chat/completions", comparator_api_format="openai",
               comparator_api_extra_body={"max_completion_tokens": 20, "top_p": None})
    c.generate("Hi", 1)
    body = server.requests[-1]["body"]
    assert body["max_completion_tokens"] == 20 and "max_tokens" not in body and "top_p" not in body
    ds = client(server, "/v1/chat/completions", comparator_api_format="openai", comparator_api_model="deepseek-chat")
    n0 = len(server.requests)
    assert len(ds.generate("Hi", 3)) == 3
    assert [r["body"]["n"] for r in server.requests[n0:]] == [1, 1, 1]
    assert APIComparatorClient(comparator_api_format="openai",
                               comparator_api_url="https://api.deepseek.com/chat/completions").request_sizes(2) \
        == [1, 1]


def test_anthropic_one_request_per_candidate_with_headers(server, key_env):
    c = client(server, "/v1/messages", comparator_api_format="anthropic", comparator_api_model="claude-x",
               comparator_api_key_env=key_env)
    out = c.generate("Hello", 3, max_new_tokens=7, temperature=0.3, top_p=0.9, top_k=5)
    assert out == ["1.0: Hello", "2.0: Hello", "3.0: Hello"]  # text blocks concatenated
    assert len(server.requests) == 3
    for r in server.requests:
        h = r["headers"]
        assert h["x-api-key"] == FAKE_KEY and h["anthropic-version"] == "2023-06-01" and "authorization" not in h
        assert r["body"] == {"model": "claude-x", "max_tokens": 7, "messages": [{"role": "user", "content": "Hello"}],
                             "temperature": 0.3, "top_p": 0.9, "top_k": 5}
        assert "n" not in r["body"]


@pytest.mark.parametrize("fmt", ["openai_responses", "responses", "codex", "Responses"])
def test_responses_aliases(server, fmt):
    c = client(server, "/v1/responses", comparator_api_format=fmt, comparator_api_model="gpt-r")
    assert c.format == "openai_responses"
    assert c.generate("Q", 2, max_new_tokens=5, temperature=0.2, top_p=0.7) == ["1.0: Q", "2.0: Q"]
    assert len(server.requests) == 2
    assert server.requests[0]["body"] == {"model": "gpt-r", "input": "Q", "max_output_tokens": 5, "temperature": 0.2,
                                          "top_p": 0.7}


def test_responses_output_text_preferred():
    with MockAPIServer(output_text=True) as srv:
        srv.script(200,
                   {"output_text": "short",
                    "output": [{"type": "message", "content": [{"type": "output_text", "text": "long"}]}]})
        assert client(srv, "/v1/responses", comparator_api_format="codex").generate("Q", 1) == ["short"]


def test_defaults_for_anthropic_and_responses(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    a = APIComparatorClient(comparator_api_format="anthropic")
    assert a.url == "https://api.anthropic.com/v1/messages" and a._headers()["x-api-key"] == FAKE_KEY
    r = APIComparatorClient(comparator_api_format="responses")
    assert r.url == "https://api.openai.com/v1/responses" and r._headers()["Authorization"] == f"Bearer {FAKE_KEY}"
    assert_no_key(repr(a), repr(r), repr(a.config))
    # a custom URL does not inherit the provider's key
    assert "x-api-key" not in APIComparatorClient(comparator_api_format="anthropic",
                                                  comparator_api_url="http://127.0.0.1:9/v1/messages")._headers()
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    with pytest.raises(ValueError, match="ANTHROPIC_API_KEY is not set"):
        APIComparatorClient(comparator_api_format="anthropic")


def test_unknown_format_and_validation():
    with pytest.raises(ValueError) as ei:
        APIComparatorConfig(comparator_api_format="gemini", comparator_api_url="http://h")
    msg = str(ei.value)
    for name in ("generic", "openai", "anthropic", "openai_responses", "responses", "codex", "'gemini'"):
        assert name in msg
    with pytest.raises(ValueError, match="comparator_api_url=None is invalid"):
        APIComparatorConfig(comparator_api_format="generic")
    with pytest.raises(ValueError, match="comparator_api_max_retries=-1 is invalid: must be >= 0"):
        APIComparatorConfig(comparator_api_url="http://h", comparator_api_max_retries=-1)
    with pytest.raises(ValueError, match=r"comparator_api_headers\['X'\] is invalid"):
        APIComparatorConfig(comparator_api_url="http://h", comparator_api_headers={"X": 1})
    with pytest.raises(ValueError, match="comparator_api_key_env"):
        APIComparatorClient(comparator_api_url="http://h", comparator_api_key_env="COMLRL_SURELY_UNSET_VAR")
    with pytest.raises(ValueError, match="n=0 is invalid"):
        APIComparatorClient(comparator_api_url="http://h").generate("p", 0)
    assert resolve_format("messages") == "anthropic"


# ---------------------------------------------------------------- retries

def test_429_then_success_with_and_without_retry_after(server):
    sleeps = Sleeps()
    c = client(server, sleep=sleeps, comparator_api_backoff=0.01, comparator_api_backoff_cap=0.04)
    server.script(429, {"error": "rate"}, headers={"Retry-After": "0.02"})
    assert len(c.generate("p", 2)) == 2
    assert sleeps == [0.02] and len(server.requests) == 2
    server.script(429, {"error": "rate"}, headers={"Retry-After": "120"})  # capped by the backoff cap
    c.generate("p", 1)
    assert sleeps[-1] == 0.04
    server.script(429, {"error": "rate"}, times=2)  # no Retry-After: base * 2**attempt
    c.generate("p", 1)
    assert sleeps[-2:] == [0.01, 0.02]
    assert c.stats["retries"] == 4 and c.stats["requests"] == 3


def test_500_until_give_up_counts_attempts(server):
    sleeps = Sleeps()
    c = client(server, sleep=sleeps, comparator_api_max_retries=3, comparator_api_backoff=0.01,
               comparator_api_backoff_cap=0.03)
    server.script(500, "internal error", times=10)
    with pytest.raises(APIError) as ei:
        c.generate("p", 1)
    assert len(server.requests) == 1 + 3 and ei.value.attempts == 4 and ei.value.status == 500
    assert "gave up after 4 attempts" in str(ei.value) and "HTTP 500: internal error" in str(ei.value)
    assert sleeps == [d for _, d, _ in backoff_schedule(0.01, 0.03, 3)] == [0.01, 0.02, 0.03]


def test_503_then_success_and_real_sleep_is_short(server):
    server.script(503, "busy", times=2)
    c = APIComparatorClient(comparator_api_url=server.url(), **FAST)  # the real time.sleep with tiny waits
    t0 = time.perf_counter()
    assert len(c.generate("p", 1)) == 1
    assert len(server.requests) == 3 and time.perf_counter() - t0 < 1.0


def test_timeout_retried_then_gives_up_quickly(server):
    c = client(server, comparator_api_timeout=0.2, comparator_api_max_retries=1)
    server.script(200, {"completions": ["late"]}, delay=0.5, times=2)
    t0 = time.perf_counter()
    with pytest.raises(APIError) as ei:
        c.generate("p", 1)
    assert time.perf_counter() - t0 < 1.5
    assert "gave up after 2 attempts" in str(ei.value) and "timed out" in str(ei.value).lower()
    assert ei.value.status is None


def test_slow_once_then_fast(server):
    c = client(server, comparator_api_timeout=0.2, comparator_api_max_retries=2)
    server.script(200, {"completions": ["late"]}, delay=0.4)
    assert c.generate("p", 1) == ["2.0: p"]


def test_connection_refused_is_transient():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    sleeps = Sleeps()
    c = APIComparatorClient(comparator_api_url=f"http://127.0.0.1:{port}/x", comparator_api_max_retries=2, sleep=sleeps,
                            **FAST)
    with pytest.raises(APIError, match="gave up after 3 attempts.*Connection"):
        c.generate("p", 1)
    assert len(sleeps) == 2


# ---------------------------------------------------------------- fatal errors

@pytest.mark.parametrize("status,hint",
                         [(400, "HTTP 400"), (401, "authentication failed"), (403, "authentication failed"),
                          (404, "not found: check comparator_api_url"), (422, "HTTP 422")])
def test_client_errors_raise_at_once(server, key_env, status, hint):
    c = client(server, comparator_api_key_env=key_env)
    server.script(status, {"error": {"message": f"bad request with key {FAKE_KEY} " + "x" * 600}})
    with pytest.raises(APIError) as ei:
        c.generate("p", 3)
    e = ei.value
    assert e.status == status and hint in str(e) and len(server.requests) == 1
    assert "bad request with key ***" in str(e)
    body_part = str(e)[str(e).index('{"error"'):]
    assert len(body_part) <= 300 and body_part.endswith("...")
    if status in (401, 403):
        assert "$COMLRL_TEST_API_KEY" in str(e)
    assert_no_key(str(e), repr(e), repr(c))


def test_redirect_not_followed(server, key_env):
    server.script(302, "", headers={"Location": "http://evil.example/steal?token=abc"})
    c = client(server, comparator_api_key_env=key_env)
    with pytest.raises(APIError, match=r"HTTP 302 redirect to http://evil.example/steal\?token=\*\*\* \(not followed"):
        c.generate("p", 1)
    assert len(server.requests) == 1


def test_non_json_html_page(server):
    server.script(200, "<html><head><title>502 Bad Gateway</title></head><body>" + "y" * 500 + "</body></html>")
    c = client(server, "/v1/chat/completions", comparator_api_format="openai")
    with pytest.raises(APIError) as ei:
        c.generate("p", 1)
    msg = str(ei.value)
    assert "comparator API (openai, http://127.0.0.1:" in msg and "/v1/chat/completions)" in msg
    assert "response is not JSON (Content-Type text/html" in msg and "<title>502 Bad Gateway</title>" in msg
    assert len(server.requests) == 1 and len(msg) < 500


@pytest.mark.parametrize("fmt,path,body,missing", [
    ("generic", "/g", {"outputs": ["a"]}, "response field 'completions' missing: no 'completions'"),
    ("generic", "/g", {"completions": 5}, "response field 'completions' is a int"),
    ("generic", "/g", {"completions": [None]}, "completions[0] holds no text"),
    ("openai", "/v1/chat/completions", {"id": "x"}, "no 'choices' list (found keys ['id'])"),
    ("openai", "/v1/chat/completions", {"choices": [{"message": {"content": None}, "finish_reason": "length"}]},
     "choices[0] has no message.content (finish_reason='length')"),
    ("anthropic", "/v1/messages", {"content": [], "stop_reason": "max_tokens"},
     "no content block of type 'text' (stop_reason='max_tokens')"),
    ("anthropic", "/v1/messages", {"type": "error"}, "no 'content' list"),
    ("responses", "/v1/responses", {"output": [{"type": "reasoning"}], "status": "incomplete"},
     "no output[*].content[*] of type 'output_text'"),
    ("responses", "/v1/responses", [1, 2], "neither 'output_text' nor an 'output' list (found a list)"),
])
def test_missing_fields(server, fmt, path, body, missing):
    c = client(server, path, comparator_api_format=fmt)
    server.script(200, body)
    with pytest.raises(APIError) as ei:
        c.generate("p", 1)
    msg = str(ei.value)
    assert missing in msg and f"comparator API ({resolve_format(fmt)}, http://127.0.0.1:" in msg and "response: " in msg


def test_fewer_completions_than_asked(server):
    c = client(server, "/v1/chat/completions", comparator_api_format="openai", comparator_api_max_n_per_request=2)
    server.script(200, {"choices": [{"message": {"content": "only one"}}]})
    with pytest.raises(APIError, match=r"asked for 3 completions in 2 request\(s\) of sizes \[2, 1\], got 2") as ei:
        c.generate("p", 3)
    assert "/v1/chat/completions" in str(ei.value)
    server.script(200, {"completions": ["a", "b"]})
    with pytest.raises(APIError, match="asked for 3 completions in 1 request"):
        client(server).generate("p", 3)


def test_mock_server_request_budget():
    with MockAPIServer(max_requests=2) as srv:
        c = client(srv)
        c.generate("p", 1)
        c.generate("p", 1)
        with pytest.raises(APIError, match="HTTP 418"):
            c.generate("p", 1)


# ---------------------------------------------------------------- secrets

def test_key_never_in_messages_reprs_or_logs(server, key_env, caplog):
    caplog.set_level(logging.DEBUG, logger="comlrl_nb")
    echo = {"error": f"key {FAKE_KEY} rejected", "auth": f"Bearer {FAKE_KEY}"}
    c = client(server, comparator_api_key_env=key_env, comparator_api_max_retries=2,
               comparator_api_headers={"X-Api-Token": "tok-SECRET-HEADER-1"})
    errors = []
    scripts = [(429, echo, 3), (500, echo, 3), (401, echo, 1), (404, echo, 1), (200, f"<p>{FAKE_KEY}</p>", 1),
               (200, {"wrong": FAKE_KEY}, 1), (302, "", 1)]
    for status, body, times in scripts:
        server.script(status, body, times=times)
        with pytest.raises(APIError) as ei:
            c.generate(f"prompt", 1)
        errors.append(ei.value)
    server.script(200, {"completions": []})
    with pytest.raises(APIError) as ei:
        c.generate("p", 2)
    errors.append(ei.value)
    assert [e.status for e in errors] == [429, 500, 401, 404, 200, 200, 302, 200]
    assert "retry 1/2" in caplog.text and "HTTP 429" in caplog.text
    assert all(r["headers"]["authorization"] == f"Bearer {FAKE_KEY}" for r in server.requests)  # it was sent
    for e in errors:
        assert_no_key(str(e), repr(e), e.args)
        assert "tok-SECRET-HEADER-1" not in str(e)
    assert_no_key(caplog.text, repr(c), repr(c.config), scrub_secrets(c.config))
    assert "tok-SECRET-HEADER-1" not in caplog.text + repr(c.config)


def test_key_from_config_and_query_secret_redacted(server):
    url = server.url("/g") + "?key=" + FAKE_KEY
    c = APIComparatorClient(comparator_api_url=url, comparator_api_key=FAKE_KEY, **FAST)
    server.script(400, {"echo": f"{url}"})
    with pytest.raises(APIError) as ei:
        c.generate("p", 1)
    assert_no_key(str(ei.value), repr(c), repr(c.config))
    assert "?key=***" in str(ei.value) and "key=from config" in repr(c)
    assert redact(f"a{FAKE_KEY}b", [FAKE_KEY]) == "a***b"
    assert safe_url(url).endswith("/g?key=***")


def test_threads_share_one_client(server):
    c = client(server, "/v1/chat/completions", comparator_api_format="openai")
    results = [None] * 4

    def work(i):
        results[i] = c.generate(f"p{i}", 2)
    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert all(len(r) == 2 and all(x.endswith(f"p{i}") for x in r) for i, r in enumerate(results))
    assert c.stats["requests"] == 4 and c.stats["completions"] == 8


def test_from_trainer_like_config(server):
    class Args:
        comparator_api_url = server.url("/v1/chat/completions")
        comparator_api_format = "openai"
        comparator_api_max_n_per_request = 3
        learning_rate = 1e-5  # ignored
    c = APIComparatorClient(Args(), **FAST)
    assert c.request_sizes(7) == [3, 3, 1] and len(c.generate("p", 4)) == 4


# ---------------------------------------------------------------- command line

def test_cli_comparator_query(server, key_env):
    from comlrl_nb.cli import main, run
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = run(["comparator-query", "--format", "openai", "--url", server.url("/v1/chat/completions"), "--model", "m",
                  "--prompt", "Say hi", "--n", "3", "--key-env", key_env,
                  "--set", "comparator_api_timeout=5", "max_n_per_request=2", 'comparator_api_extra_body={"seed": 1}'])
    assert rc == 0 and json.loads(out.getvalue()) == ["1.0: Say hi", "1.1: Say hi", "2.0: Say hi"]
    assert [r["body"]["n"] for r in server.requests] == [2, 1] and server.requests[0]["body"]["seed"] == 1
    assert server.requests[0]["headers"]["authorization"] == f"Bearer {FAKE_KEY}"
    # API errors and bad options: one line on stderr, exit status 2, no key
    server.script(401, {"error": f"bad key {FAKE_KEY}"})
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["comparator-query", "--url", server.url(), "--prompt", "x", "--key-env", key_env])
    assert rc == 2 and err.getvalue().count("\n") == 1 and "HTTP 401" in err.getvalue()
    assert_no_key(err.getvalue())
    for argv, msg in [(["--format", "gemini", "--url", "http://h"], "use one of generic"),
                      (["--format", "openai"], "comparator_api_url=None is invalid"),
                      (["--url", "http://h", "--set", "timout=3"], "Did you mean 'comparator_api_timeout'?")]:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            assert main(["comparator-query", "--prompt", "x", *argv]) == 2
        assert msg in err.getvalue() and err.getvalue().count("\n") == 1
