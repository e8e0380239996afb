"""cubevec from Python, without PyTorch: diffusion pipelines called like diffusers', and MindIE SD's
layer API on NumPy arrays.

    import cubevec
    pipe = cubevec.FluxPipeline.from_pretrained("assets/tinyflux")
    out = pipe(prompt="a red circle", num_inference_steps=8, generator=1, output_type="np")
    out.images[0]   # uint8 array, height x width x 3
    out.report      # the library's timings and stage figures

    y = cubevec.attention_forward(q, k, v, head_first=False)   # q, k, v [B, S, N, D] NumPy arrays

A loaded pipeline is immutable: several Python threads may call it at once (the GIL is released
while it computes). Ctrl-C stops a call at its next denoising step (a layer call before it
launches) with KeyboardInterrupt. Errors: TypeError / ValueError for bad arguments (naming them),
FileNotFoundError and the other OSErrors for paths, cubevec.Error for the rest.
"""

from ._cubevec import Error
from . import layers, pipelines
from .layers import (ActivationLayer, LayerNorm, RMSNorm, attention_forward, attention_forward_varlen, fast_layernorm,
                     get_activation_layer, layernorm_scale_shift, rotary_position_embedding, sparse_attention)
from .pipelines import FluxPipeline, PipelineOutput, WanImageToVideoPipeline, WanPipeline

__all__ = ["Error"] + pipelines.__all__ + layers.__all__
