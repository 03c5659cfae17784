"""quantize_model: swap a model's nn.Linear layers for QuantLinear; calibrate static scales."""
from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from .patterns import check_patterns, matches_any
from .quant_linear import QuantLinear
from .schemes import Scheme, get_scheme


def quantize_model(model: nn.Module, scheme: str | Scheme = "fp8_dynamic",
                   ignore: Iterable[str] = ()) -> nn.Module:
    """Replace every nn.Linear in `model` (in place) by a QuantLinear under `scheme`.

    ignore: module-name patterns left in full precision (globs matched against the full name or
    any dotted suffix, or "re:<regex>"; see qbackend.nn.patterns). Layers are quantized one at a
    time, so peak memory grows by one layer's float weight, not by the model's.
    Static schemes (fp8_static) leave input scales uncalibrated: run `calibrate` next.
    Returns `model` (or the new layer when `model` itself is an nn.Linear).
    """
    scheme = get_scheme(scheme)
    ignore = check_patterns(ignore)
    if isinstance(model, nn.Linear):
        return QuantLinear.from_linear(model, scheme)
    # nn.MultiheadAttention reads its out_proj (a NonDynamicallyQuantizableLinear) weight directly,
    # never calling its forward: swapping it would break attention.
    targets = [name for name, module in model.named_modules()
               if isinstance(module, nn.Linear)
               and not isinstance(module, nn.modules.linear.NonDynamicallyQuantizableLinear)]
    for name in targets:
        if matches_any(name, ignore):
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, QuantLinear.from_linear(getattr(parent, child), scheme))
    return model


def quant_linears(model: nn.Module) -> Iterator[tuple[str, QuantLinear]]:
    return ((n, m) for n, m in model.named_modules() if isinstance(m, QuantLinear))


@contextmanager
def calibration(model: nn.Module):
    """Record max |input| of every static-scheme QuantLinear while the block runs; on a clean
    exit set input_scale = amax / qmax. Layers that saw no input keep no scale (with a warning);
    they refuse to run until they get one.

        with qbackend.calibration(model), torch.no_grad():
            for batch in batches:
                model(**batch)
    """
    layers = [(n, m) for n, m in quant_linears(model) if m.scheme.static_activations]
    if not layers:
        raise ValueError("calibration: the model has no QuantLinear with static activation scales "
                         "(quantize it with a static scheme such as fp8_static first)")
    for _, layer in layers:
        layer.start_calibration()
    try:
        yield model
    except BaseException:
        for _, layer in layers:
            layer.abort_calibration()
        raise
    unseen = [name for name, layer in layers if not layer.finish_calibration()]
    if unseen:
        warnings.warn(f"calibration: {len(unseen)} layer(s) saw no non-zero input and have no "
                      f"input scale: {', '.join(unseen[:8])}{' ...' if len(unseen) > 8 else ''}",
                      stacklevel=3)


def _default_forward(model: nn.Module, batch) -> None:
    if isinstance(batch, dict):
        model(**batch)
    elif isinstance(batch, (tuple, list)):
        model(*batch)
    else:
        model(batch)


def calibrate(model: nn.Module, batches: Iterable,
              forward: Callable[[nn.Module, object], object] | None = None) -> nn.Module:
    """Run `batches` through `model` (under no_grad) to set static input scales.

    Each batch is passed as model(**batch) for a dict, model(*batch) for a tuple/list, else
    model(batch); give `forward(model, batch)` for anything else.
    """
    forward = forward or _default_forward
    with torch.no_grad(), calibration(model):
        for batch in batches:
            forward(model, batch)
    return model
