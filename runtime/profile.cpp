#include "runtime/profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <utility>

#include "core/error.h"
#include "core/thread_pool.h"
#include "formats/output_file.h"
#include "runtime/calibrate.h"
#include "runtime/device.h"
#include "runtime/trace.h"

namespace tandem::rt {
namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

uint64_t weight_bytes(const ops::Weight& w) {
  uint64_t b = uint64_t(w.t.row_bytes()) * uint64_t(w.rows());
  if (w.scale_inv && w.block_rows > 0) {
    b += uint64_t((w.rows() + w.block_rows - 1) / w.block_rows) * uint64_t(w.scale_cols) * 4;
  }
  return b;
}

// The accelerator side on the emulated host device: one expert's weights copied through the link
// (timed: the transfer), then its FFN on the device for each token count (best of N).
void profile_host_device(const LayerWeights& lw, const LinkSpec& link, const std::vector<float>& x,
                         const ProfileOptions& o, int threads, ProfileResult* r) {
  const ExpertWeights& ex = lw.experts;
  for (const ops::Weight* w : {&ex.gate[0], &ex.up[0], &ex.down[0]}) {
    if (w->scale_inv != nullptr) {
      fail(ErrorKind::kUnsupported,
           "--accel host: profiling block-scaled FP8 experts on the device is not supported");
    }
  }
  const uint64_t h = static_cast<uint64_t>(ex.down[0].rows());
  const uint64_t max_t = static_cast<uint64_t>(x.size()) / h;
  const uint64_t wbytes = uint64_t(ex.gate[0].t.nbytes()) + uint64_t(ex.up[0].t.nbytes()) +
                          uint64_t(ex.down[0].t.nbytes());
  HostDeviceOptions ho;
  ho.memory_bytes = wbytes + 2 * max_t * h * 4 + (uint64_t{16} << 20);
  ho.threads = std::max(1, threads);
  ho.link = link;
  std::unique_ptr<Device> dev = make_host_device(ho);
  const StreamId s = dev->create_stream();
  uint8_t* mem = static_cast<uint8_t*>(dev->alloc(wbytes));
  float* dx = static_cast<float*>(dev->alloc(max_t * h * 4));
  float* dy = static_cast<float*>(dev->alloc(max_t * h * 4));
  DeviceFfnWeights w;
  uint64_t off = 0;
  double best_copy = std::numeric_limits<double>::infinity();
  for (int i = 0; i <= o.repeats; ++i) {
    off = 0;
    const double t0 = now();
    for (auto [src, dst] : {std::pair{&ex.gate[0], &w.gate}, {&ex.up[0], &w.up},
                            {&ex.down[0], &w.down}}) {
      *dst = *src;
      const uint64_t n = static_cast<uint64_t>(src->t.nbytes());
      dev->copy_h2d(mem + off, src->t.data, n, s);
      dst->t.data = mem + off;
      dst->t.device = DeviceRef{DeviceKind::kAccel, 0};
      off += n;
    }
    dev->sync_stream(s);
    if (i > 0) best_copy = std::min(best_copy, now() - t0);
  }
  dev->copy_h2d(dx, x.data(), max_t * h * 4, s);
  dev->sync_stream(s);
  for (int64_t n : o.tokens) {
    double best = std::numeric_limits<double>::infinity();
    for (int i = 0; i <= o.repeats; ++i) {
      const double t0 = now();
      dev->ffn(s, w, dx, n, nullptr, dy, false);
      dev->sync_stream(s);
      if (i > 0) best = std::min(best, now() - t0);
    }
    r->accel.push_back({n, best});
  }
  r->accel_name = dev->name();
  r->transfer_seconds = best_copy;
  r->transfer_source = fmt::format("measured through {} (link {} GB/s, {} us)", dev->name(),
                                   link.gb_per_s, link.latency_us);
  dev->free(dy);
  dev->free(dx);
  dev->free(mem);
}

}  // namespace

ProfileResult profile_experts(const LoadedModel& model, const ProfileOptions& o,
                              ThreadingContext& threading) {
  const std::vector<int64_t> moe = moe_layer_indices(model);
  if (moe.empty())
    fail(ErrorKind::kUnsupported, "{}: no MoE layer to profile", model.path.string());
  if (o.repeats < 1) fail(ErrorKind::kInvalidArgument, "--repeats must be >= 1, got {}", o.repeats);
  if (o.accel != Accel::kNone && o.accel != Accel::kHost) {
    fail(ErrorKind::kUnsupported,
         "--accel {}: only the emulated host device can be profiled so far (use --accel host or "
         "none)",
         choice_name(o.accel));
  }
  const LayerWeights& lw = model.layers[static_cast<size_t>(moe[0])];
  ProfileResult r;
  r.model = model.path.filename().string();
  r.expert_bytes = weight_bytes(lw.experts.gate[0]) + weight_bytes(lw.experts.up[0]) +
                   weight_bytes(lw.experts.down[0]);
  BackendOptions bo = o.backend;
  bo.accel = Accel::kNone;
  MoeRuntime rt(model, bo, threading);
  r.cpu_backend = rt.summary();
  MoeBackend* be = rt.backend();
  const int64_t H = model.config.hidden_size, E = model.config.n_experts;
  const int64_t max_t = *std::max_element(o.tokens.begin(), o.tokens.end());
  if (max_t < 1 || max_t > 65536)
    fail(ErrorKind::kInvalidArgument, "profile: token count {}", max_t);
  std::vector<float> x(static_cast<size_t>(max_t * H)), out(x.size());
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (float& v : x) v = nd(rng);
  std::vector<int32_t> ids(static_cast<size_t>(max_t), 0);
  std::vector<float> w(static_cast<size_t>(max_t), 1.f);
  std::vector<uint8_t> mask(static_cast<size_t>(E), 0);
  mask[0] = 1;
  for (int64_t n : o.tokens) {
    MoeRequest q;
    q.layer = moe[0];
    q.moe_index = 0;
    q.n_moe_layers = int64_t(moe.size());
    q.layer_weights = &lw;
    q.experts = &lw.experts;
    q.hidden = x.data();
    q.n_tokens = n;
    q.hidden_size = H;
    q.ids = ids.data();
    q.weights = w.data();
    q.k = 1;
    q.run_here = mask.data();
    q.out = out.data();
    double best = std::numeric_limits<double>::infinity();
    for (int i = 0; i <= o.repeats; ++i) {  // the first run warms caches and is not counted
      const double t0 = now();
      be->submit(q);
      be->wait();
      const double s = now() - t0;
      if (i > 0) best = std::min(best, s);
    }
    r.cpu.push_back({n, best});
  }
  LinkSpec link;
  try {
    link = parse_link(o.link);
  } catch (const Error& e) {
    fail(ErrorKind::kInvalidArgument, "--{}", e.what());  // "--link '...': expected ..."
  }
  if (!o.trace.empty()) {
    r.expert_counts = expert_counts(read_trace(o.trace));
    if (r.expert_counts.size() != moe.size() ||
        (!r.expert_counts.empty() && static_cast<int64_t>(r.expert_counts[0].size()) != E)) {
      fail(ErrorKind::kInvalidArgument,
           "--trace {}: {} MoE layers x {} experts, the model has {} x {}", o.trace.string(),
           r.expert_counts.size(), r.expert_counts.empty() ? 0 : r.expert_counts[0].size(),
           moe.size(), E);
    }
  }
  if (o.accel == Accel::kHost) {
    profile_host_device(lw, link, x, o, threading.n_threads(), &r);
    return r;
  }
  // No device: the transfer comes from the link model, bytes / bandwidth + latency.
  r.transfer_seconds =
      (link.gb_per_s > 0 ? double(r.expert_bytes) / (link.gb_per_s * 1e9) : 0) +
      link.latency_us * 1e-6;
  r.transfer_source = fmt::format("link model {} GB/s, {} us", link.gb_per_s, link.latency_us);
  return r;
}

}  // namespace tandem::rt

namespace tandem::rt {

void save_profile(const ProfileResult& r, const std::filesystem::path& path) {
  nlohmann::json j;
  j["format"] = "tandem-cost-model";
  j["version"] = 1;
  j["model"] = r.model;
  j["cpu_backend"] = r.cpu_backend;
  j["expert_bytes"] = r.expert_bytes;
  auto table = [](const std::vector<ProfilePoint>& pts) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& p : pts) a.push_back({p.tokens, p.seconds});
    return a;
  };
  j["cpu_expert"] = table(r.cpu);
  j["accel_expert"] = table(r.accel);
  j["accel"] = r.accel_name;
  j["transfer_seconds"] = r.transfer_seconds;
  j["transfer_source"] = r.transfer_source;
  if (!r.expert_counts.empty()) j["expert_counts"] = r.expert_counts;
  write_output_file(path, j.dump(1) + "\n");
}

}  // namespace tandem::rt
