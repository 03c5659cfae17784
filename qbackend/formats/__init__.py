"""Checkpoint formats: FP8/INT8 safetensors folders (vLLM fp8, compressed-tensors, block-quantized),
GGUF, and writing compressed-tensors checkpoints."""
from .checkpoint import QuantizedCheckpoint, load_quantized
from .errors import CheckpointError
from .gguf import GGUFModel, RequantizationError, load_gguf
from .load import LoadResult, load_checkpoint
from .merge import merge_quantized
from .moe_checkpoint import load_moe
from .quant_config import compressed_tensors_config, parse_quantization_config
from .safetensors_folder import SafetensorsFolder
from .save import save_quantized

__all__ = ["QuantizedCheckpoint", "load_quantized", "load_checkpoint", "LoadResult", "CheckpointError",
           "merge_quantized", "compressed_tensors_config", "parse_quantization_config",
           "save_quantized", "SafetensorsFolder", "load_gguf", "GGUFModel", "RequantizationError",
           "load_moe"]
