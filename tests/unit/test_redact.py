"""Credential redaction of text handed to a model (switchboard.redact)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from switchboard.redact import REDACTED, redact_text

pytestmark = pytest.mark.unit

# Built from parts so no literal secret sits in the repository for scanners to flag.
OPENAI_KEY = "sk-" + "proj-" + "A1b2C3d4E5f6G7h8I9j0"
SLACK_TOKEN = "xoxb-" + "123456789012-" + "abcdefGHIJKL"
GITHUB_CLASSIC = "ghp_" + "a" * 18 + "B" * 18
GITHUB_FINE = "github_pat_" + "11ABCDEFG0" + "_" + "x" * 30
AWS_KEY_ID = "AKIA" + "IOSFODNN7EXAMPLE"
BEARER = "eyJ0eXAiOiJKV1Qi" + "LCJhbGciOiJIUzI1NiJ9"
JWT = "eyJhbGciOiJIUzI1NiJ9" + ".eyJzdWIiOiIxMjM0NTY3ODkwIn0" + ".dozjgNryP4J3jVmNHl0w5N_XgL0n3I9P"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"use {OPENAI_KEY} now", f"use sk-{REDACTED} now"),
        (f"slack {SLACK_TOKEN} done", f"slack xoxb-{REDACTED} done"),
        (f"gh {GITHUB_CLASSIC}.", f"gh ghp_{REDACTED}."),
        (f"pat {GITHUB_FINE}", f"pat github_pat_{REDACTED}"),
        (f"aws {AWS_KEY_ID} key", f"aws AKIA{REDACTED} key"),
        (f"Authorization: Bearer {BEARER}", f"Authorization: Bearer {REDACTED}"),
        (f"jwt {JWT}", f"jwt {REDACTED}"),
    ],
)
def test_vendor_tokens_are_masked_after_their_prefix(text: str, expected: str) -> None:
    """Keys with a telling prefix keep the prefix; the secret part becomes [REDACTED]."""
    assert redact_text(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("OPENAI_API_KEY=abc123def456", f"OPENAI_API_KEY={REDACTED}"),
        ("api_key = 'hunter22x'", f"api_key = '{REDACTED}'"),
        (
            '{"apiKey": "abcd1234", "token": "zzzzyyyy"}',
            f'{{"apiKey": "{REDACTED}", "token": "{REDACTED}"}}',
        ),
        ("password: hunter2", f"password: {REDACTED}"),
        ("client_secret=s3cr3tvalue&x=1", f"client_secret={REDACTED}&x=1"),
        ("accessToken: qwertyuiop", f"accessToken: {REDACTED}"),
        (
            "run --token abcdef123 --api-key=qwerty12",
            f"run --token {REDACTED} --api-key={REDACTED}",
        ),
    ],
)
def test_secret_assignments_keep_the_name_and_mask_the_value(text: str, expected: str) -> None:
    """`name=value` / `"name": "value"` / `--flag value` keep the name, mask the value."""
    assert redact_text(text) == expected


def test_pem_private_key_block_is_masked_whole() -> None:
    """A PEM private key keeps its BEGIN/END lines; the body is gone."""
    body = "MIIEowIBAAKCAQEA" + "x" * 60
    text = f"key:\n-----BEGIN RSA PRIVATE KEY-----\n{body}\n-----END RSA PRIVATE KEY-----\nafter"
    out = redact_text(text)
    assert body not in out
    assert out == (
        f"key:\n-----BEGIN RSA PRIVATE KEY-----\n{REDACTED}\n-----END RSA PRIVATE KEY-----\nafter"
    )


def test_unterminated_pem_block_is_masked_to_the_end() -> None:
    """A PEM block cut before its END line is still masked (to the end of the text)."""
    out = redact_text("-----BEGIN PRIVATE KEY-----\nMIIEabcdefgh\nmore")
    assert out == f"-----BEGIN PRIVATE KEY-----\n{REDACTED}"


@pytest.mark.parametrize(
    "text",
    [
        "max_tokens: 4000 and primary key: id, tokens=5",
        "the Bearer token goes in the header",
        "token: null, secret = true",
        "sk-learn is a library; ask-me-anything",
        "plain prose about passwords and keys",
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    """Prose, counters and placeholders that only look secret-ish are unchanged."""
    assert redact_text(text) == text


def test_redacting_twice_changes_nothing() -> None:
    """Already-redacted text is stable (no `[REDACTED]]` growth on a second pass)."""
    text = f"token={OPENAI_KEY} Bearer {BEARER} {GITHUB_CLASSIC} password: abcdefg"
    once = redact_text(text)
    assert redact_text(once) == once
    assert OPENAI_KEY not in once and BEARER not in once and GITHUB_CLASSIC not in once


@given(st.text(alphabet=st.characters(codec="ascii"), max_size=200))
def test_redaction_is_idempotent_on_any_text(text: str) -> None:
    """For arbitrary text, a second redaction pass is a no-op."""
    once = redact_text(text)
    assert redact_text(once) == once
