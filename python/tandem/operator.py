"""The fused CPU MoE operator from Python: weights in the formats the engine reads
(QuantizedTensor, quantize, dequantize) and one layer's routed experts (MoE)."""

from __future__ import annotations

import os
import threading
from typing import Optional, Sequence

import torch

from . import _tandem

_TORCH_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
_FP8 = getattr(torch, "float8_e4m3fn", None)  # (torch >= 2.1)
_BLOCK_TYPES = {n.lower(): n for n in ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K",
                                       "q4_K", "q5_K", "q6_K")}
METHODS = ("int4", "int8", "bf16", "fp8", "gguf")


# ---------------------------------------------------------------------------------------------
# Weights in the formats the engine reads

class QuantizedTensor:
    """Weights in a block format: a GGUF block type ("q4_K", "q8_0", ...) or FP8 E4M3 with
    DeepSeek-V3 block scales ("fp8"). data: uint8 [..., rows, row bytes]; shape: the logical
    [..., rows, cols]; scales: FP8's F32 [..., ceil(rows / 128), ceil(cols / 128)]."""

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
    """F32 weights [..., rows, cols] into `dtype`: "fp8" (E4M3 with per-block scales, as
    DeepSeek-V3 ships them) or a GGUF block type, quantized as llama.cpp's reference does."""
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
            _tandem.quantize_fp8(t.data_ptr() + i * rows * cols * 4, rows, cols, br, bc,
                                 w.data_ptr() + i * rows * cols, s.data_ptr() + i * sr * sc * 4)
        return QuantizedTensor(w, "fp8", t.shape, s, (br, bc))
    bt = _block_type(dtype)
    rb = _tandem.dtype_row_bytes(bt, cols)
    out = torch.empty(*lead, rows, rb, dtype=torch.uint8)
    _tandem.quantize_rows(t.data_ptr(), n * rows, cols, bt, out.data_ptr())
    return QuantizedTensor(out, bt, t.shape)


def dequantize(q: QuantizedTensor) -> torch.Tensor:
    """The F32 values of quantized weights (what the kernels multiply by)."""
    if not isinstance(q, QuantizedTensor):
        raise TypeError(f"q: expected a tandem.QuantizedTensor, got {type(q).__name__}")
    data, scales = _checked_blocks(q, "q")
    rows, cols = q.shape[-2], q.shape[-1]
    n = data.numel() // (rows * cols) if q.dtype == "fp8" else 0
    out = torch.empty(*q.shape, dtype=torch.float32)
    if scales is not None:
        sr, sc = scales.shape[-2], scales.shape[-1]
        for i in range(n):
            _tandem.dequantize_fp8(data.data_ptr() + i * rows * cols,
                                   scales.data_ptr() + i * sr * sc * 4, rows, cols, q.block[0],
                                   q.block[1], out.data_ptr() + i * rows * cols * 4)
    else:
        _tandem.dequantize_rows(data.data_ptr(), out.numel() // cols, cols, q.dtype,
                                out.data_ptr())
    return out


# ---------------------------------------------------------------------------------------------
# Argument checks

def _cpu(t, name: str) -> torch.Tensor:
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


def _expert_tensor(t, name: str, shape: Sequence[int], method: str):
    """(keep-alive objects, the native tuple) for one weight family."""
    if isinstance(t, QuantizedTensor):
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{name}: shape {list(t.shape)}, expected {list(shape)} "
                             f"(num_experts, out, in)")
        data, scales = _checked_blocks(t, name)
        if scales is not None:
            return (data, scales), (data.data_ptr(), "f8_e4m3", *shape, scales.data_ptr(),
                                    *t.block)
        return (data,), (data.data_ptr(), t.dtype, *shape, 0, 0, 0)
    if isinstance(t, (list, tuple)):  # one [out, in] tensor per expert: read where they are
        if len(t) != shape[0]:
            raise ValueError(f"{name}: {len(t)} per-expert tensors, expected num_experts "
                             f"{shape[0]}")
        keep, ptrs, dtype = [], [], None
        for e, te in enumerate(t):
            te = _cpu(te, f"{name}[{e}]")
            if tuple(te.shape) != tuple(shape[1:]):
                raise ValueError(f"{name}[{e}]: shape {list(te.shape)}, expected "
                                 f"{list(shape[1:])} (out, in)")
            if te.dtype not in _TORCH_DTYPES or (dtype is not None and te.dtype != dtype):
                raise TypeError(f"{name}[{e}]: dtype {te.dtype}; expected float32, bfloat16 or "
                                f"float16, the same for every expert")
            dtype = te.dtype
            te = te.contiguous()
            keep.append(te)
            ptrs.append(te.data_ptr())
        return tuple(keep), (ptrs, _TORCH_DTYPES[dtype], *shape, 0, 0, 0)
    t = _cpu(t, name)
    if t.dim() != 3 or tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: shape {list(t.shape)}, expected {list(shape)} "
                         f"(num_experts, out, in)")
    if _FP8 is not None and t.dtype == _FP8:
        raise TypeError(f"{name}: FP8 weights need their block scales: pass "
                        f"tandem.QuantizedTensor(t.view(torch.uint8), 'fp8', t.shape, scales)")
    if t.dtype not in _TORCH_DTYPES:
        raise TypeError(f"{name}: dtype {t.dtype}; expected float32, bfloat16, float16 or a "
                        f"tandem.QuantizedTensor (fp8, GGUF blocks)")
    t = t.contiguous()
    return (t,), (t.data_ptr(), _TORCH_DTYPES[t.dtype], *shape, 0, 0, 0)


def _mask_list(mask, n: int, name: str = "gpu_experts_mask"):
    if mask is None:
        return []
    m = torch.as_tensor(mask).cpu().flatten()
    if m.numel() != n:
        raise ValueError(f"{name}: {m.numel()} entries, expected num_experts {n}")
    return [1 if bool(v) else 0 for v in m.tolist()]


# ---------------------------------------------------------------------------------------------
# The operator

_contexts = {}
_contexts_lock = threading.Lock()


def _context(threads: int, numa_parts: int):
    """One thread pool per (threads, numa_parts), shared by every layer that asks for it."""
    key = (int(threads), int(numa_parts))
    with _contexts_lock:
        ctx = _contexts.get(key)
        if ctx is None:
            ctx = _contexts[key] = _tandem.Context(*key)
        return ctx


def _stream_handle(cuda_stream) -> int:
    if cuda_stream is None:
        return 0
    if isinstance(cuda_stream, int):
        return cuda_stream
    handle = getattr(cuda_stream, "cuda_stream", None)  # torch.cuda.Stream
    if handle is None:
        raise TypeError(f"cuda_stream: expected a torch.cuda.Stream or its handle, got "
                        f"{type(cuda_stream).__name__}")
    return int(handle)


class MoE:
    """The routed experts of one MoE layer on the CPU: tandem's fused operator.

    num_experts, num_experts_per_tok, hidden_size, moe_intermediate_size: the layer's sizes (0:
    from the model, with weight_path).
    method: int4 | int8 | bf16 (requantized into tandem's packed tiles; group: 32/64/128 for the
    INT ones; None: the largest that divides hidden_size and moe_intermediate_size) | fp8 (FP8 E4M3 with block scales, as stored) | gguf (GGUF block types, rearranged
    for the kernels).
    gpu_experts_mask: [num_experts] bools, True = on the GPU: skipped here (contributes nothing).
    threads: compute threads (0: one per physical core); numa_parts: split each expert over
    that many NUMA nodes. Layers with the same threads / numa_parts share one thread pool.
    The weights: gate / up [num_experts, moe_intermediate_size, hidden_size] and down
    [num_experts, hidden_size, moe_intermediate_size] torch tensors (float32, bfloat16, float16),
    lists of one [out, in] tensor per expert, or tandem.QuantizedTensor; or weight_path (a .gguf file or a Hugging Face directory) and
    layer_idx. load_weights() builds the operator.
    chunk_tokens: a forward of more tokens runs in pieces of this many (0: at once).
    """

    def __init__(self, num_experts: int = 0, num_experts_per_tok: int = 0, hidden_size: int = 0,
                 moe_intermediate_size: int = 0, *, method: str = "int8",
                 group: Optional[int] = None,
                 gpu_experts_mask=None, threads: int = 0, numa_parts: int = 1,
                 gate=None, up=None, down=None, weight_path: Optional[str] = None,
                 layer_idx: Optional[int] = None, chunk_tokens: int = 0):
        if method not in METHODS:
            raise ValueError(f"method {method!r}: expected one of {', '.join(METHODS)}")
        for name, v in (("num_experts", num_experts), ("num_experts_per_tok", num_experts_per_tok),
                        ("hidden_size", hidden_size),
                        ("moe_intermediate_size", moe_intermediate_size),
                        ("threads", threads), ("chunk_tokens", chunk_tokens)):
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} {v!r}: expected an integer >= 0")
        self.num_experts, self.num_experts_per_tok = num_experts, num_experts_per_tok
        self.hidden_size, self.moe_intermediate_size = hidden_size, moe_intermediate_size
        self.method, self.group, self.chunk_tokens = method, group, chunk_tokens
        self._ctx = _context(threads, numa_parts)
        self._mask = gpu_experts_mask
        self._weights = (gate, up, down)
        self._path, self._layer_idx = weight_path, layer_idx
        self._layer = None
        self._keep = ()
        self._pending = None

    # -- weights --
    def load_weights(self, gate=None, up=None, down=None, physical_to_logical_map=None):
        """Builds the operator from the weights given here or at construction (tensors or
        weight_path). physical_to_logical_map: slot p computes logical expert map[p]."""
        gate = gate if gate is not None else self._weights[0]
        up = up if up is not None else self._weights[1]
        down = down if down is not None else self._weights[2]
        given = [w is not None for w in (gate, up, down)]
        if any(given) and not all(given):
            raise ValueError("gate, up, down: give all three weight tensors or none")
        sizes = (self.num_experts, self.num_experts_per_tok, self.hidden_size,
                 self.moe_intermediate_size)
        if all(given):
            if 0 in sizes:
                raise ValueError("num_experts, num_experts_per_tok, hidden_size and "
                                 "moe_intermediate_size are needed with weight tensors")
            E, H, F = self.num_experts, self.hidden_size, self.moe_intermediate_size
            kg, g = _expert_tensor(gate, "gate", (E, F, H), self.method)
            ku, u = _expert_tensor(up, "up", (E, F, H), self.method)
            kd, d = _expert_tensor(down, "down", (E, H, F), self.method)
            mask = _mask_list(self._mask, E)
            layer = _tandem.Layer(self._ctx, *sizes, self.method, int(self.group or 0), mask,
                                  self.chunk_tokens, g, u, d)
            # (fp8 and gguf views read the caller's memory: keep it alive)
            self._keep = kg + ku + kd if self.method in ("fp8", "gguf") else ()
        elif self._path is not None:
            if self._layer_idx is None:
                raise ValueError("layer_idx: needed with weight_path")
            path = _model_file(self._path)
            mask = _mask_list(self._mask, self.num_experts) if self.num_experts else []
            layer = _tandem.Layer(self._ctx, *sizes, self.method, int(self.group or 0), mask,
                                  self.chunk_tokens, path, int(self._layer_idx))
            if self._mask is not None and not self.num_experts:
                layer.set_gpu_experts_mask(_mask_list(self._mask, layer.num_experts))
            self.num_experts, self.num_experts_per_tok = layer.num_experts, layer.num_experts_per_tok
            self.hidden_size, self.moe_intermediate_size = layer.hidden_size, layer.intermediate_size
        else:
            raise ValueError("no weights: give gate, up and down tensors or weight_path and "
                             "layer_idx")
        if physical_to_logical_map is not None:
            m = torch.as_tensor(physical_to_logical_map).cpu().flatten().tolist()
            layer.remap([int(v) for v in m])
            self.num_experts = len(m)
            if self._mask is not None:
                layer.set_gpu_experts_mask(_mask_list(self._mask, len(m)))
        self._layer = layer
        self._weights = (None, None, None)  # (packed copies made: the caller's may go)
        return self

    def set_gpu_experts_mask(self, mask) -> None:
        self._mask = mask
        self._loaded().set_gpu_experts_mask(_mask_list(mask, self.num_experts))

    @property
    def weight_format(self) -> str:
        return self._loaded().weight_format

    @property
    def weight_bytes(self) -> int:
        return self._loaded().weight_bytes

    def _loaded(self):
        if self._layer is None:
            raise RuntimeError("load_weights() first")
        return self._layer

    # -- compute --
    def _args(self, hidden, topk_ids, topk_weights, out=None, allocate=True):
        """(layer, hidden, x, tokens, ids, w, k, out) with x, ids, w, out the contiguous F32 /
        int32 / F32 / F32 CPU tensors the native call reads and writes. Written for few torch
        calls on the common path (F32 hidden, int32 or int64 ids, F32 weights, all contiguous):
        after a layer has streamed its experts through the caches each costs ~10 us."""
        layer = self._loaded()
        H, k = self.hidden_size, self.num_experts_per_tok
        if type(hidden) is not torch.Tensor:
            _cpu(hidden, "hidden_states")
        hs = hidden.shape
        if not hidden.is_cpu:
            _cpu(hidden, "hidden_states")
        if len(hs) < 1 or hs[-1] != H:
            raise ValueError(f"hidden_states: shape {list(hs)}, expected [tokens, "
                             f"hidden_size {H}]")
        x = hidden
        if hidden.dtype is not torch.float32:
            if hidden.dtype not in _TORCH_DTYPES:
                raise TypeError(f"hidden_states: dtype {hidden.dtype}; expected float32, "
                                f"bfloat16 or float16")
            x = hidden.float()
        if not x.is_contiguous():
            x = x.contiguous()
        tokens = x.numel() // H
        ids = topk_ids
        if type(ids) is not torch.Tensor or not ids.is_cpu:
            _cpu(ids, "topk_ids")
        ish = ids.shape
        if len(ish) < 1 or ish[-1] != k or ids.numel() != tokens * k:
            raise ValueError(f"topk_ids: shape {list(ish)}, expected [tokens {tokens}, "
                             f"num_experts_per_tok {k}]")
        if ids.dtype is not torch.int32:
            if ids.dtype is not torch.int64:
                raise TypeError(f"topk_ids: dtype {ids.dtype}; expected int32 or int64")
            if ids.numel():  # (a cast would wrap 2**32 + e to e)
                lo, hi = torch.aminmax(ids)
                if lo < -1 or hi > 2**31 - 1:
                    bad = int(lo) if lo < -1 else int(hi)
                    raise ValueError(f"topk_ids: {bad} is not an expert id (-1: none, or 0 .. "
                                     f"{self.num_experts - 1})")
            ids = ids.to(torch.int32)
        if not ids.is_contiguous():
            ids = ids.contiguous()
        w = topk_weights
        if type(w) is not torch.Tensor or not w.is_cpu:
            _cpu(w, "topk_weights")
        if w.shape != ish:
            raise ValueError(f"topk_weights: shape {list(w.shape)}, expected topk_ids' "
                             f"{list(ish)}")
        if w.dtype is not torch.float32:
            if not w.is_floating_point():
                raise TypeError(f"topk_weights: dtype {w.dtype}; expected a floating-point type")
            w = w.float()
        if not w.is_contiguous():
            w = w.contiguous()
        if out is None:
            if not allocate:
                return layer, hidden, x, tokens, ids, w, k, None
            out = torch.empty(hs, dtype=torch.float32)
        elif (type(out) is not torch.Tensor or not out.is_cpu or out.dtype is not torch.float32
              or out.shape != hs or not out.is_contiguous()):
            raise ValueError(f"out: expected a contiguous float32 CPU tensor of hidden_states' "
                             f"shape {list(hs)}")
        return layer, hidden, x, tokens, ids, w, k, out

    def forward(self, hidden_states, topk_ids, topk_weights, cuda_stream=None,
                out=None) -> torch.Tensor:
        """sum_j topk_weights[t, j] * expert_{topk_ids[t, j]}(hidden_states[t]) per token, over
        the experts this operator owns (ids of -1 and GPU experts are skipped); the output has
        hidden_states' shape and dtype. out: a float32 tensor of that shape to write instead of a
        new one (an engine's preallocated buffer; float32 hidden states only)."""
        if cuda_stream is not None:
            self.submit_forward(hidden_states, topk_ids, topk_weights, cuda_stream, out=out)
            return self.sync_forward(cuda_stream=cuda_stream)
        layer, hidden, x, tokens, ids, w, k, out = self._args(hidden_states, topk_ids,
                                                              topk_weights, out, allocate=False)
        given = out is not None
        if not given and tokens > 64:  # (the allocation is noise next to such a layer)
            out = torch.empty(hidden.shape, dtype=torch.float32)
        if out is not None:
            layer.forward(x.data_ptr(), tokens, ids.data_ptr(), w.data_ptr(), k, out.data_ptr())
        else:
            # A few tokens' output tensor is made while the experts compute: cold after the layer
            # has streamed its weights through the caches, the allocation is most of this call's
            # overhead (docs/performance.md, P1).
            layer.begin(x.data_ptr(), tokens, ids.data_ptr(), w.data_ptr(), k)
            try:
                out = torch.empty(hidden.shape, dtype=torch.float32)
            except BaseException:
                layer.end(0)
                raise
            layer.end(out.data_ptr())
        return out if given or hidden.dtype is torch.float32 else out.to(hidden.dtype)

    def submit_forward(self, hidden_states, topk_ids, topk_weights, cuda_stream=None,
                       out=None) -> None:
        """Starts the layer on tandem's threads and returns; sync_forward() gives the result.
        Several layers may be in flight (they run in submit order). With cuda_stream (tandem
        built with CUDA) the start is a host function on that stream, run when the stream
        reaches it: the tensors are then read and written in place, so they must be CPU tensors
        (pinned, filled by the stream's copies) that the kernels take as they are -- contiguous
        float32 hidden_states and topk_weights, int32 topk_ids, a float32 out -- and stay alive
        until the stream has passed sync_forward (static buffers, as CUDA graphs need)."""
        if self._pending is not None:
            raise RuntimeError("submit_forward: this layer already has one in flight "
                               "(sync_forward first)")
        stream = _stream_handle(cuda_stream)
        layer, hidden, x, tokens, ids, w, k, out = self._args(hidden_states, topk_ids,
                                                              topk_weights, out,
                                                              allocate=not stream)
        if stream and out is None:
            raise ValueError("out: needed with cuda_stream (written when the stream runs the "
                             "layer, after this call returns)")
        if stream:
            for name, given, used in (("hidden_states", hidden_states, x),
                                      ("topk_ids", topk_ids, ids),
                                      ("topk_weights", topk_weights, w)):
                if given is not used:
                    raise ValueError(f"{name}: with cuda_stream it must be a contiguous "
                                     f"{used.dtype} CPU tensor (read in place when the stream "
                                     f"reaches the submit)")
            layer.submit_on_stream(stream, x.data_ptr(), tokens, ids.data_ptr(), w.data_ptr(),
                                   k, out.data_ptr())
        else:
            layer.submit(x.data_ptr(), tokens, ids.data_ptr(), w.data_ptr(), k, out.data_ptr())
        self._pending = (hidden, x, ids, w, out)

    def sync_forward(self, hidden_states=None, cuda_stream=None) -> torch.Tensor:
        """Waits for submit_forward's layer and returns its output (with cuda_stream: enqueues
        the wait on the stream; the output is final once the stream passes it)."""
        if self._pending is None:
            raise RuntimeError("sync_forward without submit_forward")
        hidden, _, _, _, out = self._pending
        stream = _stream_handle(cuda_stream)
        try:
            if stream:
                self._layer.sync_on_stream(stream)
                self._pending = None
                return out
            self._layer.sync()
        finally:
            if not stream:
                self._pending = None
        return out if hidden.dtype is torch.float32 else out.to(hidden.dtype)

    __call__ = forward


def _model_file(path: str) -> str:
    """A model path as the loader takes it: a .gguf file, or an HF directory; a directory that
    holds GGUF files and no config.json (a GGUF download) means its first GGUF (shard)."""
    path = os.fspath(path)
    if os.path.isdir(path) and not os.path.exists(os.path.join(path, "config.json")):
        ggufs = sorted(f for f in os.listdir(path) if f.endswith(".gguf"))
        if ggufs:
            return os.path.join(path, ggufs[0])
    return path
