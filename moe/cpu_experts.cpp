#include "moe/cpu_experts.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>

#include "core/error.h"
#include "core/log.h"
#include "core/mapped_file.h"
#include "core/progress.h"
#include "core/thread_pool.h"
#include "formats/gguf.h"
#include "formats/output_file.h"
#include "ops/cpu/packed.h"
#include "ops/cpu/q0_x4.h"
#include "ops/cpu/q4k_x16.h"
#include "ops/cpu/q6k_x16.h"

namespace tandem {

namespace fs = std::filesystem;
using kern::KMatrix;
using kern::WFormat;

namespace {

constexpr char kMagic[8] = {'T', 'D', 'M', 'X', 'P', 'A', 'K', '1'};
constexpr uint32_t kVersion = 1;  // (format ids are in the header: BF16-tile caches differ by it)
constexpr uint64_t kAlign = 4096;  // header size and data alignment (a page: mmap-friendly)

struct CacheHeader {
  char magic[8];
  uint32_t version;
  uint32_t format;  // WFormat
  uint32_t group;
  uint32_t reserved;
  uint64_t n_matrices;
  uint64_t fingerprint;
  uint64_t file_bytes;
  uint64_t table_offset;
  uint64_t table_hash;  // FNV-1a of the table bytes
};

struct CacheEntry {
  uint32_t layer, expert, which, reserved;  // which: 0 gate, 1 up, 2 down
  int64_t rows, cols;
  uint64_t offset, bytes;
};

// The expert matrices in cache order: layer, expert, gate / up / down.
struct Source {
  uint32_t layer, expert, which;
  const ops::Weight* w;
};

uint64_t fnv1a(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

template <typename T>
uint64_t mix(uint64_t h, const T& v) {
  return fnv1a(&v, sizeof(v), h);
}

uint64_t align_up(uint64_t v) {
  return (v + kAlign - 1) / kAlign * kAlign;
}

WFormat parse_format(const std::string& f) {
  if (f == "int8") return WFormat::kInt8;
  if (f == "int4") return WFormat::kInt4;
  if (f == "bf16") return WFormat::kBF16Tile;
  if (f == "repack") {
    fail(ErrorKind::kInvalidArgument,
         "--cpu-experts repack rearranges the stored experts at load (no requantization): it "
         "writes no cache and needs no conversion");
  }
  fail(ErrorKind::kInvalidArgument,
       "--cpu-experts '{}': expected native, repack, int8, int4 or bf16", f);
}

// int8 / int4 groups: one of 32, 64, 128 (bf16 has none).
int checked_group(WFormat f, int group) {
  if (f == WFormat::kBF16Tile) return 0;
  if (group != 32 && group != 64 && group != 128) {
    fail(ErrorKind::kInvalidArgument, "--expert-group {}: expected 32, 64 or 128", group);
  }
  return group;
}

std::vector<Source> sources_of(const LoadedModel& model) {
  std::vector<Source> s;
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const ExpertWeights& e = model.layers[l].experts;
    if (!model.layers[l].moe) continue;
    for (size_t x = 0; x < e.gate.size(); ++x) {
      const auto L = static_cast<uint32_t>(l), X = static_cast<uint32_t>(x);
      s.push_back({L, X, 0, &e.gate[x]});
      s.push_back({L, X, 1, &e.up[x]});
      s.push_back({L, X, 2, &e.down[x]});
    }
  }
  return s;
}

// The files the model's bytes come from: the GGUF, or an HF directory's safetensors + config.
std::vector<fs::path> source_files(const LoadedModel& model) {
  std::vector<fs::path> files;
  std::error_code ec;
  if (fs::is_directory(model.path, ec)) {
    for (const auto& entry : fs::directory_iterator(model.path, ec)) {
      const fs::path& p = entry.path();
      if (p.extension() == ".safetensors" || p.filename() == "config.json") files.push_back(p);
    }
    std::sort(files.begin(), files.end());
  } else if (model.gguf) {
    files = model.gguf->shard_paths();  // (a split GGUF: every shard)
  } else {
    files.push_back(model.path);
  }
  return files;
}

uint64_t fingerprint(const LoadedModel& model, const std::vector<Source>& src, WFormat f,
                     int group) {
  uint64_t h = mix(mix(mix(0xcbf29ce484222325ull, kVersion), static_cast<uint32_t>(f)), group);
  for (const fs::path& p : source_files(model)) {
    std::error_code ec;
    const auto size = static_cast<uint64_t>(fs::file_size(p, ec));
    const auto mtime = fs::last_write_time(p, ec).time_since_epoch().count();
    const std::string name = p.filename().string();
    h = fnv1a(name.data(), name.size(), h);
    h = mix(mix(h, size), static_cast<int64_t>(mtime));
  }
  for (const Source& s : src) {
    h = mix(mix(mix(h, s.w->rows()), s.w->cols()), static_cast<int>(s.w->t.dtype));
    h = mix(h, s.w->scale_inv != nullptr);
  }
  return h;
}

std::string cache_name(const LoadedModel& model, WFormat f, int group) {
  fs::path p = model.path;
  if (!p.has_filename()) p = p.parent_path();  // "dir/" -> "dir"
  if (f == WFormat::kBF16Tile) return fmt::format("{}.tandem-bf16.bin", p.filename().string());
  return fmt::format("{}.tandem-{}-g{}.bin", p.filename().string(), kern::wformat_name(f), group);
}

fs::path user_cache_dir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0') {
    return fs::path(x) / "tandem";
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return fs::path(home) / ".cache" / "tandem";
  }
  return fs::temp_directory_path() / "tandem-cache";
}

// Checks a cache file against what this model and format expect; "" when valid, else why not.
std::string validate(const MappedFile& file, const std::vector<Source>& src, WFormat f, int group,
                     uint64_t fp, std::vector<CacheEntry>* entries) {
  if (file.size() < kAlign) return fmt::format("{} bytes, shorter than the header", file.size());
  CacheHeader h;
  std::memcpy(&h, file.data(), sizeof(h));
  if (std::memcmp(h.magic, kMagic, sizeof(kMagic)) != 0) return "not a tandem expert cache (magic)";
  if (h.version != kVersion) return fmt::format("version {}, expected {}", h.version, kVersion);
  if (h.format != static_cast<uint32_t>(f) || h.group != static_cast<uint32_t>(group)) {
    return "written for another format or group";
  }
  if (h.fingerprint != fp) return "the model changed since it was written (fingerprint)";
  if (h.file_bytes != file.size()) {
    return fmt::format("{} bytes, the header says {} (truncated?)", file.size(), h.file_bytes);
  }
  if (h.n_matrices != src.size()) return "wrong number of matrices";
  const uint64_t table_bytes = h.n_matrices * sizeof(CacheEntry);
  if (h.table_offset < sizeof(CacheHeader) || h.table_offset > file.size() ||
      table_bytes > file.size() - h.table_offset) {
    return "matrix table outside the file";
  }
  if (fnv1a(file.data() + h.table_offset, table_bytes) != h.table_hash) {
    return "matrix table corrupt (hash)";
  }
  entries->resize(src.size());
  std::memcpy(entries->data(), file.data() + h.table_offset, table_bytes);
  for (size_t i = 0; i < src.size(); ++i) {
    const CacheEntry& e = (*entries)[i];
    const Source& s = src[i];
    if (e.layer != s.layer || e.expert != s.expert || e.which != s.which ||
        e.rows != s.w->rows() || e.cols != s.w->cols() ||
        e.bytes != kern::packed_bytes(f, e.rows, e.cols, group) || e.offset % kAlign != 0 ||
        e.offset > file.size() || e.bytes > file.size() - e.offset) {
      return fmt::format("matrix {} (layer {} expert {}) does not match", i, s.layer, s.expert);
    }
  }
  return "";
}

void fill_result(CpuExperts* out, const LoadedModel& model, const std::vector<Source>& src,
                 std::vector<KMatrix> mats) {
  out->gate.assign(model.layers.size(), {});
  out->up.assign(model.layers.size(), {});
  out->down.assign(model.layers.size(), {});
  for (size_t i = 0; i < src.size(); ++i) {
    auto& dst = src[i].which == 0 ? out->gate : src[i].which == 1 ? out->up : out->down;
    auto& layer = dst[src[i].layer];
    if (layer.size() <= src[i].expert) layer.resize(src[i].expert + 1);
    out->bytes += mats[i].bytes();
    layer[src[i].expert] = std::move(mats[i]);
  }
}

// Packs every matrix into a new file (written beside, then renamed into place). Returns false
// (with a log line) when the file cannot be written; the caller then packs in memory.
bool write_cache(const fs::path& link, const std::vector<Source>& src, WFormat f, int group,
                 uint64_t fp, ThreadPool* pool) {
  std::vector<CacheEntry> table(src.size());
  uint64_t offset = align_up(kAlign + src.size() * sizeof(CacheEntry));
  uint64_t payload = 0;
  for (size_t i = 0; i < src.size(); ++i) {
    CacheEntry& e = table[i];
    e = CacheEntry{src[i].layer, src[i].expert, src[i].which, 0, src[i].w->rows(),
                   src[i].w->cols(), offset, kern::packed_bytes(f, src[i].w->rows(),
                                                                src[i].w->cols(), group)};
    offset = align_up(offset + e.bytes);
    payload += e.bytes;
  }
  const uint64_t total = offset;
  fs::path path;  // a symlink is written through; a device or FIFO is never renamed over
  try {
    path = resolve_output_path(link);
  } catch (const Error& e) {
    log_warn("{}; packing in memory", e.what());
    return false;
  }
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  const fs::path tmp = path.string() + fmt::format(".tmp-{}", ::getpid());
  const int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    log_warn("{}: cannot write the expert cache ({}); packing in memory", tmp.string(),
             std::strerror(errno));
    return false;
  }
  // Blocks reserved up front: a full disk is an error here rather than a SIGBUS on a store into
  // the mapping. (posix_fallocate returns the error instead of setting errno.)
  void* map = MAP_FAILED;
  if (const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(total)); err == 0) {
    map = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  } else {
    errno = err;
  }
  if (map == MAP_FAILED) {
    log_warn("{}: cannot size / map {} bytes ({}); packing in memory", tmp.string(), total,
             std::strerror(errno));
    ::close(fd);
    fs::remove(tmp, ec);
    return false;
  }
  auto* base = static_cast<uint8_t*>(map);
  try {
    Progress progress(fmt::format("repacking experts to {}", kern::wformat_name(f)), payload);
    for (size_t i = 0; i < src.size(); ++i) {
      kern::pack_weight_into(*src[i].w, f, group, base + table[i].offset, pool);
      progress.add(table[i].bytes);
    }
    progress.finish();
  } catch (...) {
    ::munmap(map, total);
    ::close(fd);
    fs::remove(tmp, ec);
    throw;
  }
  std::memcpy(base + kAlign, table.data(), table.size() * sizeof(CacheEntry));
  CacheHeader h{};
  std::memcpy(h.magic, kMagic, sizeof(kMagic));
  h.version = kVersion;
  h.format = static_cast<uint32_t>(f);
  h.group = static_cast<uint32_t>(group);
  h.n_matrices = src.size();
  h.fingerprint = fp;
  h.file_bytes = total;
  h.table_offset = kAlign;
  h.table_hash = fnv1a(base + kAlign, table.size() * sizeof(CacheEntry));
  std::memcpy(base, &h, sizeof(h));
  const bool ok = ::msync(map, total, MS_SYNC) == 0;
  ::munmap(map, total);
  ::close(fd);
  if (!ok) {
    log_warn("{}: writing the expert cache failed ({}); packing in memory", tmp.string(),
             std::strerror(errno));
    fs::remove(tmp, ec);
    return false;
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    log_warn("{}: cannot rename the expert cache into place ({}); packing in memory",
             path.string(), ec.message());
    fs::remove(tmp, ec);
    return false;
  }
  return true;
}

bool map_cache(const fs::path& path, const std::vector<Source>& src, WFormat f, int group,
               uint64_t fp, LoadMode mode, std::vector<KMatrix>* mats, std::string* why) {
  std::shared_ptr<MappedFile> file;
  try {
    file = std::make_shared<MappedFile>(MappedFile::open(path, mode));
  } catch (const Error& e) {
    *why = e.what();
    return false;
  }
  std::vector<CacheEntry> entries;
  *why = validate(*file, src, f, group, fp, &entries);
  if (!why->empty()) return false;
  std::shared_ptr<const void> owner = file;
  mats->clear();
  for (const CacheEntry& e : entries) {
    mats->push_back(kern::packed_view(f, e.rows, e.cols, group, file->data() + e.offset, owner));
  }
  return true;
}

}  // namespace

void split_cpu_experts(CpuExperts* ce, const std::vector<int>& nodes,
                       const std::vector<int>& os_node, ThreadPool* pool) {
  TD_CHECK(nodes.size() == os_node.size() && !nodes.empty(), "split_cpu_experts: bad node lists");
  const int64_t P = static_cast<int64_t>(nodes.size());
  ce->part_node = nodes;
  ce->parts.assign(ce->gate.size(), {});
  if (P == 1) return;
  std::vector<std::pair<size_t, size_t>> items;  // (layer, expert)
  for (size_t l = 0; l < ce->gate.size(); ++l) {
    ce->parts[l].resize(ce->gate[l].size());
    for (size_t e = 0; e < ce->gate[l].size(); ++e) items.emplace_back(l, e);
  }
  auto split_one = [&](size_t i) {
    const auto [l, e] = items[i];
    const KMatrix& g = ce->gate[l][e];
    const KMatrix& u = ce->up[l][e];
    const KMatrix& d = ce->down[l][e];
    if (!g.valid() || !u.valid() || !d.valid() || g.format != u.format || g.group != u.group) {
      return;  // the reference path computes it whole
    }
    const int64_t ff = g.rows;
    const int64_t a = std::lcm(std::lcm(kern::row_align(g), kern::row_align(u)), kern::col_align(d));
    std::vector<ExpertPart> parts;
    for (int64_t p = 0; p < P; ++p) {
      const int64_t f0 = ff * p / P / a * a;
      const int64_t f1 = p + 1 == P ? ff : ff * (p + 1) / P / a * a;
      ExpertPart part;
      part.f0 = f0;
      part.f1 = f1;
      // An empty part keeps the formats (the backend reads the activation encoding there).
      part.gate.format = part.up.format = g.format;
      part.down.format = d.format;
      part.gate.group = part.up.group = g.group;
      part.down.group = d.group;
      if (f1 > f0) {
        AllocOptions alloc;
        alloc.numa_node = os_node[static_cast<size_t>(p)];
        part.gate = kern::copy_submatrix(g, f0, f1, 0, g.cols, alloc);
        part.up = kern::copy_submatrix(u, f0, f1, 0, u.cols, alloc);
        part.down = kern::copy_submatrix(d, 0, d.rows, f0, f1, alloc);
      }
      parts.push_back(std::move(part));
    }
    ce->parts[l][e] = std::move(parts);
  };
  if (pool != nullptr) {
    pool->run(items.size(), split_one);
  } else {
    for (size_t i = 0; i < items.size(); ++i) split_one(i);
  }
  log_info("experts split into {} NUMA parts (tensor parallelism)", P);
}

namespace {

// --cpu-experts repack: the given matrices (routed experts, shared experts, the others the model
// multiplies by) copied into one huge-page arena (4 KiB-aligned matrices: no 2 MiB rounding per
// matrix), the Q4_K and Q6_K ones rearranged into x16 tiles (ops/cpu/q4k_x16.h, q6k_x16.h) where
// the CPU has AVX-512 VNNI, the Q5_0 / Q8_0 ones into x4 rows (ops/cpu/q0_x4.h) where it has VBMI
// and BITALG too (their kernels; elsewhere they would only be unpacked again), the rest as
// stored. Experts without a kernel stay invalid views (the reference path reads the stored
// weight). Same values, same bits: nothing is requantized.
std::vector<KMatrix> repack_experts(const std::vector<Source>& src, ThreadPool* pool,
                                    std::vector<int64_t>* tiled) {
  enum class Kind { kNone, kCopy, kX16, kX4 };
  const bool x16 = best_isa() >= Isa::kAvx512Vnni, x4 = kern::q0_x4_native();
  std::vector<KMatrix> view(src.size());
  std::vector<Kind> kind(src.size(), Kind::kNone);
  std::vector<uint64_t> offset(src.size() + 1, 0);
  for (size_t i = 0; i < src.size(); ++i) {
    KMatrix& m = view[i];
    uint64_t bytes = 0;
    if (kern::view_weight(*src[i].w, &m)) {
      WFormat x4_format;
      const bool k_x16 = m.format == WFormat::kQ4_K || m.format == WFormat::kQ6_K;
      kind[i] = x16 && k_x16 && m.cols % kQK_K == 0                  ? Kind::kX16
                : x4 && kern::q0_x4_format(m.format, &x4_format) ? Kind::kX4
                                                                 : Kind::kCopy;
      // (x16: whole tiles of 16 rows, a tile the bytes of its 16 GGUF rows)
      bytes = kind[i] == Kind::kX16
                  ? static_cast<uint64_t>((m.rows + kern::kQ4KX16Rows - 1) / kern::kQ4KX16Rows *
                                          kern::kQ4KX16Rows * m.row_bytes)
                  : static_cast<uint64_t>(m.rows * m.row_bytes);
    } else {
      m = KMatrix{};
      m.rows = src[i].w->rows();
      m.cols = src[i].w->cols();
      m.row_bytes = static_cast<int64_t>(src[i].w->t.row_bytes());
    }
    offset[i + 1] = align_up(offset[i] + bytes);
  }
  AllocOptions a;
  a.huge_pages = true;
  auto arena = std::make_shared<AlignedBuffer>(std::max<uint64_t>(offset.back(), 1), a);
  Progress progress("repacking", offset.back());
  std::vector<KMatrix> mats(src.size());
  auto one = [&](size_t i) {
    KMatrix m = view[i];
    uint8_t* dst = arena->as<uint8_t>() + offset[i];
    if (kind[i] == Kind::kX16 && m.format == WFormat::kQ6_K) {
      kern::q6k_x16_repack(m.data, m.row_bytes, m.rows, m.cols, dst);
      m.format = WFormat::kQ6_KX16;
    } else if (kind[i] == Kind::kX16) {
      kern::q4k_x16_repack(m.data, m.row_bytes, m.rows, m.cols, dst);
      m.format = WFormat::kQ4_KX16;
    } else if (kind[i] == Kind::kX4) {
      for (int64_t r = 0; r < m.rows; ++r) {
        kern::q0_x4_repack_row(m.format, m.data + r * m.row_bytes, m.cols / kQK,
                               dst + r * m.row_bytes);
      }
      kern::q0_x4_format(m.format, &m.format);
    } else if (kind[i] == Kind::kCopy) {
      std::memcpy(dst, m.data, static_cast<size_t>(m.rows * m.row_bytes));
    }
    if (kind[i] != Kind::kNone) {
      m.data = dst;
      m.owner = arena;  // (FP8 block scales stay in the model, which outlives the experts)
    }
    mats[i] = std::move(m);
    progress.add(offset[i + 1] - offset[i]);
  };
  if (pool != nullptr) {
    pool->run(src.size(), one);
  } else {
    for (size_t i = 0; i < src.size(); ++i) one(i);
  }
  progress.finish();
  tiled->assign(src.size(), 0);  // per source: 1 where it went into x16 tiles, 2 into x4 rows
  for (size_t i = 0; i < src.size(); ++i) {
    (*tiled)[i] = kind[i] == Kind::kX16 ? 1 : kind[i] == Kind::kX4 ? 2 : 0;
  }
  return mats;
}

}  // namespace

namespace {

// prepare_layer_experts, its requantizing progress counted on `progress` (nullptr: its own bar).
LayerExperts prepare_layer(const ExpertWeights& experts, const std::string& format, int group,
                           ThreadPool* pool, Progress* progress) {
  TD_CHECK(experts.up.size() == experts.gate.size() && experts.down.size() == experts.gate.size());
  LayerExperts out;
  std::vector<Source> src;
  for (size_t x = 0; x < experts.gate.size(); ++x) {
    const auto X = static_cast<uint32_t>(x);
    src.push_back({0, X, 0, &experts.gate[x]});
    src.push_back({0, X, 1, &experts.up[x]});
    src.push_back({0, X, 2, &experts.down[x]});
  }
  std::vector<KMatrix> mats;
  if (format == "native") {
    for (const Source& s : src) {
      KMatrix m;
      if (!kern::view_weight(*s.w, &m)) {
        m = KMatrix{};
        m.rows = s.w->rows();
        m.cols = s.w->cols();
        m.row_bytes = static_cast<int64_t>(s.w->t.row_bytes());
      }
      mats.push_back(std::move(m));
    }
  } else if (format == "repack") {
    std::vector<int64_t> tiled;
    mats = repack_experts(src, pool, &tiled);
  } else {
    const WFormat f = parse_format(format);
    group = checked_group(f, group);
    for (const Source& s : src) {
      if (f != WFormat::kBF16Tile && s.w->cols() % group != 0) {
        fail(ErrorKind::kUnsupported,
             "expert {}: {} rows of {} values are not a multiple of the quantization group {} "
             "(try a smaller group)", s.expert, s.which == 0 ? "gate" : s.which == 1 ? "up" : "down",
             s.w->cols(), group);
      }
    }
    std::optional<Progress> own;
    if (progress == nullptr) {
      uint64_t payload = 0;
      for (const Source& s : src) payload += kern::packed_bytes(f, s.w->rows(), s.w->cols(), group);
      progress = &own.emplace(fmt::format("repacking experts to {}", kern::wformat_name(f)), payload);
    }
    for (const Source& s : src) {
      mats.push_back(kern::pack_weight(*s.w, f, group, pool));
      progress->add(kern::packed_bytes(f, s.w->rows(), s.w->cols(), group));
    }
    if (own) own->finish();
  }
  for (size_t i = 0; i < src.size(); ++i) {
    auto& dst = src[i].which == 0 ? out.gate : src[i].which == 1 ? out.up : out.down;
    out.bytes += mats[i].bytes();
    dst.push_back(std::move(mats[i]));
  }
  return out;
}

}  // namespace

fs::path cpu_expert_cache_path(const LoadedModel& model, const CpuExpertOptions& options) {
  const WFormat f = parse_format(options.format);
  if (!options.cache_file.empty()) return options.cache_file;
  const std::string name = cache_name(model, f, options.group);
  if (!options.cache_dir.empty()) return options.cache_dir / name;
  fs::path dir = model.path;
  if (!dir.has_filename()) dir = dir.parent_path();
  dir = dir.parent_path();
  if (dir.empty()) dir = ".";
  if (::access(dir.c_str(), W_OK) == 0) return dir / name;
  return user_cache_dir() / name;
}

namespace {

// Every MoE layer through prepare_layer; requantizing, one progress bar counts all layers.
void prepare_by_layer(CpuExperts* out, const LoadedModel& model, const CpuExpertOptions& options,
                      const std::vector<Source>& src, ThreadPool* pool) {
  std::optional<Progress> progress;
  if (options.format != "native") {
    const WFormat f = parse_format(options.format);
    const int g = checked_group(f, options.group);
    uint64_t payload = 0;
    for (const Source& s : src) payload += kern::packed_bytes(f, s.w->rows(), s.w->cols(), g);
    progress.emplace(fmt::format("repacking experts to {}", kern::wformat_name(f)), payload);
  }
  out->gate.assign(model.layers.size(), {});
  out->up.assign(model.layers.size(), {});
  out->down.assign(model.layers.size(), {});
  for (size_t l = 0; l < model.layers.size(); ++l) {
    if (!model.layers[l].moe) continue;
    LayerExperts le = prepare_layer(model.layers[l].experts, options.format, options.group, pool,
                                    progress ? &*progress : nullptr);
    out->gate[l] = std::move(le.gate);
    out->up[l] = std::move(le.up);
    out->down[l] = std::move(le.down);
    out->bytes += le.bytes;
  }
  if (progress) progress->finish();
}

// repack: the matrices that go into the arena after the routed experts.
struct RepackExtras {
  std::vector<Source> shared;  // the MoE layers' shared experts (the fused operator runs them)
  std::vector<Source> rest;    // every other matrix read through kern::matmul
};

RepackExtras repack_extras(const LoadedModel& model) {
  RepackExtras x;
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const LayerWeights& lw = model.layers[l];
    const auto L = static_cast<uint32_t>(l);
    if (lw.moe && !lw.sh_gate.empty()) {
      x.shared.push_back({L, 0, 0, &lw.sh_gate});
      x.shared.push_back({L, 0, 1, &lw.sh_up});
      x.shared.push_back({L, 0, 2, &lw.sh_down});
    }
    auto add = [&](const ops::Weight& w) {
      if (!w.empty()) x.rest.push_back({L, 0, 0, &w});
    };
    for (const ops::Weight* w : {&lw.wq, &lw.wk, &lw.wv, &lw.wo, &lw.wq_a, &lw.wq_b, &lw.wkv_a,
                                 &lw.ffn_gate, &lw.ffn_up, &lw.ffn_down, &lw.router}) {
      add(*w);
    }
    // Every k_up too: GGUF's transposed k_b [kv_lora, qk_nope] is read through kern::matmul
    // in absorbed MLA (naive MLA reads it from the file with ops::matmul_transposed). Left out,
    // the absorbed k_b (27 x 16 heads of 40 KiB Q5_0 in V2-Lite) would be read from the
    // released file mapping every token.
    for (const ops::Weight& w : lw.k_up) add(w);
    for (const ops::Weight& w : lw.v_up) add(w);
  }
  if (!model.lm_head.empty()) {
    x.rest.push_back({static_cast<uint32_t>(model.layers.size()), 0, 0, &model.lm_head});
  }
  return x;
}

// The repacked shared experts into out->shared_* (and out->other, the model's path in hybrid
// runs), the repacked other matrices with a kernel into out->other.
void place_repack_extras(CpuExperts* out, const LoadedModel& model, const RepackExtras& x,
                         std::vector<KMatrix> sm, std::vector<KMatrix> rm) {
  out->shared_gate.assign(model.layers.size(), {});
  out->shared_up.assign(model.layers.size(), {});
  out->shared_down.assign(model.layers.size(), {});
  for (size_t i = 0; i < x.shared.size(); ++i) {
    auto& dst = x.shared[i].which == 0   ? out->shared_gate
                : x.shared[i].which == 1 ? out->shared_up
                                         : out->shared_down;
    out->bytes += sm[i].bytes();
    if (sm[i].valid()) out->other[x.shared[i].w] = sm[i];  // the model's path (hybrid runs)
    dst[x.shared[i].layer] = std::move(sm[i]);
  }
  for (size_t i = 0; i < x.rest.size(); ++i) {
    if (!rm[i].valid()) continue;  // no kernel for its dtype: read where it is
    out->bytes += rm[i].bytes();
    out->other[x.rest[i].w] = std::move(rm[i]);
  }
}

// How many routed, shared and other matrices went into x16 tiles (tiled 1) and x4 rows (2).
void log_repacked(const std::vector<int64_t>& tiled, size_t n_routed, size_t n_shared,
                  size_t n_rest, uint64_t bytes) {
  auto count = [&](size_t b, size_t e, int64_t kind) {
    return std::count(tiled.begin() + static_cast<std::ptrdiff_t>(b),
                      tiled.begin() + static_cast<std::ptrdiff_t>(e), kind);
  };
  const size_t routed[2] = {0, n_routed}, shared_r[2] = {n_routed, n_routed + n_shared},
               rest_r[2] = {n_routed + n_shared, n_routed + n_shared + n_rest};
  log_info(
      "{} of {} routed, {} of {} shared expert and {} of {} other matrices in Q4_K / "
      "Q6_K x16 tiles; {} / {} / {} in Q5_0 / Q8_0 x4 rows; the rest as stored ({:.2f} GiB)",
      count(routed[0], routed[1], 1), n_routed, count(shared_r[0], shared_r[1], 1), n_shared,
      count(rest_r[0], rest_r[1], 1), n_rest, count(routed[0], routed[1], 2),
      count(shared_r[0], shared_r[1], 2), count(rest_r[0], rest_r[1], 2), bytes / 1073741824.0);
}

// repack: one arena for the routed experts, then the MoE layers' shared experts (the fused
// operator runs them with the routed ones), then every other matrix the model reads through
// kern::matmul (ModelOptions::views).
void prepare_repacked(CpuExperts* out, const LoadedModel& model, const std::vector<Source>& src,
                      ThreadPool* pool) {
  const RepackExtras x = repack_extras(model);
  std::vector<Source> all = src;
  all.insert(all.end(), x.shared.begin(), x.shared.end());
  all.insert(all.end(), x.rest.begin(), x.rest.end());
  std::vector<int64_t> tiled;
  std::vector<KMatrix> mats = repack_experts(all, pool, &tiled);
  std::vector<KMatrix> sm(std::make_move_iterator(mats.begin() + src.size()),
                          std::make_move_iterator(mats.begin() + src.size() + x.shared.size()));
  std::vector<KMatrix> rm(std::make_move_iterator(mats.begin() + src.size() + x.shared.size()),
                          std::make_move_iterator(mats.end()));
  mats.resize(src.size());
  fill_result(out, model, src, std::move(mats));
  place_repack_extras(out, model, x, std::move(sm), std::move(rm));
  log_repacked(tiled, src.size(), x.shared.size(), x.rest.size(), out->bytes);
}

// int8 / int4: every expert's rows must be whole quantization groups.
void check_expert_groups(const LoadedModel& model, const std::vector<Source>& src, WFormat f,
                         int group) {
  for (const Source& s : src) {
    if (f != WFormat::kBF16Tile && s.w->cols() % group != 0) {
      fail(ErrorKind::kUnsupported,
           "{}: layer {} expert {}: {} rows of {} values are not a multiple of --expert-group {} "
           "(try a smaller group)", model.path.string(), s.layer, s.expert,
           s.which == 0 ? "gate" : s.which == 1 ? "up" : "down", s.w->cols(), group);
    }
  }
}

// The requantized experts from the cache file: mapped when it is valid, else packed, written and
// mapped. false (out->cache_path cleared) when neither works: the caller packs in memory.
bool prepare_from_cache(CpuExperts* out, const LoadedModel& model, const CpuExpertOptions& options,
                        const std::vector<Source>& src, WFormat f, int group, ThreadPool* pool) {
  std::vector<KMatrix> mats;
  const uint64_t fp = fingerprint(model, src, f, group);
  const fs::path path = cpu_expert_cache_path(model, options);
  out->cache_path = path;
  std::error_code ec;
  if (fs::exists(path, ec)) {
    std::string why;
    if (map_cache(path, src, f, group, fp, options.cache_load, &mats, &why)) {
      out->from_cache = true;
      log_info("{} experts mapped from {}", options.format, path.string());
      fill_result(out, model, src, std::move(mats));
      return true;
    }
    log_warn("{}: stale or corrupt expert cache ({}); repacking", path.string(), why);
  }
  if (write_cache(path, src, f, group, fp, pool)) {
    std::string why;
    if (map_cache(path, src, f, group, fp, options.cache_load, &mats, &why)) {
      out->cache_written = true;
      log_info("{} experts packed and cached in {}", options.format, path.string());
      fill_result(out, model, src, std::move(mats));
      return true;
    }
    log_warn("{}: the cache just written does not read back ({}); packing in memory", path.string(),
             why);
  }
  out->cache_path.clear();
  return false;
}

}  // namespace

CpuExperts prepare_cpu_experts(const LoadedModel& model, const CpuExpertOptions& options,
                               ThreadPool* pool) {
  CpuExperts out;
  out.format = options.format;
  const std::vector<Source> src = sources_of(model);
  if (options.format == "native") {
    prepare_by_layer(&out, model, options, src, pool);
    return out;
  }
  if (options.format == "repack") {
    prepare_repacked(&out, model, src, pool);
    return out;
  }
  const WFormat f = parse_format(options.format);
  const int group = checked_group(f, options.group);
  check_expert_groups(model, src, f, group);
  if (options.use_cache && prepare_from_cache(&out, model, options, src, f, group, pool)) {
    return out;
  }
  // Without a usable cache file: every layer through prepare_layer_experts.
  prepare_by_layer(&out, model, options, src, pool);
  return out;
}

LayerExperts prepare_layer_experts(const ExpertWeights& experts, const std::string& format,
                                   int group, ThreadPool* pool) {
  return prepare_layer(experts, format, group, pool, nullptr);
}

}  // namespace tandem
