"""Masking credential-looking strings in text a tool hands to a model (`sessions_history`).

A heuristic, like OpenClaw's: it catches the common shapes (vendor key prefixes, bearer
tokens, PEM private keys, `api_key=…` assignments) and keeps the text around them, so a
reader still sees *that* a secret was there and what it was for. Every secret becomes
``[REDACTED]`` (after a vendor prefix such as ``sk-`` when one identifies the kind of key);
already-redacted text is left as it is, so redacting twice changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable

REDACTED = "[REDACTED]"

# PEM private keys, whole block (an unterminated block is redacted to the end of the text).
_PEM = re.compile(
    r"(-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----)"
    r"(?:[\s\S]*?(-----END [A-Z0-9 ]*PRIVATE KEY-----)|[\s\S]*\Z)"
)
# `Authorization: Bearer <token>` and bare `Bearer <token>` (16+ chars, so prose survives).
_BEARER = re.compile(r"\b(Bearer\s+)([A-Za-z0-9\-._~+/]{16,}=*)")
# Generic assignments: a secret-ish name, `=` or `:`, then the value (quoted or not).
# The name must END in the secret word (`OPENAI_API_KEY`, `accessToken`, `client_secret`),
# so `max_tokens: 4000` or `primary key: id` are not touched.
_SECRET_NAME = (
    r"[A-Za-z0-9_.\-]*?"
    r"(?:api[_\-]?key|access[_\-]?key|secret[_\-]?key|private[_\-]?key|auth[_\-]?key"
    r"|token|secret|password|passwd|pwd)"
)
_ASSIGNMENT = re.compile(
    rf"(?i)(?<![A-Za-z0-9])(\"?{_SECRET_NAME}\"?\s*[=:]\s*)"
    r"(\"[^\"\s]{4,}\"|'[^'\s]{4,}'|[^\s\"',;&)}\]]{4,})"
)
# JSON Web Tokens (header.payload.signature, both JSON parts base64url of `{"`).
_JWT = re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}")
# Command-line flags: `--token xyz`, `--api-key=xyz`.
_FLAG = re.compile(
    r"(?i)(--(?:api[_\-]?key|access[_\-]?token|auth[_\-]?token|token|secret|password)[ =])"
    r"(\"[^\"]+\"|'[^']+'|[^\s\"']+)"
)
# Vendor keys whose prefix says what they are; the prefix is kept, the rest masked.
_VENDOR_KEYS: tuple[re.Pattern[str], ...] = (
    re.compile(r"\b(sk-)[A-Za-z0-9_\-]{16,}"),  # OpenAI / Anthropic style API keys
    re.compile(r"\b(xox[abposr]-)[A-Za-z0-9\-]{10,}"),  # Slack bot/user/app tokens
    re.compile(r"\b(xapp-)[A-Za-z0-9\-]{10,}"),  # Slack app-level tokens
    re.compile(r"\b(gh[pousr]_)[A-Za-z0-9]{20,}"),  # GitHub classic tokens
    re.compile(r"\b(github_pat_)[A-Za-z0-9_]{20,}"),  # GitHub fine-grained tokens
    re.compile(r"\b((?:AKIA|ASIA))[0-9A-Z]{16}\b"),  # AWS access key ids
)
# Values an assignment may hold that are not secrets.
_HARMLESS_VALUES = frozenset({"null", "none", "true", "false", "undefined", "redacted"})


def _pem(match: re.Match[str]) -> str:
    end = match.group(2) or ""
    return f"{match.group(1)}\n{REDACTED}\n{end}".rstrip("\n")


def _keep_prefix(match: re.Match[str]) -> str:
    return f"{match.group(1)}{REDACTED}"


def _whole(_: re.Match[str]) -> str:
    return REDACTED


def _masked_value(match: re.Match[str]) -> str:
    value = match.group(2)
    quote = value[0] if value[0] in "\"'" else ""
    bare = value.strip("\"'")
    if REDACTED[:-1] in value or bare.lower() in _HARMLESS_VALUES:
        return match.group(0)
    return f"{match.group(1)}{quote}{REDACTED}{quote}"


_RULES: tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], str]], ...] = (
    (_PEM, _pem),
    (_BEARER, _keep_prefix),
    (_FLAG, _masked_value),
    (_ASSIGNMENT, _masked_value),
    (_JWT, _whole),
    *((pattern, _keep_prefix) for pattern in _VENDOR_KEYS),
)


def redact_text(text: str) -> str:
    """The text with every credential-looking string replaced by ``[REDACTED]``."""
    for pattern, replace in _RULES:
        text = pattern.sub(replace, text)
    return text
