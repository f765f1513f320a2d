"""How many extra passes over memory the in-graph statistics add to a compiled step (issue 45,
item 6: which recorded tensors get a loop of their own, which share one with the model's work).

What it measures
    The C++ inductor generates for one forward+backward of the Qwen2 of ``--size``
    (``benchmarks/_shared.py``, as ``compile_overhead.py`` builds and compiles it), bare and
    recorded by a stats-mode ``HookRecorder`` (``torch._inductor.utils.run_and_get_code``).
    In each graph's kernels, every innermost loop whose nest iterates at least ``--min``
    elements is counted, times the number of calls of its kernel (inductor reuses one kernel
    for the layers that look alike). A statistic computed in a loop the model runs anyway adds
    no loop; one computed apart adds a loop over its tensor. Reported, per part (forward,
    backward) and per loop size: the loops bare and recorded and the difference, and the
    elements the extra loops iterate. A count of code structure, not a time: it does not depend
    on the machine's load.

    cd benchmarks && python compiled_loop_nests.py --size mid
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from typing import Any

import torch
from _shared import SIZES, build_qwen2
from torch._inductor.utils import run_and_get_code

from pytest_precalign.recording import HookRecorder
from pytest_precalign.recording.compiled_stats import in_graph_stats

FOR = re.compile(
    r"for\(int64_t (\w+)=static_cast<int64_t>\((-?\d+)L\); \1<static_cast<int64_t>\((\d+)L\); "
    r"\1\+=static_cast<int64_t>\((\d+)L\)\)"
)
KERNEL = re.compile(r"(cpp_fused_\w+) = async_compile\.cpp_pybinding\(.*?r'''(.*?)'''", re.S)


def _body(code: str, header_end: int) -> tuple[int, int]:
    """The span of the braces after a loop header."""
    start = code.index("{", header_end)
    depth = 0
    for j in range(start, len(code)):
        depth += {"{": 1, "}": -1}.get(code[j], 0)
        if depth == 0:
            return start, j
    return start, len(code)


def loop_sizes(source: str, smallest: int) -> Counter[int]:
    """Elements iterated by each innermost loop nest of ``source`` (one graph's output code),
    counted once per call of its kernel."""
    calls = Counter(re.findall(r"^\s+(cpp_fused_\w+)\(", source, re.M))
    sizes: Counter[int] = Counter()
    for kernel in KERNEL.finditer(source):
        code = kernel.group(2)
        loops = [(m, _body(code, m.end())) for m in FOR.finditer(code)]
        for m, (start, end) in loops:
            if FOR.search(code, start, end):
                continue  # not innermost
            elements = 1
            for other, (o_start, o_end) in loops:  # the loops enclosing it, and itself
                if other is m or o_start <= m.start() <= o_end:
                    elements *= int(other.group(3)) - int(other.group(2))
            if elements >= smallest:
                sizes[elements] += calls[kernel.group(1)]
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="mid", choices=sorted(SIZES))
    parser.add_argument("--min", type=int, default=65536, help="smallest loop nest counted (elements)")
    args = parser.parse_args()
    size = SIZES[args.size]
    model = build_qwen2(size, "sdpa")
    ids = torch.randint(0, size.vocab, (size.batch, size.seq), generator=torch.Generator().manual_seed(0))
    in_graph_stats(model)  # the hooks before the first compile, as Recorder.start adds them
    compiled = torch.compile(model)

    def step(record: bool) -> None:
        model.zero_grad(set_to_none=True)
        rec = HookRecorder(compiled, mode="stats") if record else None
        if rec is not None:
            rec.__enter__()
        compiled(input_ids=ids, labels=ids).loss.backward()
        if rec is not None:
            rec.__exit__(None, None, None)

    codes = {name: run_and_get_code(step, name == "stats")[1] for name in ("bare", "stats")}
    facts: dict[str, Any] = {"size": args.size, "min_elements": args.min}
    for i, part in enumerate(("forward", "backward")):
        bare, stats = (loop_sizes(codes[name][i], args.min) for name in ("bare", "stats"))
        print(f"{part}: loop nests of >= {args.min} elements, bare / recorded (+extra)")
        for n in sorted(set(bare) | set(stats)):
            print(f"  {n:>10} elements: {bare[n]:4d} / {stats[n]:4d} (+{stats[n] - bare[n]})")
        extra = sum(n * (stats[n] - bare[n]) for n in stats)
        facts[f"{part}_loops_bare"], facts[f"{part}_loops_stats"] = sum(bare.values()), sum(stats.values())
        facts[f"{part}_extra_elements"] = extra
        facts[f"{part}_by_size"] = {str(n): [bare[n], stats[n]] for n in sorted(set(bare) | set(stats))}
        print(f"  extra: {sum(stats.values()) - sum(bare.values())} loops over {extra / 1e6:.1f}M elements")
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
