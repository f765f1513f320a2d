from __future__ import annotations
class Recorder:  # placeholder
    pass
