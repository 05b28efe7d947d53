"""kt-kernel's names over tandem's operator: `KTMoEWrapper` and `generate_gpu_experts_masks`, as
SGLang's KTransformers path imports them (`from kt_kernel import KTMoEWrapper,
generate_gpu_experts_masks`), so that `from tandem import ...` drops in.

The wrapper follows kt-kernel's inference wrapper (kt-kernel/python/experts_base.py):
- submit_forward copies its inputs into buffers kept per batch size (two slots, a layer uses slot
  layer_idx % 2), so the caller may overwrite them right after (SGLang sets the ids of GPU experts
  to -1 in place); ids of -1 are skipped, as are the experts `gpu_experts_mask` puts on the GPU;
- the output is the CPU experts' weighted sum only (no routed_scaling_factor), in a buffer of that
  batch size, the same tensor call after call;
- `gpu_experts_mask` is read at every submit_forward, so an in-place update takes effect at the
  next one;
- Expert Deferral (`max_deferred_experts_per_token`): a layer's experts beyond the
  num_experts_per_tok - max_deferred with the largest weights (taken over the whole batch) are
  computed while the engine goes on, and their sum is added to the next layer's output:
      out[L] = sum_{immediate(L)} w * E_L(x_L) + sum_{deferred(L-1)} w * E_{L-1}(x_{L-1}).
  The layers' submits run in order on one thread pool (the wrappers share it when they ask for the
  same cpuinfer_threads and threadpool_count), so layer L+1's immediate experts start after layer
  L's deferred ones.
docs/python.md lists each argument and what tandem does with it.
"""

from __future__ import annotations

import weakref
from typing import Iterable, List, Optional, Tuple

import torch

from . import _tandem
from .operator import METHODS, MoE, _stream_handle

# kt-kernel's inference methods tandem runs, and the others (refused, naming them).
# (RAWINT4: a compressed-tensors INT4 checkpoint's experts, which the loader reads as the Q4_0
# blocks they are: tandem's gguf kernels run them as stored; GPTQ_INT4 likewise a GPTQ
# checkpoint's. FP8_PERCHANNEL: a compressed-tensors FP8 checkpoint's, one scale per row:
# tandem's FP8 kernels with (1 x columns) blocks. MXFP4: gpt-oss's MXFP4 experts with their
# biases and clamped SwiGLU, as the checkpoint (HF or GGUF) holds them.)
_KT_METHODS = {"AMXINT4": "int4", "AMXINT8": "int8", "LLAMAFILE": "gguf", "FP8": "fp8",
               "BF16": "bf16", "RAWINT4": "gguf", "FP8_PERCHANNEL": "fp8", "GPTQ_INT4": "gguf",
               "MXFP4": "gguf"}
_KT_OTHER_METHODS = ("SYCL_GPTQ_INT4", "MXFP8", "MOE_INT4", "MOE_INT8")


def generate_gpu_experts_masks(activation_freq: torch.Tensor,
                               num_gpu_experts: int) -> torch.Tensor:
    """The num_gpu_experts (layer, expert) pairs activated most often, over all layers at once,
    as kt-kernel computes it (ties as torch.topk breaks them).

    Args:
        activation_freq: [layers, experts] activation counts or frequencies (a tensor or anything
            torch.as_tensor takes; any device, any numeric dtype).
        num_gpu_experts: how many pairs go to the GPU, over all layers (clamped to 0 ..
            layers * experts).

    Returns:
        A torch.bool CPU tensor [layers, experts], True = on the GPU.

    Example:
        >>> masks = tandem.generate_gpu_experts_masks(torch.rand(4, 64), 32)
        >>> masks.shape, int(masks.sum())
        (torch.Size([4, 64]), 32)
    """
    freq = torch.as_tensor(activation_freq)
    if freq.dim() != 2:
        raise ValueError(f"activation_freq: shape {list(freq.shape)}, expected [layers, experts]")
    layers, experts = freq.shape
    n = max(0, min(int(num_gpu_experts), layers * experts))
    masks = torch.zeros(layers * experts, dtype=torch.bool)
    if n:
        top = torch.topk(freq.reshape(-1).to("cpu"), k=n, largest=True, sorted=False).indices
        masks[top] = True
    return masks.view(layers, experts)


class _Buffers:
    """The per-batch-size buffers every wrapper shares (kt-kernel's KExpertsCPUBuffer): two slots
    of inputs and outputs; sizes given to set_capture_batch_sizes are kept, any other one is the
    single temporary entry."""

    capture_sizes: List[int] = []
    kept: dict = {}
    temp: Tuple = (None, None)

    @classmethod
    def get(cls, tokens: int, hidden: int, k: int, pinned: bool) -> dict:
        key = (tokens, hidden, k, pinned)
        bufs = cls.kept.get(key)
        if bufs is None and cls.temp[0] == key:
            bufs = cls.temp[1]
        if bufs is None:
            pin = dict(pin_memory=True) if pinned else {}

            def two(shape, dtype, fill=0):
                return [torch.full(shape, fill, dtype=dtype, **pin) for _ in range(2)]

            bufs = dict(x=two((tokens, hidden), torch.float32),
                        immediate=two((tokens, k), torch.int32),
                        deferred=two((tokens, k), torch.int32, -1),
                        w=two((tokens, k), torch.float32),
                        out=two((tokens, hidden), torch.float32),
                        typed={})  # (slot, device, dtype) -> the output as the caller gets it
            if tokens in cls.capture_sizes:
                cls.kept[key] = bufs
            cls.temp = (key, bufs)
        return bufs

    @classmethod
    def typed(cls, bufs: dict, slot: int, device, dtype) -> torch.Tensor:
        key = (slot, str(device), dtype)
        t = bufs["typed"].get(key)
        if t is None:
            t = bufs["typed"][key] = torch.empty(bufs["out"][slot].shape, dtype=dtype,
                                                 device=device)
        return t


class KTMoEWrapper(MoE):
    """kt-kernel's KTMoEWrapper (inference) over tandem's operator; the arguments in kt-kernel's
    order and meaning (docs/python.md has the table). An argument tandem cannot honour is refused
    with a ValueError that says why; kt-kernel's fine-tuning arguments (lora_*, max_cache_depth,
    group_size, zero_point, full_weight_grad) are, as there, unused in inference.

    Args:
        layer_idx: the layer (its output slot is layer_idx % 2; with weight_path, the layer read).
        num_experts, num_experts_per_tok, hidden_size, moe_intermediate_size: the layer's sizes,
            as tandem.MoE's.
        gpu_experts_mask: [num_experts] bool tensor, True = on the GPU (skipped here); kept as
            the attribute gpu_experts_mask (pinned where CUDA is) and read at every
            submit_forward: update it in place with .copy_(). An int here is kt-kernel's older
            num_gpu_experts.
        cpuinfer_threads: compute threads (0: one per physical core).
        threadpool_count: NUMA parts; wrappers with the same threads and parts share one pool.
        weight_path: a .gguf file, a directory of GGUF files or a Hugging Face directory.
        chunked_prefill_size: longer forwards run in chunks of this many tokens (0: at once).
        cpu_save: accepted (tandem quantizes at every load and writes nothing).
        max_deferred_experts_per_token: Expert Deferral, 0 .. num_experts_per_tok (None: 0).
        method: kt-kernel's AMXINT4, AMXINT8, LLAMAFILE, FP8, BF16, RAWINT4, FP8_PERCHANNEL,
            GPTQ_INT4, MXFP4, or tandem's int4 / int8 / bf16 / fp8 / gguf.
        numa_nodes: None or [0, ..., threadpool_count - 1].
        mode: "inference" only.
        num_gpu_experts: without a mask, the first num_gpu_experts experts are the GPU's.
        lora_rank, lora_alpha, lora_dropout, max_cache_depth, group_size, zero_point,
            full_weight_grad: fine-tuning only, unused.
        swiglu_limit, swiglu_alpha: MXFP4 only: the checkpoint's own clamp (checked at load);
            0 otherwise.

    Returns:
        The wrapper; load_weights() or load_weights_from_tensors() builds the layer.

    Example:
        >>> w = tandem.KTMoEWrapper(layer_idx=0, num_experts=64, num_experts_per_tok=6,
        ...                         hidden_size=2048, moe_intermediate_size=1408,
        ...                         gpu_experts_mask=torch.zeros(64, dtype=torch.bool),
        ...                         cpuinfer_threads=16, threadpool_count=1,
        ...                         weight_path="/models/DeepSeek-V2-Lite", method="AMXINT8")
        >>> w.load_weights()
        >>> out = w.forward(hidden_states, topk_ids, topk_weights)
    """

    _pending_deferred: dict = {}  # layer_idx -> its deferred experts are on their way
    _instances = weakref.WeakSet()

    def __init__(self, layer_idx: int, num_experts: int, num_experts_per_tok: int,
                 hidden_size: int, moe_intermediate_size: int, gpu_experts_mask=None,
                 cpuinfer_threads: int = 0, threadpool_count: int = 1,
                 weight_path: Optional[str] = None, chunked_prefill_size: int = 0,
                 cpu_save: bool = False, max_deferred_experts_per_token: Optional[int] = None,
                 method: str = "AMXINT4", numa_nodes: Optional[List[int]] = None,
                 mode: str = "inference", num_gpu_experts: int = 0, lora_rank: int = 16,
                 lora_alpha: float = 32.0, lora_dropout: float = 0.0, max_cache_depth: int = 1,
                 group_size: int = 128, zero_point: bool = True, full_weight_grad: bool = False,
                 swiglu_limit: float = 0.0, swiglu_alpha: float = 0.0):
        if isinstance(gpu_experts_mask, int) and not isinstance(gpu_experts_mask, bool):
            # kt-kernel's older order: num_gpu_experts where the mask is now
            num_gpu_experts, gpu_experts_mask = gpu_experts_mask, None
        if mode != "inference":
            raise ValueError(f"mode {mode!r}: tandem's wrapper runs inference only (kt-kernel's "
                             f"'sft' LoRA fine-tuning is not supported)")
        name = str(method).upper()
        m = _KT_METHODS.get(name, method if method in METHODS else None)
        if m is None:
            why = (" (kt-kernel has it; tandem does not yet)" if name in _KT_OTHER_METHODS
                   else "")
            raise ValueError(f"method {method!r}{why}: expected one of {sorted(_KT_METHODS)} "
                             f"(or tandem's {', '.join(METHODS)})")
        if (swiglu_limit or swiglu_alpha) and name != "MXFP4":
            raise ValueError(f"swiglu_limit {swiglu_limit!r} / swiglu_alpha {swiglu_alpha!r}: "
                             f"the clamped SwiGLU belongs to kt-kernel's MXFP4 / MXFP8 methods; "
                             f"method {method} computes plain SwiGLU (pass 0)")
        # (MXFP4: the clamp is the checkpoint's; load_weights checks these against it)
        self._swiglu = (float(swiglu_limit), float(swiglu_alpha))
        deferred = 0 if max_deferred_experts_per_token is None else max_deferred_experts_per_token
        if not isinstance(deferred, int) or not 0 <= deferred <= num_experts_per_tok:
            raise ValueError(f"max_deferred_experts_per_token {max_deferred_experts_per_token!r}: "
                             f"expected 0 .. num_experts_per_tok {num_experts_per_tok}")
        if numa_nodes is not None and list(numa_nodes) != list(range(threadpool_count)):
            raise ValueError(f"numa_nodes {list(numa_nodes)}: tandem puts its threadpool_count "
                             f"{threadpool_count} NUMA parts on nodes 0 .. {threadpool_count - 1} "
                             f"(pass None or that list)")
        if gpu_experts_mask is None:
            if not isinstance(num_gpu_experts, int) or not 0 <= num_gpu_experts <= num_experts:
                raise ValueError(f"num_gpu_experts {num_gpu_experts!r}: expected 0 .. "
                                 f"{num_experts}")
            mask = torch.arange(num_experts) < num_gpu_experts  # (the first n: kt-kernel's rule)
        else:
            mask = torch.as_tensor(gpu_experts_mask).to("cpu", torch.bool).flatten()
            if mask.numel() != num_experts:
                raise ValueError(f"gpu_experts_mask: {mask.numel()} entries, expected "
                                 f"num_experts {num_experts}")
        # The mask read at every submit: update it in place (.copy_) to move experts.
        pinned = torch.cuda.is_available() and _tandem.cuda_streams
        self.gpu_experts_mask = torch.empty(num_experts, dtype=torch.bool,
                                            pin_memory=bool(pinned))
        self.gpu_experts_mask.copy_(mask)
        self.num_gpu_experts = int(self.gpu_experts_mask.sum())
        self.max_deferred_experts_per_token = deferred
        self.cpu_save = cpu_save
        self.weight_path = weight_path
        self._inflight = None
        super().__init__(num_experts, num_experts_per_tok, hidden_size, moe_intermediate_size,
                         method=m, gpu_experts_mask=self.gpu_experts_mask,
                         threads=cpuinfer_threads, numa_parts=threadpool_count,
                         weight_path=weight_path, layer_idx=layer_idx,
                         chunk_tokens=chunked_prefill_size or 0)
        self.layer_idx = layer_idx
        KTMoEWrapper._pending_deferred[layer_idx] = False
        KTMoEWrapper._instances.add(self)

    # -- weights --
    def load_weights(self, physical_to_logical_map_cpu=None):
        """Builds the layer from weight_path (kt-kernel's load_weights).

        Args:
            physical_to_logical_map_cpu: [slots] integers (SGLang's int64 map): slot p computes
                logical expert map[p]. None: slot e is expert e.

        Returns:
            self.

        Example:
            >>> w.load_weights(torch.arange(64, dtype=torch.int64))
        """
        super().load_weights(physical_to_logical_map=physical_to_logical_map_cpu)
        self._check_swiglu()
        return self

    def _check_swiglu(self):
        """swiglu_limit / swiglu_alpha, when given, must be the model's own (gpt-oss: its
        config's limit and alpha 1.702): tandem computes the experts as the checkpoint says."""
        limit, alpha = self._swiglu
        if not (limit or alpha):
            return
        have = self._loaded().swiglu_limit
        want_alpha = _tandem.swiglu_oai_alpha if have else 0.0
        if abs(limit - have) > 1e-6 or (alpha and abs(alpha - want_alpha) > 1e-4):
            raise ValueError(f"swiglu_limit {limit} / swiglu_alpha {alpha}: the checkpoint's "
                             f"experts clamp at {have} with alpha {want_alpha:g}")

    def load_weights_from_tensors(self, gate_proj, up_proj, down_proj,
                                  physical_to_logical_map_cpu=None):
        """Builds the layer from weight tensors (kt-kernel's online quantization).

        Args:
            gate_proj, up_proj: [num_experts, moe_intermediate_size, hidden_size]; down_proj:
                [num_experts, hidden_size, moe_intermediate_size]. CPU torch tensors (float32,
                bfloat16, float16), per-expert lists or tandem.QuantizedTensor, as tandem.MoE
                takes them.
            physical_to_logical_map_cpu: as load_weights()'.

        Returns:
            self.

        Example:
            >>> w.load_weights_from_tensors(gate, up, down)
        """
        super().load_weights(gate_proj, up_proj, down_proj, physical_to_logical_map_cpu)
        self._check_swiglu()
        return self

    # -- deferral --
    def select_deferred_experts(self, expert_ids: torch.Tensor, expert_scores: torch.Tensor,
                                protected_k: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Splits the routed experts into those computed now and those deferred to the next
        layer: an expert is immediate for every token when it is among some token's protected_k
        heaviest (kt-kernel's rule, over the whole batch); ids of -1 stay -1.

        Args:
            expert_ids: [T, num_experts_per_tok] integer expert ids (-1: an empty slot).
            expert_scores: their weights, the same shape, floating point.
            protected_k: how many of each token's heaviest make an expert immediate (clamped to
                0 .. num_experts_per_tok).

        Returns:
            (immediate, deferred): two tensors of expert_ids' shape, dtype and device, each with
            the ids it keeps and -1 elsewhere.

        Example:
            >>> now, later = w.select_deferred_experts(topk_ids.long(), topk_weights, 4)
        """
        topk = expert_ids.shape[-1]
        protected_k = max(0, min(int(protected_k), topk))
        if protected_k == 0:
            return torch.full_like(expert_ids, -1), expert_ids.clone()
        heaviest = torch.topk(expert_scores, k=protected_k, dim=-1, largest=True,
                              sorted=False).indices
        protected_ids = torch.gather(expert_ids, -1, heaviest)
        # (index 0 stands for id -1: never protected)
        flag = torch.zeros(self.num_experts + 1, dtype=torch.bool, device=expert_ids.device)
        flag[(protected_ids + 1).clamp(min=0).reshape(-1)] = True
        flag[0] = False
        protected = flag[(expert_ids + 1).clamp(min=0)]
        return expert_ids.masked_fill(~protected, -1), expert_ids.masked_fill(protected, -1)

    # -- compute --
    def submit_forward(self, hidden_states, topk_ids, topk_weights, cuda_stream=None):
        """Starts the layer: the inputs copied (converted) into this batch size's buffers, the
        experts queued; the caller may overwrite its tensors right after. GPU tensors with
        cuda_stream (or the current stream): all of it enqueued on that stream (CUDA-graph
        capturable: no allocation or host synchronization once the batch size's buffers exist).

        Args:
            hidden_states: [T, hidden_size] floating-point tensor, CPU or GPU.
            topk_ids: T * num_experts_per_tok integer expert ids ([T, k]), -1: none.
            topk_weights: their weights, the same number, floating point.
            cuda_stream: a torch.cuda.Stream or its handle for GPU tensors (None: the current
                stream); unused for CPU tensors.

        Returns:
            None. A second submit before sync_forward raises RuntimeError.

        Example:
            >>> w.submit_forward(hidden_states, topk_ids, topk_weights, stream)
            >>> out = w.sync_forward(hidden_states, stream)
        """
        layer = self._loaded()
        if self._inflight is not None:
            raise RuntimeError("submit_forward: this layer already has one in flight "
                               "(sync_forward first)")
        H, K, E = self.hidden_size, self.num_experts_per_tok, self.num_experts
        x = hidden_states
        if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] != H:
            raise ValueError(f"hidden_states: expected a tensor [tokens, hidden_size {H}]")
        T = x.numel() // H
        for name, t in (("topk_ids", topk_ids), ("topk_weights", topk_weights)):
            if not isinstance(t, torch.Tensor) or t.numel() != T * K:
                raise ValueError(f"{name}: expected [tokens {T}, num_experts_per_tok {K}]")
        on_device = x.is_cuda
        if on_device and not _tandem.cuda_streams:
            raise TypeError("hidden_states is on the GPU, and this tandem was built without "
                            "CUDA: pass CPU tensors")
        ids = topk_ids.reshape(T, K)
        if not on_device and ids.numel():  # (a cast to int32 would wrap 2**32 + e to e)
            lo, hi = torch.aminmax(ids)
            if lo < -1 or hi >= E:
                raise ValueError(f"topk_ids: {int(lo) if lo < -1 else int(hi)} is not an expert "
                                 f"id (-1: none, or 0 .. {E - 1})")
        w = topk_weights.reshape(T, K)
        immediate, deferred = ids, None
        if self.max_deferred_experts_per_token > 0:
            immediate, deferred = self.select_deferred_experts(
                ids.long(), w, K - self.max_deferred_experts_per_token)
        bufs = _Buffers.get(T, H, K, on_device)
        cur = self.layer_idx % 2
        handle = 0
        if on_device:
            handle = _stream_handle(cuda_stream) or torch.cuda.current_stream(x.device).cuda_stream
        copies = (("x", x.reshape(T, H)), ("w", w), ("immediate", immediate),
                  ("deferred", deferred))
        if on_device:
            with torch.cuda.stream(torch.cuda.ExternalStream(handle, device=x.device)):
                for key, t in copies:
                    if t is not None:
                        bufs[key][cur].copy_(t, non_blocking=True)
        else:
            for key, t in copies:
                if t is not None:
                    bufs[key][cur].copy_(t)
        mask = self.gpu_experts_mask
        if mask.numel() != E or mask.dtype is not torch.bool or mask.is_cuda:
            raise ValueError(f"gpu_experts_mask: expected a bool CPU tensor of num_experts {E} "
                             f"entries (update it in place with .copy_)")
        mask = mask.contiguous()

        def submit(ids_buf, out, **flags):
            args = (bufs["x"][cur].data_ptr(), T, ids_buf.data_ptr(), bufs["w"][cur].data_ptr(),
                    K, out.data_ptr())
            flags.update(mask=mask.data_ptr(), mask_size=E)
            if on_device:
                layer.submit_on_stream(handle, *args, **flags)
            else:
                layer.submit(*args, **flags)

        carry_in = KTMoEWrapper._pending_deferred.get(self.layer_idx - 1, False)
        submit(bufs["immediate"][cur], bufs["out"][cur], accumulate=carry_in)
        if deferred is not None:
            submit(bufs["deferred"][cur], bufs["out"][1 - cur], deferred=True)
        KTMoEWrapper._pending_deferred[self.layer_idx] = deferred is not None
        self._inflight = (x.shape, x.dtype, x.device, bufs, cur, handle)

    def sync_forward(self, hidden_states=None, cuda_stream=None) -> torch.Tensor:
        """Waits for the layer (with a stream: enqueues the wait) and returns its output.

        Args:
            hidden_states: unused (kt-kernel's signature).
            cuda_stream: unused: the submit's stream is the one waited on.

        Returns:
            The CPU experts' weighted sum (no routed_scaling_factor) in the submitted hidden
            states' shape, dtype and device: this batch size's buffer, rewritten by the layer
            two after this one (consume or copy it before). Without a submit, RuntimeError.

        Example:
            >>> w.submit_forward(hidden_states, topk_ids, topk_weights)
            >>> out = w.sync_forward()
        """
        if self._inflight is None:
            raise RuntimeError("sync_forward without submit_forward")
        shape, dtype, device, bufs, cur, handle = self._inflight
        self._inflight = None
        out = bufs["out"][cur]
        if handle:
            self._layer.sync_on_stream(handle)
            typed = _Buffers.typed(bufs, cur, device, dtype)
            with torch.cuda.stream(torch.cuda.ExternalStream(handle, device=device)):
                typed.copy_(out, non_blocking=True)
            return typed.view(shape)
        self._layer.sync()
        if dtype is torch.float32:
            return out.view(shape)
        typed = _Buffers.typed(bufs, cur, device, dtype)
        typed.copy_(out)
        return typed.view(shape)

    def forward(self, hidden_states, topk_ids, topk_weights, cuda_stream=None):
        """submit_forward + sync_forward.

        Args:
            hidden_states, topk_ids, topk_weights, cuda_stream: as submit_forward()'s.

        Returns:
            The output as sync_forward() gives it; on the CPU a tensor of its own (not the
            buffer).

        Example:
            >>> out = w.forward(hidden_states, topk_ids, topk_weights)
        """
        self.submit_forward(hidden_states, topk_ids, topk_weights, cuda_stream)
        out = self.sync_forward(hidden_states, cuda_stream)
        return out if out.is_cuda else out.clone()

    __call__ = forward

    # -- kt-kernel's static methods --
    @staticmethod
    def set_capture_batch_sizes(capture_bs: Iterable[int]) -> None:
        """The batch sizes (tokens) a CUDA graph captures: their buffers are kept (another size
        uses one temporary entry).

        Args:
            capture_bs: token counts, as SGLang's cuda_graph_runner passes them.

        Returns:
            None.

        Example:
            >>> tandem.KTMoEWrapper.set_capture_batch_sizes([1, 2, 4, 8, 16])
        """
        _Buffers.capture_sizes = [int(s) for s in capture_bs]

    @staticmethod
    def get_capture_batch_sizes() -> List[int]:
        """The batch sizes set_capture_batch_sizes() keeps buffers for.

        Returns:
            A new list of ints.

        Example:
            >>> tandem.KTMoEWrapper.get_capture_batch_sizes()
            [1, 2, 4, 8, 16]
        """
        return list(_Buffers.capture_sizes)

    @staticmethod
    def clear_buffer_cache() -> None:
        """Drops every kept and temporary buffer (made again at the next submit).

        Returns:
            None.

        Example:
            >>> tandem.KTMoEWrapper.clear_buffer_cache()
        """
        _Buffers.kept.clear()
        _Buffers.temp = (None, None)
