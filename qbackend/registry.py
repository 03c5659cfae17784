"""Choosing a provider: per (device, problem), cached, explainable, overridable.

Order of decision for one (device, problem):
  1. providers named in QBACKEND_DISABLE (comma-separated) are out;
  2. QBACKEND_PROVIDER=name forces that provider for every problem it can run (its verdict is ok
     or merely 'forceable', e.g. marlin on sm_90); problems it cannot run go on to step 3;
  3. the `qbackend_select` hook may name a provider;
  4. otherwise the first provider in priority order whose verdict is ok.
The decision is cached, so the per-call cost is one lookup in a bounded cache (DECISIONS_MAX
entries, least recently used dropped first; the key is (device, Problem), and a Problem holds no
sizes, only dtypes, granularities, alignment classes and the group size).
"""
from __future__ import annotations

import os
import threading
import warnings
from dataclasses import dataclass

from . import bounded, fallback, plugins, probe
from .probe import DeviceInfo
from .problem import Problem, Verdict
from .provider import Declined

FORCE_ENV = "QBACKEND_PROVIDER"
DISABLE_ENV = "QBACKEND_DISABLE"
DECISIONS_MAX = 4096


class NoProviderError(RuntimeError):
    """No enabled provider can serve a problem on a device."""


@dataclass(frozen=True)
class Decision:
    provider: object | None      # the chosen Provider, or None
    how: str                     # "priority", "forced", "hook", or "none"
    verdicts: tuple              # ((name, Verdict), ...) in priority order

    @property
    def name(self) -> str | None:
        return self.provider.name if self.provider is not None else None

    def reason(self) -> str:
        return "; ".join(f"{n}: {v.reason}" for n, v in self.verdicts if not v.ok)


class Registry:
    def __init__(self, extra_plugins=()):
        self.pm, loaded, self.errors = plugins.load(extra_plugins)
        loaded.sort(key=lambda lp: -lp.provider.priority)
        self.loaded = loaded
        self.providers = {lp.provider.name: lp.provider for lp in loaded}
        self.sources = {lp.provider.name: lp.source for lp in loaded}
        self.disabled = {n.strip() for n in os.environ.get(DISABLE_ENV, "").split(",") if n.strip()}
        unknown = sorted(self.disabled - set(self.providers))
        if unknown:
            warnings.warn(f"qbackend: {DISABLE_ENV} names no provider called {', '.join(map(repr, unknown))} "
                          f"(known: {', '.join(self.providers)}); ignored", stacklevel=3)
        self.forced = os.environ.get(FORCE_ENV, "").strip() or None
        if self.forced and self.forced not in self.providers:
            raise NoProviderError(f"{FORCE_ENV}={self.forced}: no such provider "
                                  f"(known: {', '.join(self.providers)})")
        self._cache = bounded.cache("registry.decisions", DECISIONS_MAX)   # (device key, problem) -> Decision
        # (device key, problem) whose reference fallback was reported
        self._warned = bounded.cache("registry.warned", DECISIONS_MAX)

    def verdicts(self, device: DeviceInfo, problem: Problem) -> tuple:
        out = []
        for name, provider in self.providers.items():
            if name in self.disabled:
                out.append((name, Verdict(False, f"disabled by {DISABLE_ENV}")))
                continue
            try:
                verdict = provider.supports(device, problem)
            except Exception as exc:  # a provider bug must not take the caller down
                verdict = Verdict(False, f"supports() raised {type(exc).__name__}: {exc}")
            out.append((name, verdict))
        return tuple(out)

    def decide(self, device: DeviceInfo, problem: Problem) -> Decision:
        key = (device.key, problem)
        decision = self._cache.get(key)
        if decision is None:  # decided once per key, even when threads ask at the same time
            decision = self._cache.get_or_make(key, lambda: self._decide(device, problem))
        return decision

    def _decide(self, device: DeviceInfo, problem: Problem) -> Decision:
        verdicts = self.verdicts(device, problem)
        by_name = dict(verdicts)
        if self.forced and self.forced not in self.disabled:
            v = by_name[self.forced]
            if v.ok or v.forceable:
                return Decision(self.providers[self.forced], "forced", verdicts)
        try:
            choice = self.pm.hook.qbackend_select(device=device, problem=problem,
                                                  verdicts=list(verdicts))
        except Exception as exc:
            warnings.warn(f"qbackend: qbackend_select hook raised {exc!r}; ignoring it", stacklevel=3)
            choice = None
        if choice is not None:
            v = by_name.get(choice)
            if v is not None and (v.ok or v.forceable) and choice not in self.disabled:
                return Decision(self.providers[choice], "hook", verdicts)
            warnings.warn(f"qbackend: qbackend_select chose {choice!r}, which cannot serve "
                          f"{problem.describe()}; ignoring it", stacklevel=3)
        for name, v in verdicts:
            if v.ok:
                return Decision(self.providers[name], "priority", verdicts)
        return Decision(None, "none", verdicts)

    def _warn_if_fallback(self, device: DeviceInfo, problem: Problem, decision: Decision) -> None:
        # A GPU call served by the reference provider is correct but slow: say so, with its cost
        # and what would give a fast path, once per problem.
        # Only calls warn; selection queries (qbackend info, selection_table) only report.
        if device.backend in ("cuda", "hip") and not device.simulated and decision.name == "reference" \
                and decision.how == "priority" and (device.key, problem) not in self._warned:
            self._warned.put((device.key, problem), True)
            warnings.warn(fallback.message(device, problem, decision), stacklevel=3)

    def select(self, device: DeviceInfo, problem: Problem):
        return self._served(device, problem).provider

    def _served(self, device: DeviceInfo, problem: Problem) -> Decision:
        """The decision for a call: warns of a reference fallback, raises when no provider serves."""
        decision = self.decide(device, problem)
        self._warn_if_fallback(device, problem, decision)
        if decision.provider is None:
            raise NoProviderError(f"qbackend: no provider serves {problem.describe()} on "
                                  f"{device.arch}: {decision.reason()}")
        return decision

    def run(self, device: DeviceInfo, problem: Problem, call):
        """call(provider) on the selected provider. One that raises Declined passes the call to the
        next provider, in priority order, that accepts the problem (a forced provider's decline is
        an error: the user asked for that provider)."""
        decision = self._served(device, problem)
        provider = decision.provider
        try:
            return call(provider)
        except Declined as exc:
            if decision.how == "forced":
                raise NoProviderError(f"qbackend: {provider.name} (forced by {FORCE_ENV}) declined "
                                      f"{problem.describe()}: {exc}") from exc
            declined = [(provider.name, str(exc))]
        for name, verdict in decision.verdicts:
            if not verdict.ok or name in self.disabled or name in dict(declined):
                continue
            self._warn_declined(device, problem, declined, name)
            try:
                return call(self.providers[name])
            except Declined as exc:
                declined.append((name, str(exc)))
        raise NoProviderError(f"qbackend: every provider that accepts {problem.describe()} on {device.arch} "
                              "declined it: " + "; ".join(f"{n}: {why}" for n, why in declined))

    def _warn_declined(self, device: DeviceInfo, problem: Problem, declined: list, served_by: str) -> None:
        key = (device.key, problem, tuple(n for n, _ in declined))
        if key not in self._warned:
            self._warned.put(key, True)
            why = "; ".join(f"{n} declined: {reason}" for n, reason in declined)
            warnings.warn(f"qbackend: {problem.describe()} on {device.arch}: {why}; served by {served_by}",
                          stacklevel=4)

    def native_libraries(self) -> list:
        libs = []
        for impl in self.pm.hook.qbackend_native_libraries.get_hookimpls():
            try:
                libs.extend(impl.function() or ())
            except Exception as exc:
                libs.append({"name": impl.plugin_name, "path": None, "loaded": False, "archs": [],
                             "error": f"{type(exc).__name__}: {exc}"})
        return libs


_registry: Registry | None = None
_registry_lock = threading.Lock()


def get() -> Registry:
    global _registry
    if _registry is None:
        with _registry_lock:
            if _registry is None:
                _registry = Registry()
    return _registry


def reload(extra_plugins=()) -> Registry:
    """Re-read entry points and environment variables; drop cached decisions and device records."""
    global _registry
    with _registry_lock:
        probe.reset()
        _registry = Registry(extra_plugins)
    return _registry
