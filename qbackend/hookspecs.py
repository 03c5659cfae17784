"""The plugin hooks. These docstrings are the reference for plugin authors.

A plugin is a module (or object) with functions marked `@qbackend.hookimpl`, registered through the
Python entry-point group `qbackend` in its distribution's metadata, e.g. in pyproject.toml:

    [project.entry-points.qbackend]
    myprovider = "my_package.qbackend_plugin"

qbackend's own providers are registered through this same group and these same hooks.
"""
from __future__ import annotations

import pluggy

PROJECT = "qbackend"
ENTRY_POINT_GROUP = "qbackend"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def qbackend_providers():
    """Return a list of `qbackend.Provider` instances this plugin adds.

    Called once, the first time qbackend needs its providers (not at import). Each provider needs a
    unique `name`; `priority` orders the candidates (built-ins: cutlass 100, marlin 90,
    hipblaslt 80, reference 0). A provider that raises here, or returns something that is not a
    Provider, is reported by `qbackend info` and skipped.
    """


@hookspec(firstresult=True)
def qbackend_select(device, problem, verdicts):
    """Override the choice of provider for one (device, problem).

    `device` is a `qbackend.DeviceInfo`, `problem` a `qbackend.Problem`, `verdicts` a list of
    (provider name, `qbackend.Verdict`) in priority order. Return a provider name to choose it (its
    verdict must be ok or forceable), or None to leave the choice to the next plugin and then to
    priority order. The answer is cached per (device, problem): it must not depend on tensor data.
    """


@hookspec
def qbackend_native_libraries():
    """Return a list of dicts describing native libraries this plugin uses, for `qbackend info`:
    {"name": str, "path": str | None, "loaded": bool, "archs": [str], "error": str | None}.
    Loading the library must not initialize a GPU context."""
