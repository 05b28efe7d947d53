"""The Python call's overhead on one MoE layer: tandem.MoE.forward (torch tensors in and out,
argument checks; with and without a preallocated out=) against the native call it wraps (the same layer, the same inputs, pointers
passed straight to _tandem.Layer.forward), alternated call by call in the same minutes; and the
per-call time to set beside bench_moe_layer_bench's BM_MoeLayerRepack (the same shapes and
formats: --cpu-experts repack of Q4_K_M experts).

Shapes (as bench/moe_layer_bench.cpp):
  v2lite:  hidden 2048, expert ff 1408, 64 experts, top-6; Q4_K gate/up, Q5_0 down
  qwen3:   hidden 2048, expert ff 768, 128 experts, top-8; Q4_K gate/up/down
Run: PYTHONPATH=build/python python3 bench/python/moe_layer_overhead.py [--threads 2] [--json]
Beside it, in the same minutes: build/bench/bench_moe_layer_bench
  --benchmark_filter='BM_MoeLayerRepack/(v2lite|qwen3_30b_a3b)_(decode|prefill512)/'
(its real_time per call is the layer alone, in C++).
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
    """Rounds of three calls -- tandem.MoE.forward (a new output tensor), the same with out= (a
    preallocated one), and the native call -- in rotating order, each call routed to experts of
    its own (a call must not find the experts another just read in the cache). overhead: the
    median over rounds of python / native - 1 (rounds, not two medians: this VM's speed drifts by
    30% from second to second)."""
    H, E, k = moe.hidden_size, moe.num_experts, moe.num_experts_per_tok
    x = torch.randn(T, H, generator=torch.Generator().manual_seed(seed))
    rs = routings(T, E, k, 64 if T == 1 else 8, seed)
    out = torch.empty(T, H)
    buf = torch.empty(T, H)
    native = moe._layer

    def py_call(i):
        ids, w = rs[i % len(rs)]
        moe.forward(x, ids, w)

    def py_out_call(i):
        ids, w = rs[i % len(rs)]
        moe.forward(x, ids, w, out=buf)

    def native_call(i):
        ids, w = rs[i % len(rs)]
        native.forward(x.data_ptr(), T, ids.data_ptr(), w.data_ptr(), k, out.data_ptr())

    calls = [(py_call, []), (py_out_call, []), (native_call, [])]
    for i in range(4):  # warm-up
        for f, _ in calls:
            f(i)
    for i in range(rounds):
        order = calls[i % 3:] + calls[:i % 3]
        for j, (f, acc) in enumerate(order):
            t0 = time.perf_counter()
            f(3 * i + j)
            acc.append(time.perf_counter() - t0)
    py, py_out, nat = (acc for _, acc in calls)
    return dict(tokens=T, python_ms=statistics.median(py) * 1e3,
                python_out_ms=statistics.median(py_out) * 1e3,
                native_ms=statistics.median(nat) * 1e3,
                overhead=statistics.median(p / n for p, n in zip(py, nat)) - 1,
                overhead_out=statistics.median(p / n for p, n in zip(py_out, nat)) - 1,
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
        for T, rounds in ((1, 600), (512, 24)):
            r = measure(moe, T, rounds, seed=T)
            r.update(shape=name, format=moe.weight_format, threads=a.threads)
            results.append(r)
            if not a.json:
                print(f"{name:14s} T={T:4d}  python {r['python_ms']:8.3f} ms "
                      f"(out= {r['python_out_ms']:8.3f})  native {r['native_ms']:8.3f} ms  "
                      f"overhead {100 * r['overhead']:+.2f}% (out= {100 * r['overhead_out']:+.2f}%)")
    if a.json:
        print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
