"""`qbackend convert SRC DST --scheme ...`: a bf16/fp16/fp32 safetensors model folder to a quantized
checkpoint in the compressed-tensors layout (what vLLM and llm-compressor read), loadable by
qbackend.load_checkpoint.

Tensor by tensor: shard headers are read first, the output is planned from shapes alone, and each
output shard is built from source tensors read one at a time through mmap, so memory stays near one
output shard. The output is written to a sibling temporary folder and moved into place at the end:
a failed run leaves DST as it was.
"""
from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch

from .formats.checkpoint import read_config
from .formats.errors import CheckpointError
from .formats.quant_config import compressed_tensors_config
from .formats.safetensors_folder import INDEX_NAME, SafetensorsFolder
from .formats.writer import (
    PlannedTensor,
    check_destination,
    move_into_place,
    parse_size,
    staging_folder,
    write_shards,
)
from .nn.patterns import check_patterns, matches_any
from .nn.schemes import SCHEMES, Scheme, get_scheme
from .nn.weight import QuantizedWeight, weight_scale_shape

# Left in full precision unless --ignore says otherwise: the output head and every embedding
# table (they are lookups, not matmuls, and the head is the most sensitive layer).
DEFAULT_IGNORE = ("lm_head", "*embed*")
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Never copied: these formats unpickle (run code) when loaded.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")
CONVERTIBLE_SCHEMES = tuple(n for n, s in SCHEMES.items() if not s.static_activations)


def _size(n: int) -> str:
    """Bytes in the largest decimal unit that keeps the number at 1 or more (12.3 kB, 4.56 GB)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} B"


@dataclass
class ConvertReport:
    src: Path
    dst: Path
    scheme: Scheme
    quantized: list[str] = field(default_factory=list)   # layer names
    kept: list[str] = field(default_factory=list)        # tensors copied unchanged
    skipped_files: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    bytes_in: int = 0
    bytes_out: int = 0

    def summary(self) -> str:
        return (f"converted {self.src} -> {self.dst}: {len(self.quantized)} layers quantized "
                f"({self.scheme.name}), {len(self.kept)} tensors kept; {_size(self.bytes_in)} -> "
                f"{_size(self.bytes_out)} in {len(self.files)} file(s)")


def is_quantizable(name: str, shape: tuple, dtype, scheme: Scheme) -> bool:
    """A float 2-D `X.weight` (a Linear's, unless the ignore list says it is not)."""
    if not name.endswith(".weight") or len(shape) != 2 or dtype not in FLOAT_DTYPES:
        return False
    if scheme.weight_granularity == "block" and shape[1] % scheme.block_size[1]:
        return False  # block kernels need whole blocks along K
    return True


def convert_checkpoint(src: str | Path, dst: str | Path, scheme: str | Scheme = "fp8_dynamic",
                       ignore: list[str] | None = None, force: bool = False,
                       max_shard_size: str | int = "2GB", progress: bool | None = None) -> ConvertReport:
    """Quantize the model folder `src` into `dst`. ignore: module-name patterns kept in full
    precision (default: DEFAULT_IGNORE; a given list replaces it). progress: None shows a bar on a
    terminal only."""
    scheme = get_scheme(scheme)
    if scheme.static_activations:
        raise ValueError(f"scheme {scheme.name} needs activation scales from calibration data, which "
                         "convert does not have: quantize in memory (qbackend.quantize_model + "
                         "qbackend.calibrate) and save with qbackend.save_quantized; convert takes "
                         f"{', '.join(CONVERTIBLE_SCHEMES)}")
    ignore = check_patterns(DEFAULT_IGNORE if ignore is None else ignore)
    shard_limit = parse_size(max_shard_size)
    src, dst = Path(src), Path(dst)
    if not src.is_dir():
        raise FileNotFoundError(f"{src}: no such model folder")
    if dst.resolve() == src.resolve() or src.resolve() in dst.resolve().parents:
        raise ValueError(f"{dst}: the destination must not be the source folder or inside it")
    check_destination(dst, force)
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"{src}: no config.json: convert takes a model folder with its config.json "
                                "(the converted model's quantization_config is written into it)")
    source = SafetensorsFolder(src)
    config = read_config(src)
    if "quantization_config" in config or "compression_config" in config:
        raise CheckpointError("the model is already quantized (config.json has a quantization_config)",
                              src / "config.json")

    report = ConvertReport(src, dst, scheme)
    planned: list[PlannedTensor] = []
    ignored_layers: list[str] = []
    for name in source.keys():
        dtype, shape = source.dtype(name), source.shape(name)
        if dtype not in FLOAT_DTYPES and dtype not in (torch.int64, torch.int32, torch.bool, torch.uint8):
            raise CheckpointError(f"tensor dtype {dtype} is not a float (bf16/fp16/fp32) model "
                                  "tensor: is the model already quantized?", source.file_of(name), name)
        report.bytes_in += source.nbytes(name)
        layer = name[: -len(".weight")]
        if is_quantizable(name, shape, dtype, scheme) and not matches_any(layer, ignore):
            produce = partial(_quantize_layer, source, name, scheme)
            n, k = shape
            scale_numel = 1
            for d in weight_scale_shape(scheme, n, k):
                scale_numel *= d
            planned += [PlannedTensor(name, n * k, produce),
                        PlannedTensor(layer + ".weight_scale", 4 * scale_numel, produce)]
            report.quantized.append(layer)
        else:
            if name.endswith(".weight") and len(shape) == 2:
                ignored_layers.append(layer)
            planned.append(PlannedTensor(name, source.nbytes(name), partial(_copy_tensor, source, name)))
            report.kept.append(name)
    if not report.quantized:
        raise ValueError(f"nothing to quantize in {src}: no float 2-D '.weight' tensor outside the "
                         f"ignore list ({', '.join(ignore) or 'empty'})")

    work = staging_folder(dst)
    try:
        bar = _progress_bar(len(planned), progress)
        report.files = write_shards(work, planned, shard_limit, on_tensor=lambda _: bar.update(1))
        bar.close()
        report.bytes_out = sum(t.nbytes for t in planned)
        config["quantization_config"] = compressed_tensors_config(scheme, ignored_layers)
        (work / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        report.skipped_files = _copy_other_files(src, work)
        move_into_place(work, dst)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    finally:
        source.close()
    return report


def _quantize_layer(source: SafetensorsFolder, name: str, scheme: Scheme) -> dict[str, torch.Tensor]:
    weight = source.get(name)
    q = QuantizedWeight.from_float(weight, scheme)
    layer = name[: -len(".weight")]
    return {name: q.weight, layer + ".weight_scale": q.weight_scale}


def _copy_tensor(source: SafetensorsFolder, name: str) -> dict[str, torch.Tensor]:
    return {name: source.get(name)}


def _copy_other_files(src: Path, dst: Path) -> list[str]:
    """Tokenizer, generation config, sentence-transformers modules...: everything but the weights
    (rewritten), config.json (rewritten) and pickled files (never copied). Returns skipped names."""
    skipped = []
    for item in sorted(src.iterdir()):
        name = item.name
        if name.endswith(".safetensors") or name in (INDEX_NAME, "config.json") or name.startswith(
                f".{dst.name}.partial-"):
            continue
        if name.endswith(PICKLE_SUFFIXES):
            skipped.append(name)
            continue
        if item.is_dir():
            no_pickles = shutil.ignore_patterns(*(f"*{s}" for s in PICKLE_SUFFIXES))
            shutil.copytree(item, dst / name, ignore=no_pickles)
        else:
            shutil.copy2(item, dst / name)
    return skipped


def _progress_bar(total: int, progress: bool | None):
    try:
        from tqdm import tqdm
    except ImportError:  # a progress bar is a nicety, not a requirement
        class _Null:
            def update(self, n): ...
            def close(self): ...
        return _Null()
    # disable=None: tqdm shows the bar only when stderr is a terminal.
    return tqdm(total=total, unit="tensor", desc="convert", file=sys.stderr,
                disable=None if progress is None else not progress)


def _cmd_convert(args) -> int:
    report = convert_checkpoint(args.src, args.dst, args.scheme, ignore=args.ignore, force=args.force,
                                max_shard_size=args.max_shard_size,
                                progress=False if args.quiet else None)
    print(report.summary())
    if report.skipped_files:
        print(f"not copied (pickled, never loaded): {', '.join(report.skipped_files)}")
    return 0


def add_convert_subcommand(subparsers) -> None:
    """Register `qbackend convert` on the CLI's subparsers."""
    p = subparsers.add_parser(
        "convert", help="quantize a bf16/fp16/fp32 safetensors model folder into an FP8/INT8 "
        "checkpoint (compressed-tensors layout)",
        description=__doc__.split("\n\n")[0])
    p.add_argument("src", help="model folder with config.json and *.safetensors")
    p.add_argument("dst", help="output folder (must not exist or be empty, unless --force)")
    p.add_argument("--scheme", default="fp8_dynamic", choices=CONVERTIBLE_SCHEMES,
                   help="quantization scheme (default: fp8_dynamic)")
    p.add_argument("--ignore", action="append", metavar="PATTERN",
                   help="module name pattern to keep in full precision (glob on the name or a dotted "
                   "suffix, or re:REGEX); repeatable; replaces the default "
                   f"({' '.join(DEFAULT_IGNORE)})")
    p.add_argument("--force", action="store_true", help="replace DST if it is a model folder")
    p.add_argument("--max-shard-size", default="2GB", help="largest output shard (default: 2GB)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_convert)
