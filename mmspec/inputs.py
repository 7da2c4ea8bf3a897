"""A user's own requests as JSON lines, text quality against references, and the JSONL output writer.

Why: a user wants to know what mmspec does on *their* pages, not on the testbed's. ``mmspec bench --inputs``
and ``mmspec generate --inputs`` read one request a line::

    {"images": ["scans/p1.png", "scans/p2.png"], "prompt": "Transcribe these pages.", "reference": "..."}
    {"prompt": "A text-only request"}

Image paths are relative to the JSONL file's folder; ``reference`` (optional) is the expected answer, from
which the bench computes character error rate and exact match; ``id`` (optional) names the request (default
``<file stem>/<line>``). Every bad line is an :class:`~mmspec.InvalidInputError` that names the file and
line, raised before any model is loaded.

The writer (:class:`JsonlWriter`) appends one line per finished request and flushes it, so a job that dies
loses nothing already written; reopened on the same file it reports which requests are done, so the job
resumes without writing any of them twice.

Example:
    >>> import json, os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> with open(os.path.join(d, "req.jsonl"), "w") as f:
    ...     _ = f.write(json.dumps({"prompt": "Say hi.", "reference": "hi"}) + "\\n")
    >>> [(e.id, e.prompt, e.target, e.images) for e in load_requests(os.path.join(d, "req.jsonl"))]
    [('req/1', 'Say hi.', 'hi', [])]
"""

from __future__ import annotations

import json
import os

from .errors import InvalidImageError, InvalidInputError
from .workloads import Example

__all__ = ["load_requests", "edit_distance", "text_quality", "JsonlWriter", "REQUEST_KEYS", "check_output", "generate_requests"]

REQUEST_KEYS = ("images", "prompt", "reference", "id")
"""The keys a request line may hold (any other key is an error: a typo should not pass silently)."""


def load_requests(path) -> list[Example]:
    """The requests of the JSONL file at ``path`` as :class:`~mmspec.workloads.Example` items.

    ``Example.images`` holds absolute paths (the pipeline loads them with its own image loader);
    ``Example.target`` is the line's ``reference`` (``""`` when absent; ``meta["has_reference"]`` tells an
    empty reference from none).

    Raises:
        InvalidInputError: a missing or empty file, or a bad line (invalid JSON, not an object, unknown keys,
            no prompt, a prompt or image path that is not a string, a duplicate id), naming file and line.
        InvalidImageError: an image file that does not exist (file, line and path named).

    Example:
        >>> load_requests("requests.jsonl")[0].images                     # doctest: +SKIP
        ['/data/scans/p1.png']
    """
    path = os.path.expanduser(os.fspath(path))
    if not os.path.isfile(path):
        raise InvalidInputError(f"no such requests file: {path}")
    base = os.path.dirname(os.path.abspath(path))
    stem = os.path.splitext(os.path.basename(path))[0]
    out, seen = [], {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}, line {lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise InvalidInputError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(row, dict):
                raise InvalidInputError(f"{where}: a request must be a JSON object, got {type(row).__name__}")
            unknown = sorted(set(row) - set(REQUEST_KEYS))
            if unknown:
                raise InvalidInputError(f"{where}: unknown keys {unknown}; a request has {', '.join(REQUEST_KEYS)}")
            prompt = row.get("prompt")
            if not isinstance(prompt, str) or not prompt.strip():
                raise InvalidInputError(f"{where}: 'prompt' must be a non-empty string (got {prompt!r})")
            images = row.get("images", [])
            if isinstance(images, str):
                images = [images]
            if not isinstance(images, list) or not all(isinstance(p, str) and p for p in images):
                raise InvalidInputError(f"{where}: 'images' must be a list of file paths (got {images!r})")
            resolved = []
            for p in images:
                full = p if os.path.isabs(p) else os.path.join(base, p)
                if not os.path.isfile(full):
                    raise InvalidImageError(f"{where}: image file not found: {p} (paths are relative to {base})")
                resolved.append(full)
            ref = row.get("reference")
            if ref is not None and not isinstance(ref, str):
                raise InvalidInputError(f"{where}: 'reference' must be a string (got {type(ref).__name__})")
            rid = row.get("id", f"{stem}/{lineno}")
            if not isinstance(rid, (str, int)) or isinstance(rid, bool):
                raise InvalidInputError(f"{where}: 'id' must be a string or an integer (got {rid!r})")
            rid = str(rid)
            if rid in seen:
                raise InvalidInputError(f"{where}: duplicate id {rid!r} (first on line {seen[rid]})")
            seen[rid] = lineno
            out.append(Example(id=rid, prompt=prompt, target=ref or "", images=resolved,
                               meta={"line": lineno, "has_reference": ref is not None, "source": path}))
    if not out:
        raise InvalidInputError(f"{path} holds no requests (one JSON object a line)")
    return out


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance between two strings (insertions, deletions, substitutions each cost 1).

    Example:
        >>> edit_distance("kitten", "sitting")
        3
    """
    from rapidfuzz.distance import Levenshtein

    return int(Levenshtein.distance(a, b))


def text_quality(texts, references) -> dict | None:
    """Character error rate (edit distance over reference characters, pooled) and exact match of ``texts``
    against ``references``, both stripped; pairs whose reference is ``None`` are left out (``None`` if none
    is left).

    Example:
        >>> text_quality(["abc", "xy", "q"], ["abd", "xy", None])
        {'n': 2, 'exact_match': 0.5, 'char_error_rate': 0.2}
    """
    pairs = [(t.strip(), r.strip()) for t, r in zip(texts, references) if r is not None]
    if not pairs:
        return None
    errors = sum(edit_distance(t, r) for t, r in pairs)
    chars = sum(max(1, len(r)) for _, r in pairs)
    return {"n": len(pairs), "exact_match": sum(t == r for t, r in pairs) / len(pairs),
            "char_error_rate": errors / chars}


class JsonlWriter:
    """Append-only JSON-lines output, one line per finished request, flushed as written.

    Opening an existing file keeps its complete lines (a last line cut short by a killed job, one that does
    not parse, is dropped from the file) and exposes their ids as :attr:`done` (with each row's
    ``request`` fingerprint in :attr:`fingerprints`), so a rerun skips them; nothing is written twice. A
    file that holds anything but output lines of this kind is refused, never rewritten.

    Example:
        >>> import tempfile
        >>> p = os.path.join(tempfile.mkdtemp(), "out.jsonl")
        >>> with JsonlWriter(p) as w:
        ...     w.write({"id": "a", "text": "hi"})
        >>> JsonlWriter(p).done
        {'a'}
    """

    def __init__(self, path, key: str = "id"):
        self.path = self.check(path)
        self.key = key
        self.done: set = set()
        self.fingerprints: dict = {}
        if os.path.isfile(self.path):
            with open(self.path, "rb") as f:
                data = f.read()
            try:
                lines = data.decode("utf-8").split("\n")
            except UnicodeDecodeError:
                raise InvalidInputError(f"{self.path} is not a text file of output lines; use another --out") from None
            tail = lines.pop()  # after the last newline: empty, or what a killed writer left
            for lineno, line in enumerate(lines, 1):
                if line.strip():
                    self._take(line, lineno)
            if tail.strip():
                try:
                    self._take(tail, len(lines) + 1)
                    with open(self.path, "ab") as f:  # a complete last row that only lacks its newline
                        f.write(b"\n")
                except InvalidInputError:
                    if not self.done:  # nothing of ours before it: not our file, never rewrite it
                        raise
                    with open(self.path, "wb") as f:
                        f.write(data[: data.rfind(b"\n") + 1])
        self._f = open(self.path, "a", encoding="utf-8")

    @staticmethod
    def check(path) -> str:
        """The output path, expanded, if it can be one (its folder exists, it is not a folder); said before any
        model loads. Returns the path. The contents of an existing file are checked when it is opened.

        Example:
            >>> JsonlWriter.check("/no/such/folder/out.jsonl")
            Traceback (most recent call last):
            ...
            mmspec.errors.InvalidInputError: output folder does not exist: /no/such/folder
        """
        path = os.path.expanduser(os.fspath(path))
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise InvalidInputError(f"output folder does not exist: {folder}")
        if os.path.isdir(path):
            raise InvalidInputError(f"--out {path} is a folder; name a .jsonl file")
        return path

    def _take(self, line: str, lineno: int) -> None:
        try:
            row = json.loads(line)
            rid = str(row[self.key])
        except (json.JSONDecodeError, KeyError, TypeError):
            raise InvalidInputError(f"{self.path}, line {lineno}: not an output line of this job; "
                                    "use another --out") from None
        self.done.add(rid)
        self.fingerprints[rid] = row.get("request")

    def write(self, row: dict) -> None:
        """Append ``row`` (it must carry the key) as one line and flush it to disk."""
        self._f.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())
        self.done.add(str(row[self.key]))
        self.fingerprints[str(row[self.key])] = row.get("request")

    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def check_output(requests: list, out) -> None:
    """Refuse an ``out`` that cannot take the answers to ``requests`` (no such folder, a folder, the requests
    file itself), before any model loads.

    Example:
        >>> check_output([], "/no/such/folder/out.jsonl")
        Traceback (most recent call last):
        ...
        mmspec.errors.InvalidInputError: output folder does not exist: /no/such/folder
    """
    JsonlWriter.check(out)
    ins = {r.meta.get("source") for r in requests} - {None}
    if any(os.path.exists(out) and os.path.samefile(out, p) for p in ins):
        raise InvalidInputError(f"--out {out} is the requests file itself; name another file")


def generate_requests(pipe, requests: list, out, batch_size: int = 1, progress: bool = True,
                      **generate_kwargs) -> dict:
    """Run ``pipe`` over ``requests`` (from :func:`load_requests`) in input order, ``batch_size`` at a time,
    writing one line per request to the JSONL file ``out``: ``{"id", "line", "text", "stats"}`` (the
    batch's :class:`~mmspec.SpecStats` as a dict, shared by the rows of a batch), plus ``"reference"``
    when the request has one.

    Requests already in ``out`` (a rerun after a job died) are skipped, so each is written once. Returns
    ``{"written": k, "skipped": m, "out": path}``.

    Example:
        >>> pipe = MMSpecPipeline.from_pretrained("path/to/vlm", drafter="lookup")              # doctest: +SKIP
        >>> generate_requests(pipe, load_requests("pages.jsonl"), "out.jsonl", max_new_tokens=256)  # doctest: +SKIP
        {'written': 12, 'skipped': 0, 'out': 'out.jsonl'}
    """
    from tqdm.auto import tqdm

    import hashlib

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidInputError(f"batch_size must be a positive integer (got {batch_size!r})")
    check_output(requests, out)
    settings = json.dumps(generate_kwargs, sort_keys=True, default=str)

    def fingerprint(r) -> str:
        # what the answer depends on: a rerun must not keep an answer to another prompt under the same id
        blob = json.dumps([r.prompt, [os.path.basename(p) for p in r.images], settings])
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    with JsonlWriter(out) as writer:
        for r in requests:
            old = writer.fingerprints.get(r.id, "absent")
            if old not in ("absent", None, fingerprint(r)):
                raise InvalidInputError(f"{out} holds an answer for id {r.id!r} to another request or with other "
                                        "generation settings; use another --out (or give the lines stable ids)")
        todo = [r for r in requests if r.id not in writer.done]
        skipped = len(requests) - len(todo)
        with tqdm(total=len(requests), initial=skipped, desc="mmspec generate", unit="req", disable=not progress,
                  file=None) as bar:
            for i in range(0, len(todo), batch_size):
                chunk = todo[i:i + batch_size]
                result = pipe(images=[list(r.images) for r in chunk], prompt=[r.prompt for r in chunk],
                              **generate_kwargs)
                stats = result.stats.to_dict()
                for r, text in zip(chunk, result.text):
                    row = {"id": r.id, "line": r.meta.get("line"), "request": fingerprint(r), "text": text,
                           "stats": stats}
                    if r.meta.get("has_reference"):
                        row["reference"] = r.target
                    writer.write(row)
                bar.update(len(chunk))
    return {"written": len(todo), "skipped": skipped, "out": os.fspath(out)}
