"""Stored baselines (``--align-baseline DIR``): the only module that reads and writes them.

``DIR/<case>/`` is a trace directory (``precalign compare`` reads it as a side) plus
``weights.safetensors``: the recorded model's initial parameters, by stored name, so another
environment can start from the same weights. Its manifest keeps the environment (python,
torch, transformers, megatron-core versions, device, dtype, determinism), the config digest
and a checksum of those weights. What is stored is the CANDIDATE side of the run that wrote it
(``precalign record --side baseline`` can store the baseline model instead), so later
candidates compare with it name for name.

Policy (pytest-regressions'): a missing baseline is written and the test fails;
``--align-update`` rewrites mismatching baselines and still fails; ``--align-update-all``
rewrites and passes. On a mismatch the candidate's trace is written beside the baseline as
``DIR/<case>.obtained/``, and removed by the next passing run.

Safety: every write is a temporary sibling directory renamed into place (``publish_dir``), under
a per-case lock file (xdist workers and concurrent sessions take turns on one case). A run only
ever touches the files of the cases it runs; leftovers of a killed writer (temporary
directories whose process is gone) are removed, and a baseline moved aside but not replaced is
put back, the next time that case is written or read.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._atomic import fsync_file, publish_dir, share_file, temp_dir_beside
from ..errors import CaseError, TraceError
from ..mapping.spec import MappingSpec
from ..trace.environment import environment_diff, weights_diff
from ..vocabulary import UPDATE_POLICIES
from .variants import choose

if TYPE_CHECKING:
    import torch

    from ..config.specs import AlignConfig, CaseSpec
    from ..run.case import CaseRun
    from ..trace.records import Trace
    from .record_side import SideRecording

WEIGHTS_FILE = "weights.safetensors"
OBTAINED_SUFFIX = ".obtained"
# Names kept; a single-tensor output still meets its one-tuple form (``out`` vs ``out.0``).
_SAME_NAMES = MappingSpec("same names")
_TEMP = re.compile(r"^\.(?P<name>.+)\.pid(?P<pid>\d+)\.[^.]+\.tmp$")


def obtained_dir(root: Path, case: str) -> Path:
    return root / f"{case}{OBTAINED_SUFFIX}"


@contextlib.contextmanager
def case_lock(root: Path, case: str) -> Iterator[None]:
    """An exclusive lock on one case's files (``DIR/.<case>.lock``), across processes. A
    read-only DIR (a CI mount) takes no lock: nothing there can be written, and published
    baselines are whole directories renamed into place, so reading needs none."""
    if root.is_dir() and not writable(root):
        yield
        return
    root.mkdir(parents=True, exist_ok=True)
    path = root / f".{case}.lock"
    try:
        import fcntl
    except ImportError:  # not POSIX: writes are still atomic, concurrent writers not serialised
        yield
        return
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0) | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:  # ELOOP: a link planted where the lock file goes
        raise TraceError(
            f"{path}: cannot open the case's lock file ({exc.strerror}); it must be a plain file, "
            "not a link: remove it"
        ) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise TraceError(f"{path}: the case's lock file is not a plain file: remove it")
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def writable(root: Path) -> bool:
    """Can files be created in ``root``? (Not on a read-only mount, even for root; where the
    platform has no ``statvfs``, as on Windows, the access check alone decides.)"""
    statvfs = getattr(os, "statvfs", None)
    try:
        read_only_mount = statvfs is not None and bool(statvfs(root).f_flag & os.ST_RDONLY)
    except OSError:
        return False
    return not read_only_mount and os.access(root, os.W_OK | os.X_OK)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _real_dir(path: Path) -> bool:
    """A directory itself, not a link to one (the tool's own leftovers are never links)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def recover(root: Path, name: str) -> list[str]:
    """Undo what a killed writer of ``root/name`` left: its temporary directory (when its
    process is gone) and, if the baseline was moved aside but its replacement never arrived,
    the old baseline is put back. Call under ``case_lock``. Returns what was done."""
    done: list[str] = []
    if not root.is_dir() or not writable(root):  # nothing can be cleaned up in a read-only DIR
        return done
    target = root / name
    for entry in root.iterdir():
        m = _TEMP.match(entry.name)
        if m and m.group("name") == name and not _alive(int(m.group("pid"))) and _real_dir(entry):
            shutil.rmtree(entry, ignore_errors=True)
            done.append(f"removed {entry.name} (left by killed process {m.group('pid')})")
        elif entry.name.startswith(f".{name}.") and entry.name.endswith(".old") and _real_dir(entry):
            old = entry / "old"
            if _real_dir(old) and not os.path.lexists(target):
                os.replace(old, target)
                done.append(f"restored {name} from {entry.name}")
            shutil.rmtree(entry, ignore_errors=True)
    return done


def write_stored(
    trace: Trace, weights: Mapping[str, torch.Tensor] | None, target: Path, *, extra: Mapping[str, Any]
) -> Path:
    """Write a trace (and the weights it started from) as ``target``, atomically, replacing what
    is there. The caller holds ``case_lock`` and decided that replacing is wanted."""
    from dataclasses import replace

    from ..trace.native_io import write_trace_files

    target.parent.mkdir(parents=True, exist_ok=True)
    if not writable(target.parent):
        raise TraceError(
            f"{target.parent}: read-only; cannot write {target.name} there (record baselines where "
            "they can be written; a read-only copy serves for comparing only)"
        )
    # The pid in the name lets a later run tell a dead writer's leftovers from a live one's.
    tmp = temp_dir_beside(target, prefix=f".{target.name}.pid{os.getpid()}.")
    try:
        manifest = {**dict(trace.manifest), "baseline": dict(extra)}
        sums = write_trace_files(replace(trace, manifest=manifest), tmp)
        if weights is not None:
            from safetensors.torch import save_file

            tensors = {k: v.detach().to("cpu").contiguous() for k, v in weights.items()}
            save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pytest-precalign-weights"})
            share_file(tmp / WEIGHTS_FILE)
            fsync_file(tmp / WEIGHTS_FILE)
        sums.seal(tmp)  # last: the weights file is hashed with the rest
        publish_dir(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def remove_obtained(root: Path, case: str) -> bool:
    """Remove ``DIR/<case>.obtained`` (this case's own file); True if there was one."""
    path = obtained_dir(root, case)
    if not path.exists() or not writable(root):
        return False
    aside = Path(tempfile.mkdtemp(prefix=f".{path.name}.pid{os.getpid()}.", suffix=".tmp", dir=root))
    os.replace(path, aside / "gone")  # atomic disappearance; the removal itself may be slow
    shutil.rmtree(aside, ignore_errors=True)
    return True


def read_stored(path: Path) -> Trace:
    from ..trace.native_io import read_trace

    return read_trace(path)


def read_weights(path: Path) -> dict[str, torch.Tensor] | None:
    file = path / WEIGHTS_FILE
    if not file.is_file():
        return None
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return dict(load_file(str(file)))
    except (SafetensorError, OSError, RuntimeError) as exc:
        raise TraceError(f"{file}: cannot read the baseline's weights: {exc}") from None


# -- the check of one case --------------------------------------------------------------------


@dataclass(frozen=True)
class BaselineOutcome:
    """What happened to one case against its stored baseline."""

    case: str
    path: Path
    # "written" (was missing), "compared", "updated" (--align-update, mismatched),
    # "rewritten" (--align-update-all), "written-earlier" (by another xdist worker, this run)
    action: str
    run: CaseRun | None = None
    env_diff: tuple[str, ...] = ()
    weights_diff: tuple[str, ...] = ()
    weights_source: str = ""
    obtained: Path | None = None
    stored_env: Mapping[str, Any] = field(default_factory=dict)
    recovered: tuple[str, ...] = ()  # what a killed writer left and this run cleaned up
    obtained_skipped: str = ""  # why the obtained trace of a mismatch was not written
    variant: str = ""  # the label of the environment variant compared with ("": the default)
    variants: int = 0  # how many variants of the case the folder holds


def check_case(config: AlignConfig, case: CaseSpec, root: Path, update: str, run_id: str) -> BaselineOutcome:
    """Record the case's candidate and compare it with ``root/<case>``, writing or updating
    the baseline as ``update`` ("none", "mismatched", "all") allows."""

    if update not in UPDATE_POLICIES:
        raise ValueError(update)
    started = time.perf_counter()
    with case_lock(root, case.name):
        chosen = choose(root, case.name, current_environment(config, case))
        target = chosen.path
        recovered = tuple(recover(root, case.name)) + tuple(
            recover(root, target.name) if target.name != case.name else ()
        )
        stored = _read_own(target, case.name)
        stored_info = dict(stored.manifest.get("baseline") or {}) if stored is not None else {}
        if stored is not None and stored_info.get("run_id") == run_id and update != "all":
            # Another xdist worker ran this case's other phases and wrote it in this very run.
            return BaselineOutcome(
                case.name, target, "written-earlier", stored_env=stored.manifest, recovered=recovered
            )
        stored_side = str(stored.manifest.get("side", "candidate")) if stored is not None else "candidate"
        stored_weights = read_weights(target) if stored is not None else None
        rec = _record_on_stored(config, case, target, root, stored_weights, stored_side)
        extra = {"run_id": run_id, "written_by": "pytest --align-baseline", "written_at": _now()}
        if stored is None:
            write_stored(rec.trace, rec.weights, target, extra=extra)
            remove_obtained(root, case.name)
            return BaselineOutcome(
                case.name, target, "written", weights_source=rec.weights_source, recovered=recovered
            )
        judge = _step_judge(case, stored_weights, rec, stored_side)
        outcome = _compare(config, case, stored, stored_side, rec, started, target, recovered, judge)
        outcome = replace(outcome, variant=chosen.label, variants=chosen.among)
        return _settle(outcome, rec, root, update, extra)


def current_environment(config: AlignConfig, case: CaseSpec) -> dict[str, Any]:
    """What a variant is chosen by: this process's package versions and the candidate's device
    and dtype."""
    from ..recording.determinism import package_versions

    spec = config.models[case.models.candidate]
    return {"versions": package_versions(), "device": spec.device, "dtype": spec.dtype}


def _read_own(target: Path, case: str) -> Trace | None:
    """The stored baseline of ``case`` (None when there is none)."""
    stored = read_stored(target) if target.exists() else None
    if stored is not None and stored.manifest.get("case") not in (None, case):
        raise TraceError(
            f"{target}: holds case {stored.manifest.get('case')!r}, not {case!r} "
            "(use one --align-baseline directory per config)"
        )
    return stored


def _compare(
    config: AlignConfig,
    case: CaseSpec,
    stored: Trace,
    stored_side: str,
    rec: SideRecording,
    started: float,
    target: Path,
    recovered: tuple[str, ...],
    judge: Any = None,
) -> BaselineOutcome:
    from dataclasses import replace

    from ..run.case import case_table
    from ..run.outcome import FinishInputs, finish

    # A stored candidate meets the candidate name for name (through stored_layer_mapping);
    # a stored baseline side through the case's mapping, as in a live run.
    mapping = case.mapping if stored_side == "baseline" else case.baseline_rename or _SAME_NAMES
    # A known divergence (expect:) is between the live models, not against a stored trace.
    compare_case = case if stored_side == "baseline" else replace(case, expect=None)
    job = FinishInputs(
        name=case.name,
        phases=case.phases,
        baseline=stored,
        candidate=rec.raw,
        table=case_table(config, case),
        started=started,
        mapping=mapping,
        case=compare_case,
        sync=rec.sync,
        environment=rec.environment,
        judge_steps=judge,
    )
    return BaselineOutcome(
        case.name,
        target,
        "compared",
        run=finish(job),
        env_diff=tuple(environment_diff(stored.manifest, {**rec.trace.manifest})),
        weights_diff=tuple(weights_diff(stored.manifest, rec.trace.manifest)),
        weights_source=rec.weights_source,
        stored_env=stored.manifest,
        recovered=recovered,
    )


STALE_WEIGHTS = "weights.sync: shape mismatch"


def _record_on_stored(
    config: AlignConfig,
    case: CaseSpec,
    target: Path,
    root: Path,
    stored_weights: Mapping[str, Any] | None,
    stored_side: str,
) -> Any:
    """The candidate recorded from the stored weights; weights that no longer fit the model
    (another config since the baseline was recorded) are a stale baseline, with the command
    that records it anew."""
    from .record_side import record_side

    try:
        return record_side(config, case, "candidate", stored_weights=stored_weights, stored_side=stored_side)
    except CaseError as exc:
        if not str(exc).startswith(STALE_WEIGHTS) or stored_weights is None:
            raise
        shown = str(exc).removeprefix(STALE_WEIGHTS + ": ")
        raise CaseError(
            f"the stored baseline {target} is stale: its weights.safetensors no longer fits the model as "
            f"configured now ({shown}); record it anew with: precalign record {config.path} --out {root} "
            f"--case {case.name} --overwrite"
        ) from None


def _step_judge(
    case: CaseSpec, stored_weights: Mapping[str, Any] | None, rec: SideRecording, stored_side: str
) -> Any:
    """Each optimizer step judged on its inputs (``run/update_check``) when both sides'
    parameters before step 0 are known in the stored trace's names: the stored ones, and the
    live candidate's (its own, under stored names, against a stored candidate; the stored
    baseline's when every parameter was loaded from them). None: by the table."""
    if stored_weights is None or "step" not in case.phases or case.record.mode != "tensor":
        return None
    if stored_side == "candidate":
        live = rec.weights
    elif rec.sync is not None and not rec.sync.unsynced and rec.weights_source.startswith("loaded"):
        live = stored_weights
    else:
        return None
    from ..run.update_check import update_judge

    return update_judge(case.training.optimizer, {"baseline": stored_weights, "candidate": live})


def _settle(
    outcome: BaselineOutcome, rec: SideRecording, root: Path, update: str, extra: Mapping[str, Any]
) -> BaselineOutcome:
    """Write what the policy asks after a compare: the new baseline (``--align-update``
    on a mismatch, ``--align-update-all``), else the obtained trace of a mismatch."""
    from dataclasses import replace

    assert outcome.run is not None
    failed = any(not v.passed for v in outcome.run.verdicts.values())
    target, case = outcome.path, outcome.case
    if update == "all" or (failed and update == "mismatched"):
        write_stored(rec.trace, rec.weights, target, extra=extra)
        remove_obtained(root, case)
        return replace(outcome, action="updated" if update == "mismatched" else "rewritten")
    if failed and not writable(root):
        return replace(outcome, obtained_skipped=f"{root} is read-only")
    if failed:
        obtained = obtained_dir(root, case)
        write_stored(rec.trace, None, obtained, extra={**extra, "obtained": True})
        return replace(outcome, obtained=obtained)
    remove_obtained(root, case)
    return outcome


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
