"""Which folders under results/ are GPU archives: a folder named as a GPU's slug (nvidia-h200) that
holds the four tables a report is rendered from. Anything else there (a copy such as
nvidia-h200.bak, a half-finished folder) is no archive, and is passed over, saying why."""
from __future__ import annotations

from pathlib import Path

from . import FlashbenchError
from .gpu import slugify

TABLES = ("summary.csv", "resources.csv", "profile.csv", "kernels.json")
# results/<gpu>/<name>.csv of a run that had the head-to-head and cycles stages: its report's pages say
# where a run had none
OPTIONAL_TABLES = ("head_to_head", "cycles")


def missing_tables(folder: Path | str) -> list[str]:
    return [name for name in TABLES if not (Path(folder) / name).is_file()]


def require_tables(folder: Path | str, names=TABLES) -> None:
    missing = [name for name in missing_tables(folder) if name in names]
    if missing:
        raise FlashbenchError(f"{folder} lacks {', '.join(missing)}: run the pipeline on that GPU first")


def find(results: Path | str, running: str | None = None) -> tuple[list[str], list[str]]:
    """The slugs of the archives under `results`, and one line for each other folder there (hidden
    ones, a render's staging, aside) saying why it is skipped. `running` is the GPU this run
    measures: its folder is being written, not skipped."""
    archives, skipped = [], []
    folders = sorted(p for p in Path(results).iterdir() if p.is_dir()) if Path(results).is_dir() else []
    for folder in folders:
        if folder.name.startswith(".") or folder.name == running:
            continue
        missing = missing_tables(folder)
        if slugify(folder.name) != folder.name:
            skipped.append(f"{folder}: not a GPU archive (not a GPU's folder name, such as nvidia-h200), skipped")
        elif missing:
            skipped.append(f"{folder}: not a GPU archive (no {', '.join(missing)}), skipped")
        else:
            archives.append(folder.name)
    return archives, skipped
