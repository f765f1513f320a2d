"""What a run saw: records in execution order and their tensors (no torch import).

In: a recorder's records, or files on disk. Out: a ``Trace`` (manifest, records, a lazy tensor
store).

``records`` (``Record``, ``Trace``), ``native_io`` (our on-disk format, the only reader and
writer), ``tensor_files`` and ``pt_zip`` (tensor files read as numpy), ``arrays``,
``op_names``, ``environment`` (what differs between two runs' environments), ``step_scalars``
(what one training step did, as scalars), ``merged_stats`` (statistics of fused tensors'
parts merged), ``training_record`` (the one typed record of a training run: settings, plan,
step scalars, initial parameters; its only writer and reader), ``write_failures`` (the note a
step that could not be written leaves for a later compare), ``step_markers`` (a step begun and
never finished: a run that stopped inside step k), ``trace_notes`` (``TraceNotes``: what a
recorder, a merge or the contract check noted of a trace; the only reader and writer of the
manifest's note keys), ``note_blocks`` (the notes' nested blocks typed: ``ReplicaMismatch``,
``DpJoin``, ``TpPartials`` ...), ``checksums`` (the sha256 of every file of a recording folder, written
last by every writer and checked by every reader), ``run_ids`` (which run and launch wrote
each step of a recording root; a mix refused), ``run_parts`` (the pointer a run resumed into
a new root keeps to its first part), ``json_fields`` (a dataclass as the JSON object of its
fields: the one ``as_dict`` of those that write themselves key per field).
"""

from __future__ import annotations
