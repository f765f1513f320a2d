"""pytest_precalign.Recorder inside the user's own training loop: one process, and the
Megatron example under torchrun (gloo, CPU; real megatron-core, real pipeline schedule)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_precalign.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "example_suites" / "distributed"

torch = pytest.importorskip("torch")


def torchrun(nproc: int, *args: str) -> None:
    """The example's train_megatron.py under torchrun with this checkout's package."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    done = subprocess.run(
        [*cmd, str(EXAMPLE / "train_megatron.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]


def manifest(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    return data


def saved(prefix: Path, ranks: int) -> list[dict[str, Any]]:
    return [torch.load(f"{prefix}.rank{r}.pt", weights_only=False) for r in range(ranks)]


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(2))

    def forward(self, x: Any) -> Any:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def hook_count(model: torch.nn.Module) -> int:
    modules = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    params = sum(len(getattr(p, "_post_accumulate_grad_hooks", None) or {}) for p in model.parameters())
    return modules + params


def train_step(model: torch.nn.Module, optimizer: Any, fail: bool = False) -> Any:
    loss = model(torch.ones(3, 4)).sum()
    if fail:
        raise RuntimeError("user code failed")
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss


# -- one process -----------------------------------------------------------------------------
def test_one_process_writes_step_rank0_folders(tmp_path: Path) -> None:
    from pytest_precalign import Recorder
    from pytest_precalign.errors import RecorderError
    from pytest_precalign.trace.native_io import read_trace

    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = Recorder(tmp_path / "run", mode="tensor")
    for _ in range(2):
        rec.start(model)
        loss = train_step(model, optimizer)
        rec.record_output("loss", loss)
        rec.stop()
        rec.step()
    found = sorted(p.relative_to(tmp_path / "run").as_posix() for p in (tmp_path / "run").glob("*/*"))
    assert found == ["step0/rank0", "step1/rank0"]
    trace = read_trace(tmp_path / "run" / "step1" / "rank0")
    parallel = trace.manifest["parallel"]
    assert parallel["source"] == "single" and parallel["world_size"] == 1 and parallel["rank"] == 0
    assert parallel["chunks"] == [{"index": 0, "prefix": "", "layer_offsets": {}}]
    assert {"activation", "input", "grad_output", "param_grad", "param", "loss"} <= {
        r.kind for r in trace.records
    }
    assert {r.step for r in trace.records} == {1}
    params = {r.name: r for r in trace.records if r.kind == "param"}
    assert set(params) == {"layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias"}
    # parameters are recorded after the optimizer step
    assert torch.equal(
        torch.as_tensor(trace.tensor(params["layers.0.weight"])), model.layers[0].weight.detach()
    )
    assert hook_count(model) == 0
    again = Recorder(tmp_path / "run")
    with pytest.raises(RecorderError, match="already holds a recorded run"):  # before it trains
        again.start(model)
    assert hook_count(model) == 0


def test_steps_and_ranks_not_selected_add_no_hooks(tmp_path: Path) -> None:
    from pytest_precalign import Recorder

    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for rec in (Recorder(tmp_path / "a", steps=[1]), Recorder(tmp_path / "b", ranks=[1, 2])):
        rec.start(model)
        assert hook_count(model) == 0 and not rec.recording_now
        assert rec.record_output("loss", train_step(model, optimizer)) is None
        assert rec.stop() is None
        rec.step()
    rec = Recorder(tmp_path / "c", steps=[1])
    rec.step()
    rec.start(model)
    assert hook_count(model) > 0
    train_step(model, optimizer)
    assert rec.stop() == tmp_path / "c" / "step1" / "rank0"
    assert hook_count(model) == 0
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_hooks_removed_after_an_exception(tmp_path: Path) -> None:
    from pytest_precalign import Recorder

    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = Recorder(tmp_path / "run")
    rec.start(model)
    with pytest.raises(RuntimeError, match="user code failed"):
        train_step(model, optimizer, fail=True)
    assert hook_count(model) > 0
    rec.start(model)  # the next start removes what the failed step left, then hooks again
    train_step(model, optimizer)
    rec.stop()
    assert hook_count(model) == 0
    with Recorder(tmp_path / "ctx") as rec2:
        rec2.start(model)
        with pytest.raises(RuntimeError):
            train_step(model, optimizer, fail=True)
    assert hook_count(model) == 0 and not (tmp_path / "ctx").exists()
    with pytest.raises(RuntimeError), rec2.recording(model):
        train_step(model, optimizer, fail=True)
    assert hook_count(model) == 0 and rec2.current_step == 0
    with rec2.recording(model):
        train_step(model, optimizer)
    assert hook_count(model) == 0 and rec2.current_step == 1
    assert (tmp_path / "ctx" / "step0" / "rank0" / "manifest.json").exists()


def test_chunks_are_prefixed_and_torch_distributed_layout(tmp_path: Path) -> None:
    import torch.distributed as dist

    from pytest_precalign import Recorder
    from pytest_precalign.trace.native_io import read_trace

    chunks = [Tiny(), Tiny()]
    store = dist.HashStore()  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        rec = Recorder(tmp_path / "run", mode="hash")
        rec.start(chunks)
        chunks[1](chunks[0](torch.ones(2, 4))).sum().backward()
        rec.stop()
    finally:
        dist.destroy_process_group()
    trace = read_trace(tmp_path / "run" / "step0" / "rank0")
    names = {r.name for r in trace.records}
    assert {"chunk0.layers.0", "chunk1.layers.1", "chunk1.layers.1.weight"} <= names
    parallel = trace.manifest["parallel"]
    assert parallel["source"] == "torch.distributed" and parallel["dp"] == 1 and parallel["tp"] == 1
    assert [c["prefix"] for c in parallel["chunks"]] == ["chunk0.", "chunk1."]


def test_explicit_layout_and_a_bad_key(tmp_path: Path) -> None:
    from pytest_precalign import Recorder
    from pytest_precalign.trace.native_io import read_trace

    with pytest.raises(
        ConfigError, match=r"layout: unknown key 'tp_size' \(allowed: tp, pp, dp, cp, ep, vpp"
    ):
        Recorder(tmp_path, layout={"tp": 2, "tp_size": 2})
    with pytest.raises(ConfigError, match="'pp_rank' must be an integer in 0..1"):
        Recorder(tmp_path, layout={"pp": 2, "pp_rank": 2})
    model = Tiny()
    rec = Recorder(tmp_path / "run", layout={"tp": 2, "tp_rank": 1, "world_size": 2, "rank": 1})
    with rec.recording(model):
        model(torch.ones(1, 4)).sum().backward()
    parallel = read_trace(tmp_path / "run" / "step0" / "rank1").manifest["parallel"]
    assert parallel["source"] == "explicit" and parallel["tp_rank"] == 1 and parallel["rank"] == 1
    assert parallel["chunks"][0]["layer_offsets"] == {}


def test_importing_the_package_does_not_import_torch() -> None:
    code = (
        "import sys, types, pytest_precalign, pytest_precalign.sources.megatron\n"
        "print('torch' in sys.modules)\n"
        "from pytest_precalign import megatron_cpu\n"
        "print(isinstance(megatron_cpu, types.FunctionType))\n"  # not its module, imported first
        "pytest_precalign.Recorder\n"
        "print('torch' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "True"]


# -- torchrun: the Megatron example ------------------------------------------------------------
@pytest.fixture(scope="module")
def tp2_pp2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One recorded TP=2 x PP=2 run (4 ranks, 2 steps, tensor mode) in ``run/``, params and
    loss saved as ``saved.rank<R>.pt``; made once per session (the xdist workers share it)."""
    pytest.importorskip("megatron.core")

    def make(out: Path) -> None:
        args = (
            "--tp",
            "2",
            "--pp",
            "2",
            "--steps",
            "2",
            "--out",
            str(out),
            "--save",
            str(out.parent / "saved"),
        )
        torchrun(4, *args)

    return _shared_run(tmp_path_factory, "tp2pp2", make).parent


def test_tp2_pp2_rank_folders_and_manifests(tp2_pp2: Path) -> None:
    from pytest_precalign.trace.native_io import read_trace

    run = tp2_pp2 / "run"
    assert sorted(p.relative_to(run).as_posix() for p in run.glob("*/*")) == [
        f"step{s}/rank{r}" for s in range(2) for r in range(4)
    ]
    for rank in range(4):
        parallel = manifest(run / "step1" / f"rank{rank}")["parallel"]
        expected = {"tp": 2, "pp": 2, "dp": 1, "cp": 1, "ep": 1, "vpp": None, "world_size": 4, "rank": rank}
        assert {k: parallel[k] for k in expected} == expected
        assert (parallel["tp_rank"], parallel["pp_rank"], parallel["dp_rank"]) == (rank % 2, rank // 2, 0)
        assert parallel["order"] == "tp-cp-ep-dp-pp" and parallel["source"] == "megatron"
        assert parallel["sequence_parallel"] is False
        offset = 2 * (rank // 2)  # 4 layers, 2 per stage: stage 1 holds global layers 2 and 3
        assert parallel["chunks"] == [{"index": 0, "prefix": "", "layer_offsets": {"decoder.layers": offset}}]
        sharding = parallel["sharding"]
        assert sharding["decoder.layers.1.self_attention.linear_qkv"] == "column"
        assert sharding["decoder.layers.0.mlp.linear_fc2"] == "row"
        assert ("embedding.word_embeddings" in sharding) == (rank < 2)
        assert (sharding.get("output_layer") == "column") == (rank >= 2)
    last = read_trace(run / "step1" / "rank3")
    names = {r.name for r in last.records}
    assert "decoder.layers.1.mlp" in names and "decoder.layers.2.mlp" not in names  # local names
    assert "loss" in names and "output_layer.weight" in names
    # TP ranks hold different shards of a column-parallel weight, the same replicated norm
    r2 = read_trace(run / "step1" / "rank2")
    qkv = "decoder.layers.0.self_attention.linear_qkv.weight"
    a, b = (next(t.tensor(r) for r in t.records if r.name == qkv and r.kind == "param") for t in (r2, last))
    assert a.shape == b.shape == (64, 64) and not torch.equal(a, b)


@pytest.mark.slow  # a second 4-rank run; tox -e slow
def test_recording_is_bitwise_neutral_under_torchrun(tp2_pp2: Path, tmp_path: Path) -> None:
    torchrun(4, "--tp", "2", "--pp", "2", "--steps", "2", "--save", str(tmp_path / "bare"))
    recorded, bare = saved(tp2_pp2 / "saved", 4), saved(tmp_path / "bare", 4)
    for rank in range(4):
        assert recorded[rank].keys() == bare[rank].keys()
        loss_a, loss_b = recorded[rank]["loss"], bare[rank]["loss"]
        assert (loss_a is None) == (rank < 2) and (loss_a is None or torch.equal(loss_a, loss_b))
        for name, param in bare[rank]["params"].items():
            assert torch.equal(recorded[rank]["params"][name], param), (rank, name)


@pytest.mark.slow  # more torchrun runs; tox -e slow
def test_msprobe_format_tp2_with_recomputation(tmp_path: Path) -> None:
    """TP=2, full activation recomputation, msprobe's layout: read back by our msprobe reader;
    the forwards recomputed inside the backward add no records (no call 1)."""
    from pytest_precalign.msprobe import read_msprobe_set

    pytest.importorskip("megatron.core")
    torchrun(2, "--tp", "2", "--pp", "1", "--steps", "1", "--mode", "stats", "--format", "msprobe",
             "--recompute", "--out", str(tmp_path / "dump"))  # fmt: skip
    traces = read_msprobe_set(tmp_path / "dump")
    assert sorted(traces) == [(0, 0), (0, 1)]
    for trace in traces.values():
        names = {r.name for r in trace.records}
        assert "decoder.layers.3.mlp.linear_fc1" in names
        assert {"activation", "grad_output", "grad_input", "param_grad"} <= {r.kind for r in trace.records}
        assert {r.call for r in trace.records if r.name.startswith("decoder.layers.")} == {0}


def test_megatron_cpu_patches_narrowly_and_restores() -> None:
    import importlib.util

    if importlib.util.find_spec("megatron") is None:
        pytest.skip("megatron-core is not installed")
    from pytest_precalign import megatron_cpu

    current_device = torch.cuda.current_device
    with megatron_cpu():
        schedules = sys.modules["megatron.core.pipeline_parallel.schedules"]
        p2p = sys.modules["megatron.core.pipeline_parallel.p2p_communication"]
        rng = sys.modules["megatron.core.tensor_parallel.random"]
        if torch.cuda.is_available():
            pytest.skip("a no-op where CUDA is available")
        assert torch.cuda.current_device() == "cpu"
        assert schedules.torch.zeros([], dtype=torch.int, device="cuda").device.type == "cpu"
        assert p2p.torch.cuda.synchronize() is None and p2p.torch.cat is torch.cat
        assert torch.zeros is not schedules.torch.zeros  # torch itself is untouched
        state = rng._get_cuda_rng_state()
        torch.rand(3)
        rng._set_cuda_rng_state(state)
        assert torch.equal(torch.get_rng_state(), state)
    assert torch.cuda.current_device is current_device
    assert schedules.torch is torch and p2p.torch is torch and rng.torch is torch
    assert rng._get_cuda_rng_state.__module__ == rng.__name__


@pytest.mark.slow  # more torchrun runs; tox -e slow
def test_virtual_pipeline_chunks_under_torchrun(tmp_path: Path) -> None:
    """PP=2 x VPP=2 (interleaved schedule): chunk<k>. prefixes, global layer offsets per chunk."""
    from pytest_precalign.trace.native_io import read_trace

    pytest.importorskip("megatron.core")
    torchrun(
        2, "--tp", "1", "--pp", "2", "--vpp", "2", "--steps", "1", "--mode", "hash", "--out", str(tmp_path)
    )
    for rank in range(2):
        trace = read_trace(tmp_path / "step0" / f"rank{rank}")
        parallel = trace.manifest["parallel"]
        assert (parallel["pp"], parallel["vpp"], parallel["pp_rank"]) == (2, 2, rank)
        assert parallel["chunks"] == [
            {"index": 0, "prefix": "chunk0.", "layer_offsets": {"decoder.layers": rank}},
            {"index": 1, "prefix": "chunk1.", "layer_offsets": {"decoder.layers": 2 + rank}},
        ]
        names = {r.name for r in trace.records}
        assert {"chunk0.decoder.layers.0.mlp", "chunk1.decoder.layers.0.mlp"} <= names
        assert {r.call for r in trace.records if r.name == "chunk0.decoder.layers.0.mlp"} == {
            0,
            1,
        }  # 2 micro-batches
    assert {r.call for r in trace.records if r.kind == "loss"} == {0, 1}


# -- the example end to end: record with torchrun and in one process, merge, compare ---------------
MAPPING_ARGS = (
    "--mapping",
    "preset:megatron-qwen2.5",
    "--var",
    "num_attention_heads=4",
    "--var",
    "num_key_value_heads=2",
)


def _shared_run(tmp_path_factory: pytest.TempPathFactory, name: str, make: Any) -> Path:
    """A run made once per session (under xdist: once, by whichever worker asks first)."""
    import fcntl

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    root.mkdir(exist_ok=True)
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "done").exists():
            make(root / "run")
            (root / "done").touch()
    return root / "run"


def compare(golden: Path, target: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "pytest_precalign", "compare", str(golden), str(target), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")

    def make(out: Path) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
        }
        script = EXAMPLE / "train_hf.py"
        cmd = [sys.executable, str(script), "--steps", "2", "--out", str(out)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=EXAMPLE)
        assert done.returncode == 0, done.stderr[-4000:]

    return _shared_run(tmp_path_factory, "hf_example", make)


def test_example_tp2_pp2_is_aligned_with_hf_under_its_table(tp2_pp2: Path, hf_run: Path) -> None:
    done = compare(hf_run, tp2_pp2 / "run", *MAPPING_ARGS, "--tolerances", str(EXAMPLE / "tolerances.yaml"))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith(("PASSED", "FAILED"))]
    assert [line.split(":")[0].split("[")[1] for line in lines] == ["forward]", "backward]", "step]"]
    assert all(line.startswith("PASSED") and "aligned" in line for line in lines), lines
    # The same pair under torch.testing's fp32 defaults fails after the first AdamW step: the
    # table's looser step-1 rule is what passes it, so the gate is not vacuous.
    strict = compare(hf_run, tp2_pp2 / "run", *MAPPING_ARGS)
    assert strict.returncode == 1, strict.stdout[-2000:]


def test_a_fault_on_the_second_stage_is_named_by_its_global_hf_name(
    hf_run: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """train_megatron.py --fault scales global layer 2's mlp output on stage 1 (local
    decoder.layers.0.mlp there): the merge renumbers it and the mapping names it. Two ranks
    (PP=2): the renumbering is the pipeline's; 4-rank TP=2 x PP=2 runs are the fixture's."""
    pytest.importorskip("megatron.core")
    fault = _shared_run(
        tmp_path_factory,
        "pp2_fault",
        lambda out: torchrun(2, "--tp", "1", "--pp", "2", "--steps", "2", "--fault", "--out", str(out)),
    )
    done = compare(hf_run, fault, *MAPPING_ARGS, "--tolerances", str(EXAMPLE / "tolerances.yaml"))
    assert done.returncode == 1, done.stdout[-4000:]
    assert "First divergence: model.layers.2.mlp (activation, out, step 0), origin" in done.stdout, (
        done.stdout[-4000:]
    )


@pytest.mark.slow  # more torchrun runs; tox -e slow
def test_two_different_layouts_compare_aligned(tmp_path_factory: pytest.TempPathFactory) -> None:
    """TP=2 (one stage) against PP=2 (no tensor parallelism): both merge to the same TP=1 trace."""
    pytest.importorskip("megatron.core")
    tp2 = _shared_run(
        tmp_path_factory,
        "tp2",
        lambda out: torchrun(2, "--tp", "2", "--pp", "1", "--steps", "2", "--out", str(out)),
    )
    pp2 = _shared_run(
        tmp_path_factory,
        "pp2",
        lambda out: torchrun(2, "--tp", "1", "--pp", "2", "--steps", "2", "--out", str(out)),
    )
    done = compare(tp2, pp2, "--tolerances", str(EXAMPLE / "tolerances.yaml"))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert done.stdout.count("PASSED") == 3, done.stdout[-3000:]
