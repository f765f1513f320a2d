"""The msprobe dump reader, on real dumps (mindstudio-probe 26.2.0, tests/data/msprobe/README.md)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from pytest_precalign.compare.pairs import compare_traces
from pytest_precalign.compare.tolerances import ToleranceRule, ToleranceTable
from pytest_precalign.errors import TraceError
from pytest_precalign.msprobe import is_msprobe_dump, read_msprobe_dump, read_msprobe_set
from pytest_precalign.recording import HookRecorder
from pytest_precalign.trace.native_io import read_trace, write_trace
from pytest_precalign.trace.records import PHASE_OF_KIND
from pytest_precalign.verdict.phase import phase_verdict
from tests.helpers.files import reseal
from tests.helpers.paths import MSPROBE_DATA

DATA = MSPROBE_DATA
MICRO = DATA / "micro"
TABLE = ToleranceTable("msprobe", (ToleranceRule(atol=1e-6, rtol=1e-5),))
DOWN_PROJ = "model.layers.0.mlp.down_proj"


def rank_dir(dump: Path) -> Path:
    (folder,) = (dump / "step0").iterdir()  # proc<PID>: the PID differs per dump
    return folder


def raw_data(dump: Path) -> dict:
    return json.loads((rank_dir(dump) / "dump.json").read_text())["data"]


def copy_dump(dump: Path, tmp_path: Path) -> Path:
    """A writable copy of a sample's rank folder, for breaking it."""
    target = tmp_path / "dump" / "step0" / "rank0"
    shutil.copytree(rank_dir(dump), target)
    return target


# -- every sample loads ---------------------------------------------------------------------

SAMPLES = {
    # dir: (task, level, record_mode, summary_mode, records, non-tensor values skipped)
    "tiny_statistics_L0": ("statistics", "L0", "stats", "statistics", 186, 4),
    "tiny_statistics_L0_md5": ("statistics", "L0", "stats", "md5", 186, 4),
    "tiny_statistics_L0_xor": ("statistics", "L0", "hash", "xor", 186, 4),
    "tiny_statistics_L1": ("statistics", "L1", "stats", "statistics", 370, 39),
    "tiny_statistics_mix": ("statistics", "mix", "stats", "statistics", 556, 43),
    "tiny_statistics_mix_md5": ("statistics", "mix", "stats", "md5", 556, 43),
    "micro/base_micro_statistics_L0_statistics": ("statistics", "L0", "stats", "statistics", 105, 2),
    "micro/pert_micro_statistics_L0_md5": ("statistics", "L0", "stats", "md5", 105, 2),
    "micro/base_micro_statistics_mix_statistics": ("statistics", "mix", "stats", "statistics", 319, 29),
    "micro/base_micro_tensor_L0_statistics": ("tensor", "L0", "tensor", "tensor", 105, 2),
}


@pytest.mark.parametrize("sample", sorted(SAMPLES))
def test_every_sample_loads(sample):
    task, level, mode, summary, count, skipped = SAMPLES[sample]
    dump = DATA / sample
    trace = read_msprobe_dump(dump)  # a dump root holding one rank folder is accepted
    m = trace.manifest
    assert (m["format"], m["task"], m["level"], m["framework"]) == ("msprobe", task, level, "pytorch")
    assert (trace.mode, m["summary_mode"], m["step"], m["rank"]) == (mode, summary, 0, 0)
    assert m["path"] == str(rank_dir(dump))
    assert len(trace.records) == count and m["skipped_non_tensor"] == skipped
    assert [r.seq for r in trace.records] == list(range(count))
    assert all(r.phase == PHASE_OF_KIND[r.kind] and r.step == 0 for r in trace.records)
    assert len(trace.by_id()) == count  # ids are unique
    assert all(not r.dtype.startswith("torch.") for r in trace.records)
    evidence = [(r.stats is not None, r.crc32 is not None, r.tensor_key is not None) for r in trace.records]
    expected = {
        "statistics": (True, False, False),
        "md5": (True, True, False),
        "xor": (False, True, False),
        "tensor": (True, False, True),
    }[summary]
    assert set(evidence) == {expected}
    for folder in (dump, dump / "step0", rank_dir(dump)):
        assert is_msprobe_dump(folder)
        assert repr(read_msprobe_dump(folder).records) == repr(trace.records)  # repr: NaN != NaN


def test_not_msprobe_dumps(tmp_path):
    assert not is_msprobe_dump(tmp_path)
    assert not is_msprobe_dump(tmp_path / "missing")
    (tmp_path / "f.json").write_text("{}")
    assert not is_msprobe_dump(tmp_path / "f.json")
    with HookRecorder(torch.nn.Linear(2, 2)) as rec:
        pass
    write_trace(rec.trace(), tmp_path / "ours")  # our own trace format is not msprobe's
    assert not is_msprobe_dump(tmp_path / "ours")


# -- names, kinds, slots, values ------------------------------------------------------------


def test_known_record_matches_the_json():
    dump = DATA / "tiny_statistics_L0"
    trace = read_msprobe_dump(dump)
    entry = raw_data(dump)["Module.model.layers.0.self_attn.q_proj.Linear.forward.0"]["output"][0]
    rec = trace.by_id()["model.layers.0.self_attn.q_proj|activation|out|0|0"]
    assert (rec.module_class, rec.phase, rec.dtype, rec.shape) == (
        "Linear",
        "forward",
        "float32",
        (2, 32, 64),
    )
    assert rec.stats is not None
    assert (rec.stats.max, rec.stats.min, rec.stats.mean, rec.stats.norm) == (
        entry["Max"],
        entry["Min"],
        entry["Mean"],
        entry["Norm"],
    )
    assert (rec.stats.nan, rec.stats.inf, rec.crc32, rec.tensor_key) == (0, 0, None, None)
    assert rec.deps == ("model.layers.0.self_attn.q_proj|input|in.0|0|0",)  # not its weight
    weight = trace.by_id()["model.layers.0.self_attn.q_proj|input|param.weight|0|0"]
    assert weight.shape == (64, 64) and weight.phase == "forward"


def test_slots_follow_the_recorder():
    trace = read_msprobe_dump(DATA / "tiny_statistics_L0")
    ids = trace.by_id()
    attn = "model.layers.0.self_attn"
    # Attention returns (output, None): one tensor, at position 0, also for its gradient.
    assert [r.slot for r in trace.records if r.name == attn and r.kind == "activation"] == ["out.0"]
    assert [r.slot for r in trace.records if r.name == attn and r.kind == "grad_output"] == ["out.0"]
    assert {r.slot for r in trace.records if r.name == attn and r.kind == "input"} == {
        "in.hidden_states",
        "in.position_ids",
        "in.position_embeddings.0",
        "in.position_embeddings.1",
    }
    # A ModelOutput is a mapping: its tensors are slots by key, and so are their gradients.
    assert "model|activation|out.last_hidden_state|0|0" in ids
    assert "model|grad_output|out.last_hidden_state|0|0" in ids
    assert {r.slot for r in trace.records if r.name == "model.rotary_emb" and r.kind == "activation"} == {
        "out.0",
        "out.1",
    }
    grad_in = ids["model.layers.0.mlp.down_proj|grad_input|in.0|0|0"]
    assert grad_in.phase == "backward" and grad_in.module_class == "Linear"
    assert grad_in.deps == ("model.layers.0.mlp.down_proj|grad_output|out|0|0",)
    pgrad = ids["lm_head.weight|param_grad||0|0"]
    assert (pgrad.module_class, pgrad.shape, pgrad.phase) == ("Linear", (1000, 64), "backward")
    assert "lm_head|grad_output|out|0|0" in pgrad.deps
    assert "model.layers.0.self_attn.q_proj.bias|param_grad||0|0" in ids
    ints = ids["model.embed_tokens|input|in.0|0|0"]  # int64 ids: msprobe has no Mean/Norm
    assert ints.dtype == "int64" and ints.stats is not None
    assert math.isnan(ints.stats.mean) and math.isnan(ints.stats.norm) and ints.stats.finite
    assert (ints.stats.max, ints.stats.min) == (999.0, 8.0)


def test_seq_is_the_order_of_dump_json():
    dump = DATA / "tiny_statistics_L0"
    trace = read_msprobe_dump(dump)
    order = list(raw_data(dump))
    # Every forward record of a child comes before its parent's output (post-hook order).
    assert order.index("Module.model.layers.0.mlp.down_proj.Linear.forward.0") < order.index(
        "Module.model.layers.0.mlp.Qwen2MLP.forward.0"
    )
    down = trace.by_id()[f"{DOWN_PROJ}|activation|out|0|0"].seq
    mlp = trace.by_id()["model.layers.0.mlp|activation|out|0|0"].seq
    assert down < mlp
    backward = [r for r in trace.records if r.phase == "backward"]
    assert backward[0].name == "lm_head.weight"  # the first backward record msprobe wrote
    assert (
        order[order.index("Module.lm_head.Linear.forward.0") + 1] == "Module.lm_head.Linear.parameters_grad.0"
    )


def test_api_records_of_level_L1():
    dump = DATA / "tiny_statistics_L1"
    trace = read_msprobe_dump(dump)
    ids = trace.by_id()
    rec = ids["Functional.linear|activation|out|0|13"]
    entry = raw_data(dump)["Functional.linear.13.forward"]["output"][0]
    assert (rec.module_class, rec.call, rec.phase) == ("api", 13, "forward")
    assert rec.stats is not None and rec.stats.norm == entry["Norm"]
    assert {"Functional.linear|input|in.0|0|13", "Functional.linear|input|in.1|0|13"} <= set(ids)
    assert "Functional.linear|input|in.2|0|13" not in ids  # bias=None is no record
    assert ids["Tensor.__mul__|grad_output|out|0|4"].phase == "backward"
    assert "Torch.rsqrt|activation|out|0|0" in ids
    assert all(r.module_class == "api" for r in trace.records)
    parents = trace.manifest["parents"]
    assert parents["Functional.linear#13"] == "" and set(parents.values()) == {""}  # construct.json is {}


def test_parents_come_from_the_forward_tree():
    dump = DATA / "tiny_statistics_mix"
    construct = json.loads((rank_dir(dump) / "construct.json").read_text())
    parents = read_msprobe_dump(dump).manifest["parents"]
    # msprobe's own backward parents are wrong or null here; the forward tree is right.
    assert construct["Module.model.layers.0.self_attn.o_proj.Linear.backward.0"] == (
        "Module.model.layers.0.Qwen2DecoderLayer.backward.0"
    )
    assert construct["Module.model.layers.0.Qwen2DecoderLayer.backward.0"] is None
    assert parents["model.layers.0.self_attn.o_proj#0"] == "model.layers.0.self_attn#0"
    assert parents["model.layers.0#0"] == "model#0"
    assert parents["Functional.scaled_dot_product_attention#0"] == "model.layers.0.self_attn#0"
    assert parents["Functional.linear#6"] == f"{DOWN_PROJ}#0"
    assert parents["model#0"] == "" and parents["lm_head#0"] == ""
    assert not any(key.endswith(".weight#0") for key in parents)  # param grads have owners, not parents


def test_stack_is_optional():
    dump = DATA / "tiny_statistics_L0"
    assert "stack" not in read_msprobe_dump(dump).manifest
    stack = read_msprobe_dump(dump, stack=True).manifest["stack"]
    assert any("modeling_qwen2.py" in frame for frame in stack["model.layers.0.mlp#0"])


# -- hashes -----------------------------------------------------------------------------------


def test_md5_is_a_crc32_and_xor_is_kept_apart():
    md5_dump, xor_dump = DATA / "tiny_statistics_L0_md5", DATA / "tiny_statistics_L0_xor"
    md5, xor = read_msprobe_dump(md5_dump), read_msprobe_dump(xor_dump)
    name = "Module.model.layers.0.self_attn.q_proj.Linear.forward.0"
    rid = "model.layers.0.self_attn.q_proj|activation|out|0|0"
    assert md5.by_id()[rid].crc32 == raw_data(md5_dump)[name]["output"][0]["md5"]
    assert len(md5.by_id()[rid].crc32 or "") == 8
    xor_rec = xor.by_id()[rid]
    assert xor_rec.crc32 == "xor:" + raw_data(xor_dump)[name]["output"][0]["md5"]
    assert xor_rec.stats is None
    assert all((r.crc32 or "").startswith("xor:0x") for r in xor.records)
    # Same model, same run: a CRC and an xor sum are never compared, nor "ok" by accident.
    hashed = read_msprobe_dump(md5_dump, hash_only=True)
    assert hashed.mode == "hash" and all(r.stats is None for r in hashed.records)
    pairs = compare_traces(hashed, xor, TABLE).pairs
    assert pairs and all(p.status == "not_compared" and not p.paired for p in pairs)
    assert all(p.note == "cannot be compared (CRC-32 checksum vs xor checksum)" for p in pairs)
    same = compare_traces(xor, xor, TABLE).pairs
    assert all(p.evidence == "hash" and p.passed for p in same)


# -- tensors ----------------------------------------------------------------------------------


def test_tensor_of_a_record_equals_its_stats():
    trace = read_msprobe_dump(MICRO / "base_micro_tensor_L0_statistics")
    rec = trace.by_id()[f"{DOWN_PROJ}|activation|out|0|0"]
    assert rec.tensor_key == "Module.model.layers.0.mlp.down_proj.Linear.forward.0.output.0.pt"
    assert rec.tensor_key in trace.tensors and len(trace.tensors) == len(trace.records)
    t = trace.tensor(rec)
    assert isinstance(t, torch.Tensor) and tuple(t.shape) == rec.shape and t.dtype == torch.float32
    assert rec.stats is not None
    assert float(t.max()) == rec.stats.max and float(t.min()) == rec.stats.min
    assert float(t.mean()) == pytest.approx(rec.stats.mean, rel=1e-5)
    assert float(t.norm()) == pytest.approx(rec.stats.norm, rel=1e-5)
    ids = trace.tensor(trace.by_id()["model|input|in.input_ids|0|0"])
    assert ids.dtype == torch.int64 and int(ids.max()) == 127


def test_truncated_pt_raises_on_access(tmp_path):
    folder = copy_dump(MICRO / "base_micro_tensor_L0_statistics", tmp_path)
    name = "Module.model.layers.0.mlp.down_proj.Linear.forward.0.output.0.pt"
    pt = folder / "dump_tensor_data" / name
    pt.write_bytes(pt.read_bytes()[:100])
    trace = read_msprobe_dump(folder)  # reading dump.json does not touch the tensors
    with pytest.raises(TraceError, match=f"{name}: not a readable torch tensor file"):
        trace.tensor(trace.by_id()[f"{DOWN_PROJ}|activation|out|0|0"])
    (folder / "dump_tensor_data" / "Module.lm_head.Linear.forward.0.output.0.pt").unlink()
    with pytest.raises(TraceError, match=r"Module.lm_head.Linear.forward.0.output.0.pt: missing"):
        trace.tensor(trace.by_id()["lm_head|activation|out|0|0"])


def test_tensor_of_another_shape_is_an_error(tmp_path):
    folder = copy_dump(MICRO / "base_micro_tensor_L0_statistics", tmp_path)
    name = "Module.lm_head.Linear.forward.0.output.0.pt"
    torch.save(torch.zeros(3), folder / "dump_tensor_data" / name)
    trace = read_msprobe_dump(folder)
    with pytest.raises(TraceError, match=r"holds a tensor of shape \[3\], dump.json says \[1, 8, 128\]"):
        trace.tensor(trace.by_id()["lm_head|activation|out|0|0"])


# -- compare: base vs perturbed down_proj weight ----------------------------------------------


def _verdicts(kind: str, **options):
    base = read_msprobe_dump(MICRO / f"base_micro_{kind}", **options)
    pert = read_msprobe_dump(MICRO / f"pert_micro_{kind}", **options)
    comparison = compare_traces(base, pert, TABLE)
    return (
        comparison,
        phase_verdict(comparison, "forward", None, False),
        phase_verdict(comparison, "backward", None, False),
    )


@pytest.mark.parametrize(
    ("kind", "options", "evidence"),
    [
        ("tensor_L0_statistics", {}, "tensor"),
        ("statistics_L0_statistics", {}, "stats"),
        ("statistics_L0_md5", {}, "hash"),  # md5 summaries are compared for bit equality
        ("statistics_L0_md5", {"hash_only": True}, "hash"),
    ],
)
def test_perturbed_down_proj_is_the_first_divergence(kind, options, evidence):
    comparison, forward, backward = _verdicts(kind, **options)
    first = forward.first
    assert first is not None and not forward.aligned
    assert (first.name, first.kind, first.slot, first.call) == (DOWN_PROJ, "activation", "out", 0)
    assert first.origin is True and first.origin_module == DOWN_PROJ
    assert first.evidence == evidence
    # Everything computed before it matched, and everything it feeds diverges.
    before = [p for p in comparison.by_phase("forward") if p.record.seq < first.pair.record.seq]
    assert before and all(p.passed for p in before if not p.record.slot.startswith("param."))
    assert {p.record.name for p in forward.failures} >= {DOWN_PROJ, "model.layers.0.mlp", "lm_head"}
    assert not backward.aligned and backward.first is not None
    assert forward.only_baseline == forward.only_candidate == ()


def test_first_differing_crc_is_the_first_divergence():
    """Independent of the reader: the first output in dump.json whose md5 differs."""
    base, pert = (raw_data(MICRO / f"{side}_micro_statistics_L0_md5") for side in ("base", "pert"))
    first_raw = next(
        name
        for name in base
        if "forward" in name and base[name]["output"][0]["md5"] != pert[name]["output"][0]["md5"]
    )
    assert first_raw == "Module.model.layers.0.mlp.down_proj.Linear.forward.0"
    _, forward, _ = _verdicts("statistics_L0_md5", hash_only=True)
    assert forward.first is not None and forward.first.name == DOWN_PROJ


def test_mix_level_names_down_proj_and_the_api_inside_it():
    _, forward, _ = _verdicts("statistics_mix_statistics")
    first = forward.first
    # The layer is named (its inputs matched: origin); the op inside it is the detail.
    assert first is not None and (first.name, first.origin, first.evidence) == (DOWN_PROJ, True, "stats")
    assert first.first_op == "Functional.linear#6"
    # F.linear takes the weight as an input, so its inputs differ; its module is down_proj.
    trace = read_msprobe_dump(MICRO / "base_micro_statistics_mix_statistics")
    assert trace.manifest["parents"]["Functional.linear#6"] == f"{DOWN_PROJ}#0"
    modules = [p for p in forward.failures if p.record.module_class != "api"]
    assert min(modules, key=lambda p: p.record.seq).record.name == DOWN_PROJ


def test_stats_trace_round_trips_through_our_format(tmp_path):
    trace = read_msprobe_dump(DATA / "tiny_statistics_L1")
    write_trace(trace, tmp_path / "tr")
    back = read_trace(tmp_path / "tr")
    assert repr(back.records) == repr(trace.records)  # repr: NaN != NaN in ==
    assert (
        back.manifest["parents"] == trace.manifest["parents"]
        and back.manifest["format"] == "pytest-precalign-trace"
    )


# -- sets of ranks and steps -----------------------------------------------------------------


def _multi(tmp_path: Path) -> Path:
    root = tmp_path / "dump"
    src = rank_dir(DATA / "tiny_statistics_L0")
    for step, rank in ((0, 0), (0, 1), (1, 0)):
        shutil.copytree(src, root / f"step{step}" / f"rank{rank}")
    return root


def test_read_set_keys_by_step_and_rank(tmp_path):
    root = _multi(tmp_path)
    traces = read_msprobe_set(root)
    assert list(traces) == [(0, 0), (0, 1), (1, 0)]
    assert traces[(0, 1)].manifest["rank"] == 1 and traces[(1, 0)].manifest["step"] == 1
    assert {r.step for r in traces[(1, 0)].records} == {1}
    assert list(read_msprobe_set(root / "step0")) == [(0, 0), (0, 1)]
    assert list(read_msprobe_set(root / "step1" / "rank0")) == [(1, 0)]
    assert read_msprobe_dump(root / "step1" / "rank0").manifest["step"] == 1
    assert list(read_msprobe_set(DATA / "tiny_statistics_L0")) == [(0, 0)]  # proc<PID> is rank 0
    assert is_msprobe_dump(root) and is_msprobe_dump(root / "step0")


def test_several_ranks_where_one_is_needed(tmp_path):
    root = _multi(tmp_path)
    with pytest.raises(
        TraceError, match=r"holds 3 msprobe rank folders \(step0/rank0, step0/rank1, step1/rank0\)"
    ) as exc:
        read_msprobe_dump(root)
    assert "read_msprobe_set" in str(exc.value) and str(root / "step0" / "rank0") in str(exc.value)
    with pytest.raises(TraceError, match=r"holds 2 msprobe rank folders \(rank0, rank1\)"):
        read_msprobe_dump(root / "step0")


def test_two_proc_folders_in_one_step(tmp_path):
    src = rank_dir(DATA / "tiny_statistics_L0")
    for pid in (11, 22):
        shutil.copytree(src, tmp_path / "step0" / f"proc{pid}")
    with pytest.raises(TraceError, match=r"both proc11/ and proc22/ are step 0, rank 0"):
        read_msprobe_set(tmp_path)


# -- bad inputs -------------------------------------------------------------------------------


def _edit_json(file: Path, edit) -> None:
    file.write_text(json.dumps(edit(json.loads(file.read_text()))))


def test_missing_folder_and_dump_json(tmp_path):
    with pytest.raises(TraceError, match="no msprobe dump folder there"):
        read_msprobe_dump(tmp_path / "nowhere")
    with pytest.raises(
        TraceError, match=r"no msprobe dump there: expected dump.json, rank<N>/ or proc<PID>/"
    ):
        read_msprobe_dump(tmp_path)
    folder = copy_dump(DATA / "tiny_statistics_L0", tmp_path)
    (folder / "dump.json").unlink()
    with pytest.raises(TraceError, match=r"rank0/dump.json: missing"):
        read_msprobe_dump(folder)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{not json", "dump.json: not valid JSON"),
        ('{"task": "statistics", "level": "L0"}', "not an msprobe dump.json: expected an object with 'data'"),
        ("[1, 2]", "not an msprobe dump.json"),
        ('{"task": "run_ut", "level": "L0", "data": {}}', "task 'run_ut' is not readable"),
        ('{"task": "statistics", "level": "L2", "data": {}}', "level 'L2' is not readable"),
        (
            '{"task": "statistics", "level": "L1", "framework": "mindspore", "data": {}}',
            "framework 'mindspore' is not supported",
        ),
    ],
)
def test_bad_dump_json(tmp_path, text, fragment):
    folder = copy_dump(DATA / "tiny_statistics_L0", tmp_path)
    (folder / "dump.json").write_text(text)
    reseal(folder / "dump.json")
    with pytest.raises(TraceError, match=fragment):
        read_msprobe_dump(folder)


@pytest.mark.parametrize("sample", ["tiny_statistics_L0", "tiny_statistics_mix"])
def test_construct_json_needed_for_module_levels(tmp_path, sample):
    folder = copy_dump(DATA / sample, tmp_path)
    (folder / "construct.json").write_text("{}")
    with pytest.raises(
        TraceError, match=r"construct.json: empty, but a level (L0|mix) dump records its module tree"
    ):
        read_msprobe_dump(folder)
    (folder / "construct.json").unlink()
    with pytest.raises(TraceError, match=r"construct.json: missing \(level (L0|mix) dumps need it"):
        read_msprobe_dump(folder)


def test_construct_json_optional_for_L1(tmp_path):
    folder = copy_dump(DATA / "tiny_statistics_L1", tmp_path)
    (folder / "construct.json").unlink()
    assert len(read_msprobe_dump(folder).records) == 370
    (folder / "construct.json").write_text('["not", "a", "tree"]')
    with pytest.raises(TraceError, match="construct.json: expected an object mapping record names"):
        read_msprobe_dump(folder)


def test_tensor_dump_without_its_tensor_folder(tmp_path):
    folder = copy_dump(MICRO / "base_micro_tensor_L0_statistics", tmp_path)
    shutil.rmtree(folder / "dump_tensor_data")
    with pytest.raises(
        TraceError, match="dump_tensor_data: missing; a task 'tensor' dump keeps its tensors there"
    ):
        read_msprobe_dump(folder)


Q_PROJ = "Module.model.layers.0.self_attn.q_proj.Linear.forward.0"


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (lambda r: {**r, "output": {"a": 1}}, f"record '{Q_PROJ}' output: expected a list, got dict"),
        (
            lambda r: {**r, "output": [{k: v for k, v in r["output"][0].items() if k != "shape"}]},
            f"record '{Q_PROJ}' out: tensor entry without a 'shape' list of ints",
        ),
        (
            lambda r: {**r, "output": [3]},
            f"record '{Q_PROJ}' out: expected a tensor entry, a list or an object",
        ),
        (lambda r: [r], f"record '{Q_PROJ}': expected an object, got list"),
    ],
)
def test_mismatched_record_structure(tmp_path, edit, fragment):
    folder = copy_dump(DATA / "tiny_statistics_L0", tmp_path)

    def apply(dump):
        dump["data"][Q_PROJ] = edit(dump["data"][Q_PROJ])
        return dump

    _edit_json(folder / "dump.json", apply)
    with pytest.raises(TraceError, match=fragment):
        read_msprobe_dump(folder)


def test_unknown_record_name(tmp_path):
    folder = copy_dump(DATA / "tiny_statistics_L0", tmp_path)

    def apply(dump):
        dump["data"]["Module.model.forward"] = {}
        return dump

    _edit_json(folder / "dump.json", apply)
    with pytest.raises(TraceError, match=r"record name 'Module.model.forward' is neither Module"):
        read_msprobe_dump(folder)
