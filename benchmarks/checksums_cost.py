"""What the recordings' checksums (``trace/checksums.py``, issue #47) cost on a tensor-mode
recording: a real ``Recorder(mode="tensor")`` run of an MLP (``--width`` x ``--layers``, batch
``--batch``), its step-0 rank folder written again and read again:

* ``write_s``: ``write_trace`` of the step (safetensors shards, manifest, index, the seal);
  ``seal_s``: ``Checksums.seal`` alone on a copy of the folder without its checksums (the
  shards hashed once after safetensors wrote them, from the page cache: what the writers add);
* ``read_s``: ``read_trace`` and every tensor loaded (``trace.tensor``), the check included;
  ``verify_s``: ``verify_folder`` alone (every file hashed, 1 MiB at a time: what a reader
  adds before it trusts the files);
* ``compare_s``: ``compare_runs`` of the folder against a copy (both sides read and checked,
  every tensor pair compared); ``verify_over_compare``: the two sides' checks over it.

Process CPU time (a loaded machine disturbs it less than wall time), the best of ``--rounds``;
wall time is printed beside. The last line is one JSON object.

    .venv/bin/python benchmarks/checksums_cost.py --width 1024 --layers 8 --batch 256 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pytest_precalign import Recorder
from pytest_precalign.run.offline import compare_runs
from pytest_precalign.trace.checksums import CHECKSUM_FILE, Checksums, verify_folder
from pytest_precalign.trace.native_io import read_trace, write_trace


def _record(root: Path, width: int, layers: int, batch: int) -> Path:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        *[m for _ in range(layers) for m in (torch.nn.Linear(width, width), torch.nn.Tanh())]
    )
    rec = Recorder(root, mode="tensor")
    rec.start(model)
    model(torch.randn(batch, width)).square().mean().backward()
    rec.stop()
    rec.step()
    rec.close()
    return root / "step0" / "rank0"


def _best(rounds: int, prepare: Callable[[], Any], run: Callable[[Any], Any]) -> tuple[float, float]:
    cpu, wall = [], []
    for _ in range(rounds):
        arg = prepare()
        c0, w0 = time.process_time(), time.perf_counter()
        run(arg)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return min(cpu), min(wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        folder = _record(work / "run", args.width, args.layers, args.batch)
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        trace = read_trace(folder)
        counter = iter(range(10**6))

        def target() -> Path:
            return work / f"w{next(counter)}"

        def unsealed() -> Path:
            copy = shutil.copytree(folder, work / f"c{next(counter)}")
            (copy / CHECKSUM_FILE).unlink()
            return copy

        def read_all(path: Path) -> None:
            loaded = read_trace(path)
            for record in loaded.records:
                if record.tensor_key is not None:
                    loaded.tensor(record)

        write = _best(args.rounds, target, lambda p: write_trace(trace, p))
        seal = _best(args.rounds, unsealed, lambda p: Checksums().seal(p))
        read = _best(args.rounds, lambda: folder, read_all)
        verify = _best(args.rounds, lambda: folder, verify_folder)
        other = shutil.copytree(folder, work / "other")
        compare = _best(args.rounds, lambda: other, lambda p: compare_runs(folder, p))
    result = {
        "folder_mb": round(size / 1e6, 1),
        "write_s": round(write[0], 3),
        "seal_s": round(seal[0], 3),
        "seal_over_write": round(seal[0] / write[0], 3),
        "read_s": round(read[0], 3),
        "verify_s": round(verify[0], 3),
        "verify_over_read": round(verify[0] / read[0], 3),
        "compare_s": round(compare[0], 3),
        "verify_over_compare": round(2 * verify[0] / compare[0], 3),
        "sha256_mb_per_cpu_s": round(size / 1e6 / verify[0], 1),
        "wall_s": {
            "write": round(write[1], 3),
            "seal": round(seal[1], 3),
            "read": round(read[1], 3),
            "verify": round(verify[1], 3),
        },
        "args": vars(args),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
