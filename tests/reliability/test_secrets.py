"""Recordings are committed with the code: no secret reaches one (``redaction``), from any writer.

The rule is checked on its own (which keys, URLs and token shapes), then on what each writer
writes: the ``Recorder`` given a loop's parsed arguments, the baseline store, the msprobe
format's manifest, and (slow: real Trainer / Lightning / Accelerate runs in a subprocess, as a
user runs them) every callback, grepped for the planted secrets.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pytest_precalign import Recorder
from pytest_precalign.redaction import REDACTED, redacted, redacted_text, secret_key
from tests.helpers.paths import REPO, SRC

from .secret_writers import AWS, HF, OPENAI, SECRETS, URL_PASSWORD, WANDB

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize(
    "key",
    [
        "hf_token",
        "HF_TOKEN",
        "hub_token",
        "wandb_api_key",
        "api_key",
        "apiKey",
        "openaiApiKey",
        "AWS_SECRET_ACCESS_KEY",
        "aws_access_key",
        "secret",
        "client_secret",
        "db_password",
        "password_file",
        "passwd",
        "credentials",
        "gcp-credential",
        "auth",
        "http.authorization",
        "token",
        "access-token",
        "use_auth_token",
    ],
)
def test_a_key_that_names_a_secret_is_one(key: str) -> None:
    assert secret_key(key)


@pytest.mark.parametrize(
    "key",
    [
        "keep_in_memory",
        "monkey",
        "tokens",
        "num_tokens",
        "pad_token_id",
        "pad_token",
        "eos_token",
        "key_dim",
        "keys",
        "max_position_embeddings",
        "tokenizer_name",
        "authors",
        "learning_rate",
        "",
    ],
)
def test_a_key_that_only_looks_like_one_is_not(key: str) -> None:
    assert not secret_key(key)


# Issue #47: word segments decide, not substrings; a ``*_key`` that indexes something is kept.
_KEPT = [
    "sort_key",
    "key_padding_mask",
    "tokenizer",
    "max_tokens",
    "num_key_value_heads",
    "keyword",
    "authors",
]
_REPLACED = ["hf_token", "api_key", "wandb_api_key", "secret_key", "password", "auth_token", "credentials"]


@pytest.mark.parametrize("key", _KEPT)
def test_a_setting_whose_words_name_no_secret_is_written_as_it_is(key: str) -> None:
    assert redacted({key: "by_length"}) == {key: "by_length"}


@pytest.mark.parametrize("key", _REPLACED)
def test_a_setting_whose_words_name_a_secret_is_replaced(key: str) -> None:
    assert redacted({key: "by_length"}) == {key: REDACTED}


def test_an_index_key_with_a_secret_word_in_it_is_still_replaced() -> None:
    assert redacted({"sort_secret_key": "x", "tensor_key": "t0", "key": "k"}) == {
        "sort_secret_key": REDACTED,
        "tensor_key": "t0",
        "key": REDACTED,
    }


_TOKENS = {
    "hf": HF,
    "openai": OPENAI,
    "aws": AWS,
    "github": "ghp_" + "a" * 36,
    "google": "AIza" + "Sy" + "b" * 33,
    "stripe": "sk_live_" + "c" * 24,
    "npm": "npm_" + "d" * 36,
    "pypi": "pypi-" + "AgEIcHlwaS5vcmc" * 4,
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "pem": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjE=\n-----END OPENSSH PRIVATE KEY-----",
}


@pytest.mark.parametrize("key", ["cache_key", "sort_key", "dataset_cache_key", "tensor_key", "notes"])
@pytest.mark.parametrize("kind", list(_TOKENS))
def test_a_token_shaped_value_is_replaced_whatever_its_key(key: str, kind: str) -> None:
    """Issue #47: an index key (``cache_key``) is not a secret's name, but a token in its
    value is still a token: replaced, alone or inside text and lists."""
    token = _TOKENS[kind]
    assert redacted({key: token}) == {key: REDACTED}
    assert redacted({key: [f"ran with {token} today"]}) == {key: [f"ran with {REDACTED} today"]}


@pytest.mark.parametrize("key", ["api_cache_key", "access_sort_key", "client_state_key", "private_index_key"])
def test_an_index_key_that_says_whose_credential_it_is_is_a_secret(key: str) -> None:
    assert secret_key(key) and redacted({key: "a1b2c3"}) == {key: REDACTED}
    assert redacted({key.split("_", 1)[1]: "a1b2c3"}) == {
        key.split("_", 1)[1]: "a1b2c3"
    }  # the plain one kept


def test_a_recorders_index_keys_holding_tokens_reach_no_manifest(tmp_path: Path) -> None:
    planted = {f"{kind}_cache_key": token for kind, token in _TOKENS.items()}
    manifest = _loop(tmp_path / "run", {**planted, "api_cache_key": "0f" * 20, "cache_key": "by-length"})
    text = manifest.read_text()
    assert not [t for t in (*_TOKENS.values(), "0f" * 20) if t in text]
    arguments = json.loads(text)["training"]["arguments"]
    assert arguments["cache_key"] == "by-length" and arguments["api_cache_key"] == REDACTED


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("s3://user:password@bucket/data", f"s3://{REDACTED}@bucket/data"),
        ("https://ghuser:tok@github.com/x.git", f"https://{REDACTED}@github.com/x.git"),
        ("https://example.org/a?x=1&token=abc&y=2", f"https://example.org/a?x=1&token={REDACTED}&y=2"),
        ("https://example.org/a?api_key=abc", f"https://example.org/a?api_key={REDACTED}"),
        ("https://example.org/a?page=2", "https://example.org/a?page=2"),
        (f"token {HF} here", f"token {REDACTED} here"),
        (OPENAI, REDACTED),
        ("ghp_" + "a" * 36, REDACTED),
        ("github_pat_" + "B" * 40, REDACTED),
        ("glpat-" + "c" * 20, REDACTED),
        (AWS, REDACTED),
        ("xoxb-1234567890-abc", REDACTED),
        ("/data/hf_cache/model", "/data/hf_cache/model"),
        ("sk-short", "sk-short"),
        ("", ""),
    ],
)
def test_credentials_in_text_are_replaced(text: str, shown: str) -> None:
    assert redacted_text(text) == shown


def test_only_text_under_a_secret_key_is_replaced_and_nothing_in_place() -> None:
    given = {
        "hf_token": HF,
        "use_auth_token": True,
        "pad_token_id": 0,
        "model_init_kwargs": {"token": HF, "revision": "main"},
        "credentials": {"user": "bob", "retries": 3},
        "tokens": 128,
        "list": [f"s3://a:{URL_PASSWORD}@b", 1.5],
    }
    assert redacted(given) == {
        "hf_token": REDACTED,
        "use_auth_token": True,
        "pad_token_id": 0,
        "model_init_kwargs": {"token": REDACTED, "revision": "main"},
        "credentials": {"user": REDACTED, "retries": 3},
        "tokens": 128,
        "list": [f"s3://{REDACTED}@b", 1.5],
    }
    assert given["hf_token"] == HF  # the caller's own mapping is left alone


def _loop(root: Path, arguments: dict[str, object], fmt: str = "native", mode: str = "scalars") -> Path:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with Recorder(root, mode=mode, format=fmt) as rec:
        rec.record_settings(model, optimizer, steps=1, arguments=arguments)
        rec.start(model)
        loss = model(torch.ones(1, 4)).sum()
        loss.backward()
        optimizer.step()
        rec.record_scalars(loss=loss.item())
        rec.stop()
    return root / "step0" / "rank0" / "manifest.json"


def _arguments(tmp_path: Path) -> dict[str, object]:
    return {
        "hf_token": HF,
        "wandb_api_key": WANDB,
        "aws_access_key_id": AWS,
        "data": f"s3://u:{URL_PASSWORD}@b/x",
        "notes": f"key {OPENAI}",
        "lr": 0.1,
    }


def test_the_recorder_writes_a_loops_arguments_without_their_secrets(tmp_path: Path) -> None:
    manifest = _loop(tmp_path / "run", _arguments(tmp_path))
    text = manifest.read_text()
    assert not [s for s in SECRETS if s in text]
    arguments = json.loads(text)["training"]["arguments"]
    assert arguments["hf_token"] == REDACTED and arguments["lr"] == 0.1
    assert arguments["data"] == f"s3://{REDACTED}@b/x"


def test_two_runs_with_different_tokens_record_the_same_and_without_one_differ(tmp_path: Path) -> None:
    first = json.loads(_loop(tmp_path / "a", {"hf_token": HF}).read_text())
    second = json.loads(_loop(tmp_path / "b", {"hf_token": "hf_" + "W" * 34}).read_text())
    without = json.loads(_loop(tmp_path / "c", {"hf_token": None}).read_text())
    settings = [m["training"]["arguments"] for m in (first, second, without)]
    assert settings[0] == settings[1] == {"hf_token": REDACTED}
    assert settings[2] == {"hf_token": None}


def test_the_baseline_store_writes_no_secret(tmp_path: Path) -> None:
    from pytest_precalign.baseline.store import write_stored
    from pytest_precalign.trace.records import Trace

    trace = Trace(
        manifest={"model": {"path": f"s3://u:{URL_PASSWORD}@b/m", "hf_token": HF}}, records=(), tensors={}
    )
    target = write_stored(trace, None, tmp_path / "base" / "case", extra={"run_by": f"token {OPENAI}"})
    text = (target / "manifest.json").read_text()
    assert not [s for s in SECRETS if s in text]
    assert json.loads(text)["model"]["hf_token"] == REDACTED


def test_the_msprobe_formats_manifest_holds_no_secret(tmp_path: Path) -> None:
    _loop(tmp_path / "run", _arguments(tmp_path), fmt="msprobe", mode="stats")
    texts = [p.read_text() for p in (tmp_path / "run").rglob("*.json")]
    assert len(texts) == 5 and not [s for s in SECRETS for t in texts if s in t]  # with checksums.json


@pytest.mark.slow
def test_no_writer_leaks_a_planted_secret(tmp_path: Path) -> None:
    """A loop's Recorder (native and msprobe), a Trainer with TRL's SFTConfig, Lightning and
    Accelerate, each run as a user runs it, every file they wrote grepped."""
    env = {"PYTHONPATH": f"{SRC}:{REPO}", "PYTHONWARNINGS": "ignore", "PATH": "/usr/bin:/bin"}
    writers = ["recorder", "trainer", "lightning", "accelerate"]
    cmd = [sys.executable, str(HERE / "secret_writers.py"), str(tmp_path), *writers]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    files = [
        p for w in writers for p in (tmp_path / w).rglob("*") if p.is_file() and "trainer_out" not in p.parts
    ]
    assert {p.relative_to(tmp_path).parts[0] for p in files} == set(writers)
    leaks = [
        (str(p.relative_to(tmp_path)), s) for p in files for s in SECRETS if s.encode() in p.read_bytes()
    ]
    assert not leaks
    trainer = json.loads((tmp_path / "trainer/rec/step0/rank0/manifest.json").read_text())
    arguments = trainer["training"]["arguments"]["TrainingArguments"]
    assert arguments["model_init_kwargs"] == {"token": REDACTED, "revision": "main"}
