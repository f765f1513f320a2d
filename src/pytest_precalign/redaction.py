"""Secrets never reach a recording: the one rule every value the tool writes from a user's
arguments, configs, environment or paths goes through (``redacted``).

Recordings are meant to be committed with the code as baseline runs, so a manifest must not
hold a token. Three things are replaced by ``REDACTED`` (a marker saying a value was there:
two runs with different tokens compare equal, a run with and a run without one differ):

* the value of a key that names a secret: a key whose last word is ``token``, ``key``,
  ``secret``, ``password`` / ``passwd``, ``credential(s)``, ``auth`` / ``authorization`` /
  ``apikey``, or that has ``secret``, ``password``, ``passwd`` or ``credential(s)`` as any
  word (case-insensitive; words split at ``_``, ``-``, ``.``, spaces and camelCase: ``hf_token``,
  ``wandb_api_key``, ``apiKey``, ``AWS_SECRET_ACCESS_KEY``, ``db_password_file``). Words, not
  substrings: ``keep_in_memory``, ``monkey``, ``tokens``, ``pad_token_id``, ``key_dim``,
  ``max_position_embeddings`` are not secrets, nor a tokenizer's special tokens (``pad_token``,
  ``eos_token``, ``bos_token``, ``unk_token``, ``sep_token``, ``cls_token``, ``mask_token``),
  nor ``key_padding_mask``, ``num_key_value_heads``, ``tokenizer``, ``max_tokens``, ``keyword``,
  ``authors``. A ``key`` whose word before says what it indexes (``sort_key``, ``tensor_key``,
  ``cache_key``, ``dict_key``, ``group_key``, ...: ``_INDEX_KEYS``) is a lookup key, not a
  secret, unless a word of the key says whose credential it is (``api_cache_key``,
  ``access_sort_key``, ``client_state_key``: ``_CREDENTIAL_WORDS``); a bare ``key`` or any other
  ``*_key`` (``api_key``, ``secret_key``, ``access_key``, ``private_key``) is redacted: when in
  doubt, a value is not written. Whatever the key, a value shaped like a well-known token
  (below) is replaced. Only text is replaced (a string, or the
  strings inside a list or mapping under that key): a number, a boolean or null is kept
  (``pad_token_id: 0``, ``use_auth_token: true`` say nothing secret);
* credentials inside a URL: ``s3://user:password@host/...`` -> ``s3://<redacted>@host/...``,
  and the value of a secret-named query parameter (``?token=...``, ``&api_key=...``);
* text that has the shape of a well-known token anywhere in any string: Hugging Face
  (``hf_...``), OpenAI / Anthropic (``sk-...``), GitHub (``ghp_``, ``gho_``, ``ghu_``, ``ghs_``,
  ``ghr_``, ``github_pat_...``), GitLab (``glpat-...``), AWS access key ids (``AKIA...``,
  ``ASIA...``), Slack (``xoxb-``, ``xoxp-``...), Google API keys (``AIza...``), Stripe
  (``sk_live_``, ``rk_test_``...), npm (``npm_...``), PyPI (``pypi-...``), JSON web tokens
  (``eyJ...``), PEM private key blocks. W&B keys are 40 bare hex digits, which a commit or a
  content hash also is: they are replaced under a secret-named key (the key rule), kept elsewhere.

Keys themselves are kept (the reader sees which setting held a secret).
"""

from __future__ import annotations

import contextlib
import functools
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TextIO, cast

REDACTED = "<redacted>"

_LAST_WORDS = frozenset(
    {
        "token",
        "key",
        "secret",
        "password",
        "passwd",
        "credential",
        "credentials",
        "auth",
        "authorization",
        "apikey",
    }
)
_ANY_WORDS = frozenset({"secret", "secrets", "password", "passwd", "credential", "credentials"})
# ``pad_token``, ``eos_token``...: a tokenizer's special tokens, text of the vocabulary
_SPECIAL_TOKENS = frozenset({"pad", "eos", "bos", "unk", "sep", "cls", "mask", "image", "video", "audio"})

# ``sort_key``, ``tensor_key``...: a key that indexes something (a word before ``key``), not a secret
_INDEX_KEYS = frozenset(
    {
        "sort",
        "tensor",
        "cache",
        "dict",
        "lookup",
        "group",
        "hash",
        "primary",
        "foreign",
        "index",
        "column",
        "partition",
        "layer",
        "module",
        "param",
        "parameter",
        "state",
        "metric",
        "label",
        "input",
        "output",
        "feature",
        "dataset",
        "row",
        "sample",
        "batch",
        "record",
        "shard",
        "join",
        "order",
        "dedup",
    }
)

# ``api_cache_key``, ``access_sort_key``: a word saying whose credential an "index" key is
_CREDENTIAL_WORDS = frozenset(
    {"api", "access", "private", "client", "auth", "signing", "encryption", "master", "service", "ssh"}
)

_WORD_BREAK = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")

_TOKEN_FORMS = (
    r"hf_[A-Za-z0-9]{30,}"
    r"|sk-(?:[A-Za-z0-9_-]{20,})"
    r"|gh[pousr]_[A-Za-z0-9]{30,}"
    r"|github_pat_[A-Za-z0-9_]{30,}"
    r"|glpat-[A-Za-z0-9_-]{20,}"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,}"
    r"|AIza[0-9A-Za-z_-]{35}"
    r"|[sr]k_(?:live|test)_[A-Za-z0-9]{16,}"
    r"|npm_[A-Za-z0-9]{36}"
    r"|pypi-[A-Za-z0-9_-]{50,}"
    r"|eyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)"
)
_TOKEN_SHAPES = re.compile(rf"(?<![A-Za-z0-9])(?:{_TOKEN_FORMS})")
# Whatever ``redacted_text`` could replace holds one of these (a token form, "://", a query
# parameter): text without any is returned after this one scan instead of three.
_SCREEN = re.compile(rf"{_TOKEN_FORMS}|://|[?&;][A-Za-z0-9_.\-]+=")
# scheme://userinfo@ : everything between "//" and the last "@" before the host's end
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#@\s]+)@")
_QUERY_PARAM = re.compile(r"(?P<lead>[?&;])(?P<name>[A-Za-z0-9_.\-]+)=(?P<value>[^&;#\s]*)")


@functools.lru_cache(maxsize=4096)
def secret_key(key: str) -> bool:
    """Whether a setting named ``key`` holds a secret (see the module doc: words, not substrings)."""
    words = [w.lower() for w in _WORD_BREAK.split(key) if w]
    if not words:
        return False
    if len(words) >= 2 and words[-1] == "token" and words[-2] in _SPECIAL_TOKENS:
        return False
    if (
        len(words) >= 2
        and words[-1] == "key"
        and words[-2] in _INDEX_KEYS
        and not set(words) & (_ANY_WORDS | _CREDENTIAL_WORDS)
    ):
        return False
    return words[-1] in _LAST_WORDS or any(w in _ANY_WORDS for w in words)


def redacted_text(text: str) -> str:
    """``text`` with URL credentials, secret-named query values and token-shaped text replaced."""
    if not text or not _SCREEN.search(text):
        return text
    out = _URL_USERINFO.sub(lambda m: f"{m['scheme']}{REDACTED}@", text)
    if "=" in out:
        out = _QUERY_PARAM.sub(
            lambda m: (
                f"{m['lead']}{m['name']}={REDACTED}" if m["value"] and secret_key(m["name"]) else m.group(0)
            ),
            out,
        )
    return _TOKEN_SHAPES.sub(REDACTED, out)


def _all_text_redacted(value: Any) -> Any:
    """Under a secret-named key: every string replaced, numbers, booleans and null kept."""
    if isinstance(value, str):
        return REDACTED if value else value
    if isinstance(value, Mapping):
        return {k: _all_text_redacted(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_all_text_redacted(v) for v in value]
    return value


def redacted(value: Any) -> Any:
    """``value`` (JSON-like: mappings, lists, tuples, strings, numbers) with every secret
    replaced by ``REDACTED`` (see the module doc); mappings and lists are copied, never changed
    in place; other objects are returned as they are. Each distinct text is looked at once (a
    report repeats its module and metric names in every record): a 9 MB report.json costs a
    fraction of a second (docs/security.md has the figure)."""
    return _redacted(value, {})


def _redacted(value: Any, seen: dict[str, str]) -> Any:
    kind = type(value)
    if kind is float or kind is int or kind is bool or value is None:  # most of a report
        return value
    if isinstance(value, str):
        done = seen.get(value)
        if done is None:
            done = seen[value] = redacted_text(value)
        return done
    if isinstance(value, Mapping):
        return {
            k: _all_text_redacted(v) if isinstance(k, str) and secret_key(k) else _redacted(v, seen)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_redacted(v, seen) for v in value]
    if isinstance(value, tuple):
        return tuple(_redacted(v, seen) for v in value)
    return value


class _RedactedWrites:
    """A text stream whose writes pass through ``redacted_text`` (one ``print`` is one write);
    anything else (``flush``, ``fileno``, ``isatty``) is the wrapped stream's."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(redacted_text(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def redacted_output() -> Iterator[None]:
    """While the block runs, what goes to ``sys.stdout`` and ``sys.stderr`` passes through the
    rule: the ``precalign`` command's boundary (its results, errors and argparse's messages)."""
    out, err = sys.stdout, sys.stderr
    sys.stdout = cast(TextIO, _RedactedWrites(out))
    sys.stderr = cast(TextIO, _RedactedWrites(err))
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err
