"""A user's data-parallel runs compared across DP sizes and sharding schemes (issue #45): their
own loop (``example_suites/recorded_runs/sharded_loop.py``, the documented ``Recorder`` calls)
run in one process and under torchrun (2 gloo ranks, each training its own rows), compared by
``precalign compare`` and by a ``dump:`` case. The default suite holds two pairs (1 rank vs DDP
on 2 ranks, 1 rank vs DTensor tensor parallelism on 2 ranks, one launch); the other wrappers,
the faults, the 2-D mesh and the suite cases are ``slow``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.user_runs import REPO, SCRIPTS, Judged, compare, dump_suite, run_dump_suite

pytest.importorskip("torch")
pytest.importorskip("transformers")


def record(out: Path, nproc: int, *runs: str) -> Path:
    """``sharded_loop.py OUT RUN...`` in one process or under torchrun with ``nproc`` ranks."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "TOKENIZERS_PARALLELISM": "false"}
    launch = [sys.executable]
    if nproc > 1:
        launch += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    done = subprocess.run(
        [*launch, str(SCRIPTS / "sharded_loop.py"), str(out), *runs],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=SCRIPTS,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def test_one_rank_and_two_ddp_or_tp_ranks_of_the_same_global_batch_are_the_same_training(
    tmp_path: Path,
) -> None:
    record(tmp_path, 1, "one:total=3")
    record(tmp_path, 2, "ddp:wrap=ddp,total=3", "tp:wrap=tp,total=3")
    check_tp_against_one(compare(tmp_path / "one", tmp_path / "tp", tmp_path / "tp_report"))
    judged = compare(tmp_path / "one", tmp_path / "ddp", tmp_path / "report")
    assert judged.exit_code == 0, judged.output
    assert judged.verdict() == (None, None)
    assert judged.training["steps_compared"] == 3 and not judged.training["findings"]
    # Every phase compared: the replicas' activations joined along the batch (4 rows, as the
    # one-process run's), their backward scaled to the global loss, the parameters kept once.
    for phase in ("forward", "backward", "step"):
        assert f"PASSED one_vs_ddp[{phase}]" in judged.output, judged.output
    assert "coverage 100%" in judged.output.split("[forward]")[1].splitlines()[0]
    # The DDP ranks' partial grads have no partner in a one-process run: listed with the reason.
    assert judged.report is not None
    backward = next(p for p in judged.report["cases"] if p["phase"] == "backward")
    unmatched = backward["unmatched"]["baseline"]
    assert unmatched and all(u["kind"] == "param_grad" and "partial grad" in u["reason"] for u in unmatched)


def check_tp_against_one(judged: Judged, steps: int = 3, case: str = "one_vs_tp") -> None:
    """1 rank vs ``parallelize_module`` over 2 ranks (Colwise q/k/v, gate, up; Rowwise o, down):
    the plan read back from the recording merges the local shards; what cannot be merged is
    listed with its reason, never guessed."""
    assert judged.exit_code == 0, judged.output
    assert judged.verdict() == (None, None) and judged.training["steps_compared"] == steps
    for phase in ("forward", "backward", "step"):
        assert f"PASSED {case}[{phase}]" in judged.output, judged.output
    assert judged.report is not None
    cases = {c["phase"]: c for c in judged.report["cases"]}
    unmatched = [u for c in cases.values() for u in c["unmatched"]["baseline"] + c["unmatched"]["candidate"]]
    # A Colwise module's input grad is its own share; the attention weights are split over the
    # local heads, which the plan does not say: each listed (per layer: 5 grads, 2 weights), nothing else.
    own = {(u["name"], u["kind"]) for u in unmatched if "this module's share" in u["reason"]}
    heads = {(u["name"], u["kind"], u["slot"]) for u in unmatched if "plan does not say" in u["reason"]}
    assert len(unmatched) == 2 * (5 + 2), unmatched  # each (name, kind, slot) once, over the steps
    assert ("model.layers.1.mlp.gate_proj", "grad_input") in own and len(own) == 10
    assert ("model.layers.0.self_attn", "activation", "out.1") in heads and len(heads) == 4
    # The local shards were merged: the Colwise outputs, act_fn between them and their grads
    # compared at the full width (64 features), each step.
    for phase, kind in (("forward", "activation"), ("backward", "grad_output")):
        done = {
            (r["name"], r["step"])
            for r in cases[phase]["records"]
            if r["kind"] == kind and r["status"] == "ok"
        }
        for name in (
            "model.layers.1.mlp.act_fn",
            "model.layers.0.mlp.up_proj",
            "model.layers.1.self_attn.k_proj",
        ):
            assert {(name, s) for s in range(steps)} <= done, (phase, name)


@pytest.mark.slow
def test_tensor_parallel_runs_tensor_mode_2d_mesh_and_a_shard_fault(tmp_path: Path) -> None:
    """DTensor tensor parallelism (issue #45): 1 rank vs TP-2 element by element, a fault in
    one TP rank's share found at its step and module, live compare of a TP run against a TP
    golden, a ``dump:`` case, and a 2-D mesh (FSDP2 over dp=2 x TP over 2: 4 ranks) vs 1 rank."""
    record(tmp_path, 1, "one:total=3", "one_t:total=2,mode=tensor")
    golden = f"golden={tmp_path / 'tp'}"
    record(
        tmp_path,
        2,
        "tp:wrap=tp,total=3",
        "tp_t:wrap=tp,total=2,mode=tensor",
        "shard:wrap=tp,total=3,tp_shard_from=1",
        f"live_same:wrap=tp,total=3,{golden}",
        f"live_fault:wrap=tp,total=3,tp_shard_from=1,{golden}",
    )
    judged = compare(tmp_path / "one_t", tmp_path / "tp_t", tmp_path / "tensors")
    check_tp_against_one(judged, steps=2, case="one_t_vs_tp_t")
    assert "(allclose)" in judged.output
    judged = compare(tmp_path / "one", tmp_path / "shard", tmp_path / "shard_report")
    assert judged.exit_code == 1, judged.output
    assert judged.verdict() == (1, "forward")
    assert judged.training["origin"] == "model.layers.1.mlp.down_proj"
    # Against one process the rank cannot be told (said); against a TP run of the same layout
    # each rank's partial sum before the all-reduce names it.
    assert (
        "which TP rank's share of model.layers.1.mlp.down_proj differs cannot be told"
        in (judged.training["evidence"])
    )
    judged = compare(tmp_path / "tp", tmp_path / "shard", tmp_path / "shard_tp_report")
    assert judged.exit_code == 1 and judged.verdict() == (1, "forward"), judged.output
    assert judged.training["origin"] == "model.layers.1.mlp.down_proj"
    assert (
        "TP rank1: its partial sum of model.layers.1.mlp.down_proj before the all-reduce differs"
        in (judged.training["evidence"])
    )
    # Live compare of DTensor ranks against a TP golden: every record compared on each rank,
    # nothing beyond on the same run, the fault's first record beyond at its step and kept.
    for rank in (0, 1):
        for step in range(3):
            same = json.loads((tmp_path / f"live_same/step{step}/rank{rank}/manifest.json").read_text())[
                "live"
            ]
            assert same["compared"] == same["records"] > 0 and not same["beyond"] and not same["kept_tensors"]
        fault = [
            json.loads((tmp_path / f"live_fault/step{step}/rank{rank}/manifest.json").read_text())["live"]
            for step in range(3)
        ]
        assert not fault[0]["beyond"] and fault[1]["kept_tensors"] > 0
        assert fault[1]["beyond"][0] == "model.layers.1.mlp.down_proj|activation|out|1|0"
    config = dump_suite(tmp_path / "suite", {"tp": (tmp_path / "one", tmp_path / "tp", None)})
    done = run_dump_suite(config, tmp_path / "suite_report")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "1 passed" in done.stdout and "aligned" in done.stdout
    record(tmp_path, 4, "mesh2d:wrap=fsdp2_tp,total=3")
    check_tp_against_one(
        compare(tmp_path / "one", tmp_path / "mesh2d", tmp_path / "mesh2d_report"), case="one_vs_mesh2d"
    )


@pytest.mark.slow  # one torchrun launch of 3 runs (~50 s) and 3 compares; tox -e slow
def test_sequence_parallel_dtensor_outputs_and_a_custom_style_compare_with_one_process(
    tmp_path: Path,
) -> None:
    """Tensor-parallel styles beyond Colwise/Rowwise with local outputs (``tp_styles.py``):
    ``SequenceParallel`` norms (the residual stream split along the sequence), Colwise
    projections handing DTensors on (``use_local_output=False``), and the user's own
    ``ParallelStyle`` subclass, torchtitan's ``PrepareModuleInput`` / ``PrepareModuleOutput`` /
    ``PrepareModuleInputOutput``: each run of 2 TP ranks against one process passes, what cannot
    be merged listed with its reason; no rank is said to disagree; a fault in one TP rank's share
    under the ``PrepareModule*`` plan is found at its step and module."""
    record(tmp_path, 1, "one:total=2")
    styles = ("sp", "dtensor_out", "custom", "prepared", "titan")
    fault = "prepared_fault:wrap=tp,total=2,tp_style=prepared,tp_shard_from=1"
    record(tmp_path, 2, *(f"{s}:wrap=tp,total=2,tp_style={s}" for s in styles), fault)
    for style in styles:
        judged = compare(tmp_path / "one", tmp_path / style, tmp_path / f"{style}_report")
        assert judged.exit_code == 0, judged.output
        assert judged.verdict() == (None, None) and "isagree" not in judged.output
        for phase in ("forward", "backward", "step"):
            assert f"PASSED one_vs_{style}[{phase}]" in judged.output, judged.output
        assert judged.report is not None
        unmatched = {
            (u["name"], u["kind"]): u["reason"]
            for c in judged.report["cases"]
            for u in c["unmatched"]["baseline"] + c["unmatched"]["candidate"]
        }
        reasons = set(unmatched.values())
        assert all("not merged" in r for r in reasons), reasons
        if style == "sp":  # the norms' input grads: the DTensor made for the norm alone
            assert "SequenceParallel" in unmatched[("model.layers.1.input_layernorm", "grad_input")]
            assert ("model.norm", "grad_input") in unmatched
        if style == "custom":  # its outputs and input grads: how it splits them is not known
            said = unmatched[("model.layers.0.mlp.gate_proj", "activation")]
            assert "custom ParallelStyle" in said and "not merged" in said
            assert "custom ParallelStyle" in unmatched[("model.layers.0.mlp.up_proj", "grad_input")]
        if style == "dtensor_out":  # a DTensor output is its full tensor: compared, not listed
            assert ("model.layers.0.mlp.gate_proj", "activation") not in unmatched
        if style in ("prepared", "titan"):  # PrepareModuleInput/Output/InputOutput: read (on main
            # before this, "prepared": model.norm's local sequence part merged as a replicated
            # record, "ranks disagree" and a false forward divergence at model.norm, step 0)
            assert ("model.norm", "activation") not in unmatched and (
                "model.layers.0.mlp",
                "activation",
            ) not in unmatched
            said = unmatched[("model.layers.0.self_attn", "grad_input")]
            assert "PrepareModuleInput" in said and "not merged" in said
    judged = compare(tmp_path / "one", tmp_path / "prepared_fault", tmp_path / "fault_report")
    assert judged.exit_code == 1 and judged.verdict() == (1, "forward"), judged.output
    assert judged.training["origin"] == "model.layers.1.mlp.down_proj"


@pytest.mark.slow
def test_sharding_schemes_reruns_and_faults_at_their_step_class_and_rank(tmp_path: Path) -> None:
    record(tmp_path, 1, "one:total=4", "one_micro2:total=4,micro=2", "one_tensors:total=2,mode=tensor")
    record(
        tmp_path,
        2,
        "ddp:wrap=ddp,total=4",
        "ddp_again:wrap=ddp,total=4",
        "fsdp2:wrap=fsdp2,total=4",
        "zero1:wrap=zero1,total=4",
        "norm:wrap=fsdp2,total=4,local_norm_from=2",
        "lr:wrap=zero1,total=4,lr_from=3",
        "scaled:wrap=ddp,total=4,scale_rank_from=1",
        "stale:wrap=ddp,total=4,stale_from=2",
        "hashed:wrap=ddp,total=4,mode=hash",
        "fsdp2_tensors:wrap=fsdp2,total=2,mode=tensor",
        "ddp_tensors:wrap=ddp,total=2,mode=tensor",
    )
    # Tensors: the replicas' rows concatenated and their backward scaled, element by element.
    for cand in ("ddp_tensors", "fsdp2_tensors"):
        judged = compare(tmp_path / "one_tensors", tmp_path / cand, tmp_path / f"tensors_{cand}")
        assert judged.exit_code == 0, judged.output
        assert "(allclose)" in judged.output
    for base, cand in (("one", "fsdp2"), ("one", "zero1"), ("ddp", "fsdp2"), ("ddp", "ddp_again")):
        judged = compare(tmp_path / base, tmp_path / cand, tmp_path / f"{base}_{cand}")
        assert judged.exit_code == 0, judged.output
    found = {}
    for base, cand in (("one", "norm"), ("one", "lr"), ("one", "stale"), ("ddp", "scaled")):
        judged = compare(tmp_path / base, tmp_path / cand, tmp_path / f"{base}_{cand}")
        assert judged.exit_code == 1, judged.output
        found[cand] = (*judged.verdict(), judged.training["origin"], judged.training["evidence"])
    assert found["norm"][:3] == (2, "clipping", "grad_norm")
    assert "rank1 recorded other values than" in found["norm"][3]
    assert found["lr"][:2] == (3, "schedule")
    assert found["stale"][:3] == (2, "forward", "model.layers.1.mlp.down_proj")
    assert found["scaled"][:2] == (1, "grad_reduction")
    judged = compare(tmp_path / "ddp", tmp_path / "scaled", tmp_path / "named")
    assert "(param_grad, dp1, step 1)" in judged.output  # the rank whose grads were scaled
    # Sides that split the global batch otherwise: their layers listed as not paired row by row.
    judged = compare(tmp_path / "one_micro2", tmp_path / "ddp", tmp_path / "split")
    listed = judged.training["not_compared"]
    assert listed and all("not paired row by row" in line for line in listed)
    assert (
        "the baseline's one replica x 2 micro-batches, the candidate's 2 DP replicas joined x 1 micro-batch"
        in listed[0]
    )
    # Hashes cannot be joined: said, never guessed (the one-process side's records stay unpaired).
    judged = compare(tmp_path / "one", tmp_path / "hashed", tmp_path / "hashed_report")
    assert judged.exit_code == 1 and judged.report is not None, judged.output
    forward = next(p for p in judged.report["cases"] if p["phase"] == "forward")
    assert not forward["passed"]
    reasons = {u["reason"] for u in forward["unmatched"]["baseline"]}
    assert any("the hash of the joined batch is not a function" in r for r in reasons), reasons
    # A dump: case of an align.yaml compares the same sides.
    config = dump_suite(tmp_path / "suite", {"dp": (tmp_path / "one", tmp_path / "ddp", None)})
    done = run_dump_suite(config, tmp_path / "suite_report")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "1 passed" in done.stdout and "aligned" in done.stdout


@pytest.mark.slow  # two launches of ~40 s and two compares; tox -e slow
def test_a_grad_scaled_on_one_tp_rank_is_named_at_its_step_and_rank(tmp_path: Path) -> None:
    """A fault in the backward of one TP rank (``tp_grad_from=1``: the last rank's local shard of
    ``model.layers.1.mlp.down_proj.weight``'s grad doubled) is found at step 1, backward, at its
    module; against a TP run of the same layout each rank's local grad shard names rank1 (on
    main before this: never named); against one process, one line says why it cannot be."""
    record(tmp_path, 1, "one:total=3")
    record(tmp_path, 2, "tp:wrap=tp,total=3", "tpgrad:wrap=tp,total=3,tp_grad_from=1")
    param = "model.layers.1.mlp.down_proj.weight"
    for base, said in (
        ("tp", f"TP rank1: its local shard of {param}'s grad differs from the other side's same rank's"),
        ("one", f"which TP rank's shard of {param}'s grad differs cannot be told"),
    ):
        judged = compare(tmp_path / base, tmp_path / "tpgrad", tmp_path / f"{base}_report")
        assert judged.exit_code == 1 and judged.verdict() == (1, "backward"), judged.output
        assert judged.training["origin"] == "model.layers.1.mlp.down_proj"
        assert said in judged.training["evidence"], judged.training["evidence"]
