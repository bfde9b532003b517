"""Which folders under results/ are GPU archives: a folder named as a GPU's slug (nvidia-h200) that
holds the four tables a report is rendered from. Anything else there (a copy such as
nvidia-h200.bak, a half-finished folder) is no archive, and is passed over, saying why. A GPU's
report folder (reports/nvidia-h200/) whose archive is gone, though, is an error (vanished)."""
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


def given_twice(folders) -> list[str]:
    """The folders, as given, that name one folder more than once (`results/a` and `x/../results/a`)."""
    resolved = [Path(f).resolve() for f in folders]
    return sorted({str(f) for f, r in zip(folders, resolved) if resolved.count(r) > 1})


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


def vanished(results: Path | str, reports: Path | str, running: str | None = None) -> dict[str, list[str]]:
    """The GPUs whose report folder under `reports` holds files while their folder under `results` lacks
    any of TABLES (deleted, or the folder renamed), each with the tables it lacks. Passed over, such a
    GPU would drop out of the side by side while its reports stayed. `running` is the GPU this run
    measures: its run makes its tables (on its first run it has none yet), so it is never among them."""
    gone = {}
    folders = sorted(p for p in Path(reports).iterdir() if p.is_dir()) if Path(reports).is_dir() else []
    for folder in folders:
        if folder.name.startswith(".") or folder.name == running or slugify(folder.name) != folder.name:
            continue  # a render's staging, the GPU being measured, no GPU's folder
        if any(p.is_file() and not p.name.startswith(".") for p in folder.iterdir()):
            if missing := missing_tables(Path(results) / folder.name):
                gone[folder.name] = missing
    return gone


def vanished_message(gone: dict[str, list[str]], results: Path | str = "results", reports: Path | str = "reports") -> str:
    """One line for vanished's GPUs: what is gone, and how to restore it or retire the GPU."""
    results, reports, gpus = Path(results), Path(reports), list(gone)

    def lacks(gpu: str) -> str:
        folder = results / gpu
        return f"{folder}/ lacks {', '.join(gone[gpu])}" if folder.is_dir() else f"{folder}/ is not there"

    folders = " ".join(str(results / gpu) for gpu in gpus)
    if len(gpus) == 1:
        archived = f"{reports / gpus[0]}/ is archived, but the tables it is"
        retire = f"that GPU by removing both {results / gpus[0]}/ and {reports / gpus[0]}/"
    else:
        named = ", ".join(f"{reports / gpu}/" for gpu in gpus[:-1]) + f" and {reports / gpus[-1]}/"
        archived = f"{named} are archived, but the tables they are"
        retire = f"a GPU by removing both its {results}/<gpu>/ and {reports}/<gpu>/"
    return (f"{archived} rendered from are gone ({'; '.join(map(lacks, gpus))}): restore them with "
            f"`git checkout {folders}` (or `git restore {folders}`), or retire {retire}")
