"""Write outputs whole or not at all: a failed stage never leaves half a file behind."""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path


def write_text(path: Path | str, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would make archived files private
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_json(path: Path | str, data) -> None:
    write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def read_json(path: Path | str):
    return json.loads(Path(path).read_text())


def sha256(path: Path | str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
