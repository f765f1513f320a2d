"""Under ``pytest -n N`` (xdist's default ``load`` distribution) a case's phase items must run on
one worker, in order: they share one run of the case's models, one ``--align-save-traces`` write
and one baseline write. xdist's own ``loadgroup`` would do it from the items' ``xdist_group``
markers, but only when the user passes ``--dist loadgroup``, so the plugin supplies a scheduler
for ``load``: the case's items are one work unit, every other test is a unit of its own (as
``load`` schedules it).

A worker that dies (the user's model killed the process) loses only the item it was running:
the other items of its unit go back to the queue, the crashed one is not run again.

Imported only by the plugin's ``pytest_xdist_make_scheduler`` hook, so xdist is imported only
when xdist is running."""

from __future__ import annotations

import re
from typing import Any

from xdist.scheduler import LoadScopeScheduling

from .vocabulary import PHASES

PHASE_ITEMS = PHASES


def case_unit_pattern(config_file_name: str) -> re.Pattern[str]:
    """``<path>/<config file>::<case>[<phase>]`` -> the case's unit, ``<path>/<config file>::<case>``."""
    phases = "|".join(PHASE_ITEMS)
    return re.compile(rf"^(?P<unit>(?:.*/)?{re.escape(config_file_name)}::[^\[\]]+)\[(?:{phases})\]$")


class CaseScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist is untyped
    """xdist's scope scheduling with a case (its phase items) as the scope."""

    def __init__(self, config: Any, log: Any, config_file_name: str) -> None:
        super().__init__(config, log)
        self._case_unit = case_unit_pattern(config_file_name)

    def _split_scope(self, nodeid: str) -> str:
        match = self._case_unit.match(nodeid)
        return match.group("unit") if match else nodeid

    def remove_node(self, node: Any) -> str | None:
        """A node finished or crashed. On a crash, its unfinished items go back to the queue,
        except the one it was running (reported as crashed by xdist, never run again)."""
        workload: dict[str, dict[str, bool]] = self.assigned_work.pop(node)
        pending = [nodeid for unit in workload.values() for nodeid, done in unit.items() if not done]
        if not pending:
            return None
        crashed = pending[0]
        for scope, unit in workload.items():
            unit.pop(crashed, None)
            if not all(unit.values()):
                self.workqueue[scope] = unit
        for other in self.assigned_work:
            self._reschedule(other)
        return crashed
