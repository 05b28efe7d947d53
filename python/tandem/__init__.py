"""tandem from Python: the fused CPU MoE operator as a kernel library, and the engine.

    import torch, tandem
    moe = tandem.MoE(num_experts=64, num_experts_per_tok=6, hidden_size=2048,
                     moe_intermediate_size=1408, method="int8", threads=8,
                     gate=gate, up=up, down=down)          # [experts, out, in] torch tensors
    moe.load_weights()
    out = moe.forward(hidden, topk_ids, topk_weights)     # [tokens, hidden]

    model = tandem.Model("model.gguf", cpu_experts="repack")
    for piece in model.chat([{"role": "user", "content": "Hi"}], stream=True):
        print(piece, end="")

Tensors are CPU torch tensors, read in place where their layout allows (contiguous, a dtype the
kernels take) and copied otherwise. Errors are Python exceptions whose message names the argument:
ValueError (a shape, a value, an id), TypeError (a dtype or method the operator cannot take),
OSError (a file). docs/python.md has the whole API. The modules: operator (MoE), quant (the weight
formats: QuantizedTensor, quantize, dequantize), kt (kt-kernel's names over the operator:
KTMoEWrapper, generate_gpu_experts_masks), engine (Model).

Beside the classes and functions (each documented where it is defined):
    METHODS: the tuple of tandem.MoE's methods, ("int4", "int8", "bf16", "fp8", "gguf").
    cuda_streams: bool, True when tandem was built with CUDA: submit_forward / sync_forward may
        then be put on a CUDA stream (cuda_stream=).
    set_log_level(level): how much tandem logs to stderr ("error", "warn", "info", "debug",
        "trace").
"""

from __future__ import annotations

from . import _tandem
from .engine import Model
from .kt import KTMoEWrapper, generate_gpu_experts_masks
from .operator import METHODS, MoE
from .quant import QuantizedTensor, dequantize, quantize

__all__ = ["MoE", "KTMoEWrapper", "generate_gpu_experts_masks", "Model", "QuantizedTensor",
           "quantize", "dequantize", "set_log_level", "cuda_streams", "METHODS"]

cuda_streams = _tandem.cuda_streams  # built with CUDA: submit/sync may be put on a CUDA stream
set_log_level = _tandem.set_log_level
