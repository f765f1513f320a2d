"""Before torch is imported for a case: its models' devices can be served. ``device: npu``
needs a torch_npu that matches torch and loads (CANN); an installed torch_npu that cannot load
stops ``import torch`` for every device. One message naming the model, the package and CANN
(recording/npu_backend.py), not torch's traceback. Torch-free at import."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import SourceError
from ..recording.npu_backend import npu_problem, torch_problem

if TYPE_CHECKING:
    from ..config.specs import AlignConfig, CaseSpec


def check_devices(config: AlignConfig, case: CaseSpec) -> None:
    """``SourceError`` naming the model when its device cannot be used here."""
    if case.dumps is not None:
        return  # two stored runs: no model is built
    for name in dict.fromkeys((case.models.baseline, case.models.candidate)):
        spec = config.models[name]
        problem = npu_problem() if spec.device == "npu" else torch_problem()
        if problem is not None:
            raise SourceError(f"{spec.where}: models.{name}: {problem}")
