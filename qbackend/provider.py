"""What a provider is: capabilities declared as data, plus the code that runs the math.

A provider lists Rules. A Rule says: this op, on these backends and archs, with these dtypes,
scale granularities, output dtypes and alignment. `Provider.supports` checks the rules in order and,
when none fits, reports the mismatch of the rule that came closest ("needs sm_89+" beats "wrong
dtype" when the dtype was right; of rules that came as close, the one for the device's arch).
Subclasses add run-time conditions (a native library built for the arch) in `runtime_verdict` and
implement `scaled_mm` / `quantize`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import dtypes as qd
from .probe import DeviceInfo
from .problem import Granularity, Op, Problem, Verdict


def _names(items) -> str:
    return ", ".join(sorted(str(i) if not isinstance(i, torch.dtype) else qd.dtype_name(i) for i in items))


@dataclass(frozen=True)
class Rule:
    op: Op
    backends: frozenset                     # {"cuda"}, {"hip"}, {"cuda", "hip", "cpu"}
    dtype_pairs: frozenset                  # {(a_dtype, b_dtype)}; quantize: (input, quantized)
    scale_a: frozenset = frozenset()        # accepted Granularity values (quantize: granularity)
    scale_b: frozenset = frozenset()
    out_dtypes: frozenset = frozenset()
    min_sm: int | None = None               # NVIDIA compute capability range, as ints (89 = sm_89)
    max_sm: int | None = None
    forceable_max_sm: int | None = None     # newer chips where it runs if forced by name
    forceable_backends: frozenset = frozenset()  # other backends where it runs if forced by name
    archs: frozenset | None = None          # explicit arch names (AMD)
    bias: bool = True
    k_align: int = 1                        # K (and N) must be multiples of these
    n_align: int = 1
    static: frozenset = frozenset({False, True})
    scale_ub: bool = True
    why_arch: str = ""                      # e.g. "fp8 tensor cores"
    # Sums fp8 products with the tensor cores' reduced-precision accumulator: serves
    # accumulate="fast" only.
    fast_accumulation: bool = False

    def mismatch(self, device: DeviceInfo, p: Problem) -> tuple[int, str | None, bool]:
        """(how many checks passed, first failed check's reason or None, forceable)."""
        if p.op is not self.op:
            return 0, f"does not implement {p.op}", False
        # The reason, where the device is outside the rule's backends or arch range but the rule
        # may be forced there.
        outside = None
        if device.backend not in self.backends:
            if device.backend not in self.forceable_backends:
                return 1, f"runs on {_names(self.backends)}, not {device.backend}", False
            outside = (f"serves {_names(self.backends)}, not {device.backend}; "
                       "force it with QBACKEND_PROVIDER")
        if (p.a_dtype, p.b_dtype) not in self.dtype_pairs:
            pairs = sorted(f"{qd.dtype_name(a)} x {qd.dtype_name(b)}" for a, b in self.dtype_pairs)
            return 2, (f"takes {', '.join(pairs)}, not {qd.dtype_name(p.a_dtype)} x "
                       f"{qd.dtype_name(p.b_dtype)}"), False
        why = f" ({self.why_arch})" if self.why_arch else ""
        if self.archs is not None and device.arch not in self.archs:
            return 3, f"needs {_names(self.archs)}{why}; device is {device.arch}", False
        if not self.takes_arch(device):  # outside the sm range
            lo, sm = self.min_sm or 0, device.sm
            span = (f"sm_{lo}+" if self.max_sm is None else f"sm_{lo} only" if self.max_sm == lo
                    else f"sm_{lo} to sm_{self.max_sm}")
            if not (sm is not None and lo <= sm <= (self.forceable_max_sm or 0)):
                # A rule that takes everything but the arch explains better than one for this arch
                # that does not take the problem.
                fits = self._problem_mismatch(p)[1] is None
                return (7 if fits else 3), f"serves {span}{why}; device is {device.arch}", False
            outside = f"serves {span}{why}; device is {device.arch}; force it with QBACKEND_PROVIDER"
        # Forcing lifts the backend and arch range only: every check below still holds for a forced
        # provider.
        depth, reason = self._problem_mismatch(p)
        if reason is not None:
            return depth, reason, False
        return (3, outside, True) if outside else (8, None, False)

    def takes_arch(self, device: DeviceInfo) -> bool:
        """Whether the device's arch is among the rule's (its arch names, its sm range)."""
        if self.archs is not None and device.arch not in self.archs:
            return False
        if self.min_sm is None and self.max_sm is None:
            return True
        sm = device.sm
        return sm is not None and (self.min_sm or 0) <= sm <= (self.max_sm or 10**9)

    def _problem_mismatch(self, p: Problem) -> tuple[int, str | None]:
        """(how many checks passed, first failed check's reason or None) for what the rule takes of
        the problem itself: scale granularities, quantization mode, out dtype, bias, alignment."""
        if self.scale_a and p.scale_a not in self.scale_a:
            what = "granularity" if p.op is Op.QUANTIZE else "scale_a granularity"
            return 4, f"{what} {p.scale_a} not supported (takes {_names(self.scale_a)})"
        if self.scale_b and p.scale_b not in self.scale_b:
            return 4, f"scale_b granularity {p.scale_b} not supported (takes {_names(self.scale_b)})"
        if p.op is Op.QUANTIZE:
            if p.static not in self.static:
                return 4, f"{'static' if p.static else 'dynamic'} quantization not supported"
            if p.has_scale_ub and not self.scale_ub:
                return 4, "scale_ub not supported"
        if p.op is Op.SCALED_MM and p.accumulate == "precise" and self.fast_accumulation:
            return 5, ("sums fp8 products with the tensor cores' fast accumulation, not accumulate='precise' "
                       "(fp32 throughout)")
        if self.out_dtypes and p.out_dtype not in self.out_dtypes:
            return 5, f"out_dtype {qd.dtype_name(p.out_dtype)} not supported (takes {_names(self.out_dtypes)})"
        if p.has_bias and not self.bias:
            return 6, "bias not supported"
        if p.k_align < self.k_align:
            dim = "the last dimension" if p.op is Op.QUANTIZE else "K"
            return 7, f"needs {dim} to be a multiple of {self.k_align}"
        if p.n_align < self.n_align:
            rule = ("needs the last dimension contiguous" if p.op is Op.QUANTIZE
                    else f"needs N to be a multiple of {self.n_align}")
            return 7, rule
        return 8, None


class Declined(RuntimeError):
    """Raised by a provider's scaled_mm / quantize, before it enqueues anything, when it cannot serve
    this particular call although its rules accepted the problem (a library finds no algorithm for
    the shape, say). The call goes on to the next provider that accepts the problem, with a warning
    naming the reason, once per provider and problem. The message is the reason."""


@dataclass
class Provider:
    """Base class of every provider, built-in or third-party."""
    name: str = "unnamed"
    priority: int = 0                       # higher is tried first
    description: str = ""
    rules: tuple = field(default_factory=tuple)

    def supports(self, device: DeviceInfo, problem: Problem) -> Verdict:
        misses = []  # (depth, reason, forceable, rule)
        for rule in self.rules:
            depth, reason, forceable = rule.mismatch(device, problem)
            if reason is None:
                runtime = self.runtime_verdict(device, problem)
                return runtime if runtime is not None else Verdict(True, "ok")
            misses.append((depth, reason, forceable, rule))
        if not misses:
            return Verdict(False, "declares no rules")
        # A rule that forcing would run takes the problem: its reason is the one to give.
        forceable_misses = [m for m in misses if m[2]]
        deepest = max(m[0] for m in forceable_misses or misses)
        closest = [m for m in forceable_misses or misses if m[0] == deepest]
        # Of rules that got as far, the one written for the device's arch explains best.
        _, reason, forceable, rule = next((m for m in closest if m[3].takes_arch(device)), closest[0])
        if not forceable and rule.archs is not None and not rule.takes_arch(device):
            reason = self._arch_reason(device, problem) or reason
        if forceable:
            rt = self.runtime_verdict(device, problem)
            if rt is not None and not rt.ok:
                return rt
        return Verdict(False, reason, forceable)

    def _arch_reason(self, device: DeviceInfo, problem: Problem) -> str | None:
        """Where the device's arch is in none of the rules for this op and backend: every arch they
        name, e.g. "needs gfx942 (fnuz fp8 matrix cores) or gfx950 (OCP fp8 matrix cores)"."""
        rules = [r for r in self.rules if r.op is problem.op and device.backend in r.backends and r.archs is not None]
        if not rules or any(r.takes_arch(device) for r in rules):
            return None
        named = dict.fromkeys(f"{_names(r.archs)}" + (f" ({r.why_arch})" if r.why_arch else "") for r in rules)
        return f"needs {' or '.join(named)}; device is {device.arch}"

    def runtime_verdict(self, device: DeviceInfo, problem: Problem) -> Verdict | None:
        """Conditions beyond the declared rules (a native library, a driver). None means fine.
        A simulated device counts as having everything built for it."""
        return None

    def scaled_mm(self, a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor | None,
                  scale_b: torch.Tensor, out_dtype: torch.dtype, bias: torch.Tensor | None,
                  problem: Problem) -> torch.Tensor:
        """a: [M, K] (row stride may exceed K), b: [K, N] column-major; scale_a: None, one value,
        [M, 1] or [M, G]; scale_b: one value, [N] / [1, N] or [Kb, Nb]. Inputs are validated."""
        raise NotImplementedError(f"provider {self.name} does not implement scaled_mm")

    def grouped_scaled_mm(self, a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor,
                          scale_b: torch.Tensor, offsets: torch.Tensor, out_dtype: torch.dtype,
                          bias: torch.Tensor | None, problem: Problem) -> torch.Tensor:
        """a: [M, K] rows sorted by group, b: [G, K, N] column-major per group, offsets: int32 [G]
        cumulative row ends on a's device; scales and bias as `qbackend.grouped_scaled_mm` takes
        them. Inputs are validated (their shapes; offsets' values are not read). M > 0."""
        raise NotImplementedError(f"provider {self.name} does not implement grouped_scaled_mm")

    def quantize(self, x: torch.Tensor, dtype: torch.dtype, granularity: str,
                 scale: torch.Tensor | None, scale_ub: torch.Tensor | None, group_size: int,
                 block_size: tuple, problem: Problem) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (q, scale); for static quantization (scale given) the returned scale is `scale`."""
        raise NotImplementedError(f"provider {self.name} does not implement quantize")

    def prepare_weight(self, w_q: torch.Tensor, scale_b: torch.Tensor, problem: Problem):
        """Lay out a row-major [N, K] quantized weight for this provider, once, at load time.
        Return a qbackend.weights.PreparedWeight, or None to keep the canonical layout ("nk":
        b = w_q.t()). scale_b is in scale_b form ([], [1, N] or [Kb, Nb])."""
        return None

    def scaled_mm_prepared(self, a: torch.Tensor, weight, scale_a: torch.Tensor | None,
                           out_dtype: torch.dtype, bias: torch.Tensor | None,
                           problem: Problem) -> torch.Tensor:
        """scaled_mm with a PreparedWeight from this provider's prepare_weight (or canonical)."""
        if weight.layout != "nk":
            raise NotImplementedError(f"provider {self.name} prepared layout {weight.layout!r} "
                                      "but does not implement scaled_mm_prepared")
        return self.scaled_mm(a, weight.data.t(), scale_a, weight.scale, out_dtype, bias, problem)

    def info(self) -> dict:
        """Extra facts for `qbackend info` (e.g. a native library's path)."""
        return {}


def granularities(*names: str) -> frozenset:
    return frozenset(Granularity(n) for n in names)
