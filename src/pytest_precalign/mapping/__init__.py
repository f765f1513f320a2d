"""Candidate names and layouts brought to the baseline's (no torch in ``spec``/``apply``).

In: a mapping (YAML file, ``preset:NAME`` or ``MappingSpec``) and a candidate trace or model.
Out: the trace in the baseline's names, slots and layouts; weights synced through it.

``spec`` (mappings as data), ``transforms`` (invertible tensor transforms), ``apply`` (a
trace through a mapping), ``weights`` (weight sync), ``usage`` (a rule must bite),
``layer_mapping`` (msprobe's layer_mapping files), ``fuzzy_api_calls`` (API calls paired by
order), ``peft_names`` (a PEFT run's ``base_layer`` names brought to a plain or merged model's),
``wrapper_prefix`` (a constant wrapper prefix between two recordings, found and taken off).
"""

from __future__ import annotations
