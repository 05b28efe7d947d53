# KTMoEWrapper: kt-kernel's names and arguments over tandem's operator.
import os
import shutil

import pytest
import torch

import tandem
from conftest import data_path
from test_moe import make_layer, make_routing, reference_moe, rel_err


def wrapper(**kw):
    args = dict(layer_idx=0, num_experts=8, num_experts_per_tok=2, hidden_size=128,
                moe_intermediate_size=64, cpuinfer_threads=2, threadpool_count=1,
                method="AMXINT8")
    args.update(kw)
    return tandem.KTMoEWrapper(**args)


def test_load_from_tensors_and_forward_in_hidden_dtype():
    gate, up, down = make_layer(8, 128, 64)
    w = wrapper()
    w.load_weights_from_tensors(gate.bfloat16(), up.bfloat16(), down.bfloat16(), None)
    x, ids, wt = make_routing(6, 8, 2, 128)
    out = w.forward(x.bfloat16(), ids, wt.bfloat16())
    assert out.dtype == torch.bfloat16 and out.shape == (6, 128)
    want = reference_moe(x.bfloat16(), gate.bfloat16(), up.bfloat16(), down.bfloat16(), ids, wt)
    assert rel_err(out, want) < 0.03


def test_num_gpu_experts_and_physical_map():
    gate, up, down = make_layer(8, 128, 64)
    x, ids, wt = make_routing(10, 8, 2, 128)
    # The first 3 experts are the GPU's: skipped.
    w = wrapper(num_gpu_experts=3, method="BF16")
    w.load_weights_from_tensors(gate, up, down)
    assert rel_err(w.forward(x, ids, wt),
                   reference_moe(x, gate, up, down, ids, wt, skip=(0, 1, 2))) < 0.01
    # Slot p computes logical expert map[p]: ids given as slots.
    perm = torch.tensor([3, 7, 1, 0, 6, 2, 5, 4])
    w = wrapper(method="BF16")
    w.load_weights_from_tensors(gate, up, down, physical_to_logical_map_cpu=perm)
    slot_of = torch.empty(8, dtype=torch.int64)
    slot_of[perm] = torch.arange(8)
    assert rel_err(w.forward(x, slot_of[ids], wt), reference_moe(x, gate, up, down, ids, wt)) < 0.01


def test_submit_sync_and_llamafile_from_a_gguf_directory(tmp_path):
    # kt-kernel's LLAMAFILE weight_path is a directory of GGUF files.
    src = data_path("golden", "qwen3moe-q8_0.gguf")
    shutil.copy(src, tmp_path / "qwen3moe-q8_0.gguf")
    w = tandem.KTMoEWrapper(layer_idx=1, num_experts=8, num_experts_per_tok=2, hidden_size=256,
                            moe_intermediate_size=128, cpuinfer_threads=2,
                            weight_path=str(tmp_path), method="LLAMAFILE")
    w.load_weights()
    direct = tandem.MoE(method="gguf", weight_path=str(src), layer_idx=1).load_weights()
    x, ids, wt = make_routing(5, 8, 2, 256)
    w.submit_forward(x, ids, wt)
    out = w.sync_forward(x)
    assert torch.equal(out, direct.forward(x, ids, wt))


def test_kt_arguments_refused_with_a_reason():
    with pytest.raises(ValueError, match="MXFP8.*not yet"):
        wrapper(method="MXFP8")
    with pytest.raises(ValueError, match="max_deferred_experts_per_token"):
        wrapper(max_deferred_experts_per_token=3)  # (more than num_experts_per_tok)
    with pytest.raises(ValueError, match="num_gpu_experts"):
        wrapper(num_gpu_experts=9)
    with pytest.raises(ValueError, match="gpu_experts_mask"):
        wrapper(gpu_experts_mask=torch.zeros(7, dtype=torch.bool))
    with pytest.raises(ValueError, match="sft"):
        wrapper(mode="sft", lora_rank=8)
    with pytest.raises(ValueError, match="swiglu_limit"):
        wrapper(swiglu_limit=7.0)
    with pytest.raises(ValueError, match="numa_nodes"):
        wrapper(numa_nodes=[1])
    with pytest.raises(TypeError, match="unexpected keyword"):
        wrapper(not_an_argument=1)
    w = wrapper(weight_path="/nonexistent")
    with pytest.raises(OSError):
        w.load_weights()


def test_capture_batch_sizes_are_kept():
    tandem.KTMoEWrapper.set_capture_batch_sizes([1, 2, 4])
    assert tandem.KTMoEWrapper.get_capture_batch_sizes() == [1, 2, 4]
    tandem.KTMoEWrapper.clear_buffer_cache()


@pytest.mark.skipif(not torch.cuda.is_available() or not tandem.cuda_streams,
                    reason="needs a CUDA build of torch and of tandem, and a GPU")
def test_sglang_device_form_on_a_stream():
    # SGLang's call: GPU tensors and the current stream's handle; the output comes back on the
    # GPU in the hidden states' dtype, equal to the CPU form's.
    gate, up, down = make_layer(8, 128, 64)
    w = wrapper(method="BF16")
    w.load_weights_from_tensors(gate, up, down)
    x, ids, wt = make_routing(5, 8, 2, 128)
    want = w.forward(x.bfloat16(), ids, wt)
    stream = torch.cuda.current_stream().cuda_stream
    w.submit_forward(x.bfloat16().cuda(), ids.cuda(), wt.cuda(), stream)
    got = w.sync_forward(x.bfloat16().cuda(), stream)
    torch.cuda.synchronize()
    assert got.is_cuda and got.dtype == torch.bfloat16
    assert torch.equal(got.cpu(), want)


def test_mxfp4_gpt_oss_with_its_clamped_swiglu(tmp_path):
    # kt-kernel's MXFP4 with swiglu_limit / swiglu_alpha over gpt-oss's release (MXFP4 experts,
    # biases, the clamp): the layer the checkpoint describes (the operator's gpt-oss layer equals
    # the engine's bit for bit: moe_layer_test's golden gpt-oss cases); a clamp other than the
    # checkpoint's is refused.
    import subprocess
    path = tmp_path / "gpt-oss"
    subprocess.run([os.environ["TANDEM_BIN"], "synth", "--arch", "gpt-oss", "--preset", "tiny",
                    "--format", "hf", "--type", "mxfp4_moe", "--layers", "2", "-o", str(path)],
                   check=True, capture_output=True)
    args = dict(layer_idx=1, num_experts=8, num_experts_per_tok=2, hidden_size=256,
                moe_intermediate_size=64, cpuinfer_threads=2, weight_path=str(path),
                method="MXFP4")
    w = tandem.KTMoEWrapper(**args, swiglu_limit=7.0, swiglu_alpha=1.702)
    w.load_weights()
    direct = tandem.MoE(method="gguf", weight_path=str(path), layer_idx=1).load_weights()
    assert direct.weight_format == "mxfp4"
    x, ids, wt = make_routing(5, 8, 2, 256)
    assert torch.equal(w.forward(x, ids, wt), direct.forward(x, ids, wt))
    with pytest.raises(ValueError, match="clamp at 7"):
        tandem.KTMoEWrapper(**args, swiglu_limit=5.0, swiglu_alpha=1.702).load_weights()
