"""Loading providers from entry points, so that a broken plugin never breaks `import qbackend`.

Each entry point of the group `qbackend` is imported and registered on its own; each hook
implementation is called on its own. Failures become PluginError records that `qbackend info`
shows, and the plugin's providers are skipped.
"""
from __future__ import annotations

import importlib.metadata as md
import os
import traceback
from dataclasses import dataclass

import pluggy

from . import hookspecs
from .provider import Provider

AUTOLOAD_ENV = "QBACKEND_DISABLE_PLUGIN_AUTOLOAD"
PLUGINS_ENV = "QBACKEND_PLUGINS"        # entry-point names to load even when autoload is off
BUILTIN_DIST = "qbackend"


@dataclass(frozen=True)
class PluginError:
    source: str      # "distribution version (entry point name)"
    stage: str       # "import", "qbackend_providers", "invalid provider", ...
    message: str


@dataclass(frozen=True)
class LoadedProvider:
    provider: Provider
    source: str      # e.g. "qbackend 0.1.0 (builtin)" or "qbackend-demo-provider 1.2.0"
    builtin: bool


def _source(ep) -> tuple[str, bool]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return f"? ({ep.name})", False
    name = dist.metadata["Name"]
    builtin = name == BUILTIN_DIST
    return f"{name} {dist.version}" + (" (builtin)" if builtin else ""), builtin


def _wanted(ep, builtin: bool) -> bool:
    if builtin:
        return True
    if os.environ.get(AUTOLOAD_ENV, "").strip() not in ("", "0"):
        explicit = {n.strip() for n in os.environ.get(PLUGINS_ENV, "").split(",") if n.strip()}
        return ep.name in explicit
    return True


def _brief(exc: BaseException) -> str:
    frame = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    where = f" ({frame[0].filename}:{frame[0].lineno})" if frame else ""
    return f"{type(exc).__name__}: {exc}{where}"


def load(extra_plugins=()) -> tuple[pluggy.PluginManager, list[LoadedProvider], list[PluginError]]:
    """Import entry points, collect providers. `extra_plugins`: (source, plugin object) pairs
    registered as if they came from entry points (for tests and embedding)."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    errors: list[PluginError] = []
    sources: dict[str, tuple[str, bool]] = {}
    eps = md.entry_points(group=hookspecs.ENTRY_POINT_GROUP)
    for ep in sorted(eps, key=lambda e: e.name):
        source, builtin = _source(ep)
        if not _wanted(ep, builtin):
            continue
        label = f"{source} [{ep.name}]"
        try:
            plugin = ep.load()
            pm.register(plugin, name=f"ep:{ep.name}")
        except Exception as exc:
            errors.append(PluginError(label, "import", _brief(exc)))
            continue
        sources[f"ep:{ep.name}"] = (label if not builtin else source, builtin)
    for source, plugin in extra_plugins:
        name = f"extra:{source}"
        try:
            pm.register(plugin, name=name)
        except Exception as exc:
            errors.append(PluginError(source, "register", _brief(exc)))
            continue
        sources[name] = (source, False)

    loaded: list[LoadedProvider] = []
    names: dict[str, str] = {}
    for impl in pm.hook.qbackend_providers.get_hookimpls():
        source, builtin = sources.get(impl.plugin_name, (impl.plugin_name, False))
        try:
            result = impl.function()
        except Exception as exc:
            errors.append(PluginError(source, "qbackend_providers", _brief(exc)))
            continue
        for provider in result or ():
            problem = _invalid(provider)
            if problem is None and provider.name in names:
                problem = f"name {provider.name!r} already registered by {names[provider.name]}"
            if problem:
                errors.append(PluginError(source, "invalid provider", problem))
                continue
            names[provider.name] = source
            loaded.append(LoadedProvider(provider, source, builtin))
    return pm, loaded, errors


def _invalid(provider) -> str | None:
    if not isinstance(provider, Provider):
        return f"{provider!r} is not a qbackend.Provider"
    if not isinstance(provider.name, str) or not provider.name.isidentifier():
        return f"provider name {provider.name!r} must be an identifier"
    if not isinstance(provider.priority, int):
        return f"provider {provider.name}: priority must be an int"
    return None
