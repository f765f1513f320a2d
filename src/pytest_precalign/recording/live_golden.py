"""Live compare inside the recorder: which full tensors a record keeps (see ``live_compare``).

Each record's statistics (and, where the golden has only a hash, its CRC-32) are taken at
capture and handed to a ``Judge``: that is one host synchronisation per record (two for a
non-finite tensor), unlike stats and hash modes' one per step -- deciding needs the numbers
on the host.

What keeps a host copy of its tensor:

* a record beyond tolerance where the divergence enters: none of its deps (``Record.deps``:
  a forward output's module-call inputs; a grad_input's grads w.r.t. the module's outputs; a
  param grad's both; the loss's logits) is beyond tolerance. A beyond record whose deps are
  beyond already is *downstream*: it keeps its statistics (and is listed as beyond), its
  tensor would prove nothing the entry's does not. Module inputs and grads w.r.t. module
  outputs flow in from elsewhere and are never an entry themselves. As in the case's story
  (``verdict/story.py``), a phase after one with a beyond record in the same step (the
  backward after a forward divergence) is downstream of it as a whole;
* a record without golden counterpart or with another shape (fail closed);
* the deps of a kept record, while they are still held. Held are host copies of the inputs
  of the module calls still open (the frame stack: dropped when the call's outputs are
  judged, at the forward hook's end) and of the grads w.r.t. module outputs until the step
  ends. Peak extra memory: the inputs of the open calls plus the step's output grads; disk:
  only the kept tensors.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any, Protocol

import torch

from ..trace.records import Record, Stats
from ..vocabulary import MODEL_OUTPUT_KINDS, PHASES
from .tensor_summary import tensor_crc32, tensor_stats

HELD_KINDS = ("input", "grad_output")  # records another record's tensor may depend on
# MODEL_OUTPUT_KINDS (vocabulary.py): the model's loss and logits, held when they name no deps


class Judge(Protocol):
    def wants_crc(self, record_id: str) -> bool: ...

    def verdict(self, record: Record) -> str | None: ...

    def summary(self, kept_tensors: int, kept_bytes: int, downstream: int) -> dict[str, Any]: ...


class LiveKeeper:
    """Keeps the tensors the judge asks for, in the recorder's own ``records`` / ``tensors``."""

    def __init__(self, judge: Judge, records: list[Record], tensors: dict[str, torch.Tensor]) -> None:
        self.judge = judge
        self._records = records
        self._tensors = tensors
        self._held: dict[int, torch.Tensor] = {}  # seq -> host copy, not kept (yet)
        self._seq_of: dict[str, int] = {}
        self._key_of: dict[int, str] = {}  # id(kept host copy) -> its key: one copy on disk
        self._beyond: set[str] = set()  # this step's records beyond tolerance
        self._beyond_phases: set[str] = set()  # this step's phases with such a record
        self.kept_tensors = 0
        self.kept_bytes = 0
        self.downstream = 0

    def summarize(self, data: torch.Tensor, record_id: str, crc: bool) -> tuple[Stats, str | None]:
        """The record's statistics now (host sync), and its CRC when it is to be compared
        by hash (the golden has one) or ``crc`` asks for it (hash mode)."""
        stats = tensor_stats(data)
        want = crc or self.judge.wants_crc(record_id)
        return stats, tensor_crc32(data) if want else None

    def decide(self, seq: int, data: torch.Tensor, same_as: int | None) -> None:
        """Judge record ``seq`` (already in ``records``, with its statistics): keep its
        tensor and its held deps, or hold a copy while another record may need it."""
        record = self._records[seq]
        self._seq_of[record.id] = seq
        verdict = self.judge.verdict(record)
        if verdict == "beyond":
            self._beyond.add(record.id)
            self._beyond_phases.add(record.phase)
        if verdict is not None and (verdict != "beyond" or self._entry(record)):
            self._keep(seq, data, same_as)
            for dep in record.deps:
                held = self._seq_of.get(dep)
                if held is not None and held in self._held:
                    self._keep(held, None, None)
            return
        if verdict is not None and record.kind not in HELD_KINDS:
            self.downstream += 1
        if record.kind in HELD_KINDS and record.tensor_key is None:
            self._held[seq] = self._host(data, same_as)

    def _entry(self, record: Record) -> bool:
        """Whether the divergence of a beyond record enters there (see the module's doc)."""
        if record.kind in HELD_KINDS or (record.kind in MODEL_OUTPUT_KINDS and not record.deps):
            return False
        if any(p in self._beyond_phases for p in PHASES[: PHASES.index(record.phase)]):
            return False
        return not any(dep in self._beyond for dep in record.deps)

    def release(self, seqs: Iterable[int]) -> None:
        """Drop the held copies of records ``seqs`` (a module call ended within tolerance)."""
        for seq in seqs:
            self._held.pop(seq, None)

    def end_step(self) -> None:
        self._held.clear()
        self._seq_of.clear()
        self._beyond.clear()
        self._beyond_phases.clear()

    def manifest(self) -> dict[str, Any]:
        return self.judge.summary(self.kept_tensors, self.kept_bytes, self.downstream)

    def _host(self, data: torch.Tensor | None, same_as: int | None) -> torch.Tensor:
        """A host copy of the tensor; one already held or kept for the same tensor object
        (``same_as``: the earlier record of it) is shared, not copied again."""
        if same_as is not None:
            if same_as in self._held:
                return self._held[same_as]
            key = self._records[same_as].tensor_key
            if key is not None:
                return self._tensors[key]
        assert data is not None
        return data.detach().to("cpu", copy=True)

    def _keep(self, seq: int, data: torch.Tensor | None, same_as: int | None) -> None:
        record = self._records[seq]
        if record.tensor_key is not None:  # kept already (or shares a kept tensor)
            self._held.pop(seq, None)
            return
        tensor = self._held.pop(seq, None)
        if tensor is None:
            tensor = self._host(data, same_as)
        key = self._key_of.get(id(tensor))
        if key is not None:  # the same tensor object, kept for another record
            self._records[seq] = replace(record, tensor_key=key)
            return
        key = self._key_of[id(tensor)] = f"t{seq:07d}"
        self._tensors[key] = tensor
        self._records[seq] = replace(record, tensor_key=key)
        self.kept_tensors += 1
        self.kept_bytes += tensor.numel() * tensor.element_size()
