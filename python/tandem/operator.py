"""The fused CPU MoE operator from Python: one layer's routed experts (MoE), over weights given as
torch tensors, tandem.QuantizedTensor (quant.py) or a model file."""

from __future__ import annotations

import os
import threading
from typing import Optional, Sequence

import torch

from . import _tandem
# (quantize and dequantize live in quant.py; imported here, tandem.operator names them as before)
from .quant import QuantizedTensor, _checked_blocks, _cpu, dequantize, quantize

_TORCH_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
_FP8 = getattr(torch, "float8_e4m3fn", None)  # (torch >= 2.1)
METHODS = ("int4", "int8", "bf16", "fp8", "gguf")


# ---------------------------------------------------------------------------------------------
# Argument checks

def _native_tensor(data, dtype: str, shape: Sequence[int], scales=0, block=(0, 0)) -> dict:
    """The keywords of _tandem.ExpertTensor: data and scales an address or a list of one address
    per expert (scales 0: none), shape (num_experts, out, in)."""
    return dict(data=data, dtype=dtype, experts=shape[0], rows=shape[1], cols=shape[2],
                scales=scales, block_rows=block[0], block_cols=block[1])


def _expert_tensor(t, name: str, shape: Sequence[int], method: str):
    """(keep-alive objects, the native tensor's keywords) for one weight family."""
    if isinstance(t, QuantizedTensor):
        if tuple(t.shape) != tuple(shape):
            raise ValueError(f"{name}: shape {list(t.shape)}, expected {list(shape)} "
                             f"(num_experts, out, in)")
        data, scales = _checked_blocks(t, name)
        if scales is not None:
            return (data, scales), _native_tensor(data.data_ptr(), "f8_e4m3", shape,
                                                  scales.data_ptr(), t.block)
        return (data,), _native_tensor(data.data_ptr(), t.dtype, shape)
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
        return tuple(keep), _native_tensor(ptrs, _TORCH_DTYPES[dtype], shape)
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
    return (t,), _native_tensor(t.data_ptr(), _TORCH_DTYPES[t.dtype], shape)


def _mask_list(mask, n: int, name: str = "gpu_experts_mask"):
    """mask (anything torch.as_tensor takes, or None) as n 0 / 1 bytes ([] for None)."""
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
            ctx = _contexts[key] = _tandem.Context(threads=key[0], numa_parts=key[1])
        return ctx


def _stream_handle(cuda_stream) -> int:
    """A CUDA stream's handle: a torch.cuda.Stream's, an int as it is, 0 for None."""
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
    """The routed experts of one MoE layer on the CPU: tandem's fused operator. It computes, per
    token t, sum_j topk_weights[t, j] * down_e(silu(gate_e(x_t)) * up_e(x_t)) with
    e = topk_ids[t, j], over the experts it owns; shared experts and routing are the caller's.

    Args:
        num_experts: experts of the layer (0: from the model, with weight_path).
        num_experts_per_tok: routed experts per token, k: the last size of topk_ids (0: from the
            model, with weight_path).
        hidden_size: the model's hidden size H (0: from the model, with weight_path).
        moe_intermediate_size: an expert's intermediate size F (0: from the model, with
            weight_path).
        method: "int4" | "int8" | "bf16" (requantized into tandem's packed tiles) | "fp8" (FP8
            E4M3 with block scales, as stored) | "gguf" (GGUF block types, rearranged for the
            kernels).
        group: int4 / int8 quantization group, 32, 64 or 128 (None: the largest that divides
            hidden_size and moe_intermediate_size).
        gpu_experts_mask: [num_experts] bools (anything torch.as_tensor takes), True = on the
            GPU: skipped here (contributes nothing). None: every expert is the CPU's.
        threads: compute threads (0: one per physical core).
        numa_parts: each expert split over that many NUMA nodes. Layers with the same threads /
            numa_parts share one thread pool.
        gate, up: [num_experts, F, H] weights; down: [num_experts, H, F]. torch tensors
            (float32, bfloat16, float16), lists of one [out, in] tensor per expert, or
            tandem.QuantizedTensor. Or None, with weight_path.
        weight_path: instead of tensors, a .gguf file (split files: the first), a directory of
            GGUF files or a Hugging Face directory.
        layer_idx: the layer to read from weight_path.
        chunk_tokens: a forward of more tokens runs in pieces of this many (0: at once).

    Returns:
        The layer, not yet built: load_weights() builds the operator. A size or method out of
        range raises ValueError.

    Example:
        >>> moe = tandem.MoE(num_experts=8, num_experts_per_tok=2, hidden_size=256,
        ...                  moe_intermediate_size=512, method="int8", threads=2,
        ...                  gate=torch.randn(8, 512, 256), up=torch.randn(8, 512, 256),
        ...                  down=torch.randn(8, 256, 512))
        >>> moe.load_weights()
        >>> out = moe.forward(torch.randn(4, 256), torch.randint(0, 8, (4, 2)), torch.rand(4, 2))
        >>> out.shape
        torch.Size([4, 256])
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
        weight_path). The methods that repack (int4, int8, bf16) copy the weights; fp8 and gguf
        read the caller's tensors, which the object keeps alive.

        Args:
            gate, up, down: as the constructor's (all three or none; None: the constructor's).
            physical_to_logical_map: [slots] integers (anything torch.as_tensor takes): slot p
                computes logical expert map[p] (SGLang's expert-parallel load balancing; slots
                may repeat an expert); topk_ids then name slots and num_experts becomes the
                number of slots. None: slot e is expert e.

        Returns:
            self. Missing or mis-shaped weights raise ValueError; a dtype the operator cannot
            take raises TypeError; an unreadable model file OSError.

        Example:
            >>> moe = tandem.MoE(weight_path="model.gguf", layer_idx=3, method="gguf")
            >>> moe.load_weights().num_experts
            64
        """
        gate = gate if gate is not None else self._weights[0]
        up = up if up is not None else self._weights[1]
        down = down if down is not None else self._weights[2]
        given = [w is not None for w in (gate, up, down)]
        if any(given) and not all(given):
            raise ValueError("gate, up, down: give all three weight tensors or none")
        if all(given):
            layer = self._layer_from_tensors(gate, up, down)
        elif self._path is not None:
            layer = self._layer_from_file()
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

    def _layer_options(self) -> dict:
        """The native Layer's keywords beside its weights: the context, sizes and method."""
        return dict(ctx=self._ctx, num_experts=self.num_experts,
                    num_experts_per_tok=self.num_experts_per_tok, hidden_size=self.hidden_size,
                    intermediate_size=self.moe_intermediate_size, method=self.method,
                    group=int(self.group or 0), chunk_tokens=self.chunk_tokens)

    def _layer_from_tensors(self, gate, up, down):
        """The native layer over gate / up / down (tensors, per-expert lists, QuantizedTensor)."""
        if 0 in (self.num_experts, self.num_experts_per_tok, self.hidden_size,
                 self.moe_intermediate_size):
            raise ValueError("num_experts, num_experts_per_tok, hidden_size and "
                             "moe_intermediate_size are needed with weight tensors")
        E, H, F = self.num_experts, self.hidden_size, self.moe_intermediate_size
        kg, g = _expert_tensor(gate, "gate", (E, F, H), self.method)
        ku, u = _expert_tensor(up, "up", (E, F, H), self.method)
        kd, d = _expert_tensor(down, "down", (E, H, F), self.method)
        mask = _mask_list(self._mask, E)
        layer = _tandem.Layer(**self._layer_options(), gpu_experts_mask=mask,
                              gate=_tandem.ExpertTensor(**g), up=_tandem.ExpertTensor(**u),
                              down=_tandem.ExpertTensor(**d))
        # (fp8 and gguf views read the caller's memory: keep it alive)
        self._keep = kg + ku + kd if self.method in ("fp8", "gguf") else ()
        return layer

    def _layer_from_file(self):
        """The native layer read from weight_path's layer layer_idx; the sizes left 0 become the
        model's."""
        if self._layer_idx is None:
            raise ValueError("layer_idx: needed with weight_path")
        path = _model_file(self._path)
        mask = _mask_list(self._mask, self.num_experts) if self.num_experts else []
        layer = _tandem.Layer(**self._layer_options(), gpu_experts_mask=mask, path=path,
                              layer=int(self._layer_idx))
        if self._mask is not None and not self.num_experts:
            layer.set_gpu_experts_mask(_mask_list(self._mask, layer.num_experts))
        self.num_experts, self.num_experts_per_tok = layer.num_experts, layer.num_experts_per_tok
        self.hidden_size, self.moe_intermediate_size = layer.hidden_size, layer.intermediate_size
        return layer

    def set_gpu_experts_mask(self, mask) -> None:
        """Moves experts between the GPU and this operator from the next call on.

        Args:
            mask: [num_experts] bools (anything torch.as_tensor takes), True = on the GPU
                (skipped here).

        Returns:
            None. A mask of another size raises ValueError; before load_weights(),
            RuntimeError.

        Example:
            >>> moe.set_gpu_experts_mask(torch.arange(moe.num_experts) < 4)  # the first 4: GPU's
        """
        self._mask = mask
        self._loaded().set_gpu_experts_mask(_mask_list(mask, self.num_experts))

    @property
    def weight_format(self) -> str:
        """The experts' weight layout as the kernels hold it (a name such as "int8", "q4_K_x16").

        Returns:
            str; before load_weights(), RuntimeError.

        Example:
            >>> moe.load_weights().weight_format
            'int8'
        """
        return self._loaded().weight_format

    @property
    def weight_bytes(self) -> int:
        """The bytes of the experts' weights as the operator holds them.

        Returns:
            int; before load_weights(), RuntimeError.

        Example:
            >>> moe.load_weights().weight_bytes > 0
            True
        """
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
        the experts this operator owns (ids of -1 and GPU experts are skipped), computed on the
        calling thread (which helps the pool's workers).

        Args:
            hidden_states: [T, hidden_size] (or [..., hidden_size]) CPU tensor, float32, bfloat16
                or float16 (the 16-bit ones converted to float32 for the kernels).
            topk_ids: [T, num_experts_per_tok] int32 or int64 expert ids (-1: an empty slot).
            topk_weights: topk_ids' shape, any floating dtype (used as float32).
            cuda_stream: a torch.cuda.Stream or its handle: submit_forward + sync_forward on it
                (out then required). None: compute now.
            out: a contiguous float32 CPU tensor of hidden_states' shape to write instead of a
                new one (an engine's preallocated buffer).

        Returns:
            The output, hidden_states' shape and dtype (out itself when given). Mis-shaped
            inputs or ids out of range raise ValueError, dtypes the kernels cannot take
            TypeError.

        Example:
            >>> out = moe.forward(torch.randn(4, 256), torch.randint(0, 8, (4, 2)),
            ...                   torch.rand(4, 2))
        """
        if cuda_stream is not None:
            self.submit_forward(hidden_states, topk_ids, topk_weights, cuda_stream, out=out)
            return self.sync_forward(cuda_stream=cuda_stream)
        layer, hidden, x, tokens, ids, w, k, out = self._args(hidden_states, topk_ids,
                                                              topk_weights, out, allocate=False)
        given = out is not None
        if not given and tokens > 64:  # (the allocation is noise next to such a layer)
            out = torch.empty(hidden.shape, dtype=torch.float32)
        # (the per-token native calls take their six arguments by position: keywords add about
        # a quarter to this wrapper's own per-call overhead)
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
        Several layers may be in flight (they run in submit order), one submit per layer.

        Args:
            hidden_states, topk_ids, topk_weights, out: as forward()'s.
            cuda_stream: (tandem built with CUDA) a torch.cuda.Stream or its handle: the start
                is a host function on that stream, run when the stream reaches it. The tensors
                are then read and written in place, so they must be CPU tensors (pinned, filled
                by the stream's copies) that the kernels take as they are -- contiguous float32
                hidden_states and topk_weights, int32 topk_ids, a float32 out -- and stay alive
                until the stream has passed sync_forward (static buffers, as CUDA graphs need).

        Returns:
            None. A second submit before sync_forward raises RuntimeError.

        Example:
            >>> moe.submit_forward(hidden, topk_ids, topk_weights)
            >>> ...                                   # the GPU's part of the layer meanwhile
            >>> out = moe.sync_forward()
        """
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
        """Waits for submit_forward's layer and returns its output.

        Args:
            hidden_states: unused (kt-kernel's signature).
            cuda_stream: the submit's stream: the wait is enqueued on it, and the output is
                final once the stream passes it. None: waits now.

        Returns:
            The output in the submitted hidden states' shape and dtype (with cuda_stream: the
            float32 out given to submit_forward). Without a submit, RuntimeError; an error of
            the layer is raised here.

        Example:
            >>> moe.submit_forward(hidden, topk_ids, topk_weights)
            >>> out = moe.sync_forward()
        """
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
