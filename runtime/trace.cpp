#include "runtime/trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fp_convert.h"
#include "core/input_file.h"
#include "formats/output_file.h"

namespace tandem::rt {
namespace {

constexpr char kMagic[8] = {'T', 'D', 'T', 'R', 'A', 'C', 'E', '1'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kKnownFlags =
    kTraceScores | kTraceGatePred | kTraceResidualPred | kTraceF16 | kTraceIds16;
constexpr int kMaxLayers = 4096, kMaxExperts = 65536, kMaxName = 4096;
// Layers x experts: what the simulator's per-expert tables hold (DeepSeek-V3: 58 x 256; Kimi-K2:
// 60 x 384). A header past it is refused before anything is sized from it.
constexpr int64_t kMaxLayerExperts = int64_t{1} << 20;
constexpr int64_t kRecordFixed = 12;  // int32 token, int32 batch, uint8 phase, 3 pad bytes

struct Layout {
  int64_t id_bytes, float_bytes, record;
};

Layout layout_of(uint32_t flags, int64_t n_layers, int64_t n_experts, int64_t top_k) {
  Layout l;
  l.id_bytes = (flags & kTraceIds16) ? 2 : 1;
  l.float_bytes = (flags & kTraceF16) ? 2 : 4;
  const int64_t lk = n_layers * top_k, le = n_layers * n_experts;
  l.record = kRecordFixed + lk * (l.id_bytes + l.float_bytes);
  for (uint32_t f : {kTraceScores, kTraceGatePred, kTraceResidualPred}) {
    if (flags & f) l.record += le * l.float_bytes;
  }
  return l;
}

template <typename T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <typename T>
T get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

void put_floats(std::string& out, const float* v, int64_t n, bool f16) {
  for (int64_t i = 0; i < n; ++i) {
    if (f16) {
      put<uint16_t>(out, f32_to_f16(v[i]));
    } else {
      put<float>(out, v[i]);
    }
  }
}

const uint8_t* get_floats(const uint8_t* p, float* v, int64_t n, bool f16) {
  for (int64_t i = 0; i < n; ++i) {
    if (f16) {
      v[i] = f16_to_f32(get<uint16_t>(p));
      p += 2;
    } else {
      v[i] = get<float>(p);
      p += 4;
    }
  }
  return p;
}

}  // namespace

int64_t Trace::add_record(int32_t token_index, TracePhase ph, int32_t batch_id) {
  token.push_back(token_index);
  phase.push_back(static_cast<uint8_t>(ph));
  batch.push_back(batch_id);
  const size_t lk = static_cast<size_t>(n_layers) * top_k;
  const size_t le = static_cast<size_t>(n_layers) * n_experts;
  ids.resize(ids.size() + lk, 0);
  weights.resize(weights.size() + lk, 0.f);
  if (has_scores) scores.resize(scores.size() + le, 0.f);
  if (has_gate_pred) gate_pred.resize(gate_pred.size() + le, 0.f);
  if (has_residual_pred) residual_pred.resize(residual_pred.size() + le, 0.f);
  return size() - 1;
}

void Trace::validate(const std::string& what) const {
  if (n_layers < 1 || n_layers > kMaxLayers) {
    fail(ErrorKind::kFormat, "{}: n_moe_layers {} outside 1..{}", what, n_layers, kMaxLayers);
  }
  if (n_experts < 1 || n_experts > kMaxExperts) {
    fail(ErrorKind::kFormat, "{}: n_experts {} outside 1..{}", what, n_experts, kMaxExperts);
  }
  if (top_k < 1 || top_k > n_experts) {
    fail(ErrorKind::kFormat, "{}: top_k {} outside 1..n_experts ({})", what, top_k, n_experts);
  }
  if (int64_t{n_layers} * n_experts > kMaxLayerExperts) {
    fail(ErrorKind::kFormat, "{}: {} MoE layers x {} experts is more than the {} a trace may have",
         what, n_layers, n_experts, kMaxLayerExperts);
  }
  const size_t n = token.size();
  const size_t lk = n * n_layers * top_k, le = n * n_layers * n_experts;
  if (phase.size() != n || batch.size() != n || ids.size() != lk || weights.size() != lk ||
      scores.size() != (has_scores ? le : 0) || gate_pred.size() != (has_gate_pred ? le : 0) ||
      residual_pred.size() != (has_residual_pred ? le : 0)) {
    fail(ErrorKind::kFormat, "{}: array sizes do not match {} records", what, n);
  }
  for (size_t i = 0; i < n; ++i) {
    if (phase[i] > 1)
      fail(ErrorKind::kFormat, "{}: record {}: phase {} (0 or 1)", what, i, phase[i]);
  }
  for (size_t i = 0; i < lk; ++i) {
    if (ids[i] < 0 || ids[i] >= n_experts) {
      fail(ErrorKind::kFormat, "{}: record {}: expert id {} outside 0..{}", what,
           i / (n_layers * top_k), ids[i], n_experts - 1);
    }
  }
}

void write_trace(const Trace& t, const std::filesystem::path& path, const TraceWriteOptions& o) {
  t.validate(path.string());
  if (t.model.size() > kMaxName) fail(ErrorKind::kInvalidArgument, "trace model name too long");
  uint32_t flags = 0;
  if (t.has_scores) flags |= kTraceScores;
  if (t.has_gate_pred) flags |= kTraceGatePred;
  if (t.has_residual_pred) flags |= kTraceResidualPred;
  if (o.f16) flags |= kTraceF16;
  if (t.n_experts > 256) flags |= kTraceIds16;
  const Layout lay = layout_of(flags, t.n_layers, t.n_experts, t.top_k);
  std::string out;
  out.append(kMagic, 8);
  put<uint32_t>(out, kVersion);
  put<uint32_t>(out, flags);
  put<uint32_t>(out, static_cast<uint32_t>(t.n_layers));
  put<uint32_t>(out, static_cast<uint32_t>(t.n_experts));
  put<uint32_t>(out, static_cast<uint32_t>(t.top_k));
  put<uint64_t>(out, static_cast<uint64_t>(t.size()));
  put<uint32_t>(out, static_cast<uint32_t>(t.model.size()));
  out += t.model;
  out.reserve(out.size() + static_cast<size_t>(lay.record * t.size()));
  const int64_t lk = int64_t(t.n_layers) * t.top_k, le = int64_t(t.n_layers) * t.n_experts;
  const bool f16 = o.f16;
  for (int64_t r = 0; r < t.size(); ++r) {
    put<int32_t>(out, t.token[r]);
    put<int32_t>(out, t.batch[r]);
    put<uint8_t>(out, t.phase[r]);
    out.append(3, '\0');
    for (int64_t i = 0; i < lk; ++i) {
      const int32_t id = t.ids[r * lk + i];
      if (flags & kTraceIds16) {
        put<uint16_t>(out, static_cast<uint16_t>(id));
      } else {
        put<uint8_t>(out, static_cast<uint8_t>(id));
      }
    }
    put_floats(out, t.weights.data() + r * lk, lk, f16);
    if (t.has_scores) put_floats(out, t.scores.data() + r * le, le, f16);
    if (t.has_gate_pred) put_floats(out, t.gate_pred.data() + r * le, le, f16);
    if (t.has_residual_pred) put_floats(out, t.residual_pred.data() + r * le, le, f16);
  }
  write_output_file(path, out);
}

Trace read_trace(const std::filesystem::path& path) {
  const std::string ext = path.extension().string();
  if (ext == ".json") return import_demo_trace(path);
  if (ext == ".bin") {
    auto j = path;
    j.replace_extension(".json");
    if (std::filesystem::exists(j)) return import_demo_trace(path);
  }
  const std::string d = read_input_file(path, kMaxDataFileBytes);
  return parse_trace(path.string(), reinterpret_cast<const uint8_t*>(d.data()), d.size());
}

Trace parse_trace(const std::string& what, const uint8_t* data, size_t size) {
  constexpr size_t kHead = 8 + 4 * 5 + 8 + 4;
  if (size < kHead)
    fail(ErrorKind::kFormat, "{}: {} bytes, too short for a trace header", what, size);
  if (std::memcmp(data, kMagic, 8) != 0) {
    fail(ErrorKind::kFormat, "{}: bad magic (not a tandem trace, expected 'TDTRACE1')", what);
  }
  const uint8_t* p = data + 8;
  const auto version = get<uint32_t>(p), flags = get<uint32_t>(p + 4);
  const auto nl = get<uint32_t>(p + 8), ne = get<uint32_t>(p + 12), k = get<uint32_t>(p + 16);
  const auto n = get<uint64_t>(p + 20);
  const auto name_len = get<uint32_t>(p + 28);
  if (version != kVersion)
    fail(ErrorKind::kUnsupported, "{}: trace version {} (this build reads {})", what, version,
         kVersion);
  if (flags & ~kKnownFlags) fail(ErrorKind::kFormat, "{}: unknown flags 0x{:x}", what, flags);
  if (nl < 1 || nl > kMaxLayers)
    fail(ErrorKind::kFormat, "{}: n_moe_layers {} outside 1..{}", what, nl, kMaxLayers);
  if (ne < 1 || ne > kMaxExperts)
    fail(ErrorKind::kFormat, "{}: n_experts {} outside 1..{}", what, ne, kMaxExperts);
  if (k < 1 || k > ne) fail(ErrorKind::kFormat, "{}: top_k {} outside 1..{}", what, k, ne);
  if (uint64_t{nl} * ne > uint64_t(kMaxLayerExperts)) {
    fail(ErrorKind::kFormat, "{}: {} MoE layers x {} experts is more than the {} a trace may have",
         what, nl, ne, kMaxLayerExperts);
  }
  if (ne > 256 && !(flags & kTraceIds16))
    fail(ErrorKind::kFormat, "{}: {} experts need 16-bit ids", what, ne);
  if (name_len > kMaxName) fail(ErrorKind::kFormat, "{}: model name length {}", what, name_len);
  if (size < kHead + name_len) fail(ErrorKind::kFormat, "{}: truncated header", what);
  const Layout lay = layout_of(flags, nl, ne, k);
  const uint64_t body = size - kHead - name_len;
  if (n > body / uint64_t(lay.record) || body != n * uint64_t(lay.record)) {
    fail(ErrorKind::kFormat, "{}: {} body bytes, expected {} records x {} bytes", what, body, n,
         lay.record);
  }
  if (n == 0) fail(ErrorKind::kFormat, "{}: no records", what);
  Trace t;
  t.model.assign(reinterpret_cast<const char*>(data + kHead), name_len);
  t.n_layers = int(nl);
  t.n_experts = int(ne);
  t.top_k = int(k);
  t.has_scores = flags & kTraceScores;
  t.has_gate_pred = flags & kTraceGatePred;
  t.has_residual_pred = flags & kTraceResidualPred;
  const bool f16 = flags & kTraceF16;
  const int64_t lk = int64_t(nl) * k, le = int64_t(nl) * ne;
  t.token.resize(n);
  t.batch.resize(n);
  t.phase.resize(n);
  t.ids.resize(n * lk);
  t.weights.resize(n * lk);
  if (t.has_scores) t.scores.resize(n * le);
  if (t.has_gate_pred) t.gate_pred.resize(n * le);
  if (t.has_residual_pred) t.residual_pred.resize(n * le);
  p = data + kHead + name_len;
  for (uint64_t r = 0; r < n; ++r) {
    t.token[r] = get<int32_t>(p);
    t.batch[r] = get<int32_t>(p + 4);
    t.phase[r] = p[8];
    p += kRecordFixed;
    for (int64_t i = 0; i < lk; ++i) {
      if (flags & kTraceIds16) {
        t.ids[r * lk + i] = get<uint16_t>(p);
        p += 2;
      } else {
        t.ids[r * lk + i] = *p++;
      }
    }
    p = get_floats(p, t.weights.data() + r * lk, lk, f16);
    if (t.has_scores) p = get_floats(p, t.scores.data() + r * le, le, f16);
    if (t.has_gate_pred) p = get_floats(p, t.gate_pred.data() + r * le, le, f16);
    if (t.has_residual_pred) p = get_floats(p, t.residual_pred.data() + r * le, le, f16);
  }
  t.validate(what);
  return t;
}

namespace {

// One array of a demo trace's .bin, as the .json's "arrays" list describes it.
struct DemoArray {
  std::string dtype;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
};
using DemoArrays = std::map<std::string, DemoArray>;

nlohmann::json parse_demo_json(const std::filesystem::path& jpath) {
  const std::string jtext = read_input_file(jpath, kMaxConfigFileBytes);
  try {
    return nlohmann::json::parse(jtext);
  } catch (const std::exception& e) {
    fail(ErrorKind::kFormat, "{}: invalid JSON: {}", jpath.string(), e.what());
  }
}

// One entry of "arrays" (its name in *name), checked to lie within the .bin.
DemoArray read_demo_array(const nlohmann::json& a, const std::string& bin, const std::string& what,
                          const std::filesystem::path& bpath, std::string* name) {
  DemoArray arr;
  arr.dtype = a.at("dtype").get<std::string>();
  arr.shape = a.at("shape").get<std::vector<int64_t>>();
  const auto off = a.at("offset").get<uint64_t>(), nb = a.at("nbytes").get<uint64_t>();
  const uint64_t es = arr.dtype == "uint8"                               ? 1
                      : (arr.dtype == "int32" || arr.dtype == "float32") ? 4
                                                                         : 0;
  *name = a.at("name").get<std::string>();
  if (!es) fail(ErrorKind::kUnsupported, "{}: array '{}': dtype '{}'", what, *name, arr.dtype);
  uint64_t count = 1;
  for (int64_t s : arr.shape) {
    if (s < 0 || s > INT32_MAX) fail(ErrorKind::kFormat, "{}: array '{}': bad shape", what, *name);
    count *= uint64_t(s);
    if (count > bin.size()) {
      fail(ErrorKind::kFormat, "{}: array '{}': shape larger than {}", what, *name, bpath.string());
    }
  }
  if (count * es != nb || off > bin.size() || nb > bin.size() - off) {
    fail(ErrorKind::kFormat, "{}: array '{}': {} bytes at {} do not fit its shape or {} ({} bytes)",
         what, *name, nb, off, bpath.string(), bin.size());
  }
  arr.data = reinterpret_cast<const uint8_t*>(bin.data()) + off;
  return arr;
}

// Every array the .json lists, by name (a later entry of the same name replaces an earlier one).
DemoArrays read_demo_arrays(const nlohmann::json& j, const std::string& bin,
                            const std::string& what, const std::filesystem::path& bpath) {
  DemoArrays arrays;
  try {
    for (const auto& a : j.at("arrays")) {
      std::string name;
      const DemoArray arr = read_demo_array(a, bin, what, bpath, &name);
      arrays[name] = arr;
    }
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::kFormat, "{}: {}", what, e.what());
  }
  return arrays;
}

const DemoArray& need_demo_array(const DemoArrays& arrays, const std::string& what,
                                 const std::string& name, const std::string& dtype, size_t ndim) {
  auto it = arrays.find(name);
  if (it == arrays.end()) fail(ErrorKind::kFormat, "{}: missing array '{}'", what, name);
  if (it->second.dtype != dtype || it->second.shape.size() != ndim) {
    fail(ErrorKind::kFormat, "{}: array '{}' must be {} with {} dimensions", what, name, dtype,
         ndim);
  }
  return it->second;
}

// The empty trace of the demo's dimensions: layers and top-k from topk_ids, experts from
// n_routed_experts and / or the scores array (whose presence sets has_scores).
Trace demo_trace_shape(const nlohmann::json& j, const DemoArrays& arrays, const DemoArray& ids,
                       const DemoArray& w, const std::filesystem::path& jpath,
                       const std::string& what) {
  const int64_t n = ids.shape[0];
  Trace t;
  t.model = jpath.stem().string();
  t.n_layers = int(ids.shape[1]);
  t.top_k = int(ids.shape[2]);
  if (const auto it = j.find("n_routed_experts"); it != j.end()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > 256) {
      fail(ErrorKind::kFormat, "{}: key 'n_routed_experts' must be an integer in 1..256", what);
    }
    t.n_experts = it->get<int>();
  }
  if (w.shape != ids.shape)
    fail(ErrorKind::kFormat, "{}: topk_weights shape differs from topk_ids", what);
  t.has_scores = arrays.find("scores") != arrays.end();
  if (t.has_scores) {
    const DemoArray& s = need_demo_array(arrays, what, "scores", "float32", 3);
    if (s.shape[0] != n || s.shape[1] != t.n_layers || (t.n_experts && s.shape[2] != t.n_experts)) {
      fail(ErrorKind::kFormat, "{}: scores shape does not match topk_ids / n_routed_experts", what);
    }
    t.n_experts = int(s.shape[2]);
  }
  if (t.n_experts <= 0 || t.n_experts > 256)
    fail(ErrorKind::kFormat, "{}: n_routed_experts {}", what, t.n_experts);
  return t;
}

// The per-row arrays that place each row in a batch: phase and prompt in a trace with decode
// steps, chunk and pos in a prefill-only one.
struct DemoRowKeys {
  bool decode = false;
  const DemoArray *phase = nullptr, *prompt = nullptr, *chunk = nullptr, *pos = nullptr;
};

DemoRowKeys demo_row_keys(const DemoArrays& arrays, int64_t n, const std::string& what) {
  DemoRowKeys k;
  k.decode = arrays.count("phase") > 0;
  k.phase = k.decode ? &need_demo_array(arrays, what, "phase", "int32", 1) : nullptr;
  k.prompt = k.decode ? &need_demo_array(arrays, what, "prompt", "int32", 1) : nullptr;
  k.chunk = k.decode ? nullptr : &need_demo_array(arrays, what, "chunk", "int32", 1);
  k.pos = k.decode ? nullptr : &need_demo_array(arrays, what, "pos", "int32", 1);
  for (const DemoArray* a : {k.phase, k.prompt, k.chunk, k.pos}) {
    if (a && a->shape[0] != n)
      fail(ErrorKind::kFormat, "{}: per-row arrays differ in length", what);
  }
  return k;
}

// Appends the demo's rows to t: each row's phase, batch and token index from the row keys, its
// routing (and scores) copied.
void add_demo_rows(Trace& t, const DemoArrays& arrays, const DemoArray& ids, const DemoArray& w,
                   const DemoRowKeys& k, const std::string& what) {
  const int64_t n = ids.shape[0];
  const DemoArray* scores = t.has_scores ? &arrays.find("scores")->second : nullptr;
  const int64_t lk = int64_t(t.n_layers) * t.top_k, le = int64_t(t.n_layers) * t.n_experts;
  int32_t batch_id = -1, last_key = INT32_MIN, token_index = 0;
  for (int64_t r = 0; r < n; ++r) {
    TracePhase ph = TracePhase::kPrefill;
    if (k.decode) {
      const int32_t pr = get<int32_t>(k.prompt->data + 4 * r),
                    phv = get<int32_t>(k.phase->data + 4 * r);
      if (phv != 0 && phv != 1) fail(ErrorKind::kFormat, "{}: row {}: phase {}", what, r, phv);
      ph = phv ? TracePhase::kDecode : TracePhase::kPrefill;
      // A new batch at every prompt change and at every decode step; a prompt's prefill rows
      // form one batch.
      const bool new_prompt = pr != last_key;
      if (new_prompt) token_index = 0;
      if (new_prompt || ph == TracePhase::kDecode) ++batch_id;
      last_key = pr;
    } else {
      const int32_t c = get<int32_t>(k.chunk->data + 4 * r);
      if (c != last_key) ++batch_id;
      last_key = c;
      token_index = get<int32_t>(k.pos->data + 4 * r);
    }
    t.add_record(token_index++, ph, batch_id);
    for (int64_t i = 0; i < lk; ++i) t.ids[r * lk + i] = ids.data[r * lk + i];
    std::memcpy(t.weights.data() + r * lk, w.data + 4 * r * lk, size_t(lk) * 4);
    if (t.has_scores)
      std::memcpy(t.scores.data() + r * le, scores->data + 4 * r * le, size_t(le) * 4);
  }
}

}  // namespace

Trace import_demo_trace(const std::filesystem::path& path) {
  auto jpath = path, bpath = path;
  jpath.replace_extension(".json");
  bpath.replace_extension(".bin");
  const nlohmann::json j = parse_demo_json(jpath);
  const std::string bin = read_input_file(bpath, kMaxDataFileBytes);
  const std::string what = jpath.string();
  const DemoArrays arrays = read_demo_arrays(j, bin, what, bpath);
  const DemoArray& ids = need_demo_array(arrays, what, "topk_ids", "uint8", 3);
  const DemoArray& w = need_demo_array(arrays, what, "topk_weights", "float32", 3);
  Trace t = demo_trace_shape(j, arrays, ids, w, jpath, what);
  const DemoRowKeys keys = demo_row_keys(arrays, ids.shape[0], what);
  t.validate(what);  // the empty trace: checks n_layers / n_experts / top_k
  add_demo_rows(t, arrays, ids, w, keys, what);
  t.validate(what);
  return t;
}

std::vector<TraceBatch> trace_batches(const Trace& t) {
  std::vector<TraceBatch> out;
  for (int64_t r = 0; r < t.size(); ++r) {
    if (out.empty() || t.batch[r] != t.batch[r - 1] || t.phase[r] != t.phase[r - 1]) {
      out.push_back({r, r + 1, static_cast<TracePhase>(t.phase[r])});
    } else {
      out.back().end = r + 1;
    }
  }
  return out;
}

std::vector<std::vector<int64_t>> expert_counts(const Trace& t) {
  std::vector<std::vector<int64_t>> c(t.n_layers, std::vector<int64_t>(t.n_experts, 0));
  for (int64_t r = 0; r < t.size(); ++r) {
    for (int l = 0; l < t.n_layers; ++l) {
      for (int i = 0; i < t.top_k; ++i) ++c[l][t.ids_at(r, l)[i]];
    }
  }
  return c;
}

}  // namespace tandem::rt

namespace tandem::rt {

double prediction_recall(const Trace& t, bool residual) {
  const std::vector<float>& p = residual ? t.residual_pred : t.gate_pred;
  if (!(residual ? t.has_residual_pred : t.has_gate_pred) || t.n_layers < 2 || t.size() == 0)
    return -1;
  const int E = t.n_experts, K = t.top_k, L = t.n_layers;
  std::vector<int> order(static_cast<size_t>(E));
  int64_t found = 0, total = 0;
  for (int64_t r = 0; r < t.size(); ++r) {
    for (int l = 0; l + 1 < L; ++l) {
      const float* s = p.data() + (r * L + l) * E;
      for (int e = 0; e < E; ++e) order[size_t(e)] = e;
      std::partial_sort(order.begin(), order.begin() + K, order.end(),
                        [s](int a, int b) { return s[a] > s[b] || (s[a] == s[b] && a < b); });
      const int32_t* next = t.ids_at(r, l + 1);
      for (int j = 0; j < K; ++j) found += std::find(next, next + K, order[size_t(j)]) != next + K;
      total += K;
    }
  }
  return double(found) / double(total);
}

}  // namespace tandem::rt
