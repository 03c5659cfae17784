"""Module-name patterns, as used in `ignore` lists (ours and compressed-tensors').

A pattern is either
  "re:<regex>"  matched with re.match against the full dotted name (compressed-tensors' rule), or
  a glob      matched against the full name or any dotted suffix of it, so "lm_head" matches
              "lm_head" and "model.lm_head", "*.query" matches "encoder.layer.0.attention.self.query",
              and "*embed*" matches every name containing "embed".
"""
from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable


def matches(name: str, pattern: str) -> bool:
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, "*." + pattern)


def matches_any(name: str, patterns: Iterable[str]) -> bool:
    return any(matches(name, p) for p in patterns)


def check_patterns(patterns: Iterable[str]) -> list[str]:
    """Validate a pattern list up front so that a typo in a regex fails before any work."""
    out = []
    for p in patterns:
        if not isinstance(p, str) or not p:
            raise ValueError(f"ignore pattern must be a non-empty string, got {p!r}")
        if p.startswith("re:"):
            try:
                re.compile(p[3:])
            except re.error as e:
                raise ValueError(f"ignore pattern {p!r} is not a valid regular expression: {e}") from None
        out.append(p)
    return out
