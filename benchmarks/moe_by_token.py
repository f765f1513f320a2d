"""Time of keying one MoE block's expert records by token (``record.moe``).

What it measures
    Two synthetic tensor-mode traces of one MoE block call: ``--tokens`` tokens of width
    ``--hidden`` (fp32), ``--experts`` experts, top-``--top-k``, each expert called once with its
    tokens (an input and an output record per expert); the baseline in Hugging Face's order
    ((top-k slot, token)), the candidate in a sort-by-expert dispatcher's (token). Times
    ``compare.moe_tokens.by_token`` over both (best of ``--repeat``) and checks the keyed records
    are equal on both sides.

Run: ``python benchmarks/moe_by_token.py``. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from pytest_precalign.compare.moe_tokens import MoeSpec, by_token
from pytest_precalign.trace.records import Record, Trace


def _trace(expert_inputs: dict[str, np.ndarray], block_input: np.ndarray) -> Trace:
    records: list[Record] = []
    tensors: dict[str, np.ndarray] = {}

    def add(name: str, kind: str, slot: str, arr: np.ndarray) -> None:
        key = f"k{len(records)}"
        tensors[key] = arr
        rec = Record(
            len(records), name, "M", "forward", 0, 0, kind, slot, "float32", arr.shape, tensor_key=key
        )  # type: ignore[arg-type]
        records.append(rec)

    add("moe", "input", "in.0", block_input)
    for name, rows in expert_inputs.items():
        add(f"moe.{name}", "input", "in.0", rows)
        add(f"moe.{name}", "activation", "out", rows * 2)
    add("moe", "activation", "out", block_input)
    return Trace({"record_mode": "tensor"}, tuple(records), tensors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.tokens, args.hidden), dtype=np.float32)
    choice = np.argsort(rng.random((args.tokens, args.experts)), axis=1)[:, : args.top_k]
    experts = range(args.experts)
    loop = {f"experts.{e}": x[np.where((choice == e).T)[1]] for e in experts}
    sort = {f"experts.{e}": x[np.sort(np.where(choice == e)[0])] for e in experts}
    base, cand = _trace(loop, x), _trace(sort, x)
    best = float("inf")
    for _ in range(args.repeat):
        start = time.perf_counter()
        keyed = by_token(base, cand, MoeSpec("moe"))
        best = min(best, time.perf_counter() - start)
    a = {r.id: keyed.baseline.array(r) for r in keyed.baseline.records if r.tensor_key}
    b = {r.id: keyed.candidate.array(r) for r in keyed.candidate.records if r.tensor_key}
    equal = a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    out = {**vars(args), "seconds": round(best, 3), "keyed_equal": equal, "unmatched": len(keyed.reasons)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
