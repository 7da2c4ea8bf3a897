"""The job's output folder: ``pages.jsonl`` shared by every process, and files replaced atomically.

Why: a batch job is killed (preempted nodes, Ctrl-C, OOM) and restarted, and several processes write the
same folder. ``pages.jsonl`` is the work manifest's done list: a page is finished exactly when its record is
in it. :class:`SharedJsonlWriter` is :class:`mmspec.inputs.JsonlWriter` (which reads back a file, drops a
line cut short by a killed writer and knows which ids are done) made safe for several processes:

* every append takes an exclusive ``flock`` on ``pages.jsonl.lock`` and is one ``write`` on an
  ``O_APPEND`` descriptor, then ``fsync``: lines of two processes never interleave, and a record is
  either whole on disk or absent;
* under the lock it first checks the file ends in a newline (a writer killed mid-line, e.g. by a power
  cut, leaves a stub) and cuts the stub: the page behind it is redone, nothing else is lost;
* a record whose id is already in the file is not written again (two processes never both own a page,
  but a user may start two jobs on one folder);
* :meth:`SharedJsonlWriter.refresh` reads what the other processes appended since the last read.

Other files (Markdown, the manifest) are written to a temporary name and renamed over the target, so a
reader sees the old file or the new one, never half of one.

Example:
    >>> import tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "pages.jsonl")
    >>> w = SharedJsonlWriter(p); w.write({"id": "a.png#1", "text": "hi"}), w.write({"id": "a.png#1"})
    (True, False)
    >>> w.close()
    >>> other = SharedJsonlWriter(p); sorted(other.rows)
    ['a.png#1']
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os

from mmspec.inputs import JsonlWriter

__all__ = ["SharedJsonlWriter", "atomic_write"]


def atomic_write(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file renamed over it (readers never see half a file).

    Example:
        >>> import tempfile
        >>> p = os.path.join(tempfile.mkdtemp(), "a", "b.md"); atomic_write(p, "x"); open(p).read()
        'x'
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class SharedJsonlWriter(JsonlWriter):
    """A :class:`~mmspec.inputs.JsonlWriter` that several processes may append to at once.

    Attributes:
        rows: every record read or written so far, by id (kept for assembling documents).
        done: their ids (from :class:`~mmspec.inputs.JsonlWriter`).
    """

    def __init__(self, path, key: str = "id"):
        self.rows: dict = {}
        path = os.path.expanduser(os.fspath(path))
        self._lock_file = open(path + ".lock", "a")
        with self._locked():
            super().__init__(path, key)  # reads the file back and cuts a stub line left by a killed writer
            self._f.close()
            self._offset = os.path.getsize(self.path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    @contextlib.contextmanager
    def _locked(self):
        fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)

    def _take(self, line: str, lineno: int) -> None:
        super()._take(line, lineno)
        row = json.loads(line)
        self.rows[str(row[self.key])] = row

    def _read_new(self) -> list:
        """Rows appended since the last read (call under the lock)."""
        size = os.path.getsize(self.path)
        if size < self._offset:  # only a stub cut by another process shrinks the file
            self._offset = size
        if size == self._offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read(size - self._offset)
        end = data.rfind(b"\n") + 1  # a stub without its newline is left for the next check
        new = []
        for line in data[:end].decode("utf-8").split("\n"):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                rid = str(row[self.key])
            except (json.JSONDecodeError, KeyError, TypeError):
                continue  # a stub that a later writer completed with its own line: that page is redone
            if rid not in self.rows:
                self.rows[rid] = row
                self.done.add(rid)
                new.append(row)
        self._offset += end
        return new

    def _cut_stub(self) -> None:
        """Cut a last line without its newline (a writer died in it); call under the lock."""
        size = os.path.getsize(self.path)
        if size == 0:
            return
        with open(self.path, "rb+") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) == b"\n":
                return
            back = min(size, 1 << 20)
            while True:
                f.seek(size - back)
                chunk = f.read(back)
                nl = chunk.rfind(b"\n")
                if nl >= 0 or back == size:
                    f.truncate(size - back + nl + 1)
                    break
                back = min(size, back * 2)
        self._offset = min(self._offset, os.path.getsize(self.path))

    def refresh(self) -> list:
        """Rows other processes appended since the last read (also recorded in :attr:`rows` / ``done``)."""
        with self._locked():
            return self._read_new()

    def write(self, row: dict) -> bool:
        """Append ``row`` unless a record with its id is already there; returns whether it was written."""
        return self.write_many([row]) == 1

    def write_many(self, rows: list) -> int:
        """Append ``rows`` (one lock, one ``write`` each, one ``fsync``); skip ids already done. Returns how
        many were written."""
        written = 0
        with self._locked():
            self._cut_stub()
            self._read_new()
            for row in rows:
                rid = str(row[self.key])
                if rid in self.done:
                    continue
                os.write(self._fd, (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))
                self.done.add(rid)
                self.rows[rid] = row
                written += 1
            if written:
                os.fsync(self._fd)
            self._offset = os.path.getsize(self.path)
        return written

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._lock_file.close()
