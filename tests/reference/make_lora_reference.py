#!/usr/bin/python3
"""A diffusers / PEFT LoRA for the tiny Flux transformer, and the transformer's output with it fused,
for cubevec's `forward --lora` (models/lora.h).

    /usr/bin/python3 tests/reference/make_lora_reference.py [OUTPUT_DIR]   # default tests/data

Fusing follows diffusers' fuse_lora over PEFT layers: W' = W + scale * (alpha / rank) * B A, where
a file without an alpha for a layer means alpha = rank. The transformer is make_flux_reference.py's
(written from diffusers' source), its weights tests/data/flux_tiny/transformer's, its inputs the
goldens' "transformer" case. It writes, under OUTPUT_DIR:

  lora/flux_tiny_lora.safetensors   "transformer.<module>.lora_A.weight" [rank, in] and ".lora_B.weight"
                                    [out, rank] for six layers (double and single blocks, attention,
                                    feed-forward, a modulation and the embedder), one with an alpha
  goldens_lora.safetensors          `expected` (scale 0.7) and `expected_scale_minus_1` (scale -1) with
                                    the inputs
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_flux_reference as ref  # noqa: E402
from safetensors_io import read_safetensors, write_safetensors  # noqa: E402

ROOT = ref.ROOT
OUT_DIR = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "data")
LAYERS = {  # module: (rank, alpha or None)
    "transformer_blocks.0.attn.to_q": (4, None),
    "transformer_blocks.0.attn.to_v": (2, None),
    "transformer_blocks.1.ff.net.2": (3, 6.0),
    "transformer_blocks.0.norm1.linear": (2, None),
    "single_transformer_blocks.1.proj_out": (4, None),
    "x_embedder": (2, None),
}


def main():
    torch.manual_seed(0)
    weights, _ = read_safetensors(os.path.join(OUT_DIR, "flux_tiny", "transformer", "diffusion_pytorch_model.safetensors"))
    model = ref.FluxTransformer2DModel(ref.TRANSFORMER_CONFIG).double().eval()
    model.load_state_dict({k: v.double() for k, v in weights.items()})
    goldens, _ = read_safetensors(os.path.join(OUT_DIR, "goldens_flux.safetensors"))
    case = {k[len("transformer."):]: v for k, v in goldens.items() if k.startswith("transformer.") and not k.startswith("transformer.intermediate")}
    gen = torch.Generator().manual_seed(77)
    lora, factors = {}, {}
    modules = dict(model.named_modules())
    for name, (rank, alpha) in LAYERS.items():
        layer = modules[name]
        down = (torch.randn((rank, layer.in_features), generator=gen, dtype=torch.float64) / layer.in_features ** 0.5).float()
        up = (torch.randn((layer.out_features, rank), generator=gen, dtype=torch.float64) * 0.3).float()
        lora[f"transformer.{name}.lora_A.weight"] = down
        lora[f"transformer.{name}.lora_B.weight"] = up
        if alpha is not None:
            lora[f"transformer.{name}.alpha"] = torch.tensor([alpha], dtype=torch.float32)
        factors[name] = ((alpha if alpha is not None else rank) / rank, down.double(), up.double())
    os.makedirs(os.path.join(OUT_DIR, "lora"), exist_ok=True)
    write_safetensors(os.path.join(OUT_DIR, "lora", "flux_tiny_lora.safetensors"), lora, {"format": "pt"})

    def run(scale):
        with torch.no_grad():
            fused = ref.FluxTransformer2DModel(ref.TRANSFORMER_CONFIG).double().eval()
            fused.load_state_dict(model.state_dict())
            fused_modules = dict(fused.named_modules())
            for name, (factor, down, up) in factors.items():
                fused_modules[name].weight += scale * factor * (up @ down)
            return fused(case["hidden_states"].double(), case["encoder_hidden_states"].double(), case["pooled_projections"].double(),
                         case["timestep"], case["img_ids"], case["txt_ids"], case["guidance"], {})

    out = {k: v for k, v in case.items() if k != "expected"}
    out["expected"] = run(0.7).float()
    out["expected_scale_minus_1"] = run(-1.0).float()
    print("max |expected - without LoRA|:", float((out["expected"] - case["expected"]).abs().max()))
    write_safetensors(os.path.join(OUT_DIR, "goldens_lora.safetensors"), out,
                      {"_generator": "tests/reference/make_lora_reference.py", "_torch_version": torch.__version__})


if __name__ == "__main__":
    main()
