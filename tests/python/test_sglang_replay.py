# SGLang's KTransformers path replayed against tandem's KTMoEWrapper, call for call as
# python/sglang/srt/layers/moe/kt_ep_wrapper.py makes them (kvcache-ai's fork; upstream's in-place
# id overwrite) and cuda_graph_runner.py sets the capture sizes: the import of both names, the
# masks from generate_gpu_experts_masks, the constructor with the fork's keyword arguments
# (deferral on every layer but the last), load_weights with an int64 physical-to-logical map, and
# per layer submit_forward -> the caller overwriting its ids and hidden states in place ->
# sync_forward, a mask moved in place between forwards, CUDA-graph padding rows of -1. The
# expectation is plain torch over the checkpoint's BF16 weights, per token and slot, with the
# deferral split and the mask written out here independently:
#   out[L] = sum over immediate CPU slots of layer L of w * E_L(x_L)
#          + sum over deferred CPU slots of layer L-1 of w * E_{L-1}(x_{L-1}),
# within each method's measured error (kt-kernel's metric: mean |out - ref| / mean |ref|).
import os
import subprocess

import pytest
import torch
import torch.nn.functional as F

import tandem
# As SGLang imports them: the build's python-kt/kt_kernel stands in for KTransformers' package.
from kt_kernel import KTMoEWrapper, generate_gpu_experts_masks
from safetensors_reader import fp8_e4m3_values, read_safetensors

LAYERS, E, K, H, FD, T = 4, 8, 2, 256, 128, 4


def dequantize_int4(tensors, name):
    """compressed-tensors' unpack_from_int32 and dequantize, written out: value i of a row is
    ((word[i // 8] >> 4 (i % 8)) & 15) - 8, times its group's BF16 scale (groups of 32)."""
    packed = tensors[name + "_packed"].to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(8) * 4
    q = ((packed.unsqueeze(-1) >> shifts) & 15).reshape(packed.shape[0], -1) - 8
    scale = tensors[name + "_scale"].float().repeat_interleave(32, dim=1)
    return q.float() * scale


def dequantize_gptq(tensors, base):
    """AutoGPTQ's dequantization, written out: w[n, k] = scales[k // 128, n] * (q - (z + 1)), q the
    nibble k % 8 of qweight[k // 8, n], z the nibble n % 8 of qzeros[k // 128, n // 8]."""
    shifts = torch.arange(8) * 4
    qw = tensors[base + ".qweight"].to(torch.int64) & 0xFFFFFFFF       # [in / 8, out]
    q = ((qw.unsqueeze(1) >> shifts.view(1, 8, 1)) & 15).reshape(-1, qw.shape[1])  # [in, out]
    qz = tensors[base + ".qzeros"].to(torch.int64) & 0xFFFFFFFF        # [in / 128, out / 8]
    z = ((qz.unsqueeze(-1) >> shifts) & 15).reshape(qz.shape[0], -1) + 1  # [in / 128, out]
    scales = tensors[base + ".scales"].float()                          # [in / 128, out]
    w = (q - z.repeat_interleave(128, dim=0)).float() * scales.repeat_interleave(128, dim=0)
    return w.t().contiguous()


def synth_checkpoint(tmp_path_factory, kind):
    """A tiny Qwen3-MoE checkpoint (BF16, or its routed experts in compressed-tensors INT4) and
    its experts' weights as plain torch reads them."""
    path = tmp_path_factory.mktemp("sglang") / kind
    subprocess.run([os.environ["TANDEM_BIN"], "synth", "--arch", "qwen3moe", "--preset", "tiny",
                    "--format", "hf", "--type", kind, "--layers", str(LAYERS), "--seed", "5",
                    "-o", str(path)], check=True, capture_output=True)
    tensors = {}
    for f in sorted(path.glob("*.safetensors")):
        tensors.update(read_safetensors(f))
    experts = []
    for layer in range(LAYERS):
        def weight(e, w):
            name = f"model.layers.{layer}.mlp.experts.{e}.{w}_proj.weight"
            if kind == "int4-ct":
                return dequantize_int4(tensors, name)
            if kind == "gptq-int4":
                return dequantize_gptq(tensors, name[:-len(".weight")])
            if kind == "fp8-ct":  # (compressed-tensors: fp8 value times its row's scale)
                return fp8_e4m3_values(tensors[name]) * tensors[name + "_scale"].float()
            return tensors[name].float()
        experts.append({w: [weight(e, w) for e in range(E)] for w in ("gate", "up", "down")})
    return path, experts


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return synth_checkpoint(tmp_path_factory, "bf16")


@pytest.fixture(scope="module")
def int4_checkpoint(tmp_path_factory):
    return synth_checkpoint(tmp_path_factory, "int4-ct")


@pytest.fixture(scope="module")
def fp8_checkpoint(tmp_path_factory):
    return synth_checkpoint(tmp_path_factory, "fp8-ct")


@pytest.fixture(scope="module")
def gptq_checkpoint(tmp_path_factory):
    return synth_checkpoint(tmp_path_factory, "gptq-int4")


def expert(ex, e, x):
    return ex["down"][e] @ (F.silu(ex["gate"][e] @ x) * (ex["up"][e] @ x))


def protected_experts(ids, w, protected_k):
    """kt-kernel's rule, written as loops: every expert among some token's protected_k heaviest."""
    out = set()
    for t in range(ids.shape[0]):
        order = sorted(range(ids.shape[1]), key=lambda j: -float(w[t, j]))[:protected_k]
        out |= {int(ids[t, j]) for j in order if int(ids[t, j]) >= 0}
    return out


def expected_step(experts, xs, idss, ws, masks, deferred_per_layer):
    outs, carry = [], torch.zeros(T, H)
    for layer in range(LAYERS):
        ids, w, x = idss[layer], ws[layer], xs[layer]
        d = deferred_per_layer[layer]
        protected = protected_experts(ids, w, K - d) if d else None
        out, deferred = carry.clone(), torch.zeros(T, H)
        for t in range(T):
            for j in range(K):
                e = int(ids[t, j])
                if e < 0 or bool(masks[layer][e]):
                    continue  # padding, or a GPU expert
                y = float(w[t, j]) * expert(experts[layer], e, x[t].float())
                if protected is None or e in protected:
                    out[t] += y
                else:
                    deferred[t] += y
        outs.append(out)
        carry = deferred
    return outs


def rel_mean(got, want):
    return ((got.float() - want).abs().mean() / want.abs().mean()).item()


# Measured (this test, 3 forwards x 4 layers): bf16 0.0026, int8 0.023, int4 0.22 (requantized
# from BF16), RAWINT4 0.0135 (the checkpoint's own INT4, against its dequantized values),
# FP8_PERCHANNEL 0.0028 and GPTQ_INT4 0.0133 (likewise their own weights); kt-kernel's own bounds
# for its methods are 0.02, 0.05, 0.35, 0.12, 0.1 and 0.12. (A wrapper that dropped the
# deferred experts' carry into the next layer measures 0.30 here, one that kept the mask it was
# built with 3.96.)
METHODS = [("BF16", 0.005), ("AMXINT8", 0.03), ("AMXINT4", 0.3), ("RAWINT4", 0.02),
           ("FP8_PERCHANNEL", 0.005), ("GPTQ_INT4", 0.02)]


@pytest.mark.parametrize("method,bound", METHODS)
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_sglang_call_sequence(request, method, bound, device):
    if device == "cuda" and not (torch.cuda.is_available() and tandem.cuda_streams):
        pytest.skip("needs a CUDA build of torch and of tandem, and a GPU (label gpu)")
    assert KTMoEWrapper is tandem.KTMoEWrapper  # (the stand-in is tandem's)
    # RAWINT4 reads a compressed-tensors INT4 checkpoint as stored (kt-kernel's --kt-method for
    # Kimi-K2-Thinking / K2.5), FP8_PERCHANNEL a compressed-tensors FP8 one, GPTQ_INT4 a GPTQ one;
    # the others a BF16 one.
    path, experts = request.getfixturevalue({"RAWINT4": "int4_checkpoint",
                                             "FP8_PERCHANNEL": "fp8_checkpoint",
                                             "GPTQ_INT4": "gptq_checkpoint"}.get(
                                                method, "checkpoint"))
    g = torch.Generator().manual_seed(11)
    # The fork's "frequency" placement: activation counts from --init-expert-location.
    freq = torch.randperm(LAYERS * E, generator=g).view(LAYERS, E)  # (distinct: no ties)
    masks = generate_gpu_experts_masks(freq, 6)
    assert masks.dtype == torch.bool and masks.shape == (LAYERS, E)
    top6 = set(torch.argsort(freq.flatten(), descending=True)[:6].tolist())
    assert set(masks.flatten().nonzero().flatten().tolist()) == top6
    masks = [m.clone() for m in masks]

    KTMoEWrapper.set_capture_batch_sizes([T])  # cuda_graph_runner: tokens per captured batch
    deferred = [1 if layer != LAYERS - 1 else 0 for layer in range(LAYERS)]
    wrappers = []
    for layer in range(LAYERS):
        common = dict(layer_idx=layer, num_experts=E, num_experts_per_tok=K, hidden_size=H,
                      moe_intermediate_size=FD, gpu_experts_mask=masks[layer],
                      cpuinfer_threads=2, threadpool_count=1, numa_nodes=None,
                      weight_path=str(path), chunked_prefill_size=64)
        w = KTMoEWrapper(**common, swiglu_limit=0.0, swiglu_alpha=0.0, method=method,
                         max_deferred_experts_per_token=deferred[layer])
        w.load_weights(torch.arange(E, dtype=torch.int64).contiguous())
        wrappers.append(w)

    stream = torch.cuda.current_stream().cuda_stream if device == "cuda" else 0
    worst, first_outputs = 0.0, None
    for step in range(3):
        if step == 2:  # dynamic expert placement: layer 1's GPU experts move, in place
            moved = ~masks[1]
            moved[4:] = False
            wrappers[1].gpu_experts_mask.copy_(moved)
            masks[1] = moved.clone()
        xs = [torch.randn(T, H, generator=g).bfloat16() for _ in range(LAYERS)]
        ws = [torch.softmax(torch.randn(T, K, generator=g), -1) for _ in range(LAYERS)]
        idss = [torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
                for _ in range(LAYERS)]
        for ids in idss:
            ids[-1] = -1  # a CUDA-graph padding row
        outs = []
        for layer, w in enumerate(wrappers):
            x, ids, wt = (t.clone().to(device) for t in (xs[layer], idss[layer], ws[layer]))
            w.submit_forward(x, ids, wt, stream)
            ids[ids >= 2] = -1  # upstream's mask_cpu_expert_ids, in place after the submit
            x.zero_()           # (the GPU experts may write over the hidden states)
            out = w.sync_forward(x, stream)
            assert out.shape == (T, H) and out.dtype == torch.bfloat16 and out.device == x.device
            outs.append(out)
            if step == 0 and layer == 0:
                first_outputs = out.data_ptr()
            if layer == 0:  # the batch size's buffer, not a new tensor
                assert out.data_ptr() == first_outputs
            outs[-1] = out.float().cpu().clone()
        want = expected_step(experts, xs, idss, ws, masks, deferred)
        for layer in range(LAYERS):
            assert outs[layer][-1].abs().max() == 0  # (the padding row)
            err = rel_mean(outs[layer], want[layer])
            worst = max(worst, err)
            assert err < bound, (method, step, layer, err)
    print(f"{method} on {device}: largest relative mean error {worst:.4f}")
    KTMoEWrapper.clear_buffer_cache()
