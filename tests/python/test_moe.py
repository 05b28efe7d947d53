# tandem.MoE against a plain-torch F32 MoE: every method, odd sizes, the GPU-expert mask, several
# layers in flight, the golden model's layer bit for bit, and bad arguments.
import pytest
import torch
import torch.nn.functional as F

import tandem
from conftest import data_path
from safetensors_reader import read_safetensors


def reference_moe(x, gate, up, down, ids, weights, skip=()):
    """sum_j w[t, j] * down_e(silu(gate_e x) * up_e x), F32, skipping ids -1 and `skip`."""
    x = x.float()
    out = torch.zeros_like(x)
    for e in range(gate.shape[0]):
        if e in skip:
            continue
        rows, slots = (ids == e).nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        h = x[rows]
        y = (F.silu(h @ gate[e].float().T) * (h @ up[e].float().T)) @ down[e].float().T
        out.index_add_(0, rows, y * weights[rows, slots].float().unsqueeze(1))
    return out


def rel_err(got, want):
    return ((got.float() - want).norm() / want.norm()).item()


def make_layer(E, H, Fd, seed=0):
    g = torch.Generator().manual_seed(seed)
    gate = torch.randn(E, Fd, H, generator=g) / H ** 0.5
    up = torch.randn(E, Fd, H, generator=g) / H ** 0.5
    down = torch.randn(E, H, Fd, generator=g) / Fd ** 0.5
    return gate, up, down


def make_routing(T, E, K, H, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).to(torch.int64)
    w = torch.softmax(torch.randn(T, K, generator=g), dim=-1)
    return x, ids, w


# Each method's documented tolerance (docs/python.md): relative L2 error of the layer's output
# against the F32 MoE on the original weights, and (for formats stored as given) against the F32
# MoE on the weights the kernels really read (only the activations' rounding is left).
ODD = dict(E=7, K=3, H=96, Fd=160)  # nothing a multiple of 128 or 256
CASES = [
    # (method, weight dtype, sizes, tolerance vs original, tolerance vs stored)
    ("int8", None, ODD, 0.025, None),
    ("int4", None, ODD, 0.25, None),
    ("bf16", None, ODD, 0.01, None),
    ("fp8", "fp8", ODD, 0.08, 0.01),
    ("gguf", "q8_0", ODD, 0.025, 0.02),
    ("gguf", "q5_0", ODD, 0.10, 0.02),
    ("gguf", "q4_K", dict(E=5, K=2, H=256, Fd=512), 0.17, 0.025),
    ("gguf", "q6_K", dict(E=5, K=2, H=256, Fd=256), 0.05, 0.025),
]


@pytest.mark.parametrize("method,wtype,sizes,tol,tol_stored", CASES,
                         ids=[f"{c[0]}-{c[1] or 'f32'}" for c in CASES])
@pytest.mark.parametrize("T", [1, 5, 33])
def test_methods_match_torch(method, wtype, sizes, tol, tol_stored, T):
    E, K, H, Fd = sizes["E"], sizes["K"], sizes["H"], sizes["Fd"]
    gate, up, down = make_layer(E, H, Fd)
    x, ids, w = make_routing(T, E, K, H, seed=T)
    if wtype is None:
        weights = (gate, up, down)
        stored = None
    else:
        weights = tuple(tandem.quantize(t, wtype) for t in (gate, up, down))
        stored = tuple(tandem.dequantize(q) for q in weights)
    moe = tandem.MoE(E, K, H, Fd, method=method, group=32, threads=2,
                     gate=weights[0], up=weights[1], down=weights[2]).load_weights()
    got = moe.forward(x, ids, w)
    assert got.shape == x.shape and got.dtype == torch.float32
    assert rel_err(got, reference_moe(x, gate, up, down, ids, w)) < tol
    if stored is not None:
        assert rel_err(got, reference_moe(x, *stored, ids, w)) < tol_stored


@pytest.mark.parametrize("T", [4, 80])  # (two paths: the output made during the call, or before)
def test_bf16_weights_and_hidden(T):
    E, K, H, Fd = 6, 2, 128, 64
    gate, up, down = (t.to(torch.bfloat16) for t in make_layer(E, H, Fd))
    x, ids, w = make_routing(T, E, K, H)
    moe = tandem.MoE(E, K, H, Fd, method="bf16", gate=gate, up=up, down=down).load_weights()
    got = moe.forward(x.to(torch.bfloat16), ids.to(torch.int32), w)
    assert got.dtype == torch.bfloat16
    assert rel_err(got, reference_moe(x.to(torch.bfloat16), gate, up, down, ids, w)) < 0.02


def test_gpu_mask_skips_experts():
    E, K, H, Fd = 8, 4, 64, 64
    gate, up, down = make_layer(E, H, Fd)
    x, ids, w = make_routing(9, E, K, H)
    ids[0, 1] = -1  # an empty slot
    mask = torch.zeros(E, dtype=torch.bool)
    mask[[1, 6]] = True
    moe = tandem.MoE(E, K, H, Fd, method="bf16", gpu_experts_mask=mask,
                     gate=gate, up=up, down=down).load_weights()
    got = moe.forward(x, ids, w)
    want = reference_moe(x, gate, up, down, ids, w, skip=(1, 6))
    assert rel_err(got, want) < 0.02
    # the skipped experts' share is large enough that computing them would be caught
    assert rel_err(reference_moe(x, gate, up, down, ids, w), want) > 0.2
    moe.set_gpu_experts_mask(None)
    assert rel_err(moe.forward(x, ids, w), reference_moe(x, gate, up, down, ids, w)) < 0.02


def test_several_layers_in_flight():
    E, K, H, Fd = 8, 2, 128, 96
    layers, inputs = [], []
    for i in range(3):
        gate, up, down = make_layer(E, H, Fd, seed=10 + i)
        layers.append(tandem.MoE(E, K, H, Fd, method="int8", group=32, threads=2,
                                 gate=gate, up=up, down=down).load_weights())
        inputs.append(make_routing(1 + 20 * i, E, K, H, seed=i))
    alone = [m.forward(*a) for m, a in zip(layers, inputs)]
    for m, a in zip(layers, inputs):
        m.submit_forward(*a)
    with pytest.raises(RuntimeError, match="in flight"):
        layers[0].submit_forward(*inputs[0])
    for m, want in reversed(list(zip(layers, alone))):
        assert torch.equal(m.sync_forward(), want)


def test_golden_layer_bit_for_bit():
    # Qwen3-MoE golden model (BF16 safetensors): its layer-0 experts read by this test as torch
    # tensors and handed over, against the engine's loader reading the same layer from the file.
    hf = data_path("golden", "qwen3moe-hf")
    t = read_safetensors(hf / "model.safetensors")
    E, H, Fd = 8, 256, 128

    def stack(which):
        return torch.stack([t[f"model.layers.0.mlp.experts.{e}.{which}_proj.weight"]
                            for e in range(E)])

    x, ids, w = make_routing(7, E, 2, H, seed=3)
    # Besides agreeing with each other, the layer must be the model's: plain torch over the file's
    # BF16 weights in F32 is the independent expectation, bounded at the measured error (bf16
    # 0.0027, int8 0.021, int4 0.20) with a margin -- a loader that swapped gate and up, or read
    # another layer, agrees with itself on both paths but misses these.
    bounds = {"bf16": 0.005, "int8": 0.03, "int4": 0.25}
    want_f32 = reference_moe(x, stack("gate"), stack("up"), stack("down"), ids, w)
    for method in ("bf16", "int8", "int4"):
        from_tensors = tandem.MoE(E, 2, H, Fd, method=method, gate=stack("gate"),
                                  up=stack("up"), down=stack("down")).load_weights()
        from_model = tandem.MoE(method=method, weight_path=str(hf), layer_idx=0).load_weights()
        per_expert = tandem.MoE(E, 2, H, Fd, method=method, gate=[t[f"model.layers.0.mlp."
                                f"experts.{e}.gate_proj.weight"] for e in range(E)],
                                up=list(stack("up")), down=list(stack("down"))).load_weights()
        assert from_model.num_experts == E and from_model.moe_intermediate_size == Fd
        want = from_model.forward(x, ids, w)
        assert rel_err(want, want_f32) < bounds[method], method
        assert torch.equal(from_tensors.forward(x, ids, w), want), method
        assert torch.equal(per_expert.forward(x, ids, w), want), method


def test_chunked_forward_equals_whole():
    E, K, H, Fd = 8, 2, 64, 64
    gate, up, down = make_layer(E, H, Fd)
    x, ids, w = make_routing(50, E, K, H)
    whole = tandem.MoE(E, K, H, Fd, method="int8", group=32, gate=gate, up=up,
                       down=down).load_weights()
    chunked = tandem.MoE(E, K, H, Fd, method="int8", group=32, chunk_tokens=16, gate=gate,
                         up=up, down=down).load_weights()
    a, b = whole.forward(x, ids, w), chunked.forward(x, ids, w)
    assert rel_err(a, reference_moe(x, gate, up, down, ids, w)) < 0.03
    # each token's result depends on its own row only (the decode path of 1-token chunks aside)
    assert torch.allclose(a, b, rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def small():
    E, K, H, Fd = 4, 2, 64, 64
    gate, up, down = make_layer(E, H, Fd)
    moe = tandem.MoE(E, K, H, Fd, method="int8", group=32, gate=gate, up=up,
                     down=down).load_weights()
    return moe, make_routing(3, E, K, H)


@pytest.mark.parametrize("args,exc,needle", [
    (lambda x, i, w: (x.to(torch.int32), i, w), TypeError, "hidden_states"),
    (lambda x, i, w: (x[:, :10], i, w), ValueError, "hidden_states"),
    (lambda x, i, w: (torch.empty(x.shape, device="meta"), i, w), ValueError, "hidden_states"),
    (lambda x, i, w: (x, i.float(), w), TypeError, "topk_ids"),
    (lambda x, i, w: (x, i[:, :1], w), ValueError, "topk_ids"),
    (lambda x, i, w: (x, i, w[:, :1]), ValueError, "topk_weights"),
    (lambda x, i, w: (x, i, w.to(torch.int64)), TypeError, "topk_weights"),
    (lambda x, i, w: (x, torch.full_like(i, 4), w), ValueError, r"topk_ids\[0\]\[0\] = 4"),
    (lambda x, i, w: (x, torch.full_like(i, -2), w), ValueError, "topk_ids"),
    (lambda x, i, w: ([1.0], i, w), TypeError, "hidden_states"),
])
def test_bad_calls_name_the_argument(small, args, exc, needle):
    moe, (x, ids, w) = small
    with pytest.raises(exc, match=needle):
        moe.forward(*args(x, ids, w))
    assert torch.isfinite(moe.forward(x, ids, w)).all()  # still serves


@pytest.mark.parametrize("kwargs,exc,needle", [
    (dict(method="int3"), ValueError, "method"),
    (dict(method="fp8"), TypeError, "fp8"),
    (dict(group=48), ValueError, "group"),
    (dict(gpu_experts_mask=[True, False]), ValueError, "gpu_experts_mask"),
    (dict(gate_shape=(4, 64, 65)), ValueError, "gate"),
    (dict(down_shape=(4, 64, 32)), ValueError, "down"),
    (dict(gate_dtype=torch.int8), TypeError, "gate"),
])
def test_bad_layers_name_the_argument(kwargs, exc, needle):
    E, K, H, Fd = 4, 2, 64, 64
    gate, up, down = make_layer(E, H, Fd)
    if "gate_shape" in kwargs:
        gate = torch.zeros(kwargs.pop("gate_shape"))
    if "down_shape" in kwargs:
        down = torch.zeros(kwargs.pop("down_shape"))
    if "gate_dtype" in kwargs:
        gate = gate.to(kwargs.pop("gate_dtype"))
    with pytest.raises(exc, match=needle):
        tandem.MoE(E, K, H, Fd, gate=gate, up=up, down=down, **kwargs).load_weights()


def test_quantized_tensors_are_checked():
    q = tandem.quantize(torch.randn(2, 4, 64), "q8_0")
    assert torch.allclose(tandem.dequantize(q), tandem.dequantize(tandem.QuantizedTensor(
        q.data.clone(), "Q8_0", q.shape)))
    with pytest.raises(ValueError, match="bytes of q8_0"):  # too few bytes: never read past them
        tandem.dequantize(tandem.QuantizedTensor(q.data[:1], "q8_0", q.shape))
    w = torch.randn(3, 130, 70)  # (partial 128 x 128 blocks)
    f = tandem.quantize(w, "fp8")
    assert rel_err(tandem.dequantize(f), w) < 0.05
    with pytest.raises(ValueError, match="scales"):
        tandem.dequantize(tandem.QuantizedTensor(f.data, "fp8", f.shape, f.scales[:, :1]))
    with pytest.raises(ValueError, match="q4_K|values"):
        tandem.quantize(torch.randn(4, 100), "q4_K")  # rows of 100 are not 256-blocks
    with pytest.raises(TypeError, match="QuantizedTensor"):
        tandem.dequantize(torch.zeros(4))


def test_model_path_errors():
    with pytest.raises(ValueError, match="layer_idx"):
        tandem.MoE(weight_path=str(data_path("golden", "qwen3moe.gguf")),
                   layer_idx=5).load_weights()
    with pytest.raises(OSError):
        tandem.MoE(weight_path="/nonexistent/model.gguf", layer_idx=0).load_weights()


def test_cuda_stream_arguments():
    # The checks made before anything is enqueued (a real stream: tests/gpu/moe_stream_test.cpp).
    E, K, H, Fd = 4, 2, 64, 64
    gate, up, down = make_layer(E, H, Fd)
    moe = tandem.MoE(E, K, H, Fd, method="bf16", gate=gate, up=up, down=down).load_weights()
    x, ids, w = make_routing(2, E, K, H)  # (int64 ids)
    with pytest.raises(TypeError, match="cuda_stream"):
        moe.submit_forward(x, ids, w, cuda_stream="stream")
    with pytest.raises(ValueError, match="out"):
        moe.submit_forward(x, ids.int(), w, cuda_stream=1234)
    with pytest.raises(ValueError, match="topk_ids"):  # converted: not readable in place
        moe.submit_forward(x, ids, w, cuda_stream=1234, out=torch.empty_like(x))
    with pytest.raises(ValueError, match="hidden_states"):
        moe.submit_forward(x.t().contiguous().t(), ids.int(), w, cuda_stream=1234,
                           out=torch.empty_like(x))
    if not tandem.cuda_streams:
        with pytest.raises(TypeError, match="without CUDA"):
            moe.submit_forward(x, ids.int(), w, cuda_stream=1234, out=torch.empty_like(x))
    assert torch.equal(moe.forward(x, ids, w, out=torch.empty_like(x)), moe.forward(x, ids, w))
    with pytest.raises(ValueError, match="out"):
        moe.forward(x, ids, w, out=torch.empty(3, H))


def test_numa_parts_compute_the_same_layer():
    # Split over NUMA nodes (on a one-node machine the two parts share the node: a software split
    # that runs the same code), against the unsplit layer: the same sums up to the order in
    # which the parts' outputs are added.
    E, K, H, Fd = 8, 2, 128, 128
    gate, up, down = make_layer(E, H, Fd)
    x, ids, w = make_routing(6, E, K, H)
    one = tandem.MoE(E, K, H, Fd, method="int8", threads=2, numa_parts=1, gate=gate, up=up,
                     down=down).load_weights()
    two = tandem.MoE(E, K, H, Fd, method="int8", threads=2, numa_parts=2, gate=gate, up=up,
                     down=down).load_weights()
    assert tandem.operator._context(2, 2).numa_parts == 2  # (the split is real, not a fallback to one)
    assert torch.allclose(one.forward(x, ids, w), two.forward(x, ids, w), rtol=1e-5, atol=1e-6)


def test_one_call_at_a_time_per_layer():
    """Two threads calling one layer: the second is refused with a clear error while the first
    runs, never interleaved with it (it corrupted memory); each answer that comes back is right,
    and the layer serves after."""
    import threading
    E, K, H, Fd = 8, 2, 256, 512
    gate, up, down = make_layer(E, H, Fd)
    moe = tandem.MoE(E, K, H, Fd, method="int8", gate=gate, up=up, down=down).load_weights()
    x, ids, w = make_routing(64, E, K, H)
    want = moe.forward(x, ids, w)
    refused, wrong, start = [], [], threading.Barrier(4)

    def hammer():
        start.wait()
        for _ in range(40):
            try:
                got = moe.forward(x, ids, w)
            except ValueError as e:
                assert "one call at a time" in str(e) or "in flight" in str(e), str(e)
                refused.append(1)
                continue
            if not torch.equal(got, want):
                wrong.append(1)

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong
    assert refused, "four threads never met on the layer"
    assert torch.equal(moe.forward(x, ids, w), want)


def test_ids_beyond_int32_are_refused(small):
    """int64 ids are checked before the cast to the kernels' int32 (2**32 + e ran expert e)."""
    moe, (x, ids, w) = small
    with pytest.raises(ValueError, match=r"42949672\d\d is not an expert id"):
        moe.forward(x, ids + 2**32, w)
    with pytest.raises(ValueError, match=r"-42949672\d\d is not an expert id"):
        moe.forward(x, ids - 2**32, w)
    assert torch.isfinite(moe.forward(x, ids, w)).all()


@pytest.mark.parametrize("method", ["int8", "int4", "bf16"])
def test_non_finite_tokens_give_nan(method):
    """A token whose hidden state has a NaN or Inf comes out NaN in every method (the quantized
    ones' activation quantizers skipped NaN and gave finite numbers); the other tokens are as
    they are without it."""
    E, K, H, Fd = 4, 2, 64, 64
    gate, up, down = make_layer(E, H, Fd)
    moe = tandem.MoE(E, K, H, Fd, method=method, group=32, gate=gate, up=up,
                     down=down).load_weights()
    x, ids, w = make_routing(4, E, K, H)
    clean = moe.forward(x, ids, w)
    x[1, 5] = float("nan")
    x[2, 0] = float("inf")
    got = moe.forward(x, ids, w)
    assert torch.isnan(got[1]).all() and torch.isnan(got[2]).all()
    assert torch.equal(got[0], clean[0]) and torch.equal(got[3], clean[3])


def test_quantize_block_sizes_are_checked():
    with pytest.raises(ValueError, match="block"):
        tandem.quantize(torch.randn(4, 64), "fp8", block=(0, 0))
    with pytest.raises(ValueError, match="block"):
        tandem.quantize(torch.randn(4, 64), "fp8", block=(128, -1))
