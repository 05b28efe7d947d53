"""The Python call's overhead on one MoE layer: tandem.MoE.forward (torch tensors in and out,
argument checks) against the native call it wraps (the same layer, the same inputs, pointers
passed straight to _tandem.Layer.forward), alternated call by call in the same minutes; and the
per-call time to set beside bench_moe_layer_bench's BM_MoeLayerRepack (the same shapes and
formats: --cpu-experts repack of Q4_K_M experts).

Shapes (as bench/moe_layer_bench.cpp):
  v2lite:  hidden 2048, expert ff 1408, 64 experts, top-6; Q4_K gate/up, Q5_0 down
  qwen3:   hidden 2048, expert ff 768, 128 experts, top-8; Q4_K gate/up/down
Run: PYTHONPATH=build/python python3 bench/python/moe_layer_overhead.py [--threads 2] [--json]
"""
import argparse
import json
import statistics
import time

import torch

import tandem

SHAPES = {
    "v2lite": dict(hidden=2048, ff=1408, experts=64, k=6, gate_up="q4_K", down="q5_0"),
    "qwen3_30b_a3b": dict(hidden=2048, ff=768, experts=128, k=8, gate_up="q4_K", down="q4_K"),
}


def quantized_experts(E, rows, cols, dtype, seed):
    """E random experts [rows, cols] in `dtype`, quantized one at a time (bounded memory)."""
    g = torch.Generator().manual_seed(seed)
    first = tandem.quantize(torch.randn(1, rows, cols, generator=g) * 0.02, dtype)
    data = torch.empty(E, rows, first.data.shape[-1], dtype=torch.uint8)
    data[0] = first.data[0]
    for e in range(1, E):
        data[e] = tandem.quantize(torch.randn(1, rows, cols, generator=g) * 0.02, dtype).data[0]
    return tandem.QuantizedTensor(data, first.dtype, (E, rows, cols))


def routings(T, E, k, n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).to(torch.int32),
             torch.softmax(torch.randn(T, k, generator=g), -1)) for _ in range(n)]


def measure(moe, T, rounds, seed):
    H, E, k = moe.hidden_size, moe.num_experts, moe.num_experts_per_tok
    x = torch.randn(T, H, generator=torch.Generator().manual_seed(seed))
    rs = routings(T, E, k, 16, seed)
    out = torch.empty(T, H)
    native = moe._layer

    def py_call(i):
        ids, w = rs[i % len(rs)]
        moe.forward(x, ids, w)

    def native_call(i):
        ids, w = rs[i % len(rs)]
        native.forward(x.data_ptr(), T, ids.data_ptr(), w.data_ptr(), k, out.data_ptr())

    for i in range(4):  # warm-up
        py_call(i)
        native_call(i)
    py, nat = [], []
    for i in range(rounds):  # alternated, so both see the same machine
        for f, acc in ((py_call, py), (native_call, nat)) if i % 2 == 0 else \
                ((native_call, nat), (py_call, py)):
            t0 = time.perf_counter()
            f(i)
            acc.append(time.perf_counter() - t0)
    p, n = statistics.median(py), statistics.median(nat)
    return dict(tokens=T, python_ms=p * 1e3, native_ms=n * 1e3, overhead=p / n - 1,
                rounds=rounds)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    results = []
    for name in a.shapes.split(","):
        s = SHAPES[name]
        E, H, F = s["experts"], s["hidden"], s["ff"]
        gate = quantized_experts(E, F, H, s["gate_up"], 1)
        up = quantized_experts(E, F, H, s["gate_up"], 2)
        down = quantized_experts(E, H, F, s["down"], 3)
        moe = tandem.MoE(E, s["k"], H, F, method="gguf", threads=a.threads,
                         gate=gate, up=up, down=down).load_weights()
        del gate, up, down
        for T, rounds in ((1, 400), (512, 16)):
            r = measure(moe, T, rounds, seed=T)
            r.update(shape=name, format=moe.weight_format, threads=a.threads)
            results.append(r)
            if not a.json:
                print(f"{name:14s} T={T:4d}  python {r['python_ms']:8.3f} ms  native "
                      f"{r['native_ms']:8.3f} ms  overhead {100 * r['overhead']:+.2f}%")
    if a.json:
        print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
