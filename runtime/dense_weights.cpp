#include "runtime/dense_weights.h"

#include <map>
#include <utility>

#include "core/error.h"
#include "core/progress.h"

namespace tandem::rt {

DenseWeights::~DenseWeights() {
  for (void* p : allocations_) dev_.free(p);
}

namespace {

// Every non-expert matrix of the model, as pointers into `m` (a copy of the loaded model's
// structure) so the copies can be re-pointed in place.
std::vector<ops::Weight*> dense_matrices(LoadedModel& m) {
  std::vector<ops::Weight*> out{&m.lm_head};
  for (LayerWeights& lw : m.layers) {
    for (ops::Weight* w :
         {&lw.wq, &lw.wk, &lw.wv, &lw.wo, &lw.wq_a, &lw.wq_b, &lw.wkv_a, &lw.ffn_gate, &lw.ffn_up,
          &lw.ffn_down, &lw.router, &lw.sh_gate, &lw.sh_up, &lw.sh_down, &lw.idx_wq_b,
          &lw.idx_wk, &lw.idx_weights}) {
      out.push_back(w);
    }
    for (ops::Weight& w : lw.k_up) out.push_back(&w);
    for (ops::Weight& w : lw.v_up) out.push_back(&w);
    for (ops::Weight& w : lw.delta.in) out.push_back(&w);  // (Gated DeltaNet layers)
    out.push_back(&lw.delta.out);
  }
  return out;
}

// A matrix's block scales for its rows: scale rows row0 / block_rows .. (row0 + rows - 1) /
// block_rows (floats).
int64_t scale_floats(const ops::Weight& w) {
  if (w.scale_inv == nullptr || w.rows() == 0) return 0;
  const int64_t first = w.row0 / w.block_rows, last = (w.row0 + w.rows() - 1) / w.block_rows;
  return (last - first + 1) * w.scale_cols;
}

uint64_t align_up(uint64_t bytes) {
  return (bytes + 255) / 256 * 256;
}

}  // namespace

std::shared_ptr<DenseWeights> upload_dense_weights(Device& dev, const LoadedModel& model,
                                                   bool shared_experts) {
  auto out = std::make_shared<DenseWeights>(dev);
  out->shared_experts = shared_experts;
  LoadedModel& m = out->weights;
  m.path = model.path;
  m.config = model.config;
  m.from_gguf = model.from_gguf;
  m.embed = model.embed;
  m.lm_head = model.lm_head;
  m.out_norm = model.out_norm;
  m.layers = model.layers;
  for (LayerWeights& lw : m.layers) {
    lw.experts = ExpertWeights{};
    if (!shared_experts) {
      lw.sh_gate = lw.sh_up = lw.sh_down = ops::Weight{};
      lw.sh_gate_inp.clear();
    }
  }

  // What to copy: each distinct data region once (tied embeddings), each weight's scale rows.
  std::vector<ops::Weight*> mats = dense_matrices(m);
  std::map<const void*, uint64_t> regions;  // host data -> bytes
  auto note = [&](const Tensor& t, const std::string& what) {
    if (t.data == nullptr) return;
    if (!t.is_contiguous()) {
      fail(ErrorKind::kUnsupported,
           "{}: {} {} is not contiguous: it cannot be copied to the {} "
           "device as one block",
           model.path.string(), what, t.shape_string(), dev.name());
    }
    uint64_t& b = regions[t.data];
    b = std::max<uint64_t>(b, static_cast<uint64_t>(t.nbytes()));
  };
  note(m.embed, "the embedding");
  uint64_t total = 0;
  for (ops::Weight* w : mats) {
    note(w->t, "a matrix");
    total += align_up(static_cast<uint64_t>(scale_floats(*w)) * 4);
  }
  for (const auto& [p, b] : regions) total += align_up(b);
  const uint64_t free = dev.memory_capacity() - dev.memory_used();
  if (total > free) {
    fail(ErrorKind::kResource,
         "the dense part of {} (embedding, attention, dense FFNs, routers, lm_head{}: {:.1f} "
         "MiB) does not fit the {} device's {:.1f} MiB left: raise --vram-budget, or keep the "
         "dense part on the CPU with a --rules file holding "
         "`- {{match: {{name: 'embed|lm_head|layers\\.\\d+\\.(attention|ffn)'}}, device: cpu}}`",
         model.path.string(), shared_experts ? ", shared experts" : "", total / 1048576.0,
         dev.name(), free / 1048576.0);
  }

  Progress progress(fmt::format("copying the dense part to the {} device", dev.name()), total);
  const StreamId s = 0;
  try {
    std::map<const void*, void*> copied;  // host data -> device data
    for (const auto& [p, b] : regions) {
      void* d = dev.alloc(b);
      out->allocations_.push_back(d);
      dev.copy_h2d(d, p, b, s);
      dev.host_callback(s, [&progress, b] { progress.add(align_up(b)); });
      copied[p] = d;
    }
    auto repoint = [&](Tensor& t) {
      if (t.data != nullptr) t.data = copied.at(t.data);
    };
    repoint(m.embed);
    for (ops::Weight* w : mats) {
      const int64_t sf = scale_floats(*w);
      repoint(w->t);
      if (sf > 0) {
        const int64_t first = w->row0 / w->block_rows;
        void* d = dev.alloc(static_cast<uint64_t>(sf) * 4);
        out->allocations_.push_back(d);
        dev.copy_h2d(d, w->scale_inv + first * w->scale_cols, static_cast<uint64_t>(sf) * 4, s);
        dev.host_callback(
            s, [&progress, sf] { progress.add(align_up(static_cast<uint64_t>(sf) * 4)); });
        w->scale_inv = static_cast<const float*>(d);
        w->row0 -= first * w->block_rows;
      }
    }
    dev.sync_stream(s);  // (the copies run back to back on the stream, the bar counts them done)
  } catch (...) {
    try {
      dev.sync_stream(s);  // (copies in flight write into what the unwinding frees)
    } catch (...) {
    }
    throw;
  }
  progress.finish();
  out->bytes = total;
  m.weight_bytes = total;
  return out;
}

KvCacheOptions device_cache_options(Device& dev, KvCacheOptions o) {
  Device* d = &dev;
  o.alloc = [d](uint64_t bytes) {
    const uint64_t left = d->memory_capacity() - d->memory_used();
    if (bytes > left) {
      fail(ErrorKind::kResource,
           "a KV cache of {:.1f} MiB does not fit the {} device's {:.1f} MiB left next to the "
           "dense part and the expert cache: lower --ctx (or --parallel), lower --cache-slots, "
           "or raise --vram-budget",
           bytes / 1048576.0, d->name(), left / 1048576.0);
    }
    return d->alloc(bytes);
  };
  o.release = [d](void* p) { d->free(p); };
  return o;
}

}  // namespace tandem::rt
