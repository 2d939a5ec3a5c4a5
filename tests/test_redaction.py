"""Tests for engine.redaction, alone and through real child processes (docs/field-cases.md C14).

Secrets are generated at test time (prefix + random characters); no key-like literal is
committed.
"""

from __future__ import annotations

import json
import os
import secrets
import string
import sys
import textwrap
import time
import uuid

import pytest

from engine.processes.process import find_marked, kill_tree, run_supervised
from engine.redaction import REDACTED, Redactor, redact_text, secret_env_values

ALNUM = string.ascii_letters + string.digits
UPPER_DIGITS = string.ascii_uppercase + string.digits


def rand(n: int, alphabet: str = ALNUM) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(n))


def rand_digit_free(n: int) -> str:
    return rand(n, string.ascii_letters)


# One case per kind: (name, text containing the credential, the exact part replaced).
def _cases() -> list[tuple[str, str, str]]:
    anthropic = "sk-ant-api03-" + rand(80) + "-" + rand(10)
    openai = "sk-" + rand(48)
    openai_proj = "sk-proj-" + rand(40) + "_" + rand(20)
    stripe_live = "sk_live_" + rand(24)
    stripe_restricted = "rk_live_" + rand(24)
    stripe_test = "sk_test_" + rand(24)
    ghp = "ghp_" + rand(36)
    gho = "gho_" + rand(36)
    ghs = "ghs_" + rand(36)
    pat = "github_pat_" + rand(22) + "_" + rand(59)
    google = "AIza" + rand(35, ALNUM + "-_")
    slack = "xoxb-" + rand(12, string.digits) + "-" + rand(24)
    akia = "AKIA" + rand(16, UPPER_DIGITS)
    aws_secret = rand(40, ALNUM + "/+")
    bearer = rand(40, ALNUM + "-._")
    password = rand(16)
    key_body = "\n".join(rand(64, ALNUM + "+/") for _ in range(5))
    pem = f"-----BEGIN RSA PRIVATE KEY-----\n{key_body}\n-----END RSA PRIVATE KEY-----"
    return [
        ("anthropic", f"key: {anthropic} end", anthropic),
        ("openai", f'OPENAI_API_KEY="{openai}"', openai),
        ("openai_proj", f"use {openai_proj}.", openai_proj),
        ("stripe_live", f"STRIPE={stripe_live}", stripe_live),
        ("stripe_restricted", f"({stripe_restricted})", stripe_restricted),
        ("stripe_test", f"{stripe_test}\n", stripe_test),
        ("github_ghp", f"token {ghp}", ghp),
        ("github_gho", f"[{gho}]", gho),
        ("github_ghs", f"{ghs},", ghs),
        ("github_pat", f"GH={pat} x", pat),
        ("google", f"key={google}&q=1", google),
        ("slack", f"SLACK {slack}", slack),
        ("aws_key_id", f"id {akia}.", akia),
        ("aws_secret_ini", f"aws_secret_access_key = {aws_secret}\n", aws_secret),
        ("aws_secret_env", f"AWS_SECRET_ACCESS_KEY={aws_secret}", aws_secret),
        ("aws_secret_json", f'{{"SecretAccessKey": "{aws_secret}"}}', aws_secret),
        ("bearer_header", f"Authorization: Bearer {bearer}\r\n", bearer),
        ("bearer_curl", f"curl -H 'authorization: bearer {bearer}' x", bearer),
        ("private_key", f"x\n{pem}\ny", pem),
        ("private_key_json", json.dumps({"c": pem + "\n"}), json.dumps(pem)[1:-1]),
        ("url_password", f"postgres://app:{password}@db:5432/prod", password),
        ("url_password_no_user", f"redis://:{password}@cache:6379", password),
    ]


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_it_redacts_each_kind(case):
    _name, text, secret = case

    out, count = redact_text(text)

    assert out == text.replace(secret, "[REDACTED]")
    assert count == 1


# The prefixed kinds, each with a body of its provider's usual alphabet.
def _prefixed() -> list[tuple[str, str]]:
    return [("anthropic", "sk-ant-api03-" + rand(40)), ("openai", "sk-" + rand(48)),
            ("stripe_live", "sk_live_" + rand(24)), ("github", "ghp_" + rand(36)),
            ("github_pat", "github_pat_" + rand(22) + "_" + rand(30)), ("google", "AIza" + rand(35)),
            ("slack", "xoxb-" + rand(12, string.digits) + "-" + rand(24)), ("aws_key_id", "AKIA" + rand(16, UPPER_DIGITS)),
            ("bearer", "Bearer " + rand(40)), ("aws_secret", "aws_secret_access_key=" + rand(40, ALNUM + "/+"))]


# what may follow a body's usual alphabet inside the same credential: issue 13 saw "[REDACTED]_UZG0lgg"
_TAILS = ["_", ".", "~", "%2F", ":", "#", "+", "=", "*", "$", "|", "é", "-_."]


@pytest.mark.parametrize("kind", _prefixed(), ids=lambda k: k[0])
@pytest.mark.parametrize("joint", _TAILS)
def test_a_credential_is_redacted_to_its_end_whatever_characters_follow_its_prefix(kind, joint):
    tail = rand(6) + "Zq" + rand(6)
    text = f"token: {kind[1]}{joint}{tail}. next"
    out, count = redact_text(text)
    assert count == 1, out
    assert tail[:6] not in out and tail[-6:] not in out and kind[1][-6:] not in out, out
    # the sentence's own full stop and what follows are kept; a bearer token's alphabet holds "." (JWTs):
    # a full stop right after one goes with it (safer than leaving the token's last dot-separated part)
    assert out.endswith("[REDACTED]. next" if kind[0] != "bearer" else " next"), out
    # the same through a stream fed in small pieces, and JSON-escaped in a stream-json line
    redactor = Redactor()
    line = json.dumps({"text": text}).encode()
    streamed = b"".join(redactor.feed(line[i:i + 7]) for i in range(0, len(line), 7)) + redactor.flush()
    assert tail[:6].encode() not in streamed and tail[-6:].encode() not in streamed, streamed
    assert json.loads(streamed)["text"].endswith("[REDACTED]. next" if kind[0] != "bearer" else " next")


def test_a_credential_followed_by_many_non_ascii_characters_leaves_valid_utf_8():
    # the bound of the rest counts characters: cutting one in half made redact_text raise
    for tail in ("€" * 400, "é" * 1500, "😀" * 300):
        out, count = redact_text("key sk-" + rand(20) + tail + " end")
        assert count == 1 and out.startswith("key [REDACTED]") and out.endswith(" end")
        out.encode("utf-8")


def test_it_keeps_the_rest_of_a_url_and_of_a_header():
    password = rand(20)
    out, _ = redact_text(f"git clone https://bot:{password}@git.example.com/org/repo.git")
    assert out == "git clone https://bot:[REDACTED]@git.example.com/org/repo.git"

    token = rand(32)
    out, _ = redact_text(f"Authorization: Bearer {token}\n")
    assert out == "Authorization: Bearer [REDACTED]\n"


def test_it_leaves_ordinary_text_alone():
    text = (
        "task-queue-worker-configuration-file and risk-assessment-for-the-whole-project\n"
        "see http://example.com:8080/path?x=1 and https://docs.python.org/3/\n"
        "Bearer tokens are described in RFC 6750; bearer authentication\n"
        "SECRET_KEY = get_random_secret_key()\n"
        "MAX_TOKENS=4096 git sha 3f2a9c1d7e6b5a4f3e2d1c0b9a8f7e6d5c4b3a21\n"
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
        "Asia/Tokyo, AKIAfoo, desk-1234567890123456789012345\n"
    )
    assert redact_text(text) == (text, 0)


def test_it_redacts_literal_secrets_raw_and_json_escaped():
    value = rand(12) + '"\\/' + rand(12)  # needs escaping in JSON
    plain = f"echo {value} done"
    as_json = json.dumps({"output": f"value={value}"})

    out, count = redact_text(plain + "\n" + as_json, secrets=[value])

    assert value not in out
    assert json.dumps(value)[1:-1] not in out
    assert count == 2
    assert json.loads(out.splitlines()[1]) == {"output": "value=[REDACTED]"}


def test_it_ignores_short_literal_secrets():
    assert redact_text("the word secret1 stays", secrets=["secret1"]) == (
        "the word secret1 stays",
        0,
    )


def test_c14_secret_json_escaped_in_a_stream_json_line():
    stripe = "sk_live_" + rand(24)
    openai = "sk-" + rand(48)
    env_file = f"STRIPE_SECRET_KEY={stripe}\nOPENAI_API_KEY={openai}\nDEBUG=1\n"
    event = {
        "type": "user",
        "message": {
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": env_file}
            ]
        },
    }
    line = json.dumps(event) + "\n"

    out, count = redact_text(line)

    assert stripe[len("sk_live_") :] not in out
    assert openai[len("sk-") :] not in out
    assert count == 2
    parsed = json.loads(out)  # the closing quote and the \n escapes survived
    assert parsed["message"]["content"][0]["content"] == (
        "STRIPE_SECRET_KEY=[REDACTED]\nOPENAI_API_KEY=[REDACTED]\nDEBUG=1\n"
    )


def test_c14_pasted_key_in_a_prompt_is_redacted_before_storing():
    key = "sk-" + rand(48)
    prompt = f"Use this key for the integration: {key}\nThen run the tests."

    stored, count = redact_text(prompt)

    assert key[3:] not in stored
    assert count == 1
    assert stored == "Use this key for the integration: [REDACTED]\nThen run the tests."


def test_it_finds_a_secret_split_at_any_point_between_chunks():
    key = "sk-ant-api03-" + rand(60)
    pem_body = rand(64)
    text = (
        f'{{"a": "x {key} y"}}\nAuthorization: Bearer {rand(30)}\n'
        f"-----BEGIN PRIVATE KEY-----\n{pem_body}\n-----END PRIVATE KEY-----\nend\n"
    ).encode()
    whole_redactor = Redactor()
    whole = whole_redactor.feed(text) + whole_redactor.flush()

    for cut in range(1, len(text)):
        redactor = Redactor()
        out = redactor.feed(text[:cut]) + redactor.feed(text[cut:]) + redactor.flush()
        assert out == whole, cut
        assert redactor.count == whole_redactor.count == 3
    assert key.encode() not in whole and pem_body.encode() not in whole


def test_it_redacts_a_stream_fed_byte_by_byte():
    literal = rand(30)
    key = "ghp_" + rand(36)
    text = f"start {literal} middle {key} end\n".encode()
    redactor = Redactor([literal])

    out = b"".join(redactor.feed(text[i : i + 1]) for i in range(len(text)))
    out += redactor.flush()

    assert out == b"start [REDACTED] middle [REDACTED] end\n"
    assert redactor.count == 2


def test_it_holds_back_only_a_bounded_tail():
    redactor = Redactor()
    fed = emitted = 0
    chunk = (rand_digit_free(50) + " ").encode() * 1000  # no newline at all
    for _ in range(200):
        fed += len(chunk)
        emitted += len(redactor.feed(chunk))
        assert fed - emitted <= 2048
    emitted += len(redactor.flush())
    assert emitted == fed


def test_it_emits_whole_lines_at_once():
    redactor = Redactor()
    assert redactor.feed(b"first line\nsecond") == b"first line\n"
    assert redactor.flush() == b"second"


def test_it_is_fast_on_large_input():
    line = b'{"type":"assistant","text":"ordinary output, paths /usr/lib, urls https://x.org"}\n'
    data = line * (16 * 1024 * 1024 // len(line))
    chunks = [data[i : i + 65536] for i in range(0, len(data), 65536)]
    redactor = Redactor([rand(40)])

    started = time.perf_counter()
    out = b"".join(redactor.feed(c) for c in chunks) + redactor.flush()
    elapsed = time.perf_counter() - started

    assert out == data
    assert elapsed < 2.0  # about 0.1 s here; a per-byte Python loop would take minutes


def test_it_secret_env_values_picks_secret_looking_variables():
    token = rand(24)
    env = {
        "ANTHROPIC_API_KEY": "sk-ant-" + rand(30),
        "GITHUB_TOKEN": token,
        "DB_PASSWORD": rand(10),
        "aws_session_token": rand(40),
        "COOKIE_JAR_SECRET": rand(16),
        "MY_CREDENTIALS": rand(12),
        "HTTP_AUTH": rand(12),
        "DUPLICATE_TOKEN": token,
        "SHORT_TOKEN": "abc",
        "KEY_FILE": "/etc/ssl/private/key.pem",
        "USE_AUTH": "true",
        "TOKEN_LIMIT": "100000000",
        "API_TIMEOUT_MS": "600000",
        "SESSION_RATIO": "1.25e10",
        "PATH": "/usr/bin:/bin",
        "HOME": "/home/agent",
        "EDITOR_THEME": rand(20),
    }

    values = secret_env_values(env)

    assert values == [
        env["ANTHROPIC_API_KEY"],
        token,
        env["DB_PASSWORD"],
        env["aws_session_token"],
        env["COOKIE_JAR_SECRET"],
        env["MY_CREDENTIALS"],
        env["HTTP_AUTH"],
    ]


# --- through a real child process -----------------------------------------------------


@pytest.fixture
def marker():
    value = f"test-{uuid.uuid4().hex}"
    yield value
    kill_tree(None, marker=value, grace_seconds=0)


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def test_it_redacts_a_secret_split_across_two_writes_of_a_child(tmp_path, marker):
    key = "sk-ant-api03-" + rand(60)
    env_secret = rand(28)  # no recognisable prefix: found because it is in the env
    half = len(key) // 2
    code = """
        import os, sys, time
        key, env_secret = sys.argv[1], os.environ["SERVICE_TOKEN"]
        os.write(1, ("key " + key[:%d]).encode())
        time.sleep(0.2)
        os.write(1, (key[%d:] + " and " + env_secret[:9]).encode())
        time.sleep(0.2)
        os.write(1, (env_secret[9:] + " done\\n").encode())
    """ % (half, half)
    env = dict(os.environ, SERVICE_TOKEN=env_secret)

    result = run_supervised(
        _py(code) + [key],
        cwd=str(tmp_path),
        env=env,
        deadline_seconds=10,
        grace_seconds=1,
        log_path=tmp_path / "out.log",
        raw_path=tmp_path / "out.raw",
        marker=marker,
    )

    assert result.exit_code == 0
    assert result.redactions == 2
    expected = b"key [REDACTED] and [REDACTED] done\n"
    assert (tmp_path / "out.raw").read_bytes() == expected
    assert (tmp_path / "out.log").read_bytes() == expected
    assert find_marked(marker) == []


def test_c14_child_cats_env_file_into_stream_json(tmp_path, marker):
    stripe = "sk_live_" + rand(24)
    (tmp_path / ".env").write_text(f"STRIPE_SECRET_KEY={stripe}\n")
    code = """
        import json, subprocess, sys
        out = subprocess.run(["cat", ".env"], capture_output=True, text=True).stdout
        events = [
            {"type": "assistant", "message": {"content": [{"type": "tool_use",
             "name": "Bash", "input": {"command": "cat .env"}}]}},
            {"type": "user", "message": {"content": [{"type": "tool_result",
             "content": out}]}},
            {"type": "result", "is_error": False, "result": "done"},
        ]
        for event in events:
            sys.stdout.write(json.dumps(event) + "\\n")
            sys.stdout.flush()
    """

    result = run_supervised(
        _py(code),
        cwd=str(tmp_path),
        env=dict(os.environ),
        deadline_seconds=10,
        grace_seconds=1,
        log_path=tmp_path / "out.log",
        raw_path=tmp_path / "out.raw",
        redactor=Redactor(),
        marker=marker,
    )

    assert result.exit_code == 0
    assert result.redactions == 1
    body = stripe[len("sk_live_") :].encode()
    for name in ("out.raw", "out.log"):
        stored = (tmp_path / name).read_bytes()
        assert body not in stored
        lines = [json.loads(line) for line in stored.decode().splitlines()]
        assert lines[1]["message"]["content"][0]["content"] == "STRIPE_SECRET_KEY=[REDACTED]\n"
        assert lines[2]["result"] == "done"


def test_it_counts_redactions_per_run_with_a_shared_redactor(tmp_path, marker):
    redactor = Redactor()
    key = "ghp_" + rand(36)
    for i in range(2):
        result = run_supervised(
            ["echo", key],
            cwd=str(tmp_path),
            env=None,
            deadline_seconds=10,
            log_path=tmp_path / f"{i}.log",
            redactor=redactor,
            marker=marker,
        )
        assert result.redactions == 1
        assert (tmp_path / f"{i}.log").read_bytes() == REDACTED + b"\n"
    assert redactor.count == 2


def test_a_key_printed_with_a_colour_code_inside_it_is_redacted_in_both_logs(tmp_path):
    """`grep --color` puts escape sequences inside a matched key: the display text joins it again,
    so it is redacted there, and the raw pass looks through the escapes too, so the raw log is
    redacted as printed (the escapes around the key kept, those inside it gone with it)."""
    import secrets
    import string
    import sys

    from engine.processes.process import run_supervised

    body = "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(40))
    key = f"sk-ant-api03-{body}"
    printed = f"KEY=\x1b[01;31m\x1b[Ksk-ant\x1b[m\x1b[K-api03-{body}\n"
    log, raw = tmp_path / "out.log", tmp_path / "out.raw"
    result = run_supervised([sys.executable, "-c", f"import sys; sys.stdout.write({printed!r}); print('after')"],
                            cwd=str(tmp_path), env=dict(os.environ), deadline_seconds=30, log_path=str(log),
                            raw_path=str(raw))
    assert result.exit_code == 0
    display, raw_bytes = log.read_text(), raw.read_bytes()
    assert key not in display and body not in display and "[REDACTED]" in display and "after" in display
    assert body.encode() not in raw_bytes and raw_bytes == b"KEY=\x1b[01;31m\x1b[K[REDACTED]\nafter\n", raw_bytes
    assert result.redactions == 1


@pytest.mark.parametrize("printed", [
    "ghp_0123456789\x1b[1mabcdefghijABCDEFGHIJabcdefgh01\x1b[0m done",  # a prefix too short to be known alone
    '{"text": "ghp_0123456789\\u001b[1mabcdefghijABCDEFGHIJabcdefgh01\\u001b[0m done"}',  # stream-json's form
    "sk-ant-api03-ABCDEFGHIJKLMNOPQRST\x1b]8;;https://example.invalid/\x07UVWXYZabcdefghij01234 done",  # a link
])
def test_a_key_split_by_an_escape_is_redacted_whole_by_the_streaming_pass(printed):
    whole = Redactor()
    one_by_one = Redactor()
    out = whole.feed(printed.encode()) + whole.flush()
    assert out == b"".join(one_by_one.feed(bytes([b])) for b in printed.encode()) + one_by_one.flush()
    for piece in (b"0123456789", b"abcdefghijABCDEFGHIJ", b"UVWXYZabcdefghij01234", b"ABCDEFGHIJKLMNOPQRST"):
        assert piece not in out, out
    assert out.endswith(b" done" + (b'"}' if printed.startswith("{") else b"")) and whole.count == 1
    # escapes that split no credential are left as printed
    plain = Redactor()
    assert plain.feed(b"\x1b[31mred\x1b[0m and \\u001b[1mbold") + plain.flush() == \
        b"\x1b[31mred\x1b[0m and \\u001b[1mbold" and plain.count == 0


def test_a_url_password_counts_once_and_leaves_the_raw_log_as_printed(tmp_path, marker):
    """Issue 19 (capture): the display pass saw ``https://u:[REDACTED]@host`` as a URL password again,
    counted it (the benchmark reported 27% more redactions than it made) and so rewrote the whole raw log
    as if a credential had been split by colour codes. The marker alone is nothing new."""
    secret = "dpl-" + rand(24)
    printed = f"\x1b[1mdeploying\x1b[0m with https://deploy:{secret}@registry.example.com/app\n"
    result = run_supervised(
        ["printf", "%s", printed], cwd=str(tmp_path), env=dict(os.environ, DEPLOY_TOKEN=secret),
        deadline_seconds=10, log_path=tmp_path / "out.log", raw_path=tmp_path / "out.raw", marker=marker)
    assert result.exit_code == 0 and result.redactions == 1
    # the raw log keeps its escape sequences: it was not rewritten (no scrub note)
    assert (tmp_path / "out.raw").read_bytes() == printed.replace(secret, "[REDACTED]").encode()
    assert (tmp_path / "out.log").read_bytes() == b"deploying with https://deploy:[REDACTED]@registry.example.com/app\n"
    assert redact_text("https://deploy:[REDACTED]@registry.example.com/app") == (
        "https://deploy:[REDACTED]@registry.example.com/app", 0)


def test_a_key_split_by_a_colour_code_across_two_reads_is_redacted_in_the_display(tmp_path, marker):
    """Issue 19 (capture): plain output is redacted once, but a long line whose escape sequence came in an
    earlier read (the raw pass emits a line over 1 KiB in parts) still goes through the display pass when
    it ends in a plain read."""
    code = """
        import os, time
        os.write(1, b"key sk-ant-\\x1b[1m" + b"A" * 1500)
        time.sleep(0.3)
        os.write(1, b"B" * 10 + b" end\\n")
    """
    result = run_supervised(
        _py(code), cwd=str(tmp_path), env=dict(os.environ), deadline_seconds=10,
        log_path=tmp_path / "out.log", raw_path=tmp_path / "out.raw", redactor=Redactor(), marker=marker)
    assert result.exit_code == 0 and result.redactions == 1
    assert (tmp_path / "out.log").read_bytes() == b"key [REDACTED] end\n"
    raw = (tmp_path / "out.raw").read_bytes()
    assert b"AAAA" not in raw and raw.startswith(b"key [REDACTED] end\n")


def test_a_key_split_by_an_osc_held_across_a_newline_is_redacted_in_the_display(tmp_path, marker):
    """Issue 19 review: an unfinished OSC (``ESC ] 0 ;`` holds newlines until its BEL) split a key across
    three reads; a display pass that closed at the first plain newline let the key reach the display log."""
    code = """
        import os, time
        for part in (b"key sk-ant-\\x1b]0;\\n", b"\\n", b"\\x07" + b"A" * 24 + b" end\\n"):
            os.write(1, part)
            time.sleep(0.3)
    """
    result = run_supervised(
        _py(code), cwd=str(tmp_path), env=dict(os.environ), deadline_seconds=10,
        log_path=tmp_path / "out.log", raw_path=tmp_path / "out.raw", redactor=Redactor(), marker=marker)
    assert result.exit_code == 0 and result.redactions == 1
    assert b"AAAA" not in (tmp_path / "out.log").read_bytes()
    assert b"AAAA" not in (tmp_path / "out.raw").read_bytes()
