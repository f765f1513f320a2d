"""Read msprobe (mindstudio-probe) dumps as pytest-precalign traces, and write traces as
msprobe dumps.

>>> trace = read_msprobe_dump("dump/step0/rank0")        # one rank folder -> Trace
>>> traces = read_msprobe_set("dump")                     # {(step, rank): Trace}
>>> write_msprobe_dump(trace, "out")                      # out/step0/rank0/{dump,construct,stack}.json

No torch import here: tensors of ``task: tensor`` dumps are loaded on access.

``reader`` (a rank folder -> ``Trace``), ``writer`` (a trace -> an msprobe dump), ``layout``
(where a dump's rank folders are), ``names`` (msprobe record names -> ours), ``tensors`` (the
lazy view over ``dump_tensor_data/``).
"""

from __future__ import annotations

from .layout import is_msprobe_dump
from .reader import read_msprobe_dump, read_msprobe_set
from .writer import write_msprobe_dump

__all__ = ["is_msprobe_dump", "read_msprobe_dump", "read_msprobe_set", "write_msprobe_dump"]
