"""Write outputs whole or not at all: a failed stage never leaves half a file behind, and two
writers of one file (two renders at once) never share a temporary name."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from . import FlashbenchError


def _readable_by_all(path: str) -> None:
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)  # mkstemp's 0600 would make archived files private


@contextmanager
def staged(path: Path | str):
    """A unique temporary file beside `path` (same suffix, so writers that go by it still do), moved
    onto `path` when the block ends without error and removed otherwise."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=path.suffix)
    os.close(fd)
    try:
        yield Path(tmp)
        _readable_by_all(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def staged_folder(folder: Path | str, expected: list[str]):
    """A unique temporary folder beside `folder` to write the files `expected` into; when the block
    ends without error and every one of them is there, each replaces its namesake in `folder`. On an
    error, or with one missing, `folder` is left as it was."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    try:
        yield tmp
        missing = [name for name in expected if not (tmp / name).is_file()]
        if missing:
            raise FlashbenchError(f"{folder}: {', '.join(missing)} not written; the folder is left as it was")
        folder.mkdir(exist_ok=True)
        for name in expected:
            _readable_by_all(str(tmp / name))
            os.replace(tmp / name, folder / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text(path: Path | str, text: str) -> None:
    with staged(path) as tmp:
        tmp.write_text(text)


def write_json(path: Path | str, data) -> None:
    write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def read_json(path: Path | str):
    """A JSON file's content; a file that is missing, unreadable or not JSON is one clear error."""
    try:
        return json.loads(Path(path).read_text())
    except OSError as e:
        raise FlashbenchError(f"{path}: cannot be read ({e.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FlashbenchError(f"{path}: not valid JSON ({e}): damaged or cut short") from None


def sha256(path: Path | str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def digests(paths) -> dict[str, str]:
    """Each file's sha256 by its path as given: what a record was made from (its `inputs_sha256`)."""
    return {str(path): sha256(path) for path in paths}


def made_from(record: Path | str) -> dict[str, str]:
    """The inputs a record names with their sha256 (`inputs_sha256`); none where the record is missing,
    unreadable or names none (written before records named them)."""
    try:
        named = json.loads(Path(record).read_text()).get("inputs_sha256")
    except (OSError, ValueError, AttributeError):
        return {}
    return named if isinstance(named, dict) else {}
