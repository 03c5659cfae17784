"""The golden selection table: for each simulated arch and problem kind, the chosen provider and
every rejection reason. docs/selection.md embeds it; tests/test_golden_table.py checks both."""
from __future__ import annotations

import os

from . import probe, registry
from .problem import ALL_KINDS as PROBLEM_KINDS
from .selection import selection_table

ARCHS = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "gfx942", "gfx950", "cpu")
BEGIN, END = "<!-- golden-table:begin -->", "<!-- golden-table:end -->"


def golden() -> dict:
    """{arch: {kind: (provider or None, {provider: reason})}} with built-in providers only."""
    saved = {k: os.environ.pop(k, None) for k in ("QBACKEND_PROVIDER", "QBACKEND_DISABLE")}
    os.environ["QBACKEND_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    try:
        registry.reload()
        return {arch: selection_table(probe.simulated(arch), PROBLEM_KINDS) for arch in ARCHS}
    finally:
        del os.environ["QBACKEND_DISABLE_PLUGIN_AUTOLOAD"]
        for k, v in saved.items():
            if v is not None:
                os.environ[k] = v
        registry.reload()


def markdown(table: dict | None = None) -> str:
    table = table or golden()
    lines = [BEGIN, "", "| arch | " + " | ".join(f"`{k}`" for k in PROBLEM_KINDS) + " |",
             "|---" * (len(PROBLEM_KINDS) + 1) + "|"]
    for arch, row in table.items():
        lines.append(f"| {arch} | " + " | ".join(f"**{row[k][0] or 'null'}**" for k in PROBLEM_KINDS) + " |")
    lines += ["", "Rejection reasons (every provider not chosen, per arch and kind):", ""]
    for arch, row in table.items():
        for kind in PROBLEM_KINDS:
            name, reasons = row[kind]
            why = "; ".join(f"{p}: {r}" for p, r in reasons.items()) or "-"
            lines.append(f"- `{arch}` `{kind}` -> {name or 'null'}. {why}")
    lines += ["", END]
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown())
