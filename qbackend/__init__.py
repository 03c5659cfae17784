"""qbackend: FP8/INT8 quantized matrix multiplication for LLM inference, on whatever GPU you have.

    import qbackend
    q, s = qbackend.quantize(x, torch.float8_e4m3fn, granularity="token")
    y = qbackend.scaled_mm(q, w_q.t(), s, w_scale.t(), out_dtype=torch.bfloat16, bias=b)

Importing qbackend registers its torch ops and nothing else: providers and plugins load on first
use, and no GPU is initialized.
"""
from __future__ import annotations

from .api import dequantize, grouped_scaled_mm, linear, quantize, scaled_mm
from .convert import convert_checkpoint
from .formats import CheckpointError, load_checkpoint, load_gguf, load_moe, load_quantized, save_quantized
from .fp8 import native_fp8_dtype, to_fnuz
from .hookspecs import hookimpl
from .moe import gather_quantize, moe_align, silu_mul_quantize
from .nn import QuantLinear, QuantMoE, Routing, calibrate, calibration, quantize_model
from .probe import DeviceInfo, device_info
from .problem import PROBLEM_KINDS, Granularity, Op, Problem, Verdict
from .provider import Declined, Provider, Rule
from .registry import NoProviderError
from .selection import explain, select, selection_table
from .weights import PreparedWeight, prepare_weight

__version__ = "0.1.0"

__all__ = ["scaled_mm", "grouped_scaled_mm", "moe_align", "gather_quantize", "silu_mul_quantize",
           "quantize", "dequantize",
           "prepare_weight", "linear",
           "PreparedWeight",
           "select", "explain", "selection_table",
           "device_info", "DeviceInfo", "Provider", "Declined", "Rule", "Problem", "Verdict", "Granularity",
           "Op", "PROBLEM_KINDS", "NoProviderError", "hookimpl", "native_fp8_dtype", "to_fnuz",
           "QuantLinear", "QuantMoE", "Routing", "load_moe", "quantize_model", "calibrate", "calibration",
           "load_checkpoint",
           "load_quantized", "load_gguf", "save_quantized", "convert_checkpoint", "CheckpointError"]
