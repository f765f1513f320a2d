"""Reliability corpus: bad inputs of every kind, each one clear message and exit code 2.

Each entry builds one broken input from a good one (a config and its factory models, a
recorded trace, a real msprobe dump, a tolerance or mapping file, CLI arguments) and runs
the ``precalign`` CLI on it. The message must be one ``precalign: error:`` line naming the
file, the key and what is allowed; never a traceback. Config entries marked ``plugin`` go
through ``pytest --align-config`` too (``pytest.UsageError``). Entries here are new: the ones
in tests/test_bad_input.py, test_config.py, test_cli_compare.py and test_msprobe_reader.py are
not repeated.
"""

from __future__ import annotations

import json
import shutil
import struct
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from pytest_precalign.cli import main
from pytest_precalign.recording import HookRecorder
from pytest_precalign.trace.native_io import write_trace
from tests.helpers.bad_input import replace_once
from tests.helpers.files import reseal
from tests.helpers.paths import MSPROBE_DATA

DATA = MSPROBE_DATA

MODELS = """
import torch


class Tiny(torch.nn.Module):
    def __init__(self, vocab=8, width=4):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, width)
        self.proj = torch.nn.Linear(width, vocab)

    def forward(self, input_ids, attention_mask=None):
        return self.proj(self.emb(input_ids))


def build(**kwargs):
    return Tiny(**kwargs)


def inputs_not_a_tensor():
    return {"input_ids": [[1, 2, 3]]}


def no_patch_args():
    return None
"""

GOOD = """\
version: 1
models:
  base: {source: factory, factory: "corpus_models:build"}
  cand: {source: factory, factory: "corpus_models:build"}
inputs:
  toks: {kind: tokens, batch: 1, seq_len: 3, vocab_size: 8, labels: true}
cases:
  - name: c1
    baseline: base
    candidate: cand
    inputs: toks
"""


def edit(old: str, new: str, text: str = GOOD) -> str:
    return replace_once(text, old, new)


def case_line(extra: str) -> str:
    """GOOD with ``extra`` keys added to its case (line 12 of the file)."""
    return GOOD + "".join(f"    {line}\n" for line in extra.split("\n"))


@dataclass(frozen=True)
class Bad:
    id: str
    build: Callable[[Path], list[str]]  # writes the broken input under root, returns argv
    fragments: tuple[str, ...]  # each in the one error line; {root} is the corpus folder
    plugin: bool = False  # a config error found at load: also checked through pytest


def config(text: str, *files: tuple[str, str]) -> Callable[[Path], list[str]]:
    def build(root: Path) -> list[str]:
        for name, content in files:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(content, encoding="utf-8")
        (root / "cfg.yaml").write_text(text, encoding="utf-8")
        return ["validate", str(root / "cfg.yaml")]

    return build


def run_config(text: str, *extra: str) -> Callable[[Path], list[str]]:
    def build(root: Path) -> list[str]:
        (root / "cfg.yaml").write_text(text, encoding="utf-8")
        return ["run", str(root / "cfg.yaml"), *extra]

    return build


# -- traces ------------------------------------------------------------------------------------


def record_trace(path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    with HookRecorder(model, mode="tensor") as rec:
        model(torch.randn(3, 4)).sum().backward()
    write_trace(rec.trace({"case": "t", "side": "baseline"}), path)


def trace(change: Callable[[Path], None]) -> Callable[[Path], list[str]]:
    """Compare a good trace (golden) with a broken copy of it (target)."""

    def build(root: Path) -> list[str]:
        record_trace(root / "a")
        shutil.copytree(root / "a", root / "b")
        change(root / "b")
        reseal(root / "b")  # crafted elsewhere and sealed again: the reader's own checks refuse it
        return ["compare", str(root / "a"), str(root / "b")]

    return build


def _write_bytes(name: str, content: bytes, argv: list[str]) -> Callable[[Path], list[str]]:
    def build(root: Path) -> list[str]:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content)
        return [a.format(root=root) for a in argv]

    return build


def _sparse(name: str, size: int, argv: list[str]) -> Callable[[Path], list[str]]:
    """A file of ``size`` bytes on paper, none on disk: a huge config refused by its size."""

    def build(root: Path) -> list[str]:
        with (root / name).open("wb") as handle:
            handle.write(b"version: 1\n")
            handle.truncate(size)
        return [a.format(root=root) for a in argv]

    return build


def json_edit(file: str, fn: Callable[[dict], object]) -> Callable[[Path], None]:  # type: ignore[type-arg]
    def change(folder: Path) -> None:
        path = folder / file
        path.write_text(json.dumps(fn(json.loads(path.read_text()))))

    return change


def first_record(fn: Callable[[dict], None], where: str = "tensor") -> Callable[[dict], dict]:  # type: ignore[type-arg]
    def apply(index: dict) -> dict:  # type: ignore[type-arg]
        rec = next(r for r in index["records"] if where != "tensor" or r.get("tensor_key"))
        fn(rec)
        return index

    return apply


def write(file: str, data: bytes) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        (folder / file).write_bytes(data)

    return change


def shard(fn: Callable[[bytes], bytes]) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        file = next(folder.glob("*.safetensors"))
        file.write_bytes(fn(file.read_bytes()))

    return change


def safetensors_header(fn: Callable[[dict], None]) -> Callable[[bytes], bytes]:  # type: ignore[type-arg]
    """Rewrite a shard's JSON header (same tensor bytes)."""

    def apply(data: bytes) -> bytes:
        (size,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + size])
        fn(header)
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        return struct.pack("<Q", len(text)) + text + data[8 + size :]

    return apply


def retype(header: dict) -> None:  # type: ignore[type-arg]
    key = next(k for k in header if k != "__metadata__")
    header[key]["dtype"] = "F16"  # half the bytes the offsets hold


def reshape(header: dict) -> None:  # type: ignore[type-arg]
    key = next(k for k in header if k != "__metadata__" and header[k]["shape"])
    header[key]["shape"] = [*header[key]["shape"], 1000]


def swap_tensor_shape(folder: Path) -> None:
    """The shard holds a transposed tensor under the key index.json gives another shape."""
    from safetensors.torch import load_file, save_file

    file = next(folder.glob("*.safetensors"))
    tensors = load_file(str(file))
    key = next(k for k, t in tensors.items() if t.dim() == 2 and t.shape[0] != t.shape[1])
    tensors[key] = tensors[key].t().contiguous()
    save_file(tensors, str(file))


# -- msprobe dumps --------------------------------------------------------------------------


def dump(sample: str, change: Callable[[Path], None]) -> Callable[[Path], list[str]]:
    """Compare a real msprobe dump with a broken copy of it."""

    def build(root: Path) -> list[str]:
        source = next((DATA / sample).glob("step0/*"))
        shutil.copytree(source, root / "a" / "step0" / "rank0")
        shutil.copytree(source, root / "b" / "step0" / "rank0")
        change(root / "b" / "step0" / "rank0")
        return ["compare", str(root / "a"), str(root / "b")]

    return build


def dump_record(
    fn: Callable[[dict], None], name: str = "Module.model.layers.0.self_attn.q_proj.Linear.forward.0"
):  # type: ignore[no-untyped-def,type-arg]
    def apply(data: dict) -> dict:  # type: ignore[type-arg]
        fn(data["data"][name])
        return data

    return json_edit("dump.json", apply)


def first_pt(fn: Callable[[Path], None]) -> Callable[[Path], None]:
    def change(folder: Path) -> None:
        fn(sorted((folder / "dump_tensor_data").glob("*.pt"))[0])

    return change


def cli(argv: list[str], *files: tuple[str, str], golden: bool = False) -> Callable[[Path], list[str]]:
    def build(root: Path) -> list[str]:
        for name, content in files:
            (root / name).write_text(content, encoding="utf-8")
        if golden:
            record_trace(root / "a")
        return [a.format(root=root) for a in argv]

    return build


TENSOR = "micro/base_micro_tensor_L0_statistics"
STATS = "tiny_statistics_L0"
CFG = "{root}/cfg.yaml"
RULES = "- {match: '*', atol: 1.0e-5, rtol: 0}\n"

CORPUS: list[Bad] = [
    # ---- configs: case keys -----------------------------------------------------------------
    Bad(
        "optimizer-betas-one-number",
        config(case_line("optimizer: {name: adamw, betas: [0.9]}")),
        (CFG + ":12: cases[0].optimizer.betas: expected two numbers, got [0.9]",),
        plugin=True,
    ),
    Bad(
        "optimizer-unknown-name",
        config(case_line("optimizer: {name: lamb}")),
        (CFG + ":12: cases[0].optimizer.name:", "'lamb'", "adamw, adam, sgd"),
        plugin=True,
    ),
    Bad(
        "record-unknown-mode",
        config(case_line("record: {mode: full}")),
        (CFG + ":12: cases[0].record.mode:", "'full'", "stats, tensor, hash"),
        plugin=True,
    ),
    Bad(
        "record-unknown-format",
        config(case_line("record: {format: npy}")),
        (CFG + ":12: cases[0].record.format:", "'npy'", "native, msprobe, precalign"),
    ),
    Bad(
        "record-include-not-globs",
        config(case_line("record: {include: [1, 2]}")),
        (CFG + ":12: cases[0].record.include: expected a glob or a list of globs",),
    ),
    Bad(
        "expect-origin-not-bool",
        config(case_line("expect: {first_divergence: proj, origin: maybe}")),
        (CFG + ":12: cases[0].expect.origin: expected true or false, got 'maybe'",),
        plugin=True,
    ),
    Bad(
        "isolate-in-stats-mode",
        config(case_line("isolate: true")),
        (CFG + ":12: cases[0].isolate:", "needs record: {mode: tensor} (got 'stats')"),
    ),
    Bad(
        "isolate-without-inputs",
        config(case_line("isolate: true\nrecord: {mode: tensor, inputs: false}")),
        (CFG + ":12: cases[0].isolate: isolation needs the modules' inputs: record: {inputs: true}",),
    ),
    Bad(
        "steps-zero",
        config(case_line("steps: 0")),
        (CFG + ":12: cases[0].steps: must be >= 1, got 0",),
    ),
    Bad(
        "weights-unknown-key",
        config(case_line("weights: {sync: true, copy: false}")),
        (CFG + ":12: cases[0].weights.copy: unknown key 'copy'", "allowed: strict, sync"),
        plugin=True,
    ),
    Bad(
        "case-name-with-bracket",
        config(edit("name: c1", "name: 'c1[x]'")),
        (CFG + ":8: cases[0].name: 'c1[x]' is not a usable case name",),
    ),
    Bad(
        "train-not-bool",
        config(case_line("train: sometimes")),
        (CFG + ":12: cases[0].train: expected true or false, got str 'sometimes'",),
    ),
    Bad(
        "loss-unknown",
        config(case_line("loss: mse")),
        (CFG + ":12: cases[0].loss:", "'mse'", "causal_lm, model, mean, none"),
    ),
    # ---- configs: dumps instead of models -------------------------------------------------
    Bad(
        "dump-and-model-mixed",
        config(edit("baseline: base", "baseline: {dump: runs/a}"), ("runs/a/x", "")),
        (CFG + ":9: cases[0].baseline: baseline and candidate must both be models or both be {dump: path}",),
    ),
    Bad(
        "dump-path-missing",
        config(
            edit(
                "baseline: base\n    candidate: cand",
                "baseline: {dump: runs/a}\n    candidate: {dump: runs/b}",
            )
        ),
        (CFG + ":9: cases[0].baseline.dump: no such dump or trace directory: {root}/runs/a",),
        plugin=True,
    ),
    Bad(
        "dump-unknown-key",
        config(edit("baseline: base", "baseline: {dump: runs/a, rank: 0}")),
        (CFG + ":9: cases[0].baseline.rank: unknown key 'rank'", "allowed: dump"),
    ),
    Bad(
        "isolate-with-dumps",
        config(
            edit("baseline: base\n    candidate: cand", "baseline: {dump: a}\n    candidate: {dump: a}")
            + "    isolate: true\n    record: {mode: tensor}\n",
            ("a/manifest.json", "{}"),
        ),
        (
            CFG
            + ":12: cases[0].isolate: isolation re-runs the candidate's modules: it needs a model, not a dump",
        ),
    ),
    # ---- configs: models --------------------------------------------------------------------
    Bad(
        "patch-not-module-function",
        config(
            edit(
                'cand: {source: factory, factory: "corpus_models:build"}',
                'cand: {source: factory, factory: "corpus_models:build", patch: "corpus_models.no_patch_args"}',
            )
        ),
        (CFG + ":4: models.cand.patch: expected 'module:function'", "'corpus_models.no_patch_args'"),
        plugin=True,
    ),
    Bad(
        "output-not-string",
        config(
            edit(
                'cand: {source: factory, factory: "corpus_models:build"}',
                'cand: {source: factory, factory: "corpus_models:build", output: 3}',
            )
        ),
        (CFG + ":4: models.cand.output: expected a string, got int 3",),
    ),
    Bad(
        "megatron-tensor-parallel-zero",
        config(
            edit(
                'cand: {source: factory, factory: "corpus_models:build"}',
                "cand: {source: megatron, tensor_parallel: 0}",
            )
        ),
        (CFG + ":4: models.cand.tensor_parallel: must be >= 1, got 0",),
    ),
    Bad(
        "megatron-unknown-preset",
        config(
            edit(
                'cand: {source: factory, factory: "corpus_models:build"}',
                "cand: {source: megatron, preset: llama3}",
            )
        ),
        (CFG + ":4: models.cand.preset:", "'llama3'", "qwen2.5"),
    ),
    Bad(
        "preset-mapping-unknown",
        config(case_line("mapping: 'preset:llama'")),
        (
            CFG
            + ":12: cases[0].mapping: unknown preset mapping 'preset:llama' (allowed: preset:megatron-qwen2.5, "
            "preset:megatron-llama, preset:megatron-qwen3, preset:megatron-mixtral, preset:megatron-qwen3-moe)",
        ),
    ),
    Bad(
        "preset-mapping-without-heads",
        config(case_line("mapping: 'preset:megatron-qwen2.5'")),
        (
            CFG
            + ":12: cases[0].mapping: preset:megatron-qwen2.5 needs num_attention_heads in a model's config",
        ),
    ),
    Bad(
        "hf-unknown-attn-implementation",
        config(
            edit(
                'cand: {source: factory, factory: "corpus_models:build"}',
                "cand: {source: hf, class: transformers.Qwen2ForCausalLM, attn_implementation: flash9, "
                "config: {vocab_size: 8, hidden_size: 8, intermediate_size: 8, num_hidden_layers: 1, "
                "num_attention_heads: 2, num_key_value_heads: 1}}",
            )
        ),
        (CFG + ":4: models.cand", "flash9"),
    ),
    Bad(
        "hf-config-unknown-type",
        config(
            edit(
                'cand: {source: factory, factory: "corpus_models:build"}',
                "cand: {source: hf, class: transformers.Qwen2ForCausalLM, config: {vocab_size: eight}}",
            )
        ),
        (CFG + ":4: models.cand", "vocab_size", "eight"),
    ),
    # ---- configs: explicit token ids (kind: ids) -----------------------------------------------
    Bad(
        "ids-ragged-rows",
        config(
            edit(
                "{kind: tokens, batch: 1, seq_len: 3, vocab_size: 8, labels: true}",
                "{kind: ids, input_ids: [[1, 2, 3], [4, 5]], labels: true}",
            )
        ),
        (CFG + ":6: inputs.toks.input_ids: row 1 has 2 values, row 0 has 3: rows must be equally long",),
        plugin=True,
    ),
    Bad(
        "ids-negative",
        config(
            edit(
                "{kind: tokens, batch: 1, seq_len: 3, vocab_size: 8, labels: true}",
                "{kind: ids, input_ids: [[1, -2, 3]], labels: true}",
            )
        ),
        (CFG + ":6: inputs.toks.input_ids: row 0: expected integers >= 0, got -2",),
    ),
    Bad(
        "ids-mask-other-shape",
        config(
            edit(
                "{kind: tokens, batch: 1, seq_len: 3, vocab_size: 8, labels: true}",
                "{kind: ids, input_ids: [[1, 2, 3]], attention_mask: [[1, 1]], labels: true}",
            )
        ),
        (CFG + ":6: inputs.toks.attention_mask: expected the shape of input_ids [1, 3], got [1, 2]",),
    ),
    Bad(
        "ids-mask-not-binary",
        config(
            edit(
                "{kind: tokens, batch: 1, seq_len: 3, vocab_size: 8, labels: true}",
                "{kind: ids, input_ids: [[1, 2, 3]], attention_mask: [[1, 2, 0]], labels: true}",
            )
        ),
        (CFG + ":6: inputs.toks.attention_mask: row 0: expected only 0 and 1, got [1, 2, 0]",),
    ),
    Bad(
        "ids-mask-row-all-padding",
        config(
            edit(
                "{kind: tokens, batch: 1, seq_len: 3, vocab_size: 8, labels: true}",
                "{kind: ids, input_ids: [[1, 2, 3]], attention_mask: [[0, 0, 0]], labels: true}",
            )
        ),
        (CFG + ":6: inputs.toks.attention_mask: row 0: every row needs at least one 1",),
    ),
    Bad(
        "ids-beyond-vocabulary",
        run_config(
            edit(
                "{kind: tokens, batch: 1, seq_len: 3, vocab_size: 8, labels: true}",
                "{kind: ids, input_ids: [[1, 2, 30]], labels: true}",
            )
        ),
        (CFG + ": case 'c1':", "inputs.toks", "token id 30", "vocabulary"),
    ),
    Bad(
        "ids-backward-without-labels",
        config(
            case_line("phases: [forward, backward]").replace(
                "{kind: tokens, batch: 1, seq_len: 3, vocab_size: 8, labels: true}",
                "{kind: ids, input_ids: [[1, 2, 3]]}",
            )
        ),
        (CFG + ":12: cases[0].phases: phase 'backward' with loss 'causal_lm' needs labels",),
    ),
    # ---- tolerance, mapping and layer_mapping files -------------------------------------------
    Bad(
        "tolerance-file-yaml-error",
        config(GOOD + "tolerances:\n  t: tol.yaml\n", ("tol.yaml", "- {match: '*', atol: 1\n")),
        ("{root}/tol.yaml:", "YAML syntax error"),
        plugin=True,
    ),
    Bad(
        "tolerance-file-a-scalar",
        config(GOOD + "tolerances:\n  t: tol.yaml\n", ("tol.yaml", "fp32\n")),
        ("{root}/tol.yaml", "expected a list of rules"),
    ),
    Bad(
        "tolerance-file-rule-bad-metric",
        config(GOOD + "tolerances:\n  t: tol.yaml\n", ("tol.yaml", "- {match: '*', cosine: 1.5}\n")),
        ("{root}/tol.yaml:1: [0].cosine:", "1.5"),
    ),
    Bad(
        "mapping-file-renames-not-list",
        config(case_line("mapping: m.yaml"), ("m.yaml", "renames: {a: b}\n")),
        ("{root}/m.yaml:1: renames: expected a list", "got a mapping"),
    ),
    Bad(
        "layer-mapping-unknown-preset",
        config(case_line("layer_mapping: 'preset:llama'")),
        (
            CFG + ":12: cases[0].layer_mapping: unknown preset 'preset:llama'",
            "preset:qwen2.5-mindspeed-to-hf",
        ),
    ),
    Bad(
        "layer-mapping-file-not-strings",
        config(case_line("layer_mapping: lm.yaml"), ("lm.yaml", "Qwen2Model:\n  layers: [1, 2]\n")),
        ("{root}/lm.yaml:2: Qwen2Model.layers: expected 'child.path: baseline.path' strings",),
    ),
    Bad(
        "layer-mapping-file-a-list",
        config(case_line("layer_mapping: lm.yaml"), ("lm.yaml", "- a\n- b\n")),
        ("{root}/lm.yaml", "expected a mapping", "got a list"),
    ),
    # ---- traces ------------------------------------------------------------------------------
    Bad(
        "trace-manifest-corrupt",
        trace(write("manifest.json", b'{"format": "pytest-precalign-trace", ')),
        ("{root}/b/manifest.json: cannot read:",),
    ),
    Bad(
        "trace-format-version-2",
        trace(json_edit("manifest.json", lambda m: {**m, "format_version": 2})),
        ("{root}/b/manifest.json: format_version 2 is not supported (expected 1)",),
    ),
    Bad(
        "trace-index-missing",
        trace(lambda folder: (folder / "index.json").unlink()),
        ("{root}/b/index.json: missing",),
    ),
    Bad(
        "trace-index-records-not-list",
        trace(json_edit("index.json", lambda i: {**i, "records": {"a": 1}})),
        ("{root}/b/index.json: expected {'records': [...], 'shards': {...}}",),
    ),
    Bad(
        "trace-record-missing-key",
        trace(json_edit("index.json", first_record(lambda r: r.pop("name")))),
        ("{root}/b/index.json: records[", "missing key 'name'"),
    ),
    Bad(
        "trace-record-unknown-dtype",
        trace(json_edit("index.json", first_record(lambda r: r.update(dtype="float33")))),
        ("{root}/b/index.json: records[", "dtype 'float33'", "float32"),
    ),
    Bad(
        "trace-record-unknown-kind",
        trace(json_edit("index.json", first_record(lambda r: r.update(kind="weights")))),
        ("{root}/b/index.json: records[", "kind 'weights'", "activation"),
    ),
    Bad(
        "trace-record-shape-not-ints",
        trace(json_edit("index.json", first_record(lambda r: r.update(shape=["three", 4])))),
        ("{root}/b/index.json: records[", "shape must be a list of integers >= 0, got ['three', 4]"),
    ),
    Bad(
        "trace-duplicate-record-id",
        trace(json_edit("index.json", lambda i: {**i, "records": [*i["records"], i["records"][0]]})),
        ("{root}/b/index.json: records[", "duplicate record id"),
    ),
    Bad(
        "trace-shards-not-mapping",
        trace(json_edit("index.json", lambda i: {**i, "shards": ["tensors-00000.safetensors"]})),
        ("{root}/b/index.json: 'shards' must map tensor keys to file names in the trace directory",),
    ),
    Bad(
        "trace-shard-file-missing",
        trace(lambda folder: next(folder.glob("*.safetensors")).unlink()),
        ("{root}/b: index.json names tensors-00000.safetensors, which is missing",),
    ),
    Bad(
        "trace-shard-truncated-header",
        trace(shard(lambda data: data[:6])),
        ("{root}/b/tensors-00000.safetensors: cannot read tensor",),
    ),
    Bad(
        "trace-shard-wrong-dtype-in-header",
        trace(shard(safetensors_header(retype))),
        ("{root}/b/tensors-00000.safetensors: cannot read tensor",),
    ),
    Bad(
        "trace-shard-wrong-shape-in-header",
        trace(shard(safetensors_header(reshape))),
        ("{root}/b/tensors-00000.safetensors: cannot read tensor",),
    ),
    Bad(
        "trace-tensor-shape-differs-from-index",
        trace(swap_tensor_shape),
        ("{root}/b", "holds a tensor of shape", "index.json says"),
    ),
    Bad(
        "trace-tensor-key-not-in-shard",
        trace(
            json_edit(
                "index.json",
                lambda i: {
                    **i,
                    "shards": {**i["shards"], **{k + "x": v for k, v in i["shards"].items()}},
                    "records": [
                        {**r, "tensor_key": r["tensor_key"] + "x"} if r.get("tensor_key") else r
                        for r in i["records"]
                    ],
                },
            )
        ),
        ("{root}/b/tensors-00000.safetensors: cannot read tensor",),
    ),
    # ---- files that are not configs at all, refused by their first bytes ---------------------
    Bad(
        "config-binary",
        _write_bytes("cfg.yaml", b"version: 1\n\0\0ELF", ["validate", "{root}/cfg.yaml"]),
        ("{root}/cfg.yaml: a binary file (NUL bytes); expected an alignment YAML file",),
        plugin=True,
    ),
    Bad(
        "config-deeply-nested",
        _write_bytes("cfg.yaml", b"[" * 100_000 + b"]" * 100_000, ["validate", "{root}/cfg.yaml"]),
        ("{root}/cfg.yaml: nested too deeply to be a config",),
        plugin=True,
    ),
    Bad(
        "config-huge-sparse",
        _sparse("cfg.yaml", 2 << 30, ["validate", "{root}/cfg.yaml"]),
        (f"{{root}}/cfg.yaml: {2 << 30} bytes; expected an alignment YAML file of at most 16 MiB",),
        plugin=True,
    ),
    Bad(
        "tolerance-file-binary",
        lambda root: (
            (root / "t.yaml").write_bytes(b"\0" * 64),
            config(GOOD + "tolerances:\n  t: t.yaml\n")(root),
        )[-1],  # type: ignore[index]
        ("{root}/t.yaml: a binary file (NUL bytes)",),
        plugin=True,
    ),
    Bad(
        "causal-lm-one-token",
        config(edit("seq_len: 3", "seq_len: 1")),
        ("loss 'causal_lm' needs at least 2 tokens per row",),
        plugin=True,
    ),
    Bad(
        "env-diff-deep-manifest",
        _write_bytes(
            "m/manifest.json", b"[" * 100_000 + b"]" * 100_000, ["env-diff", "{root}/m", "{root}/m"]
        ),
        ("{root}/m/manifest.json: not a readable manifest: nested too deeply",),
    ),
    # ---- msprobe dumps -------------------------------------------------------------------------
    Bad(
        "dump-json-deeply-nested",
        dump(STATS, lambda folder: (folder / "dump.json").write_bytes(b"[" * 100_000 + b"]" * 100_000)),
        ("{root}/b/step0/rank0/dump.json: not valid JSON: nested too deeply",),
    ),
    Bad(
        "dump-dtype-not-string",
        dump(STATS, dump_record(lambda r: r["output"][0].update(dtype=7))),
        (
            "{root}/b/step0/rank0/dump.json: record 'Module.model.layers.0.self_attn.q_proj.Linear.forward.0' out: tensor entry without a 'dtype' string",
        ),
    ),
    Bad(
        "dump-data-name-not-string",
        dump(STATS, dump_record(lambda r: r["output"][0].update(data_name=["a.pt"]))),
        ("{root}/b/step0/rank0/dump.json: record", "'data_name' must be a file name, got ['a.pt']"),
    ),
    Bad(
        "dump-header-not-object",
        dump(STATS, json_edit("dump.json", lambda d: {**d, "data": [1, 2]})),
        ("{root}/b/step0/rank0/dump.json: not an msprobe dump.json: expected an object with 'data'",),
    ),
    Bad(
        "dump-construct-values-not-names",
        dump(STATS, json_edit("construct.json", lambda c: dict.fromkeys(c, 3))),
        ("{root}/b/step0/rank0/construct.json: expected an object mapping record names to parent names",),
    ),
    Bad(
        "dump-pt-file-missing",
        dump(TENSOR, first_pt(lambda p: p.unlink())),
        ("{root}/b/step0/rank0/dump_tensor_data/", ".pt: missing (dump.json names it as data_name)"),
    ),
    Bad(
        "dump-pt-holds-a-dict",
        dump(TENSOR, first_pt(lambda p: torch.save({"t": torch.zeros(1)}, p))),
        ("{root}/b/step0/rank0/dump_tensor_data/", ".pt: holds a dict, expected a tensor"),
    ),
    Bad(
        "dump-pt-garbage",
        dump(TENSOR, first_pt(lambda p: p.write_bytes(b"not a pickle at all"))),
        ("{root}/b/step0/rank0/dump_tensor_data/", "not a readable torch tensor file"),
    ),
    Bad(
        "dump-unknown-dtype-string",
        dump(STATS, dump_record(lambda r: r["output"][0].update(dtype="torch.float33"))),
        ("{root}/b/step0/rank0/dump.json: record", "dtype 'torch.float33'", "float32"),
    ),
    # ---- CLI arguments --------------------------------------------------------------------------
    Bad(
        "cli-metric-file-missing",
        cli(["compare", "{root}/a", "{root}/a", "--metric", "{root}/nope.py:f"], golden=True),
        ("--metric: {root}/nope.py: file not found",),
    ),
    Bad(
        "cli-metric-not-file-function",
        cli(["compare", "{root}/a", "{root}/a", "--metric", "cosine"], golden=True),
        ("--metric: expected file.py:function, got 'cosine'",),
    ),
    Bad(
        "cli-metric-function-missing",
        cli(
            ["compare", "{root}/a", "{root}/a", "--metric", "{root}/m.py:score"],
            ("m.py", "def other(a, b):\n    return 0.0\n"),
            golden=True,
        ),
        ("--metric: {root}/m.py has no function 'score'",),
    ),
    Bad(
        "cli-metric-import-raises",
        cli(
            ["compare", "{root}/a", "{root}/a", "--metric", "{root}/m.py:score"],
            ("m.py", "import no_such_thing_here\n"),
            golden=True,
        ),
        ("--metric: {root}/m.py: importing it raised ModuleNotFoundError",),
    ),
    Bad(
        "cli-metric-raises-on-a-pair",
        cli(
            ["compare", "{root}/a", "{root}/a", "--metric", "{root}/m.py:score"],
            ("m.py", "def score(a, b):\n    return 1 / 0\n"),
            golden=True,
        ),
        ("--metric score: raised ZeroDivisionError on",),
    ),
    Bad(
        "cli-layer-mapping-unknown-preset",
        cli(["compare", "{root}/a", "{root}/a", "--layer-mapping", "preset:nope"], golden=True),
        ("--layer-mapping: preset:nope: not found", "preset:qwen2.5-mindspeed-to-hf"),
    ),
    Bad(
        "cli-layer-mapping-file-missing",
        cli(["compare", "{root}/a", "{root}/a", "--layer-mapping", "{root}/lm.yaml"], golden=True),
        ("--layer-mapping", "{root}/lm.yaml", "not found"),
    ),
    Bad(
        "cli-mapping-file-bad-op",
        cli(
            ["compare", "{root}/a", "{root}/a", "--mapping", "{root}/m.yaml"],
            ("m.yaml", "tensors:\n  - {baseline: a, candidate: b, transform: {op: spin}}\n"),
            golden=True,
        ),
        ("{root}/m.yaml:2: tensors[0].transform[0].op: unknown value 'spin'", "allowed: concat"),
    ),
    Bad(
        "cli-tolerances-bad-rule",
        cli(
            ["compare", "{root}/a", "{root}/a", "--tolerances", "{root}/t.yaml"],
            ("t.yaml", "- {match: '*', atol: 1.0e-5}\n"),
            golden=True,
        ),
        ("{root}/t.yaml:1: [0]: atol and rtol must be given together (missing 'rtol')",),
    ),
    Bad(
        "cli-var-not-integer",
        cli(["compare", "{root}/a", "{root}/a", "--var", "num_attention_heads=four"], golden=True),
        ("--var: expected KEY=INTEGER", "'num_attention_heads=four'"),
    ),
    Bad(
        "cli-report-is-a-file",
        cli(
            ["compare", "{root}/a", "{root}/a", "--report", "{root}/r.txt"], ("r.txt", "taken\n"), golden=True
        ),
        ("--report: {root}/r.txt: {root}/r.txt is a file, not a directory",),
    ),
    Bad(
        "cli-run-save-traces-exist",
        lambda root: (
            (root / "cfg.yaml").write_text(GOOD),
            (root / "out" / "cfg" / "c1" / "baseline").mkdir(parents=True),
            ["run", str(root / "cfg.yaml"), "--save-traces", str(root / "out")],
        )[-1],  # type: ignore[index]
        ("{root}/out/cfg/c1/baseline: a trace already exists there; refusing to overwrite it",),
    ),
    # ---- models' weights: {load, format} (issue #14 item 4) ----------------------------------
    Bad(
        "weights-unknown-format",
        config(
            edit(
                'factory: "corpus_models:build"}\ninputs',
                'factory: "corpus_models:build",\n         weights: {load: ., format: safetensors}}\ninputs',
            )
        ),
        (CFG + ":5: models.cand.weights.format:", "'safetensors'", "hf, megatron, megatron-dist"),
        plugin=True,
    ),
    Bad(
        "weights-no-format",
        config(
            edit(
                'factory: "corpus_models:build"}\ninputs',
                'factory: "corpus_models:build",\n         weights: {load: .}}\ninputs',
            )
        ),
        (
            CFG
            + ":5: models.cand.weights: missing required key 'format' (allowed: hf, megatron, megatron-dist)",
        ),
        plugin=True,
    ),
    Bad(
        "weights-missing-folder",
        config(
            edit(
                'factory: "corpus_models:build"}\ninputs',
                'factory: "corpus_models:build",\n         weights: {load: nope, format: hf}}\ninputs',
            )
        ),
        (CFG + ":5: models.cand.weights.load: no such checkpoint folder '{root}/nope'",),
        plugin=True,
    ),
    Bad(
        "weights-loaded-then-synced",
        config(
            edit(
                'factory: "corpus_models:build"}\ninputs',
                'factory: "corpus_models:build",\n         weights: {load: ., format: hf}}\ninputs',
            )
        ),
        (
            "cases[0].weights: candidate 'cand' loads its weights from {root}, which the weight sync "
            "would overwrite: set weights: {sync: false}",
        ),
        plugin=True,
    ),
    Bad(
        "weights-do-not-fit-the-model",
        lambda root: (
            (root / "ck").mkdir(),
            __import__("safetensors.torch").torch.save_file(
                {"emb.weight": torch.zeros(8, 4), "extra.weight": torch.zeros(1)},
                str(root / "ck" / "model.safetensors"),
            ),
            run_config(
                edit(
                    'factory: "corpus_models:build"}\ninputs',
                    'factory: "corpus_models:build",\n         weights: {load: ck, format: hf}}\ninputs',
                )
                + "    weights: {sync: false}\n"
            )(root),
        )[-1],  # type: ignore[index]
        (
            "models.cand.weights: {root}/ck (format hf) does not fit the model: 2 model tensor(s) not in the "
            "checkpoint: proj.weight, proj.bias; 1 checkpoint tensor(s) the model has no place for: extra.weight",
        ),
    ),
]


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """The corpus folder: the factory module the configs name, imported by the CLI in process."""
    (tmp_path / "corpus_models.py").write_text(MODELS, encoding="utf-8")
    yield tmp_path
    sys.modules.pop("corpus_models", None)


def _one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("precalign: error: "), err
    return lines[0]


def test_corpus_ids_are_distinct_and_enough() -> None:
    ids = [bad.id for bad in CORPUS]
    assert len(ids) == len(set(ids))
    assert len(ids) >= 40


@pytest.mark.parametrize("bad", CORPUS, ids=[b.id for b in CORPUS])
def test_bad_input_is_one_message_and_exit_2(
    root: Path, capsys: pytest.CaptureFixture[str], bad: Bad
) -> None:
    argv = bad.build(root)
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    line = _one_line(err)
    assert code == 2, (out, err)
    for fragment in bad.fragments:
        expected = fragment.replace("{root}", str(root))
        assert expected in line, f"{expected!r} not in {line!r}"


PLUGIN = [b for b in CORPUS if b.plugin]


@pytest.mark.parametrize("bad", PLUGIN, ids=[b.id for b in PLUGIN])
def test_bad_config_is_a_usage_error_in_pytest(pytester: pytest.Pytester, bad: Bad) -> None:
    """The same config errors through ``pytest --align-config``: found when the config loads,
    before torch is imported, so pytest runs in process."""
    (pytester.path / "corpus_models.py").write_text(MODELS, encoding="utf-8")
    argv = bad.build(pytester.path)
    result = pytester.runpytest_inprocess(
        "--align-config", argv[1], "-p", "no:cacheprovider", f"--basetemp={pytester.path / 'bt'}"
    )
    text = "\n".join(result.outlines + result.errlines)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    assert "Traceback" not in text and "INTERNALERROR" not in text, text
    errors = [line for line in result.errlines if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("ERROR: --align-config: "), text
    for fragment in bad.fragments:
        assert fragment.replace("{root}", str(pytester.path)) in errors[0], text
