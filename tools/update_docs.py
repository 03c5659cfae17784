"""Regenerate the golden selection table inside docs/selection.md (between its markers).

    python tools/update_docs.py          # rewrite the table
    python tools/update_docs.py --check  # exit 1 if the committed table is stale
"""
import argparse
import sys
from pathlib import Path

from qbackend.golden import BEGIN, END, markdown

DOC = Path(__file__).resolve().parent.parent / "docs" / "selection.md"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = DOC.read_text()
    start, stop = text.index(BEGIN), text.index(END) + len(END)
    updated = text[:start] + markdown() + text[stop:]
    if args.check:
        if updated != text:
            print(f"{DOC} is stale: run python tools/update_docs.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
