// The CUDA device's forward ops (model/forward_ops.h; docs/device.md).
// Not yet run on a GPU: it builds here (sm_80 to sm_90a), and its `gpu` tests skip without a
// device (docs/device.md, "The CUDA device").
#include "core/error.h"

#ifdef TANDEM_HAVE_CUDA

#include "ops/cuda/delta_net.h"
#include "runtime/cuda_device_impl.h"
#include "runtime/step_staging.h"

namespace tandem::rt::cuda_detail {

// The forward's ops on the GPU: each a kernel (or a few) on the ops' own stream, over the dense
// weights upload_dense_weights put in device memory (read as stored by ops/cuda/matvec.h's
// products), the small F32 vectors uploaded here, activations and the KV cache (F32, BF16, F16 or
// Q8_0) in device memory. RoPE's cos / sin per token come from ops::Rope on the
// host (the CPU's YaRN), the cache's write offsets and block tables from the KvCache on the host:
// stage() puts them, the token ids and each part's first position in pinned memory that the
// step's first copy brings over, so a graph of the step replays at new positions. MLA attends
// absorbed (W_UK / W_UV per head around attention over the latent cache).
class CudaForwardOps final : public DeviceForwardOps {
 public:
  CudaForwardOps(CudaDevice& dev, std::shared_ptr<const DenseWeights> w, const ForwardOpsOptions& o)
      : DeviceForwardOps(dev, std::move(w)),
        cuda_(dev),
        st_(dev.stream(stream_)),
        step_host_(&dev) {
    for (Buf** b : {&logits_, &head_in_, &step_dev_, &q_, &k_, &v_, &qa_, &qc_, &att_, &o_, &g_,
                    &u_, &scores_, &gate_, &mixed_, &conv_in_, &conv_out_, &z_, &beta_, &decay_}) {
      *b = new_buf();
    }
    const LoadedModel& m = w_->weights;
    const ModelConfig& c = m.config;
    if (c.is_mla() && o.mla == MlaMode::kNaive) {
      fail(ErrorKind::kUnsupported,
           "{}: the CUDA forward ops attend MLA absorbed (--mla auto or "
           "absorbed), not naive",
           dev.name());
    }
    if (c.has_indexer()) {
      fail(ErrorKind::kUnsupported,
           "{}: DeepSeek Sparse Attention (the lightning indexer of {}) has no CUDA kernels; run "
           "it with --accel none or host",
           dev.name(), arch_name(c.arch));
    }
    if (c.has_linear_layers() && (c.linear_conv_kernel > 8 || c.linear_key_head_dim > 256)) {
      fail(ErrorKind::kUnsupported,
           "{}: the CUDA DeltaNet kernels take convolutions up to 8 wide and key heads up to 256 "
           "(this model: {} and {}); run it with --accel none or host",
           dev.name(), c.linear_conv_kernel, c.linear_key_head_dim);
    }
    rope_ = ops::Rope(c.rope_dim, c.rope_theta, c.rope_scaling);
    rope_.set_sections(c.rope_sections);
    neox_ = !(c.is_mla() || (c.arch == ModelArch::kMixtral && m.from_gguf));
    attn_scale_ = 1.0f / std::sqrt(static_cast<float>(c.head_dim)) * rope_.softmax_scale_factor();
    upload(m.out_norm);
    for (const LayerWeights& lw : m.layers) {
      for (const std::vector<float>* v :
           {&lw.attn_norm, &lw.ffn_norm, &lw.q_norm, &lw.k_norm, &lw.q_a_norm, &lw.kv_a_norm,
            &lw.bq, &lw.bk, &lw.bv, &lw.bo, &lw.sinks, &lw.router_logit_bias, &lw.sh_gate_inp,
            &lw.delta.conv_t, &lw.delta.dt_bias, &lw.delta.a, &lw.delta.norm}) {
        upload(*v);
      }
      for (const std::vector<int32_t>* v :
           {&lw.delta.conv_src, &lw.delta.z_src, &lw.delta.beta_src, &lw.delta.alpha_src}) {
        upload(*v);
      }
    }
  }
  ~CudaForwardOps() override {
    try {
      finish();  // (before the vectors the stream's work reads go)
    } catch (const std::exception& e) {
      log_warn("{} forward ops: {}", dev_.name(), e.what());
    }
    for (const auto& [h, d] : vecs_) dev_.free(d);
    for (const auto& [h, d] : ints_) dev_.free(d);
  }

  KvCacheOptions cache_options(KvCacheOptions o) const override {
    o = DeviceForwardOps::cache_options(o);
    // (The cache copies and zeroes between forwards, and the forward's kernels run on a
    // non-blocking stream that the default stream does not wait for: each finishes here.)
    o.copy = [](void* dst, const void* src, uint64_t bytes) {
      TD_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
      TD_CUDA_CHECK(cudaDeviceSynchronize());
    };
    o.zero = [](void* dst, uint64_t bytes) {
      TD_CUDA_CHECK(cudaMemset(dst, 0, bytes));
      TD_CUDA_CHECK(cudaDeviceSynchronize());
    };
    return o;
  }
  void check_cache(const KvCache& cache) const override {
    cuda_.check_device(cache.memory(), cache.bytes(),
                       "the KV cache (make it with "
                       "Model::cache_options)");
  }

  // What the step's kernels read that changes from step to step, in one pinned host area and one
  // device buffer of the same layout (runtime/step_staging.h), which the step's first copy brings
  // over: so sizes follow from the step's shape and a graph's replay reads the new step's values.
  void stage(const ForwardStep& step, KvCache& cache) override {
    step_ = step;
    cache_ = &cache;
    const StepLayout l = step_layout(step, cache, rope_.dim());
    host_step_ = reinterpret_cast<uint8_t*>(host_step_floats(static_cast<int64_t>(l.bytes / 4)));
    auto* dev = reinterpret_cast<uint8_t*>(grow(step_dev_, static_cast<int64_t>(l.bytes / 4)));
    stage_step(l, step, cache, rope_, host_step_);
    step_bytes_ = l.bytes;
    max_blocks_ = l.max_blocks;
    tok_dev_ = reinterpret_cast<const int32_t*>(dev + l.tokens);
    pos0_dev_ = reinterpret_cast<const int64_t*>(dev + l.pos0);
    cs_dev_ = reinterpret_cast<const float*>(dev + l.rope);
    k_ofs_ = reinterpret_cast<const int64_t*>(dev + l.rows);
    v_ofs_ = k_ofs_ + l.n_tokens * l.k_heads;
    blocks_dev_ = reinterpret_cast<const int32_t*>(dev + l.blocks);
    step_dev_bytes_ = dev;
  }
  void upload_step() override { dev_.copy_h2d(step_dev_bytes_, host_step_, step_bytes_, stream_); }
  uint64_t memory_epoch() const override {
    return DeviceForwardOps::memory_epoch() + st_.generation;
  }
  void embed(float* x) override {
    const CudaDevice::Timed timed(cuda_, st_, "embedding");
    const LoadedModel& m = w_->weights;
    const int64_t hd = m.config.hidden_size;
    run(gather_rows_cuda(m.embed.dtype, m.embed.data, m.embed.row_bytes(), tok_dev_,
                         step_.n_tokens(), hd, x, hd, st_.stream),
        "embedding");
  }
  void norm(Norm which, int64_t layer, const float* x, int64_t n, float* out) override {
    const CudaDevice::Timed timed(cuda_, st_, "norm");
    const LayerWeights& lw = w_->weights.layers[layer];
    const ModelConfig& c = w_->weights.config;
    const float* g = vec(which == Norm::kAttention ? lw.attn_norm : lw.ffn_norm);
    run(rms_norm_cuda(x, c.hidden_size, g, n, c.hidden_size, c.rms_norm_eps, out, c.hidden_size,
                      st_.stream),
        "norm");
  }
  void add(float* out, const float* a, int64_t count) override {
    const CudaDevice::Timed timed(cuda_, st_, "add");
    run(add_cuda(a, out, count, st_.stream), "add");
  }
  void fill_zero(float* out, int64_t count) override {
    TD_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<size_t>(count) * 4, st_.stream));
  }
  void attention(int64_t layer, const float* x, float* out) override {
    const CudaDevice::Timed timed(cuda_, st_, "attention", &seconds_.attention);
    if (w_->weights.config.is_mla()) {
      attention_mla(layer, x, out);
    } else {
      attention_mha(layer, x, out);
    }
  }
  void linear_attention(int64_t layer, const float* x, float* out) override {
    const CudaDevice::Timed timed(cuda_, st_, "linear attention", &seconds_.attention);
    delta_net(layer, x, out);
  }
  void dense_ffn(int64_t layer, const float* x, int64_t n, float* out) override {
    const CudaDevice::Timed timed(cuda_, st_, "dense FFN");
    const LayerWeights& lw = w_->weights.layers[layer];
    swiglu(lw.ffn_gate, lw.ffn_up, lw.ffn_down, x, n, out);
  }
  void shared_ffn(int64_t layer, const float* x, int64_t n, float* out) override {
    TD_CHECK(w_->shared_experts,
             "CUDA forward ops: the shared experts were not uploaded (the MoE backend computes "
             "them)");
    const CudaDevice::Timed timed(cuda_, st_, "shared experts");
    const LayerWeights& lw = w_->weights.layers[layer];
    const int64_t hd = w_->weights.config.hidden_size;
    if (lw.sh_gate.empty()) {
      fill_zero(out, n * hd);
      return;
    }
    swiglu(lw.sh_gate, lw.sh_up, lw.sh_down, x, n, out);
    if (!lw.sh_gate_inp.empty()) {
      run(sigmoid_gate_rows_cuda(x, vec(lw.sh_gate_inp), n, hd, out, st_.stream), "shared gate");
    }
  }
  void router(int64_t layer, const float* x, int64_t n, float* logits) override {
    const CudaDevice::Timed timed(cuda_, st_, "router");
    const LayerWeights& lw = w_->weights.layers[layer];
    const ModelConfig& c = w_->weights.config;
    mm(lw.router, x, c.hidden_size, n, logits, c.n_experts);
    if (!lw.router_logit_bias.empty()) {
      run(scale_rows_cuda(logits, n, c.n_experts, vec(lw.router_logit_bias), nullptr, logits, false,
                          st_.stream),
          "router bias");
    }
  }
  const float* logits_rows(const std::vector<int64_t>& row_ids, const float* x) override {
    const LoadedModel& m = w_->weights;
    const ModelConfig& c = m.config;
    const int64_t hd = c.hidden_size, rows = static_cast<int64_t>(row_ids.size());
    float* h = grow(head_in_, rows * hd);
    const CudaDevice::Timed timed(cuda_, st_, "LM head", &seconds_.lm_head);
    for (int64_t j = 0; j < rows; ++j) {
      run(rms_norm_cuda(x + row_ids[j] * hd, hd, vec(m.out_norm), 1, hd, c.rms_norm_eps, h + j * hd,
                        hd, st_.stream),
          "final norm");
    }
    float* d = grow(logits_, rows * c.vocab_size);
    mm(m.lm_head, h, hd, rows, d, c.vocab_size);
    return d;
  }
  // The attention and lm_head spans collected so far (with a timeline set: tandem bench).
  ForwardOpsProfile profile() const override { return cuda_.span_seconds(seconds_); }

 private:
  void run(cudaError_t err, const char* what) { cuda_.launch(err, what); }
  bool capturing() const {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    TD_CUDA_CHECK(cudaStreamIsCapturing(st_.stream, &status));
    return status != cudaStreamCaptureStatusNone;
  }
  // The pinned host area stage() fills (grown like the buffers: memory a graph reads).
  float* host_step_floats(int64_t count) {
    bool grew = false;
    float* p = step_host_.floats(count, &grew);
    if (grew) moved();
    return p;
  }
  void upload(const std::vector<float>& v) {
    if (v.empty() || vecs_.count(v.data()) > 0) return;
    auto* d = static_cast<float*>(dev_.alloc(v.size() * 4));
    TD_CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    vecs_[v.data()] = d;
  }
  void upload(const std::vector<int32_t>& v) {
    if (v.empty() || ints_.count(v.data()) > 0) return;
    auto* d = static_cast<int32_t*>(dev_.alloc(v.size() * 4));
    TD_CUDA_CHECK(cudaMemcpy(d, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    ints_[v.data()] = d;
  }
  const int32_t* ints(const std::vector<int32_t>& v) const {
    const auto it = ints_.find(v.data());
    TD_CHECK(it != ints_.end(), "CUDA forward ops: an index map was not uploaded");
    return it->second;
  }
  const float* vec(const std::vector<float>& v) const {
    const auto it = vecs_.find(v.data());
    TD_CHECK(it != vecs_.end(), "CUDA forward ops: a vector was not uploaded");
    return it->second;
  }
  // y [n, ldy] = x [n, ldx] W^T, W read as stored.
  void mm(const ops::Weight& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy) {
    cuda_.product(w, x, ldx, n, y, ldy, st_);
  }
  void swiglu(const ops::Weight& gw, const ops::Weight& uw, const ops::Weight& dw, const float* x,
              int64_t n, float* out) {
    const int64_t hd = gw.cols(), ff = gw.rows();
    float* g = grow(g_, n * ff);
    float* u = grow(u_, n * ff);
    mm(gw, x, hd, n, g, ff);
    mm(uw, x, hd, n, u, ff);
    run(glu_cuda(g, u, n, ff, nullptr, nullptr, 0.0f, ops::kSwigluOaiAlpha, st_.stream), "swiglu");
    mm(dw, g, ff, n, out, dw.rows());
  }
  void bias(float* x, int64_t n, int64_t cols, const std::vector<float>& b) {
    if (!b.empty()) {
      run(scale_rows_cuda(x, n, cols, vec(b), nullptr, x, false, st_.stream), "bias");
    }
  }
  // Attention of each part over its cache rows; args' q / out / heads / dims set by `fill`.
  template <typename F>
  void attend(int64_t layer, F&& fill) {
    for (size_t i = 0; i < step_.parts.size(); ++i) {
      const ForwardStep::Part& p = step_.parts[i];
      ops::AttentionArgs a;
      cache_->attention_args(w_->weights.config.kv_layer(layer), p.seq, &a);
      if (a.blocks != nullptr) a.blocks = blocks_dev_ + static_cast<int64_t>(i) * max_blocks_;
      a.n_tokens = p.n;
      a.pos0 = p.pos0;
      a.scale = attn_scale_;
      fill(p, a);
      const int64_t nf = attention_scratch_floats(a);
      float* sc = grow(scores_, nf);
      // The split kernels read the part's first position from the staged step (a graph's replay
      // then attends at the new positions); the others take it as a parameter, which a graph
      // would keep: no graph of them.
      const bool splits = attention_cuda_splits(a);
      if (!splits && capturing()) {
        fail(ErrorKind::kUnsupported,
             "{}: attention of {} tokens, dk {}, dv {} takes its positions as parameters",
             dev_.name(), a.n_tokens, a.dk, a.dv);
      }
      run(attention_cuda(a, sc, nf, st_.stream, splits ? pos0_dev_ + i : nullptr), "attention");
    }
  }

  // Rows [rows, d] (stride d) into layer l's keys (or values) at the offsets begin_step() uploaded.
  void write_cache(int64_t l, bool values, const int64_t* offsets, int64_t rows, const float* src,
                   int64_t d, const char* what) {
    ops::AttentionArgs base;
    cache_->attention_args(w_->weights.config.kv_layer(l), step_.parts[0].seq, &base);
    const void* dst = nullptr;
    DType type = DType::kF32;
    switch (cache_->type()) {
      case KvType::kF32:
        dst = values ? base.v : base.k;
        break;
      case KvType::kBf16:
      case KvType::kF16:
        dst = values ? base.v16 : base.k16;
        type = cache_->type() == KvType::kBf16 ? DType::kBF16 : DType::kF16;
        break;
      case KvType::kQ8_0:  // (the offsets are bytes from the values of position 0's row)
        dst = values ? base.v8 : base.k8;
        type = DType::kQ8_0;
        break;
    }
    run(kv_write_cuda(type, const_cast<void*>(dst), offsets, rows, src, d, d, st_.stream), what);
  }

  void attention_mha(int64_t l, const float* x, float* out) {
    const LayerWeights& lw = w_->weights.layers[l];
    const ModelConfig& c = w_->weights.config;
    const int64_t n = step_.n_tokens(), hd = c.hidden_size, d = c.head_dim;
    const int64_t nq = c.num_heads, nkv = c.num_kv_heads, half = rope_.dim() / 2;
    float* q = grow(q_, n * nq * d);
    float* k = grow(k_, n * nkv * d);
    float* v = grow(v_, n * nkv * d);
    float* gate = nullptr;
    if (c.attn_output_gate) {
      // q_proj's rows are each head's query then its gate: split into q and the gate.
      float* qg = grow(o_, n * nq * 2 * d);
      gate = grow(gate_, n * nq * d);
      mm(lw.wq, x, hd, n, qg, nq * 2 * d);
      const size_t row = static_cast<size_t>(d) * 4, pitch = 2 * row;
      const size_t rows = static_cast<size_t>(n * nq);
      TD_CUDA_CHECK(cudaMemcpy2DAsync(q, row, qg, pitch, row, rows, cudaMemcpyDeviceToDevice,
                                      st_.stream));
      TD_CUDA_CHECK(cudaMemcpy2DAsync(gate, row, qg + d, pitch, row, rows,
                                      cudaMemcpyDeviceToDevice, st_.stream));
    } else {
      mm(lw.wq, x, hd, n, q, nq * d);
    }
    mm(lw.wk, x, hd, n, k, nkv * d);
    mm(lw.wv, x, hd, n, v, nkv * d);
    bias(q, n, nq * d, lw.bq);
    bias(k, n, nkv * d, lw.bk);
    bias(v, n, nkv * d, lw.bv);
    if (c.qk_norm_all_heads) {
      run(rms_norm_cuda(q, nq * d, vec(lw.q_norm), n, nq * d, c.rms_norm_eps, q, nq * d,
                        st_.stream),
          "q norm");
      run(rms_norm_cuda(k, nkv * d, vec(lw.k_norm), n, nkv * d, c.rms_norm_eps, k, nkv * d,
                        st_.stream),
          "k norm");
    } else if (!lw.q_norm.empty()) {
      run(rms_norm_cuda(q, d, vec(lw.q_norm), n * nq, d, c.rms_norm_eps, q, d, st_.stream),
          "q norm");
      run(rms_norm_cuda(k, d, vec(lw.k_norm), n * nkv, d, c.rms_norm_eps, k, d, st_.stream),
          "k norm");
    }
    const float* cs = cs_dev_;
    run(rope_cuda(q, n, nq * d, nq, d, 0, rope_.dim(), cs, cs + n * half, neox_, st_.stream),
        "rope q");
    run(rope_cuda(k, n, nkv * d, nkv, d, 0, rope_.dim(), cs, cs + n * half, neox_, st_.stream),
        "rope k");
    write_cache(l, false, k_ofs_, n * nkv, k, d, "cache keys");
    write_cache(l, true, v_ofs_, n * nkv, v, d, "cache values");
    float* att = grow(att_, n * nq * d);
    const float* sinks = lw.sinks.empty() ? nullptr : vec(lw.sinks);
    attend(l, [&](const ForwardStep::Part& p, ops::AttentionArgs& a) {
      a.q = q + p.t0 * nq * d;
      a.q_stride = nq * d;
      a.n_heads = nq;
      a.n_kv_heads = nkv;
      a.dk = a.dv = d;
      if (c.is_swa_layer(l)) a.window = c.sliding_window;
      a.sinks = sinks;
      a.out = att + p.t0 * nq * d;
    });
    if (gate != nullptr) run(sigmoid_mul_cuda(att, gate, n * nq * d, st_.stream), "output gate");
    mm(lw.wo, att, nq * d, n, out, hd);
    bias(out, n, hd, lw.bo);
  }

  void attention_mla(int64_t l, const float* x, float* out) {
    const LayerWeights& lw = w_->weights.layers[l];
    const ModelConfig& c = w_->weights.config;
    const int64_t n = step_.n_tokens(), hd = c.hidden_size;
    const int64_t nope = c.qk_nope_head_dim, rd = c.qk_rope_head_dim, kvl = c.kv_lora_rank;
    const int64_t vd = c.v_head_dim, nh = c.num_heads, qk = nope + rd, kr = kvl + rd;
    const int64_t half = rope_.dim() / 2;
    float* q = grow(q_, n * nh * qk);
    float* kv = grow(k_, n * kr);
    if (!lw.wq_a.empty()) {
      float* qa = grow(qa_, n * c.q_lora_rank);
      mm(lw.wq_a, x, hd, n, qa, c.q_lora_rank);
      run(rms_norm_cuda(qa, c.q_lora_rank, vec(lw.q_a_norm), n, c.q_lora_rank, c.rms_norm_eps, qa,
                        c.q_lora_rank, st_.stream),
          "q_a norm");
      mm(lw.wq_b, qa, c.q_lora_rank, n, q, nh * qk);
    } else {
      mm(lw.wq, x, hd, n, q, nh * qk);
    }
    mm(lw.wkv_a, x, hd, n, kv, kr);
    run(rms_norm_cuda(kv, kr, vec(lw.kv_a_norm), n, kvl, c.rms_norm_eps, kv, kr, st_.stream),
        "kv_a norm");
    const float* cs = cs_dev_;
    run(rope_cuda(kv, n, kr, 1, kr, kvl, rope_.dim(), cs, cs + n * half, neox_, st_.stream),
        "rope k");
    run(rope_cuda(q, n, nh * qk, nh, qk, nope, rope_.dim(), cs, cs + n * half, neox_, st_.stream),
        "rope q");
    write_cache(l, false, k_ofs_, n, kv, kr, "cache latents");
    // q_cat per head: W_UK^T q_nope (kv_lora values), then q_pe.
    float* qc = grow(qc_, n * nh * kr);
    for (int64_t h = 0; h < nh; ++h) {
      const ops::Weight& wk = lw.k_up[static_cast<size_t>(h)];
      if (lw.k_up_transposed) {  // [kv_lora, qk_nope]
        mm(wk, q + h * qk, nh * qk, n, qc + h * kr, nh * kr);
      } else {  // [qk_nope, kv_lora], dequantized for the transposed product
        float* wf = cuda_.scratch(st_, static_cast<uint64_t>(wk.rows() * wk.cols()) * 4);
        cuda_.dequantize(cuda_.quant_matrix(wk), wf, st_);
        run(matmul_t_f32_cuda(wf, nope, kvl, q + h * qk, nh * qk, n, qc + h * kr, nh * kr,
                              st_.stream),
            "W_UK");
      }
      TD_CUDA_CHECK(cudaMemcpy2DAsync(qc + h * kr + kvl, static_cast<size_t>(nh * kr) * 4,
                                      q + h * qk + nope, static_cast<size_t>(nh * qk) * 4,
                                      static_cast<size_t>(rd) * 4, static_cast<size_t>(n),
                                      cudaMemcpyDeviceToDevice, st_.stream));
    }
    float* att = grow(att_, n * nh * kvl);
    attend(l, [&](const ForwardStep::Part& p, ops::AttentionArgs& a) {
      a.q = qc + p.t0 * nh * kr;
      a.q_stride = nh * kr;
      a.n_heads = nh;
      a.n_kv_heads = 1;
      a.dk = kr;
      a.dv = kvl;
      a.out = att + p.t0 * nh * kvl;
    });
    float* o = grow(o_, n * nh * vd);
    for (int64_t h = 0; h < nh; ++h) {
      const ops::Weight& wv = lw.v_up[static_cast<size_t>(h)];  // [v_head, kv_lora]
      mm(wv, att + h * kvl, nh * kvl, n, o + h * vd, nh * vd);
    }
    mm(lw.wo, o, nh * vd, n, out, hd);
  }

  // A Gated DeltaNet layer (model/delta_net_layer.h's steps): the input projections into one
  // row per token, their split, the convolution, q / k normalized, the delta rule, the gated
  // norm, out_proj. The convolution and the delta rule run each part's tokens in segments cut at
  // the step's checkpoints (each segment's end state copied to its checkpoint's slot by the
  // kernels), one launch per round of segments.
  void delta_net(int64_t l, const float* x, float* out) {
    const LayerWeights::DeltaNet& w = w_->weights.layers[l].delta;
    const ModelConfig& c = w_->weights.config;
    const int64_t n = step_.n_tokens(), hd = c.hidden_size;
    const int64_t nk = c.linear_num_key_heads, nv = c.linear_num_value_heads;
    const int64_t hk = c.linear_key_head_dim, hv = c.linear_value_head_dim;
    const int64_t vdim = nv * hv, ch = c.linear_conv_channels(), K = c.linear_conv_kernel;
    const int64_t sl = c.state_layer(l);
    float* mixed = grow(mixed_, n * w.in_rows);
    int64_t at = 0;
    for (const ops::Weight& in : w.in) {
      mm(in, x, hd, n, mixed + at, w.in_rows);
      at += in.rows();
    }
    float* conv_in = grow(conv_in_, n * ch);
    float* conv_out = grow(conv_out_, n * ch);
    float* z = grow(z_, n * vdim);
    float* beta = grow(beta_, n * nv);
    float* decay = grow(decay_, n * nv);
    run(delta_prep_cuda(mixed, n, w.in_rows, ints(w.conv_src), ch, ints(w.z_src), vdim,
                        ints(w.beta_src), ints(w.alpha_src), vec(w.a), vec(w.dt_bias), nv, conv_in,
                        z, beta, decay, st_.stream),
        "delta net inputs");
    const std::vector<std::vector<DeltaSegment>> rounds = delta_rounds(sl);
    for (const std::vector<DeltaSegment>& r : rounds) {
      for_segments(r, [&](const DeltaSegments& segs) {
        run(conv_silu_cuda(vec(w.conv_t), K, ch, segs, conv_in, conv_out, st_.stream),
            "delta net convolution");
      });
    }
    run(l2_normalize_qk_cuda(conv_out, n, ch, nk, hk, c.rms_norm_eps,
                             1.0f / std::sqrt(static_cast<float>(hk)), st_.stream),
        "delta net q / k norm");
    DeltaRuleShape shape;
    shape.nk = nk;
    shape.nv = nv;
    shape.hk = hk;
    shape.hv = hv;
    shape.channels = ch;
    shape.window = (K - 1) * ch;
    shape.tiled = w.tiled;
    float* o = grow(att_, n * vdim);
    for (const std::vector<DeltaSegment>& r : rounds) {
      for_segments(r, [&](const DeltaSegments& segs) {
        run(delta_rule_cuda(shape, segs, conv_out, decay, beta, o, st_.stream), "delta rule");
      });
    }
    // rms_norm(o_h) * w * silu(z_h), per token and value head, into z.
    run(rms_norm_cuda(o, hv, vec(w.norm), n * nv, hv, c.rms_norm_eps, o, hv, st_.stream),
        "delta net norm");
    run(glu_cuda(z, o, n * nv, hv, nullptr, nullptr, 0.0f, ops::kSwigluOaiAlpha, st_.stream),
        "delta net gate");
    mm(w.out, z, vdim, n, out, hd);
  }
  // Round r holds each part's r-th segment: its tokens up to its next checkpoint (copied there),
  // the last one to the part's end.
  std::vector<std::vector<DeltaSegment>> delta_rounds(int64_t state_layer) const {
    std::vector<std::vector<DeltaSegment>> rounds;
    for (size_t i = 0; i < step_.parts.size(); ++i) {
      const ForwardStep::Part& p = step_.parts[i];
      float* state = cache_->state(state_layer, p.seq);
      int64_t done = 0;
      size_t r = 0;
      auto add = [&](int64_t end, float* snapshot) {
        if (rounds.size() <= r) rounds.emplace_back();
        rounds[r++].push_back(DeltaSegment{p.t0 + done, end - done, state, snapshot});
        done = end;
      };
      for (const ForwardStep::Snapshot& s : step_.snapshots) {  // (ascending per part)
        if (s.part == static_cast<int32_t>(i)) add(s.offset, cache_->slot_state(s.slot, state_layer));
      }
      if (done < p.n || r == 0) add(p.n, nullptr);
    }
    return rounds;
  }
  template <typename F>
  static void for_segments(const std::vector<DeltaSegment>& round, F&& fn) {
    for (size_t b = 0; b < round.size(); b += kDeltaMaxSegments) {
      DeltaSegments segs;
      segs.count = static_cast<int>(std::min<size_t>(kDeltaMaxSegments, round.size() - b));
      for (int i = 0; i < segs.count; ++i) segs.s[i] = round[b + static_cast<size_t>(i)];
      fn(segs);
    }
  }

  CudaDevice& cuda_;
  CudaStreamState& st_;
  ForwardOpsProfile seconds_;  // added to by the collected spans (CudaDevice::span_mu_)
  ops::Rope rope_;
  bool neox_ = true;
  float attn_scale_ = 1.0f;
  std::map<const float*, float*> vecs_;  // host vector -> its device copy
  std::map<const int32_t*, int32_t*> ints_;
  ForwardStep step_;
  KvCache* cache_ = nullptr;
  // The staged step (stage()): the pinned host area, the device buffer it is copied into, and
  // the sections' device pointers.
  HostStaging step_host_;
  uint8_t* host_step_ = nullptr;
  void* step_dev_bytes_ = nullptr;
  uint64_t step_bytes_ = 0;
  int64_t max_blocks_ = 0;  // block table entries per part
  const int32_t* tok_dev_ = nullptr;
  const int64_t* pos0_dev_ = nullptr;
  const float* cs_dev_ = nullptr;
  const int64_t* k_ofs_ = nullptr;
  const int64_t* v_ofs_ = nullptr;
  const int32_t* blocks_dev_ = nullptr;
  Buf *logits_, *head_in_, *step_dev_, *q_, *k_, *v_, *qa_, *qc_, *att_, *o_, *g_, *u_, *scores_;
  Buf *gate_, *mixed_, *conv_in_, *conv_out_, *z_, *beta_, *decay_;
};

std::unique_ptr<ForwardOps> make_cuda_forward_ops(CudaDevice& dev,
                                                  std::shared_ptr<const DenseWeights> weights,
                                                  const ForwardOpsOptions& options) {
  return std::make_unique<CudaForwardOps>(dev, std::move(weights), options);
}

}  // namespace tandem::rt::cuda_detail

#endif
