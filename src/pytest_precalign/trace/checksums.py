"""A recording folder's checksums: ``checksums.json``, the sha256 of every file a writer put in
the folder (by relative name), written atomically and LAST, once the files it covers are there;
checked by every reader before it trusts the files. Torch-free.

Writers (``native_io``, the msprobe writer, the baseline store) hash what they write while the
bytes are in memory (``Checksums.write``); a file written by a library straight to disk (a
safetensors shard) is hashed once, right after it was written, with a bounded buffer
(``Checksums.add_file``). ``seal`` hashes whatever else is in the folder and writes the file.

``verify_folder`` is the readers' check: every entry of the folder is a regular file or a
directory (a link, a FIFO, a socket or a device is refused, never followed or opened); with a
``checksums.json``, a file listed but missing, present but not listed, or whose sha256 differs
is one ``TraceError`` naming it. A folder without one (written before checksums existed, or an
msprobe dump msprobe wrote itself) is read as before. Each seal holds a ``publication`` id
(new for every write), which ``folder_identity`` returns, so a reader can tell that a folder
it read was replaced by another write while it read (``recheck``). Tensor files are loaded
lazily, after that check: ``verify_folder`` returns the ``Stamps`` of the files it hashed (device,
inode, size, change times, from the descriptor it hashed), and a loader opens a file, then checks
its descriptor against them (``check_opened``) before it reads a byte: the file loaded is the file
hashed, unchanged since (a rerun's new file, or any write into it, changes its inode or its
change time; the kernel sets ``st_ctime``, a writer cannot).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .._atomic import publish_dir, write_file_atomic
from ..errors import TraceError
from ..untrusted import ErrorType, bounded_repr, open_regular, read_json, refuse_link

Stamps = dict[Path, tuple[int, ...]]  # a hashed file -> its stamp (``_stamp``), as hashed

CHECKSUM_FILE = "checksums.json"
FORMAT = "pytest-precalign-checksums"
ALGORITHM = "sha256"
_BUFFER = 1 << 20  # files are hashed 1 MiB at a time: memory bounded whatever their size
_HEX = re.compile(r"^[0-9a-f]{64}$")
_MAX_ENTRIES = 1_000_000  # a crafted folder of a billion files is refused, not walked


class Checksums:
    """The sha256 of each file written into a (temporary) recording folder, by relative name."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}

    def write(self, folder: Path, name: str, data: bytes) -> Path:
        """Write ``folder/name`` (flushed to disk), hashing the bytes on the way."""
        path = folder / name
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        self.files[name] = hashlib.sha256(data).hexdigest()
        return path

    def write_json(self, folder: Path, name: str, content: Any) -> Path:
        text = json.dumps(content, indent=1, sort_keys=False, default=str)
        return self.write(folder, name, text.encode("utf-8"))

    def add_file(self, folder: Path, name: str) -> str:
        """Hash a file already written into ``folder`` (by a library writing to disk)."""
        digest = file_sha256(folder / name)
        self.files[name] = digest
        return digest

    def update(self, digests: Mapping[str, str]) -> None:
        self.files.update(digests)

    def seal(self, folder: Path) -> str:
        """Hash every file of ``folder`` not hashed yet, then write ``checksums.json``
        atomically, last; returns its publication id."""
        for name in _walk(folder, TraceError):
            if name not in self.files and name != CHECKSUM_FILE:
                self.add_file(folder, name)
        publication = uuid.uuid4().hex
        body = {
            "format": FORMAT,
            "algorithm": ALGORITHM,
            "publication": publication,
            "files": dict(sorted(self.files.items())),
        }
        write_file_atomic(folder / CHECKSUM_FILE, json.dumps(body, indent=1) + "\n")
        return publication

    def publish(self, tmp: Path, target: Path) -> None:
        """Seal the folder ``tmp`` a writer filled, then publish it whole as ``target``."""
        self.seal(tmp)
        publish_dir(tmp, target)


def _stamp(fd: int) -> tuple[int, ...]:
    info = os.fstat(fd)
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def file_sha256(path: Path, stamps: Stamps | None = None) -> str:
    """sha256 of a regular file, read with a bounded buffer (never through a link or a FIFO);
    its stamp put in ``stamps`` (refused when the file changed while it was hashed)."""
    refuse_link(path, TraceError, "a recording folder")
    digest = hashlib.sha256()
    with open_regular(path, TraceError, "a recorded file") as f:
        before = _stamp(f.fileno())
        while chunk := f.read(_BUFFER):
            digest.update(chunk)
        if stamps is not None:
            if _stamp(f.fileno()) != before:
                raise TraceError(f"{path}: changed while its checksum was checked (another write)")
            stamps[path] = before
    return digest.hexdigest()


def check_opened(path: Path, fd: int, stamps: Stamps | None) -> None:
    """A file of a sealed folder, opened to be loaded after ``verify_folder``: refused unless
    it is the file that was hashed, unchanged (``stamps``: ``verify_folder``'s; None for a
    folder without checksums, read as before)."""
    if stamps is None:
        return
    if stamps.get(path) != _stamp(fd):
        raise TraceError(
            f"{path}: changed after its checksum was checked (replaced or rewritten by another "
            "write while the recording was read); run the compare again"
        )


def _walk(folder: Path, error: ErrorType, where: str = "") -> Iterable[str]:
    """Relative names of the regular files below ``folder``; anything else than a regular
    file or a directory (a link, a FIFO, a socket, a device) is refused, never followed."""
    count = 0
    stack = [(folder, where)]
    while stack:
        current, prefix = stack.pop()
        try:
            entries = sorted(os.scandir(current), key=lambda e: e.name)
        except OSError as exc:
            raise error(f"{current}: cannot list: {exc.strerror or exc}") from None
        for entry in entries:
            count += 1
            if count > _MAX_ENTRIES:
                raise error(f"{folder}: holds more than {_MAX_ENTRIES} entries; not a recording folder")
            mode = entry.stat(follow_symlinks=False).st_mode
            name = f"{prefix}{entry.name}"
            if stat.S_ISDIR(mode):
                stack.append((Path(entry.path), f"{name}/"))
            elif stat.S_ISREG(mode):
                yield name
            elif stat.S_ISLNK(mode):
                raise error(
                    f"{entry.path}: a symbolic link inside a recording folder; its files are read "
                    "only as real files (never followed)"
                )
            else:
                raise error(
                    f"{entry.path}: is {_kind(mode)}, expected a regular file inside a recording "
                    "folder (refused, never opened)"
                )


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device or special file"


def verify_folder(folder: Path) -> Stamps | None:
    """Check a recording folder before its files are trusted (see the module doc); the stamps
    of the files hashed, or None when it carries no checksums (read as before)."""
    present = set(_walk(folder, TraceError))
    file = folder / CHECKSUM_FILE
    if CHECKSUM_FILE not in present:
        return None
    listed, _ = _read_seal(file)
    stamps: Stamps = {}
    for name in sorted(present - set(listed) - {CHECKSUM_FILE}):
        raise TraceError(
            f"{folder / name}: not listed in {CHECKSUM_FILE}: a file added after the recording "
            "was written (remove it, or record again)"
        )
    for name in sorted(set(listed) - present):
        raise TraceError(
            f"{folder / name}: listed in {CHECKSUM_FILE} but missing (removed after it was recorded)"
        )
    for name, expected in sorted(listed.items()):
        actual = file_sha256(folder / name, stamps)
        if actual != expected:
            raise TraceError(
                f"{folder / name}: content changed after it was recorded "
                f"(sha256 {actual[:16]}… ≠ recorded {expected[:16]}…)"
            )
    return stamps


def _read_seal(file: Path) -> tuple[dict[str, str], str]:
    refuse_link(file, TraceError, "a recording folder")
    data = read_json(file, TraceError, what="a recording's checksums")
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TraceError(f"{file}: not a pytest-precalign checksums file (format {FORMAT!r} expected)")
    if data.get("algorithm") != ALGORITHM:
        raise TraceError(
            f"{file}: algorithm {bounded_repr(data.get('algorithm'))} is not supported (expected {ALGORITHM})"
        )
    files, publication = data.get("files"), data.get("publication")
    if not isinstance(publication, str) or not publication:
        raise TraceError(f"{file}: 'publication' must be a non-empty string, got {bounded_repr(publication)}")
    if not isinstance(files, dict) or not all(
        isinstance(k, str) and _plain_relative(k) and isinstance(v, str) and _HEX.match(v)
        for k, v in files.items()
    ):
        raise TraceError(
            f"{file}: 'files' must map relative file names (no '..', no absolute path) to "
            "sha256 digests (64 lowercase hex digits)"
        )
    return dict(files), publication


def sealed_names(folder: Path) -> frozenset[str]:
    """The files ``folder``'s checksums list (none without a readable seal; the readers'
    ``verify_folder`` says what is wrong with one)."""
    if not os.path.lexists(folder / CHECKSUM_FILE):
        return frozenset()
    try:
        return frozenset(_read_seal(folder / CHECKSUM_FILE)[0])
    except TraceError:
        return frozenset()


def _plain_relative(name: str) -> bool:
    parts = name.split("/")
    return (
        bool(name)
        and "\0" not in name
        and not name.startswith("/")
        and all(p not in ("", ".", "..") for p in parts)
    )


def folder_identity(folder: Path) -> str:
    """What says which write of ``folder`` is there now: its inode and its seal's publication
    id ("" without a seal; "gone" when the folder is not there)."""
    try:
        info = os.lstat(folder)
    except OSError:
        return "gone"
    publication = ""
    file = folder / CHECKSUM_FILE
    if os.path.lexists(file):
        try:
            publication = _read_seal(file)[1]
        except TraceError:
            publication = "unreadable"
    return f"{info.st_dev}:{info.st_ino}:{publication}"


def recheck(root: Path, identities: Mapping[Path, str]) -> None:
    """After a read: every folder read is still the write that was read, else one error
    (the recording was replaced, e.g. re-published by a rerun, while it was read)."""
    for folder, before in identities.items():
        if folder_identity(folder) != before:
            raise TraceError(
                f"{root}: the recording changed while it was read ({folder} was replaced or "
                "removed by another write); run the compare again"
            )


SUM_SUFFIX = ".sha256"


def write_checked_file(path: Path, data: bytes) -> Path:
    """A single file outside a recording folder (a trainer's evidence file) written atomically,
    then its sha256 beside it, last, in ``sha256sum``'s format (``NAME.sha256``)."""
    write_file_atomic(path, data)
    digest = hashlib.sha256(data).hexdigest()
    write_file_atomic(path.with_name(path.name + SUM_SUFFIX), f"{digest}  {path.name}\n")
    return path


def verify_file(path: Path, error: ErrorType = TraceError) -> None:
    """The check of ``write_checked_file``'s file: its sha256 equals the one beside it (a file
    without one is read as before)."""
    side = path.with_name(path.name + SUM_SUFFIX)
    if not os.path.lexists(side):
        return
    refuse_link(side, error, "a recording")
    with open_regular(side, error, "a checksum file") as f:
        text = f.read(200).decode("ascii", "replace")
    recorded, _, name = text.strip().partition("  ")
    if not _HEX.match(recorded) or name != path.name:
        raise error(f"{side}: expected '<sha256>  {path.name}' (sha256sum's format)")
    actual = file_sha256(path)
    if actual != recorded:
        raise error(
            f"{path}: content changed after it was recorded (sha256 {actual[:16]}… ≠ recorded {recorded[:16]}…)"
        )
