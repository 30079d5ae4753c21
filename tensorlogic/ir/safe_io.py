"""Bounded, typed file access for everything the library reads from or writes to disk.

Reading: only regular files are opened (a FIFO, a device such as /dev/zero or a directory is
refused before a byte is read), and a file is read up to a bound, never "until the end". An .npz
archive is read member by member: each member's declared size (zip directory and .npy header) is
checked against the bounds and the memory budget *before* it is inflated, and members nobody asked
for are never inflated. Writing: a temporary file in the target's folder, renamed over the target
only once complete, so a failing run never leaves a partial file or destroys an existing one.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
import tempfile
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Self

import numpy as np

from ..errors import SerializationError

# Largest member an archive may declare when no explicit budget is given and the free memory is
# unknown; with a known free memory the budget is half of it.
DEFAULT_ARRAY_BUDGET = 4 << 30

# files we write get the permissions a plain open() would give them (mkstemp makes them 0600)
_UMASK = os.umask(0)
os.umask(_UMASK)

_HEADER_READERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}


def _where(path: object, where: str) -> str:
    return where or (
        f"file {Path(path).name!r}"
        if isinstance(path, (str, os.PathLike))
        else "an in-memory archive"
    )


def open_regular(path: str | os.PathLike, where: str = "") -> IO[bytes]:
    """Open ``path`` for reading if it is a regular file; raise SerializationError otherwise.

    ``O_NONBLOCK`` keeps a FIFO from blocking the open; the type is checked on the open descriptor,
    so a file swapped after the check cannot slip through.
    """
    where = _where(path, where)
    try:
        fd = os.open(os.fspath(path), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise SerializationError(f"{where}: cannot read ({exc.strerror or exc})") from exc
    except (TypeError, ValueError) as exc:
        raise SerializationError(f"{where}: not a file path ({exc})") from exc
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = (
                "a directory"
                if stat.S_ISDIR(mode)
                else "a FIFO"
                if stat.S_ISFIFO(mode)
                else "a device"
                if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
                else "a socket"
                if stat.S_ISSOCK(mode)
                else "not a regular file"
            )
            raise SerializationError(f"{where}: is {kind}; expected a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path: str | os.PathLike, limit: int, where: str = "") -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes."""
    where = _where(path, where)
    with open_regular(path, where) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise SerializationError(f"{where}: {size} bytes exceed the limit of {limit}")
        data = f.read(limit + 1)  # the file may grow after the check
    if len(data) > limit:
        raise SerializationError(f"{where}: more than {limit} bytes; over the limit")
    return data


def array_budget(budget: int | None = None) -> int:
    """Bytes an archive may inflate: ``budget`` if given, else half the free host memory."""
    if budget is not None:
        return int(budget)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 // 2
    except (OSError, ValueError):
        pass
    return DEFAULT_ARRAY_BUDGET


class NpzReader:
    """An .npz archive opened for bounded, member-by-member reading (use as a context manager)."""

    def __init__(
        self,
        source: str | os.PathLike | bytes,
        where: str = "",
        budget: int | None = None,
        max_elements: int | None = None,
    ) -> None:
        self.where = _where(source, where)
        self.budget = array_budget(budget)
        self.max_elements = max_elements
        self.spent = 0
        f: IO[bytes] = (
            io.BytesIO(source)
            if isinstance(source, (bytes, bytearray))
            else open_regular(source, self.where)
        )
        try:
            self._zip = zipfile.ZipFile(f)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as exc:
            f.close()
            raise SerializationError(f"{self.where}: not an .npz archive ({exc})") from exc
        self._file = f
        self._members = {}
        for info in self._zip.infolist():
            if info.filename.endswith(".npy"):
                self._members[info.filename[:-4]] = info

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the archive."""
        self._zip.close()
        self._file.close()

    @property
    def names(self) -> tuple[str, ...]:
        """Names of the arrays the archive holds (without reading them)."""
        return tuple(self._members)

    def __contains__(self, name: str) -> bool:
        return name in self._members

    def read(self, name: str) -> np.ndarray:
        """One array, its declared size checked against the bounds before it is inflated."""
        info = self._members.get(name)
        if info is None:
            raise SerializationError(f"{self.where}: no array {name!r} in the archive")
        w = f"{self.where}: array {name!r}"
        self._charge(info.file_size, w, "declares")
        try:
            with self._zip.open(info) as member:
                version = np.lib.format.read_magic(member)
                if version not in _HEADER_READERS:
                    raise SerializationError(f"{w}: unsupported .npy format version {version}")
                shape, fortran, dtype = _HEADER_READERS[version](member)
                if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
                    raise SerializationError(
                        f"{w}: holds {dtype} data (objects or records); "
                        "expected a plain numeric array"
                    )
                n = int(np.prod(shape, dtype=object))
                if self.max_elements is not None and n > self.max_elements:
                    raise SerializationError(
                        f"{w}: {n} elements exceed the limit of {self.max_elements}"
                    )
                nbytes = n * dtype.itemsize
                if nbytes > info.file_size:
                    raise SerializationError(
                        f"{w}: header declares {nbytes} bytes but the "
                        f"member holds {info.file_size}; corrupted"
                    )
                arr = np.empty(shape, dtype=dtype, order="F" if fortran else "C")
                view = memoryview(arr.reshape(-1, order="A").view(np.uint8)) if n else None
                got = 0
                while view is not None and got < nbytes:
                    k = member.readinto(view[got:])
                    if not k:
                        break
                    got += k
                if got != nbytes:
                    raise SerializationError(f"{w}: truncated ({got} of {nbytes} bytes)")
        except SerializationError:
            raise
        except (
            ValueError,
            OSError,
            EOFError,
            zipfile.BadZipFile,
            TypeError,
            KeyError,
            NotImplementedError,
            RuntimeError,
        ) as exc:
            # BadZipFile: CRC mismatch; NotImplementedError/RuntimeError: unknown compression
            # method or an encrypted member
            raise SerializationError(f"{w}: cannot read ({type(exc).__name__}: {exc})") from exc
        except MemoryError as exc:
            raise SerializationError(f"{w}: does not fit in memory") from exc
        if not arr.dtype.isnative:
            arr = arr.astype(arr.dtype.newbyteorder("="))  # same values, native byte order
        return arr

    def _charge(self, nbytes: int, w: str, verb: str) -> None:
        if nbytes > self.budget - self.spent:
            raise SerializationError(
                f"{w}: {verb} {nbytes} bytes; with {self.spent} already read that exceeds the "
                f"memory budget of {self.budget} bytes"
            )
        self.spent += nbytes

    def read_all(self) -> dict[str, np.ndarray]:
        """Every array of the archive (each bounded as in ``read``)."""
        return {k: self.read(k) for k in self._members}


def read_npz(
    source: str | os.PathLike | bytes,
    names: Iterable[str] | None = None,
    where: str = "",
    budget: int | None = None,
    max_elements: int | None = None,
) -> dict[str, np.ndarray]:
    """The named arrays (all when ``names`` is None) of an .npz file or bytes, bounded."""
    with NpzReader(source, where, budget, max_elements) as z:
        if names is None:
            return z.read_all()
        return {k: z.read(k) for k in names if k in z}


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, where: str = "") -> Iterator[IO[bytes]]:
    """A binary file object whose content replaces ``path`` only if the block completes."""
    try:
        path = Path(path)
    except TypeError as exc:
        raise SerializationError(f"{where or 'output'}: not a file path ({exc})") from exc
    where = where or f"file {path.name!r}"
    if path.is_dir():
        raise SerializationError(f"{where}: is a directory; expected a file path")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    except OSError as exc:
        raise SerializationError(f"{where}: cannot write ({exc.strerror or exc})") from exc
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise SerializationError(f"{where}: cannot write ({exc.strerror or exc})") from exc
        raise


def write_npz(path: str | os.PathLike, arrays: dict[str, np.ndarray], where: str = "") -> None:
    """Write arrays by name into an .npz atomically; any name is allowed (no keyword clash)."""
    with atomic_write(path, where) as f:
        write_npz_to(f, arrays, where or str(path))


def write_npz_to(f: IO[bytes], arrays: dict[str, np.ndarray], where: str) -> None:
    """Write arrays by name as an .npz archive into an open binary file."""
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
        for name, arr in arrays.items():
            if not isinstance(name, str) or not name or "/" in name or "\x00" in name:
                raise SerializationError(f"{where}: array name {name!r} cannot be stored")
            with z.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(arr), allow_pickle=False)
