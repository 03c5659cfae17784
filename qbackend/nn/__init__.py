"""Quantized layers for models: QuantLinear, quantize_model, calibration, schemes."""
from .patterns import matches, matches_any
from .quant_linear import QuantLinear
from .quant_moe import QuantMoE, Routing
from .quantize_model import calibrate, calibration, quant_linears, quantize_model
from .schemes import SCHEMES, Scheme, get_scheme
from .weight import QuantizedWeight, weight_scale_shape

__all__ = ["QuantLinear", "QuantMoE", "Routing", "QuantizedWeight", "Scheme", "SCHEMES", "get_scheme", "quantize_model",
           "calibrate", "calibration", "quant_linears", "matches", "matches_any",
           "weight_scale_shape"]
