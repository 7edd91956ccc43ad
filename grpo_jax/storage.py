"""Where a run's files live: a local directory, or a URL such as ``gs://bucket/run``.

A workdir given as a URL (any ``scheme://``) stays that URL: `normalize` makes plain paths
absolute and leaves URLs as they are, `join` appends with "/", and every read and write goes
through `etils.epath.Path` (`path`), which reaches ``gs://``, ``s3://`` and ``az://`` through
TensorFlow's gfile or fsspec. ``file:///abs/dir`` names a local directory: epath and orbax do
not know the scheme, so `path` hands them its local path.

What needs a local filesystem asks `local_path` (a plain path or a ``file://`` URL has one, an
object store none) and does without on an object store: there the run takes no lock, skips
the free-space check before a checkpoint, rewrites append-only files whole (`append_text`),
and writes TensorBoard events only where tensorboardX has a writer for the scheme.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import urllib.parse
import urllib.request

__all__ = ["append_text", "exists", "is_url", "isdir", "isfile", "join", "listdir",
           "local_path", "makedirs", "move_tree", "normalize", "path", "read_bytes",
           "read_text", "rmtree", "scheme", "write_bytes", "write_text"]


def is_url(location) -> bool:
    """Whether `location` is a URL (``scheme://...``) rather than a plain path."""
    return "://" in os.fspath(location)


def scheme(location) -> str | None:
    """The URL scheme of `location` ("gs", "file", ...), None for a plain path."""
    location = os.fspath(location)
    return location.split("://", 1)[0].lower() if "://" in location else None


def normalize(location) -> str:
    """A plain path made absolute (as `os.path.abspath`); a URL as given, without a
    trailing "/"."""
    location = os.fspath(location)
    if is_url(location):
        head, rest = location.split("://", 1)
        return f"{head}://{rest.rstrip('/')}" if rest.strip("/") else location
    return os.path.abspath(location)


def join(base, *parts: str) -> str:
    """`base` / parts: `os.path.join` for a plain path, "/" for a URL."""
    base = os.fspath(base)
    return posixpath.join(base, *parts) if is_url(base) else os.path.join(base, *parts)


def _file_url_path(url: str) -> str:
    parsed = urllib.parse.urlparse(url)
    if parsed.netloc not in ("", "localhost"):
        raise ValueError(f"{url!r}: expected file:///absolute/path (a file:// URL names a "
                         "local directory, not a host)")
    return urllib.request.url2pathname(parsed.path)


def local_path(location) -> str | None:
    """The local filesystem path of `location`: a plain path itself, a ``file://`` URL its
    path; None for an object store (gs://, s3://, ...)."""
    location = os.fspath(location)
    if not is_url(location):
        return location
    return _file_url_path(location) if scheme(location) == "file" else None


def path(location):
    """`location` as an `etils.epath.Path` (a ``file://`` URL as its local path)."""
    from etils import epath  # pylint: disable=import-outside-toplevel

    location = os.fspath(location)
    if scheme(location) == "file":
        location = _file_url_path(location)
    return epath.Path(location)


def exists(location) -> bool:
    return path(location).exists()


def isdir(location) -> bool:
    return path(location).is_dir()


def isfile(location) -> bool:
    return path(location).is_file()


def listdir(location) -> list[str]:
    """The names in directory `location`; [] when it does not exist."""
    directory = path(location)
    if not directory.is_dir():
        return []
    return sorted(child.name for child in directory.iterdir())


def makedirs(location) -> None:
    """Creates directory `location` and its parents (a no-op where it exists)."""
    path(location).mkdir(parents=True, exist_ok=True)


def read_text(location) -> str:
    return path(location).read_text(encoding="utf-8")


def read_bytes(location) -> bytes:
    return path(location).read_bytes()


def write_bytes(location, data: bytes) -> None:
    """Writes the whole file at once: on a local disk into a temporary file renamed over
    `location` (a crash leaves the old file or the new one, never half of one); on an object
    store as one object write, which is all-or-nothing already."""
    local = local_path(location)
    if local is None:
        path(location).write_bytes(data)
        return
    tmp = f"{local}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, local)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def write_text(location, text: str) -> None:
    """`write_bytes` of UTF-8 text."""
    write_bytes(location, text.encode("utf-8"))


def append_text(location, text: str) -> None:
    """Appends `text` to a file (created when missing). An object store has no appends:
    the object is read and written again whole, which suits files written now and then
    (not once per step: `metrics.MetricWriter` keeps its log in memory there)."""
    local = local_path(location)
    if local is not None:
        with open(local, "a", encoding="utf-8") as f:
            f.write(text)
        return
    old = read_text(location) if exists(location) else ""
    path(location).write_text(old + text, encoding="utf-8")


def rmtree(location) -> None:
    """Removes directory `location` and everything under it (a no-op where it is absent)."""
    local = local_path(location)
    if local is not None:
        shutil.rmtree(local, ignore_errors=True)
    elif path(location).exists():
        path(location).rmtree()


def move_tree(source, target) -> None:
    """Moves directory `source` to `target` (which must not exist): a rename on a local
    disk; on an object store, which renames nothing, a copy of every file then a delete."""
    local_source, local_target = local_path(source), local_path(target)
    if local_source is not None and local_target is not None:
        os.replace(local_source, local_target)
        return
    root, goal = path(source), path(target)
    for directory, _, files in root.walk():
        relative = os.fspath(directory)[len(os.fspath(root)):].strip("/")
        into = goal / relative if relative else goal
        into.mkdir(parents=True, exist_ok=True)
        for name in files:
            (directory / name).copy(into / name, overwrite=True)
    root.rmtree()
