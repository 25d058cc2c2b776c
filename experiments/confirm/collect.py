"""Copy a confirmatory grid's finished runs into the repository: each run's config.json and summary.json (and
probes.jsonl where it has one), from RUNS_DIR/runs/<cell>/ to DEST/<cell>/. A run without a summary.json is not
finished and is skipped. usage: python experiments/confirm/collect.py RUNS_DIR DEST"""
import shutil
import sys
from pathlib import Path

KEPT = ("config.json", "summary.json", "probes.jsonl")


def collect(runs_dir: Path, dest: Path) -> int:
    copied = 0
    for run in sorted((runs_dir / "runs").iterdir()) if (runs_dir / "runs").is_dir() else []:
        if not (run / "summary.json").is_file():
            continue
        (dest / run.name).mkdir(parents=True, exist_ok=True)
        for name in KEPT:
            if (run / name).is_file():
                shutil.copyfile(run / name, dest / run.name / name)
        copied += 1
    return copied


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    n = collect(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"{n} finished runs copied to {sys.argv[2]}")
