"""What every benchmark's report shares: its header (date, commit, GPU, torch), the common
options, the JSON and markdown files, and the two-way tables (after the layer, back to back)."""

import argparse
import datetime
import json
import os
import subprocess
from pathlib import Path

import torch


def git_commit() -> str:
    if os.environ.get("KIMI_COMMIT"):  # set by tools/device_run.sh: GPU machines get no .git
        return os.environ["KIMI_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def report_header(**fields) -> dict:
    """The start of every benchmark's JSON report: when, which commit, GPU and torch, then
    `fields`."""
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, **fields,
    }


def parse_bench_args(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """The options every benchmark takes (--replays, --out), parsed; a GPU is required."""
    parser.add_argument("--replays", type=int, default=30, help="graph replays (at least 30)")
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("the benchmark needs a CUDA GPU")
    args.out.mkdir(parents=True, exist_ok=True)
    args.replays = max(30, args.replays)
    return args


def save_report(out: Path, stem: str, report: dict, table: str) -> None:
    """<out>/<stem>.json (the raw report) and <out>/<stem>.md (the table), then the table."""
    (out / f"{stem}.json").write_text(json.dumps(report, indent=1))
    (out / f"{stem}.md").write_text(table)
    print(table)


def two_way_markdown(report, what, table_key, row_keys) -> str:
    """A two-way report: the run's header line, then two_way_tables."""
    header = f"{report['gpu']}, torch {report['torch']}, commit {report['commit']}, {report['date']}: {what}"
    return "\n".join([header, *two_way_tables(report["results"], table_key, row_keys)]) + "\n"


def two_way_tables(results, group: str, columns: tuple) -> list:
    """Markdown lines: one table per value of `group`, a row per value of the `columns`, a
    cell per M: "after the layer (back to back)" (bench.chain, bench.precisions)."""
    lines = []
    m_list = list(dict.fromkeys(r["M"] for r in results))
    for name in dict.fromkeys(r[group] for r in results):
        rows = [r for r in results if r[group] == name]
        lines += ["", f"{name}:", "", "| " + " | ".join(columns) + " | " + " | ".join(f"M = {m}" for m in m_list)
                  + " |", "|---" * (len(columns) + len(m_list)) + "|"]
        for key in dict.fromkeys(tuple(r[c] for c in columns) for r in rows):
            cells = {r["M"]: r for r in rows if tuple(r[c] for c in columns) == key}
            lines.append("| " + " | ".join(key) + " | " + " | ".join(
                f"{cells[m]['after_layer']:.2f} ({cells[m]['back_to_back']:.2f})" if m in cells else ""
                for m in m_list) + " |")
    return lines
