#include "runtime/profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "core/thread_pool.h"
#include "runtime/calibrate.h"

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

}  // namespace

ProfileResult profile_experts(const LoadedModel& model, const ProfileOptions& o,
                              ThreadingContext& threading) {
  const std::vector<int64_t> moe = moe_layer_indices(model);
  if (moe.empty())
    fail(ErrorKind::kUnsupported, "{}: no MoE layer to profile", model.path.string());
  if (o.repeats < 1) fail(ErrorKind::kInvalidArgument, "--repeats must be >= 1, got {}", o.repeats);
  if (o.accel != "none") {
    fail(ErrorKind::kUnsupported,
         "--accel {}: this build has no accelerator device to profile; "
         "use --accel none (CPU only, transfer from --link)",
         o.accel);
  }
  const LayerWeights& lw = model.layers[static_cast<size_t>(moe[0])];
  ProfileResult r;
  r.model = model.path.filename().string();
  r.expert_bytes = weight_bytes(lw.experts.gate[0]) + weight_bytes(lw.experts.up[0]) +
                   weight_bytes(lw.experts.down[0]);
  BackendOptions bo = o.backend;
  bo.accel = "none";
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
    q.expert_mask = mask.data();
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
  // No Device here (runtime/device.h is not part of this build yet): the transfer comes from
  // the link model, bytes / bandwidth + latency.
  double gbps = 25, us = 10;
  if (o.link == "pcie5") {
    gbps = 50;
    us = 8;
  } else if (o.link == "none") {
    gbps = 0;
    us = 0;
  } else if (o.link != "pcie4") {
    const size_t comma = o.link.find(',');
    try {
      gbps = std::stod(o.link.substr(0, comma));
      us = comma == std::string::npos ? 0 : std::stod(o.link.substr(comma + 1));
    } catch (const std::exception&) {
      fail(ErrorKind::kInvalidArgument, "--link '{}': expected pcie4, pcie5, none or GBPS[,US]",
           o.link);
    }
    if (!(gbps >= 0) || !(us >= 0))
      fail(ErrorKind::kInvalidArgument, "--link '{}': negative", o.link);
  }
  r.transfer_seconds = (gbps > 0 ? double(r.expert_bytes) / (gbps * 1e9) : 0) + us * 1e-6;
  r.transfer_source = fmt::format("link model {} GB/s, {} us", gbps, us);
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
  std::ofstream out(path);
  if (!out) fail(ErrorKind::kIo, "{}: cannot create", path.string());
  out << j.dump(1) << "\n";
  if (!out) fail(ErrorKind::kIo, "{}: write failed", path.string());
}

}  // namespace tandem::rt
