#include "model/kv_cache.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/fp_convert.h"
#include "core/topology.h"
#include "ops/cpu/ref_ops.h"

namespace tandem {

KvType parse_kv_type(const std::string& name) {
  if (name == "f32") return KvType::kF32;
  if (name == "bf16") return KvType::kBf16;
  if (name == "f16") return KvType::kF16;
  if (name == "q8_0") return KvType::kQ8_0;
  fail(ErrorKind::kInvalidArgument,
       "--cache-type must be 'f32', 'bf16', 'f16' or 'q8_0', got '{}'", name);
}

const char* kv_type_name(KvType type) {
  switch (type) {
    case KvType::kF32: return "f32";
    case KvType::kBf16: return "bf16";
    case KvType::kF16: return "f16";
    case KvType::kQ8_0: return "q8_0";
  }
  return "?";
}

namespace {

// Elements of one cached row of d values (bytes for Q8_0, whose rows are q8_row_bytes).
int64_t row_elems(KvType type, int64_t d) {
  return type == KvType::kQ8_0 ? ops::q8_row_bytes(d) : d;
}
int64_t elem_bytes(KvType type) {
  return type == KvType::kF32 ? 4 : type == KvType::kQ8_0 ? 1 : 2;
}

}  // namespace

KvCache::KvCache(const KvLayout& layout, const KvCacheOptions& options)
    : layout_(layout), options_(options) {
  const KvLayout& l = layout_;
  if (l.layers <= 0 || l.k_heads <= 0 || l.k_dim <= 0 || l.v_heads < 0 || l.v_dim <= 0 ||
      (l.v_heads == 0 && (l.k_heads != 1 || l.v_dim > l.k_dim)) || l.state_layers < 0 ||
      l.state_floats < 0 || (l.state_layers > 0) != (l.state_floats > 0) ||
      l.state_floats > (int64_t{1} << 32) || l.index_layers < 0 || l.index_dim < 0 ||
      (l.index_layers > 0) != (l.index_dim > 0) || l.index_layers > l.layers) {
    fail(ErrorKind::kInvalidArgument,
         "KV cache: a bad layout ({} layers, {} x {} key values, {} x {} values per position)",
         l.layers, l.k_heads, l.k_dim, l.v_heads, l.v_dim);
  }
  block_ = options.block_positions;
  if (block_ <= 0 || (block_ & (block_ - 1)) != 0 || block_ % ops::kKvBlockAlign != 0 ||
      block_ > (int64_t{1} << 20)) {
    fail(ErrorKind::kInvalidArgument,
         "KV cache: positions per block must be a power of two, a multiple of {} and at most "
         "2^20, got {}",
         ops::kKvBlockAlign, block_);
  }
  if (options.positions <= 0) {
    fail(ErrorKind::kInvalidArgument, "KV cache: the pool needs a positive number of positions, "
         "got {}", options.positions);
  }
  if (options.max_sequence_positions < 0) {
    fail(ErrorKind::kInvalidArgument, "KV cache: a negative context size {}",
         options.max_sequence_positions);
  }
  const KvType t = options.type;
  k_row_ = row_elems(t, l.k_dim);
  v_row_ = l.v_heads > 0 ? row_elems(t, l.v_dim) : 0;
  k_row_bytes_ = k_row_ * elem_bytes(t);
  v_row_bytes_ = v_row_ * elem_bytes(t);
  i_row_ = l.index_layers > 0 ? row_elems(t, l.index_dim) : 0;
  i_row_bytes_ = i_row_ * elem_bytes(t);
  k_block_bytes_ = static_cast<uint64_t>(l.k_heads * block_ * k_row_bytes_);
  v_block_bytes_ = static_cast<uint64_t>(l.v_heads * block_ * v_row_bytes_);
  i_block_bytes_ = static_cast<uint64_t>(block_ * i_row_bytes_);
  block_bytes_ = static_cast<uint64_t>(l.layers) * (k_block_bytes_ + v_block_bytes_) +
                 static_cast<uint64_t>(l.index_layers) * i_block_bytes_;
  // The pool's size before any arithmetic that could overflow: at most 2^31 - 1 blocks and 1 TiB.
  constexpr uint64_t kMaxBytes = uint64_t{1} << 40;
  const uint64_t blocks = (static_cast<uint64_t>(options.positions) + block_ - 1) / block_;
  // (An accelerator's pool: its allocator says what does not fit.)
  const uint64_t available = options.alloc ? 0 : meminfo_bytes("MemAvailable");  // 0: unknown
  const uint64_t limit = available > 0 ? std::min(available, kMaxBytes) : kMaxBytes;
  if (options.state_slots < 0 || options.state_slots > 65536 || options.checkpoint_interval < 0) {
    fail(ErrorKind::kInvalidArgument,
         "KV cache: {} state slots, a checkpoint every {} positions: out of range",
         options.state_slots, options.checkpoint_interval);
  }
  if (l.state_layers > 0) {
    n_slots_ = options.state_slots > 0 ? options.state_slots : 4;
    slot_bytes_ = (static_cast<uint64_t>(l.state_layers) * static_cast<uint64_t>(l.state_floats) *
                       4 + 63) / 64 * 64;
  }
  const uint64_t state = slot_bytes_ * static_cast<uint64_t>(n_slots_);
  if (blocks > static_cast<uint64_t>(INT32_MAX) || state > limit ||
      blocks > (limit - state) / block_bytes_) {
    fail(ErrorKind::kResource,
         "a KV cache of {} positions{} needs {:.1f} GiB, more than the {:.1f} GiB of memory "
         "available (lower the context size, --ctx{})",
         options.positions,
         n_slots_ > 0 ? fmt::format(" and {} recurrent states", n_slots_) : std::string(),
         (static_cast<double>(blocks) * static_cast<double>(block_bytes_) +
          static_cast<double>(state)) / 1073741824.0,
         static_cast<double>(limit) / 1073741824.0,
         n_slots_ > 0 ? ", or the checkpoints, --checkpoints" : "");
  }
  n_blocks_ = static_cast<int64_t>(blocks);
  state_base_ = (static_cast<uint64_t>(n_blocks_) * block_bytes_ + 4095) / 4096 * 4096;
  max_seq_ = options.max_sequence_positions > 0 ? options.max_sequence_positions : capacity();
  if (options.alloc) {
    TD_CHECK(options.release != nullptr, "KV cache: an alloc without a release");
    external_ = std::shared_ptr<void>(options.alloc(bytes()), options.release);
    base_ = static_cast<uint8_t*>(external_.get());
  } else {
    AllocOptions ao;
    ao.huge_pages = true;  // mmap: zero pages, taken as the positions are written
    pool_ = AlignedBuffer(static_cast<size_t>(bytes()), ao);
    base_ = pool_.as<uint8_t>();
  }
  refs_.assign(static_cast<size_t>(n_blocks_), 0);
  free_.resize(static_cast<size_t>(n_blocks_));
  // A stack popped from the back: block 0 first, so a lone sequence's blocks are in order.
  for (int64_t i = 0; i < n_blocks_; ++i) free_[static_cast<size_t>(i)] =
      static_cast<int32_t>(n_blocks_ - 1 - i);
  init_state();
}

uint64_t KvCache::position_bytes() const {
  return static_cast<uint64_t>(layout_.k_heads * k_row_bytes_ + layout_.v_heads * v_row_bytes_);
}

const KvCache::Seq& KvCache::seq_ref(SeqId seq) const {
  if (seq < 0 || static_cast<size_t>(seq) >= seqs_.size() || !seqs_[seq].live) {
    fail(ErrorKind::kInvalidArgument, "KV cache: no sequence {}", seq);
  }
  return seqs_[static_cast<size_t>(seq)];
}

KvCache::Seq& KvCache::seq_ref(SeqId seq) {
  return const_cast<Seq&>(static_cast<const KvCache*>(this)->seq_ref(seq));
}

SeqId KvCache::create() { return create_seq(true); }

SeqId KvCache::create_seq(bool zero_state) {
  int32_t slot = -1;
  if (has_state()) {
    slot = take_slot({});
    if (slot < 0) {
      fail(ErrorKind::kResource,
           "KV cache: all {} recurrent-state slots are held by live sequences (fewer sequences "
           "at once, or more slots)",
           n_slots_);
    }
    slots_[static_cast<size_t>(slot)].refs = 1;
    if (zero_state) zero_bytes(slot_address(slot), slot_bytes_);
  }
  size_t i = 0;
  while (i < seqs_.size() && seqs_[i].live) ++i;
  if (i == seqs_.size()) {
    if (seqs_.size() >= static_cast<size_t>(INT32_MAX)) {
      if (slot >= 0) unref_slot(slot);
      fail(ErrorKind::kResource, "KV cache: too many sequences");
    }
    seqs_.emplace_back();
  }
  seqs_[i] = Seq{};
  seqs_[i].live = true;
  seqs_[i].slot = slot;
  return static_cast<SeqId>(i);
}

SeqId KvCache::fork(SeqId src) {
  seq_ref(src);  // (checks it before create_seq() may move seqs_)
  const SeqId id = create_seq(false);  // (its state is the source's copy below)
  Seq& dst = seqs_[static_cast<size_t>(id)];
  const Seq& s = seqs_[static_cast<size_t>(src)];
  dst.length = s.length;
  dst.blocks = s.blocks;
  dst.tokens = s.tokens;
  for (int32_t b : dst.blocks) ++refs_[static_cast<size_t>(b)];
  if (has_state()) {
    copy_slot(dst.slot, s.slot);
    dst.checkpoints = s.checkpoints;
    for (int32_t c : dst.checkpoints) ++slots_[static_cast<size_t>(c)].refs;
  }
  return id;
}

void KvCache::drop_blocks(Seq& s, size_t keep) {
  for (size_t i = keep; i < s.blocks.size(); ++i) {
    const int32_t b = s.blocks[i];
    if (--refs_[static_cast<size_t>(b)] == 0) free_.push_back(b);
  }
  if (keep < s.blocks.size()) s.blocks.resize(keep);
}

int64_t KvCache::truncate(SeqId seq, int64_t length) {
  Seq& s = seq_ref(seq);
  if (length < 0) {
    fail(ErrorKind::kInvalidArgument, "KV cache: truncating sequence {} to {} positions", seq,
         length);
  }
  if (length >= s.length) return s.length;
  if (has_state()) {
    // The latest checkpoint at or before length, restored into the live state.
    drop_checkpoints_after(s, length);
    if (s.checkpoints.empty()) {
      length = 0;
      zero_bytes(slot_address(s.slot), slot_bytes_);
    } else {
      Slot& c = slots_[static_cast<size_t>(s.checkpoints.back())];
      length = c.pos;
      c.used = ++tick_;
      copy_slot(s.slot, s.checkpoints.back());
    }
  }
  s.length = length;
  s.tokens.resize(static_cast<size_t>(length));
  drop_blocks(s, static_cast<size_t>((length + block_ - 1) / block_));
  return length;
}

void KvCache::release(SeqId seq) {
  Seq& s = seq_ref(seq);
  drop_blocks(s, 0);
  if (has_state()) {
    for (int32_t c : s.checkpoints) unref_slot(c);
    unref_slot(s.slot);
  }
  s = Seq{};
}

bool KvCache::contains(SeqId seq) const {
  return seq >= 0 && static_cast<size_t>(seq) < seqs_.size() && seqs_[seq].live;
}

int64_t KvCache::length(SeqId seq) const { return seq_ref(seq).length; }

int64_t KvCache::positions_used() const {
  int64_t n = 0;
  for (const Seq& s : seqs_) n += s.live ? s.length : 0;
  return n;
}

std::span<const int32_t> KvCache::tokens(SeqId seq) const { return seq_ref(seq).tokens; }

KvCache::PrefixMatch KvCache::longest_prefix(std::span<const int32_t> tokens) const {
  PrefixMatch best;
  for (size_t i = 0; i < seqs_.size(); ++i) {
    const Seq& s = seqs_[i];
    if (!s.live) continue;
    const size_t n = std::min(s.tokens.size(), tokens.size());
    const size_t common =
        static_cast<size_t>(std::mismatch(s.tokens.begin(), s.tokens.begin() + n, tokens.begin())
                                .first -
                            s.tokens.begin());
    int64_t usable = static_cast<int64_t>(common);
    if (has_state() && usable < s.length) {
      // Where a fork of it resumes: its latest checkpoint within the match.
      usable = 0;
      for (int32_t c : s.checkpoints) {
        const int64_t pos = slots_[static_cast<size_t>(c)].pos;
        if (pos <= static_cast<int64_t>(common)) usable = pos;
      }
    }
    if (usable > best.length) {
      best.seq = static_cast<SeqId>(i);
      best.length = usable;
    }
  }
  return best;
}

int64_t KvCache::blocks_needed(std::span<const Write> writes) const {
  int64_t needed = 0;
  for (const Write& w : writes) {
    const Seq& s = seq_ref(w.seq);
    const int64_t n = static_cast<int64_t>(w.tokens.size());
    if (n == 0) continue;
    const int64_t first = w.pos0 / block_, last = (w.pos0 + n - 1) / block_;
    // The sequence's blocks after the truncation to pos0: the ones holding [0, pos0).
    const int64_t kept = std::min<int64_t>(static_cast<int64_t>(s.blocks.size()),
                                           (w.pos0 + block_ - 1) / block_);
    for (int64_t b = first; b <= last; ++b) {
      // A new block past the kept ones, or a copy of a kept one another sequence holds too.
      if (b >= kept || refs_[static_cast<size_t>(s.blocks[static_cast<size_t>(b)])] > 1) {
        ++needed;
      }
    }
  }
  return needed;
}

void KvCache::make_writable(std::span<const Write> writes) {
  for (size_t i = 0; i < writes.size(); ++i) {
    const Write& w = writes[i];
    const Seq& s = seq_ref(w.seq);
    for (size_t j = 0; j < i; ++j) {
      if (writes[j].seq == w.seq) {
        fail(ErrorKind::kInvalidArgument, "KV cache: sequence {} written twice in one batch",
             w.seq);
      }
    }
    const int64_t n = static_cast<int64_t>(w.tokens.size());
    if (w.pos0 < 0 || w.pos0 > s.length) {
      fail(ErrorKind::kOutOfRange,
           "KV cache: sequence {} has {} positions; tokens cannot go at position {}", w.seq,
           s.length, w.pos0);
    }
    if (n > max_seq_ - w.pos0) {
      fail(ErrorKind::kOutOfRange, "{} tokens at position {} exceed the context size {}", n,
           w.pos0, max_seq_);
    }
    if (has_state() && w.pos0 != s.length) {
      fail(ErrorKind::kInvalidArgument,
           "KV cache: sequence {} has a recurrent state at position {}: tokens cannot go at "
           "position {} (truncate it first: it resumes from a checkpoint)",
           w.seq, s.length, w.pos0);
    }
  }
  // Free blocks, and the ones the truncations to pos0 give back (held by that sequence alone).
  int64_t available = blocks_free();
  for (const Write& w : writes) {
    const Seq& s = seq_ref(w.seq);
    for (size_t b = static_cast<size_t>((w.pos0 + block_ - 1) / block_); b < s.blocks.size();
         ++b) {
      if (refs_[static_cast<size_t>(s.blocks[b])] == 1) ++available;
    }
  }
  const int64_t needed = blocks_needed(writes);
  if (needed > available) {
    fail(ErrorKind::kResource,
         "KV cache full: the batch needs {} more blocks of {} positions, {} of {} are free "
         "(a larger pool, or fewer sequences at once)",
         needed, block_, available, n_blocks_);
  }
  for (const Write& w : writes) {
    const int64_t n = static_cast<int64_t>(w.tokens.size());
    Seq& s = seq_ref(w.seq);
    truncate(w.seq, w.pos0);
    if (n == 0) continue;
    const int64_t first = w.pos0 / block_, last = (w.pos0 + n - 1) / block_;
    for (int64_t b = first; b <= last; ++b) {
      if (b < static_cast<int64_t>(s.blocks.size())) {
        int32_t& old = s.blocks[static_cast<size_t>(b)];
        if (refs_[static_cast<size_t>(old)] == 1) continue;
        // Copy-on-write: the rows written so far (a block is shared only up to some position:
        // copying all of it keeps the code simple, a block is ~0.1-5 MB).
        const int32_t copy = take_block();
        uint8_t* base = base_;
        for (int64_t l = 0; l < layout_.layers; ++l) {
          const uint64_t layer = static_cast<uint64_t>(l) * n_blocks_ *
                                 (k_block_bytes_ + v_block_bytes_);
          const uint64_t vbase = layer + static_cast<uint64_t>(n_blocks_) * k_block_bytes_;
          copy_bytes(base + layer + copy * k_block_bytes_, base + layer + old * k_block_bytes_,
                     k_block_bytes_);
          if (v_block_bytes_ > 0) {
            copy_bytes(base + vbase + copy * v_block_bytes_, base + vbase + old * v_block_bytes_,
                       v_block_bytes_);
          }
        }
        for (int64_t il = 0; il < layout_.index_layers; ++il) {
          copy_bytes(index_row_at(il, copy, 0), index_row_at(il, old, 0), i_block_bytes_);
        }
        --refs_[static_cast<size_t>(old)];
        old = copy;
      } else {
        s.blocks.push_back(take_block());
      }
    }
    s.length = w.pos0 + n;
    s.tokens.insert(s.tokens.end(), w.tokens.begin(), w.tokens.end());
  }
  if (has_state()) plan_snapshots(writes);
}

void KvCache::copy_bytes(void* dst, const void* src, uint64_t bytes) {
  if (options_.copy) {
    options_.copy(dst, src, bytes);
  } else {
    std::memcpy(dst, src, bytes);
  }
}

void KvCache::zero_bytes(void* dst, uint64_t bytes) {
  if (options_.zero) {
    options_.zero(dst, bytes);
  } else {
    std::memset(dst, 0, bytes);
  }
}

int32_t KvCache::take_block() {
  TD_CHECK(!free_.empty(), "KvCache: no free block after the check");
  const int32_t b = free_.back();
  free_.pop_back();
  refs_[static_cast<size_t>(b)] = 1;
  return b;
}

uint8_t* KvCache::row_at(int64_t layer, KvPart part, int32_t block, int64_t r,
                         int64_t head) const {
  const uint64_t layer_base =
      static_cast<uint64_t>(layer) * n_blocks_ * (k_block_bytes_ + v_block_bytes_);
  uint8_t* base = base_ + layer_base;
  if (part == KvPart::kKey) {
    return base + block * k_block_bytes_ + static_cast<uint64_t>((head * block_ + r) * k_row_bytes_);
  }
  return base + static_cast<uint64_t>(n_blocks_) * k_block_bytes_ + block * v_block_bytes_ +
         static_cast<uint64_t>((head * block_ + r) * v_row_bytes_);
}

uint8_t* KvCache::index_row_at(int64_t il, int32_t block, int64_t r) const {
  const uint64_t base = static_cast<uint64_t>(layout_.layers) * n_blocks_ *
                            (k_block_bytes_ + v_block_bytes_) +
                        static_cast<uint64_t>(il) * n_blocks_ * i_block_bytes_;
  return base_ + base + block * i_block_bytes_ + static_cast<uint64_t>(r * i_row_bytes_);
}

void KvCache::store_row(uint8_t* row, const float* src, int64_t d) const {
  switch (options_.type) {
    case KvType::kF32:
      std::memcpy(row, src, static_cast<size_t>(d) * 4);
      break;
    case KvType::kBf16:
    case KvType::kF16: {
      uint16_t* dst = reinterpret_cast<uint16_t*>(row);
      const bool f16 = options_.type == KvType::kF16;
      for (int64_t i = 0; i < d; ++i) dst[i] = f16 ? f32_to_f16(src[i]) : f32_to_bf16(src[i]);
      break;
    }
    case KvType::kQ8_0:
      ops::q8_quantize(src, d, reinterpret_cast<int8_t*>(row) + ops::q8_lead_bytes(d));
      break;
  }
}

void KvCache::load_row(const uint8_t* row, float* dst, int64_t d) const {
  switch (options_.type) {
    case KvType::kF32:
      std::memcpy(dst, row, static_cast<size_t>(d) * 4);
      break;
    case KvType::kBf16:
    case KvType::kF16: {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(row);
      const bool f16 = options_.type == KvType::kF16;
      for (int64_t i = 0; i < d; ++i) dst[i] = f16 ? f16_to_f32(h[i]) : bf16_to_f32(h[i]);
      break;
    }
    case KvType::kQ8_0: {
      const int8_t* values = reinterpret_cast<const int8_t*>(row) + ops::q8_lead_bytes(d);
      for (int64_t i = 0; i < d; ++i) dst[i] = ops::q8_value(values, i);
      break;
    }
  }
}

void KvCache::write_row(int64_t layer, KvPart part, SeqId seq, int64_t pos, int64_t head,
                        const float* src) {
  const Seq& s = seqs_[static_cast<size_t>(seq)];
  store_row(row_at(layer, part, s.blocks[static_cast<size_t>(pos / block_)], pos % block_, head),
            src, part == KvPart::kValue ? layout_.v_dim : layout_.k_dim);
}

void KvCache::read_row(int64_t layer, KvPart part, SeqId seq, int64_t pos, int64_t head,
                       float* dst) const {
  const Seq& s = seqs_[static_cast<size_t>(seq)];
  load_row(row_at(layer, part, s.blocks[static_cast<size_t>(pos / block_)], pos % block_, head),
           dst, part == KvPart::kValue ? layout_.v_dim : layout_.k_dim);
}

void KvCache::write_index_row(int64_t il, SeqId seq, int64_t pos, const float* src) {
  TD_CHECK(il >= 0 && il < layout_.index_layers, "KV cache: index layer {}", il);
  const Seq& s = seqs_[static_cast<size_t>(seq)];
  store_row(index_row_at(il, s.blocks[static_cast<size_t>(pos / block_)], pos % block_), src,
            layout_.index_dim);
}

void KvCache::set_row_pointers(const uint8_t* k, const uint8_t* v, int64_t k_dim, int64_t v_dim,
                               ops::AttentionArgs* a) const {
  switch (options_.type) {
    case KvType::kF32:
      a->k = reinterpret_cast<const float*>(k);
      a->v = reinterpret_cast<const float*>(v);
      break;
    case KvType::kBf16:
    case KvType::kF16:
      a->k16 = reinterpret_cast<const uint16_t*>(k);
      a->v16 = reinterpret_cast<const uint16_t*>(v);
      a->f16 = options_.type == KvType::kF16;
      break;
    case KvType::kQ8_0:
      a->k8 = reinterpret_cast<const int8_t*>(k) + ops::q8_lead_bytes(k_dim);
      // (The values of a latent row are its first v_dim: the same row, the key's scales.)
      a->v8 = v == k ? a->k8 : reinterpret_cast<const int8_t*>(v) + ops::q8_lead_bytes(v_dim);
      break;
  }
}

void KvCache::index_args(int64_t il, SeqId seq, ops::AttentionArgs* a) const {
  TD_CHECK(il >= 0 && il < layout_.index_layers, "KV cache: index layer {}", il);
  const Seq& s = seq_ref(seq);
  const uint8_t* k = index_row_at(il, 0, 0);
  set_row_pointers(k, k, layout_.index_dim, layout_.index_dim, a);
  a->k_stride = i_row_;
  a->k_head = 0;
  a->blocks = s.blocks.data();
  a->block_positions = block_;
  a->k_block = static_cast<int64_t>(i_block_bytes_) / elem_bytes(options_.type);
}

void KvCache::attention_args(int64_t layer, SeqId seq, ops::AttentionArgs* a) const {
  const Seq& s = seq_ref(seq);
  const int64_t eb = elem_bytes(options_.type);
  const uint8_t* k = row_at(layer, KvPart::kKey, 0, 0, 0);
  const bool values_in_keys = layout_.v_heads == 0;
  const uint8_t* v = values_in_keys ? k : row_at(layer, KvPart::kValue, 0, 0, 0);
  set_row_pointers(k, v, layout_.k_dim, layout_.v_dim, a);
  // Head-major within a block: a KV head's positions of the block are consecutive rows.
  a->k_stride = k_row_;
  a->v_stride = values_in_keys ? k_row_ : v_row_;
  a->k_head = layout_.k_heads > 1 ? block_ * k_row_ : 0;
  a->v_head = values_in_keys ? a->k_head : layout_.v_heads > 1 ? block_ * v_row_ : 0;
  a->blocks = s.blocks.data();
  a->block_positions = block_;
  a->k_block = static_cast<int64_t>(k_block_bytes_) / eb;
  a->v_block = static_cast<int64_t>(values_in_keys ? k_block_bytes_ : v_block_bytes_) / eb;
}

}  // namespace tandem
