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
                                    the inputs; `kohya.expected` (scale 0.8) and `wan.*` (scale 0.6)
  lora/flux_tiny_kohya.safetensors  the same tiny Flux in kohya / sd-scripts names: fused qkv of the
                                    image and text streams, a single block's linear1 (q, k, v and the
                                    MLP in one) and linear2, a modulation, and the global layers
                                    (img_in, txt_in, time_in, vector_in, guidance_in, final_layer with
                                    its adaLN rows in BFL's shift, scale order), some with alphas
  lora/wan_tiny_original.safetensors
                                    a LoRA for tests/data/wan_tiny/transformer in Wan's original names
                                    (diffusion_model.blocks.N.self_attn.q.lora_A.weight, ffn.0, head.head,
                                    time_projection.1, text_embedding.0), alphas, diff_b bias differences
                                    and a norm diff (which diffusers drops)

kohya and Wan files are converted as diffusers' lora_conversion_utils converts them
(_convert_kohya_flux_lora_to_diffusers, _convert_non_diffusers_wan_lora_to_diffusers): alpha / rank
folded into A and B (scale_down, scale_up), a fused layer's A given to every part and B's rows split
(diffusers hard-codes FLUX.1's single-block sizes [3072, 3072, 3072, 12288]; here the tiny model's
[32, 32, 32, 128]), the final adaLN's B halves swapped, diff_b as the PEFT lora_B bias; then fused as
PEFT fuses (alpha = rank after the conversion): W += scale * B A, b += scale * diff_b.
"""

import json
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
    kohya_case(out)
    wan_case(out)
    write_safetensors(os.path.join(OUT_DIR, "goldens_lora.safetensors"), out,
                      {"_generator": "tests/reference/make_lora_reference.py", "_torch_version": torch.__version__})


def fold_alpha(down, up, alpha):
    """diffusers' scale_down / scale_up: alpha / rank split so that both stay near 1."""
    scale = (alpha if alpha is not None else down.shape[0]) / down.shape[0]
    scale_down, scale_up = scale, 1.0
    while scale_down * 2 < scale_up:
        scale_down *= 2
        scale_up /= 2
    return down * scale_down, up * scale_up


def swap_scale_shift(w):
    shift, scale = w.chunk(2, dim=0)
    return torch.cat([scale, shift], dim=0)


KOHYA_LAYERS = {  # kohya name: ([diffusers modules in B's row order], rank, alpha or None)
    "double_blocks_0_img_attn_qkv": (["transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.to_k", "transformer_blocks.0.attn.to_v"], 4, 8.0),
    "double_blocks_1_txt_attn_qkv": (["transformer_blocks.1.attn.add_q_proj", "transformer_blocks.1.attn.add_k_proj",
                                      "transformer_blocks.1.attn.add_v_proj"], 3, None),
    "double_blocks_0_img_mod_lin": (["transformer_blocks.0.norm1.linear"], 2, 1.0),
    "double_blocks_1_txt_mlp_2": (["transformer_blocks.1.ff_context.net.2"], 2, None),
    "single_blocks_0_linear1": (["single_transformer_blocks.0.attn.to_q", "single_transformer_blocks.0.attn.to_k",
                                 "single_transformer_blocks.0.attn.to_v", "single_transformer_blocks.0.proj_mlp"], 4, 2.0),
    "single_blocks_1_linear2": (["single_transformer_blocks.1.proj_out"], 2, None),
    "img_in": (["x_embedder"], 2, None),
    "txt_in": (["context_embedder"], 2, 4.0),
    "time_in_in_layer": (["time_text_embed.timestep_embedder.linear_1"], 2, None),
    "vector_in_out_layer": (["time_text_embed.text_embedder.linear_2"], 2, None),
    "guidance_in_in_layer": (["time_text_embed.guidance_embedder.linear_1"], 2, None),
    "final_layer_linear": (["proj_out"], 2, None),
    # No alpha: diffusers' conversion leaves the final layer's alpha out (docs/models.md, "LoRA").
    "final_layer_adaLN_modulation_1": (["norm_out.linear"], 2, None),
}


def kohya_case(out):
    """A kohya Flux LoRA, diffusers' conversion of it, and the tiny transformer with it fused at 0.8."""
    weights, _ = read_safetensors(os.path.join(OUT_DIR, "flux_tiny", "transformer", "diffusion_pytorch_model.safetensors"))
    model = ref.FluxTransformer2DModel(ref.TRANSFORMER_CONFIG).double().eval()
    model.load_state_dict({k: v.double() for k, v in weights.items()})
    modules = dict(model.named_modules())
    gen = torch.Generator().manual_seed(78)
    lora, converted = {}, {}
    for name, (targets, rank, alpha) in KOHYA_LAYERS.items():
        dims = [modules[t].out_features for t in targets]
        n_in = modules[targets[0]].in_features
        down = (torch.randn((rank, n_in), generator=gen, dtype=torch.float64) / n_in ** 0.5).float()
        up = (torch.randn((sum(dims), rank), generator=gen, dtype=torch.float64) * 0.3).float()
        lora[f"lora_unet_{name}.lora_down.weight"] = down
        lora[f"lora_unet_{name}.lora_up.weight"] = up
        if alpha is not None:
            lora[f"lora_unet_{name}.alpha"] = torch.tensor(alpha, dtype=torch.float32)
        if name.startswith("final_layer"):  # assign_remaining_weights: no alpha, the adaLN rows swapped
            converted[targets[0]] = (down, swap_scale_shift(up) if "adaLN" in name else up)
            continue
        a, b = fold_alpha(down, up, alpha)
        for target, part in zip(targets, torch.split(b, dims, dim=0)):
            converted[target] = (a, part)  # not block-sparse: A copied to every part, B's rows split
    write_safetensors(os.path.join(OUT_DIR, "lora", "flux_tiny_kohya.safetensors"), lora, {"format": "pt"})
    goldens, _ = read_safetensors(os.path.join(OUT_DIR, "goldens_flux.safetensors"))
    case = {k[len("transformer."):]: v for k, v in goldens.items() if k.startswith("transformer.") and not k.startswith("transformer.intermediate")}
    with torch.no_grad():
        for target, (a, b) in converted.items():
            modules[target].weight += 0.8 * (b.double() @ a.double())
        expected = model(case["hidden_states"].double(), case["encoder_hidden_states"].double(), case["pooled_projections"].double(),
                         case["timestep"], case["img_ids"], case["txt_ids"], case["guidance"], {})
    out["kohya.expected"] = expected.float()
    print("kohya: max |expected - without LoRA|:", float((expected.float() - case["expected"]).abs().max()))


WAN_LAYERS = {  # Wan original name: (diffusers module, rank, alpha or None, with diff_b)
    "blocks.0.self_attn.q": ("blocks.0.attn1.to_q", 4, 8.0, False),
    "blocks.1.cross_attn.k": ("blocks.1.attn2.to_k", 2, None, True),
    "blocks.1.cross_attn.o": ("blocks.1.attn2.to_out.0", 2, 1.0, False),
    "blocks.0.ffn.0": ("blocks.0.ffn.net.0.proj", 3, None, True),
    "blocks.1.ffn.2": ("blocks.1.ffn.net.2", 2, 4.0, False),
    "head.head": ("proj_out", 2, None, True),
    "time_projection.1": ("condition_embedder.time_proj", 2, None, False),
    "text_embedding.0": ("condition_embedder.text_embedder.linear_1", 2, None, False),
}


def wan_case(out):
    """A LoRA in Wan's original names, diffusers' conversion, and the tiny Wan transformer with it at 0.6."""
    import make_wan_reference as wan  # noqa: E402  (imported here: it sets torch's global options)
    weights, _ = read_safetensors(os.path.join(OUT_DIR, "wan_tiny", "transformer", "diffusion_pytorch_model.safetensors"))
    config = json.load(open(os.path.join(OUT_DIR, "wan_tiny", "transformer", "config.json")))
    model = wan.WanTransformer3DModel(config).double().eval()
    model.load_state_dict({k: v.double() for k, v in weights.items()})
    modules = dict(model.named_modules())
    gen = torch.Generator().manual_seed(79)
    lora = {}
    with torch.no_grad():
        for name, (target, rank, alpha, diff_b) in WAN_LAYERS.items():
            layer = modules[target]
            down = (torch.randn((rank, layer.in_features), generator=gen, dtype=torch.float64) / layer.in_features ** 0.5).float()
            up = (torch.randn((layer.out_features, rank), generator=gen, dtype=torch.float64) * 0.3).float()
            lora[f"diffusion_model.{name}.lora_A.weight"] = down
            lora[f"diffusion_model.{name}.lora_B.weight"] = up
            if alpha is not None:
                lora[f"diffusion_model.{name}.alpha"] = torch.tensor(alpha, dtype=torch.float32)
            a, b = fold_alpha(down, up, alpha)
            layer.weight += 0.6 * (b.double() @ a.double())
            if diff_b:
                bias = (torch.randn((layer.out_features,), generator=gen, dtype=torch.float64) * 0.1).float()
                lora[f"diffusion_model.{name}.diff_b"] = bias
                layer.bias += 0.6 * bias.double()
        lora["diffusion_model.blocks.0.norm3.diff"] = torch.zeros(32)  # dropped, as diffusers drops norm diffs
        write_safetensors(os.path.join(OUT_DIR, "lora", "wan_tiny_original.safetensors"), lora, {"format": "pt"})
        goldens, _ = read_safetensors(os.path.join(OUT_DIR, "goldens_wan.safetensors"))
        inputs = {k: goldens[f"transformer.{k}"] for k in ("hidden_states", "timestep", "encoder_hidden_states")}
        expected = model(inputs["hidden_states"].double(), inputs["timestep"], inputs["encoder_hidden_states"].double())
    out.update({f"wan.{k}": v for k, v in inputs.items()})
    out["wan.expected"] = expected.float()
    print("wan: max |expected - without LoRA|:", float((expected.float() - goldens["transformer.sample"]).abs().max()))


if __name__ == "__main__":
    main()
