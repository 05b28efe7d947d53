"""Weights in the formats the engine reads: QuantizedTensor, quantize and dequantize (GGUF block
types as llama.cpp quantizes them, FP8 E4M3 with per-block scales as DeepSeek-V3 ships them), and
the checks the operator (operator.py) shares with them."""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from . import _tandem

_BLOCK_TYPES = {n.lower(): n for n in ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K",
                                       "q4_K", "q5_K", "q6_K")}


class QuantizedTensor:
    """Weights in a block format: a GGUF block type ("q4_K", "q8_0", ...) or FP8 E4M3 with
    DeepSeek-V3 block scales ("fp8"). What tandem.quantize returns and tandem.dequantize, tandem.MoE
    and tandem.KTMoEWrapper take; the tensors are held, not copied.

    Args:
        data: the encoded weights, torch.uint8 on the CPU: [..., rows, row bytes] for a GGUF type
            (row bytes: the type's blocks of one row), [..., rows, cols] FP8 bytes for "fp8".
        dtype: "fp8" or a GGUF block type: q4_0, q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, q4_K, q5_K,
            q6_K (any case).
        shape: the logical [..., rows, cols] (for MoE weights [num_experts, out, in]).
        scales: "fp8" only: torch.float32 [..., ceil(rows / block[0]), ceil(cols / block[1])],
            one scale per block (value = FP8 value * scale).
        block: "fp8" only: the (rows, cols) of a scale's block; DeepSeek-V3's (128, 128).

    Returns:
        The tensor; its attributes data, dtype (the canonical name), shape (a tuple), scales and
        block are the arguments. An unknown dtype raises ValueError; the sizes are checked where
        the tensor is used.

    Example:
        >>> w = torch.randn(8, 256, 512)
        >>> q = tandem.quantize(w, "q4_K")          # or, from bytes one has:
        >>> q = tandem.QuantizedTensor(q.data, "q4_K", (8, 256, 512))
        >>> q
        QuantizedTensor(q4_K, shape=[8, 256, 512])
    """

    def __init__(self, data: torch.Tensor, dtype: str, shape: Sequence[int],
                 scales: Optional[torch.Tensor] = None, block: Sequence[int] = (128, 128)):
        dtype = "fp8" if str(dtype).lower() == "fp8" else _block_type(dtype)
        self.data, self.dtype, self.shape = data, dtype, tuple(int(s) for s in shape)
        self.scales, self.block = scales, (int(block[0]), int(block[1]))

    def __repr__(self):
        return f"QuantizedTensor({self.dtype}, shape={list(self.shape)})"


def _block_type(name: str) -> str:
    t = _BLOCK_TYPES.get(str(name).lower())
    if t is None:
        raise ValueError(f"dtype {name!r}: expected fp8 or one of {sorted(_BLOCK_TYPES.values())}")
    return t


def quantize(t: torch.Tensor, dtype: str, block: Sequence[int] = (128, 128)) -> QuantizedTensor:
    """F32 weights into a block format, quantized as llama.cpp's reference does (GGUF types) or
    as DeepSeek-V3 ships FP8 (E4M3 with one F32 scale per block).

    Args:
        t: the weights, a CPU torch tensor [..., rows, cols] of any floating dtype (converted to
            float32); cols must be a multiple of the GGUF type's block (32, or 256 for the K
            types).
        dtype: "fp8" or a GGUF block type (q4_0, q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, q4_K, q5_K,
            q6_K; any case).
        block: "fp8" only: the (rows, cols) each scale covers, positive.

    Returns:
        A QuantizedTensor of t's shape: data torch.uint8 [..., rows, row bytes] (GGUF) or
        [..., rows, cols] with scales torch.float32 [..., ceil(rows / block[0]),
        ceil(cols / block[1])] (FP8).

    Example:
        >>> q = tandem.quantize(torch.randn(4, 256, 512), "fp8")
        >>> q.data.dtype, q.scales.shape
        (torch.uint8, torch.Size([4, 2, 4]))
    """
    t = _cpu(t, "t").to(torch.float32).contiguous()
    if t.dim() < 2:
        raise ValueError(f"t: {t.dim()} dimensions, expected [..., rows, cols]")
    rows, cols = t.shape[-2], t.shape[-1]
    lead = t.shape[:-2]
    n = t.numel() // (rows * cols) if t.numel() else 0
    if str(dtype).lower() == "fp8":
        br, bc = int(block[0]), int(block[1])
        if br <= 0 or bc <= 0:
            raise ValueError(f"block {list(block)}: expected positive sizes (rows, cols)")
        sr, sc = -(-rows // br), -(-cols // bc)
        w = torch.empty(*lead, rows, cols, dtype=torch.uint8)
        s = torch.empty(*lead, sr, sc, dtype=torch.float32)
        for i in range(n):
            _tandem.quantize_fp8(src=t.data_ptr() + i * rows * cols * 4, rows=rows, cols=cols,
                                 block_rows=br, block_cols=bc,
                                 dst=w.data_ptr() + i * rows * cols,
                                 scales=s.data_ptr() + i * sr * sc * 4)
        return QuantizedTensor(w, "fp8", t.shape, s, (br, bc))
    bt = _block_type(dtype)
    rb = _tandem.dtype_row_bytes(bt, cols)
    out = torch.empty(*lead, rows, rb, dtype=torch.uint8)
    _tandem.quantize_rows(src=t.data_ptr(), rows=n * rows, cols=cols, dtype=bt,
                          dst=out.data_ptr())
    return QuantizedTensor(out, bt, t.shape)


def dequantize(q: QuantizedTensor) -> torch.Tensor:
    """The F32 values of quantized weights: what the kernels multiply by.

    Args:
        q: a QuantizedTensor whose data (and FP8 scales) are CPU tensors of the sizes its shape,
            dtype and block call for.

    Returns:
        A new torch.float32 tensor of q.shape.

    Example:
        >>> w = torch.randn(256, 512)
        >>> err = (tandem.dequantize(tandem.quantize(w, "q8_0")) - w).norm() / w.norm()
    """
    if not isinstance(q, QuantizedTensor):
        raise TypeError(f"q: expected a tandem.QuantizedTensor, got {type(q).__name__}")
    data, scales = _checked_blocks(q, "q")
    rows, cols = q.shape[-2], q.shape[-1]
    n = data.numel() // (rows * cols) if q.dtype == "fp8" else 0
    out = torch.empty(*q.shape, dtype=torch.float32)
    if scales is not None:
        sr, sc = scales.shape[-2], scales.shape[-1]
        for i in range(n):
            _tandem.dequantize_fp8(src=data.data_ptr() + i * rows * cols,
                                   scales=scales.data_ptr() + i * sr * sc * 4, rows=rows,
                                   cols=cols, block_rows=q.block[0], block_cols=q.block[1],
                                   dst=out.data_ptr() + i * rows * cols * 4)
    else:
        _tandem.dequantize_rows(src=data.data_ptr(), rows=out.numel() // cols, cols=cols,
                                dtype=q.dtype, dst=out.data_ptr())
    return out


# ---------------------------------------------------------------------------------------------
# Argument checks (the operator's too)

def _cpu(t, name: str) -> torch.Tensor:
    """t when it is a CPU torch tensor; TypeError / ValueError naming `name` otherwise."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name} is on {t.device}: tandem's CPU operator takes CPU tensors "
                         f"(copy it with .cpu(), pinned for a CUDA stream)")
    return t


def _checked_blocks(q: QuantizedTensor, name: str):
    """q's contiguous CPU bytes and (FP8) F32 scales, their sizes checked against q.shape."""
    if len(q.shape) < 2:
        raise ValueError(f"{name}: shape {list(q.shape)}, expected [..., rows, cols]")
    rows, cols = q.shape[-2], q.shape[-1]
    n = 1
    for s in q.shape[:-2]:
        n *= s
    data = _cpu(q.data, name).contiguous()
    if q.dtype != "fp8":
        rb = _tandem.dtype_row_bytes(q.dtype, cols)
        if data.dtype != torch.uint8 or data.numel() != n * rows * rb:
            raise ValueError(f"{name}: {data.numel()} {data.dtype} values, expected "
                             f"{n * rows * rb} uint8 bytes of {q.dtype}")
        return data, None
    if data.dtype != torch.uint8 or data.numel() != n * rows * cols:
        raise ValueError(f"{name}: {data.numel()} {data.dtype} values, expected {n * rows * cols} "
                         f"uint8 FP8 bytes")
    if q.block[0] <= 0 or q.block[1] <= 0:
        raise ValueError(f"{name}: block {list(q.block)}, expected positive sizes")
    scales = _cpu(q.scales, f"{name} scales").to(torch.float32).contiguous()
    want = (*q.shape[:-2], -(-rows // q.block[0]), -(-cols // q.block[1]))
    if tuple(scales.shape) != want:
        raise ValueError(f"{name} scales: shape {list(scales.shape)}, expected {list(want)}")
    return data, scales
