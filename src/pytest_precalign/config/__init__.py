"""The alignment config: YAML -> frozen specs (no torch, no pytest).

In: ``align.yaml`` text or file. Out: an ``AlignConfig`` (models, inputs, tolerances,
mappings, cases), or one ``ConfigError`` naming the file, the line, the key and what is allowed.

``loader`` (the file), ``cases`` (one case), ``specs`` (the dataclasses), ``model_sources``
(which sources and keys exist), ``model_weights`` (``weights: {load:}``), ``launch`` (parallel
sizes and launched ranks), ``presets`` (shipped mappings and the one ``preset:`` resolver),
``search`` (the divergence search's parts), ``training`` (``optimizer:`` and ``training:``, and
their checks against the case's models and inputs), ``dataset_rows`` (a ``kind: dataset``
file's token rows, read as bytes, bounded, only the rows a case needs).
"""

from __future__ import annotations
