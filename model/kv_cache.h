// The KV cache, apart from the model that fills it: one pool of fixed-size blocks of positions,
// shared by any number of sequences (vLLM's PagedAttention; llama.cpp's seq_rm / seq_cp /
// seq_keep). A sequence is a block table: block i holds its positions [i B, (i + 1) B). Sequences
// are created, forked (the fork shares every block, counted by reference), truncated and
// released; a block shared by several sequences is copied for the one that writes into it
// (copy-on-write at the first differing block), so a common prefix is stored once.
//
// Who owns which positions is the cache's business; the model only writes the rows of the
// positions a batch feeds (after make_writable) and reads a sequence's rows through its block
// table (attention_args). Not thread-safe: one forward, or one scheduler, at a time.
//
// Not here: eviction. A full pool is an Error(kResource) from make_writable before anything
// changes (or blocks_needed / blocks_free ahead of it: back-pressure to the caller); a live
// sequence's blocks are never taken from it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/memory.h"
#include "ops/types.h"

namespace tandem {

// The cache's element (`--cache-type`; llama.cpp's `-ctk` / `-ctv`, whose default is F16).
// kF32: as computed, the reference's numbers. kBf16: half the memory and, on AVX-512 BF16,
// attention by vdpbf16ps (queries and probabilities rounded to BF16): faster long-context
// attention, logits within BF16 rounding of F32's. kF16: half the memory, 11 significant bits,
// F32 arithmetic on the rows widened. kQ8_0: int8 in blocks of 32 with an F32 scale per block
// (ops::q8_quantize), 28% of F32's memory, F32 arithmetic on the rows dequantized.
enum class KvType { kF32, kBf16, kF16, kQ8_0 };
// "f32" | "bf16" | "f16" | "q8_0"; anything else: Error(kInvalidArgument) naming the choices.
KvType parse_kv_type(const std::string& name);
const char* kv_type_name(KvType type);

// What a model caches per layer and position: k_heads rows of k_dim values (the keys), and
// v_heads rows of v_dim (the values); v_heads 0: the values are the first v_dim values of the key
// rows (DeepSeek MLA's latent cache: the latent, then the rope key).
struct KvLayout {
  int64_t layers = 0;
  int64_t k_heads = 0, k_dim = 0;
  int64_t v_heads = 0, v_dim = 0;
  bool operator==(const KvLayout&) const = default;
};

struct KvCacheOptions {
  KvType type = KvType::kF32;
  // The pool: positions of all sequences together (rounded up to whole blocks).
  int64_t positions = 4096;
  // Positions per block: a power of two, a multiple of ops::kKvBlockAlign (64). Smaller blocks
  // share prefixes more finely and waste less at a sequence's end; larger ones mean fewer table
  // lookups. 64 holds a V2-Lite layer's latents of a block in 147 KB (F32).
  int64_t block_positions = 64;
  // One sequence's positions at most (the context size); 0: `positions`.
  int64_t max_sequence_positions = 0;
  // Where the pool lives. Unset: host memory (huge pages, taken as positions are written). Set
  // (ForwardOps::cache_options of an accelerator): alloc(bytes) returns the pool in its memory (or
  // throws Error(kResource)), release(p) gives it back when the cache goes; the cache's
  // copy-on-write copies and write_row / read_row then address that memory directly (the host
  // device's memory is the host's).
  std::function<void*(uint64_t bytes)> alloc;
  std::function<void(void*)> release;
  // With alloc: copies bytes within the pool (a copy-on-write block; a GPU's device-to-device
  // copy); unset: memcpy.
  std::function<void(void* dst, const void* src, uint64_t bytes)> copy;
};

using SeqId = int32_t;

class KvCache {
 public:
  // Throws Error(kInvalidArgument) for a bad layout or block size, Error(kResource) naming the
  // sizes when the pool is larger than the memory available. The pool's pages are taken as
  // positions are written, not at construction.
  KvCache(const KvLayout& layout, const KvCacheOptions& options);

  const KvLayout& layout() const { return layout_; }
  KvType type() const { return options_.type; }
  int64_t block_positions() const { return block_; }
  int64_t blocks_total() const { return n_blocks_; }
  int64_t blocks_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t max_sequence_positions() const { return max_seq_; }
  // The pool's positions (blocks_total * block_positions) and bytes.
  int64_t capacity() const { return n_blocks_ * block_; }
  uint64_t bytes() const { return static_cast<uint64_t>(n_blocks_) * block_bytes_; }
  // Bytes of one position of one layer (keys and values): what attention reads per position.
  uint64_t position_bytes() const;
  // The pool's first byte (bytes() of them).
  const void* memory() const { return base_; }

  // Sequences. Ids of released sequences are reused. Every call on a sequence that does not
  // exist throws Error(kInvalidArgument) naming it.
  SeqId create();
  SeqId fork(SeqId src);  // the same positions; blocks shared until one of them writes
  void truncate(SeqId seq, int64_t length);  // keeps positions [0, length)
  void release(SeqId seq);
  bool contains(SeqId seq) const;
  int64_t length(SeqId seq) const;
  int64_t sequences() const;
  int64_t positions_used() const;  // the live sequences' lengths together
  // The token ids written at the sequence's positions, in order.
  std::span<const int32_t> tokens(SeqId seq) const;

  // The live sequence sharing the longest prefix with `tokens` (length 0, seq -1: none), for a
  // new sequence to fork and truncate to it.
  struct PrefixMatch {
    SeqId seq = -1;
    int64_t length = 0;
  };
  PrefixMatch longest_prefix(std::span<const int32_t> tokens) const;

  // Tokens written at positions [pos0, pos0 + tokens.size()) of seq (pos0 <= its length: the
  // positions from pos0 on are replaced).
  struct Write {
    SeqId seq = -1;
    int64_t pos0 = 0;
    std::span<const int32_t> tokens;
  };
  // Blocks make_writable would take from the free list for these writes.
  int64_t blocks_needed(std::span<const Write> writes) const;
  // Makes the writes' positions writable: each sequence truncated to its pos0, given new blocks
  // past its last and a private copy of a shared block the write reaches into; records the
  // tokens. All or nothing: throws Error(kOutOfRange) for a write past max_sequence_positions or
  // a pos0 past the sequence's length, Error(kInvalidArgument) for an unknown or repeated
  // sequence, Error(kResource) when the free blocks are too few, before changing anything.
  void make_writable(std::span<const Write> writes);

  // The model's side. Row `head` of position pos (writable, or < length) of layer's keys
  // (value = false) or values, converted from / to F32.
  void write_row(int64_t layer, bool value, SeqId seq, int64_t pos, int64_t head,
                 const float* src);
  void read_row(int64_t layer, bool value, SeqId seq, int64_t pos, int64_t head,
                float* dst) const;
  // The cache fields of AttentionArgs for seq's rows of layer: k / v (k16 / v16, k8 / v8), the
  // strides, heads and its block table (valid until the sequence's blocks change).
  void attention_args(int64_t layer, SeqId seq, ops::AttentionArgs* a) const;

 private:
  struct Seq {
    bool live = false;
    int64_t length = 0;
    std::vector<int32_t> blocks;
    std::vector<int32_t> tokens;
  };
  const Seq& seq_ref(SeqId seq) const;
  Seq& seq_ref(SeqId seq);
  void drop_blocks(Seq& s, size_t keep);  // unreferences blocks [keep, end)
  int32_t take_block();
  void copy_bytes(void* dst, const void* src, uint64_t bytes);  // within the pool
  // Address of the row (layer, value, block b, row r within the block, head) in the pool.
  uint8_t* row_at(int64_t layer, bool value, int32_t block, int64_t r, int64_t head) const;

  KvLayout layout_;
  KvCacheOptions options_;
  int64_t block_ = 0, n_blocks_ = 0, max_seq_ = 0;
  // Per row: elements (bytes for Q8_0) and bytes; per block of one layer: K and V bytes.
  int64_t k_row_ = 0, v_row_ = 0, k_row_bytes_ = 0, v_row_bytes_ = 0;
  uint64_t k_block_bytes_ = 0, v_block_bytes_ = 0, block_bytes_ = 0;
  // The pool, layer-major: layer l's key blocks, then its value blocks. In pool_, or in the
  // memory of options.alloc (owned by external_, which releases it).
  AlignedBuffer pool_;
  std::shared_ptr<void> external_;
  uint8_t* base_ = nullptr;
  std::vector<int32_t> refs_;  // per block: sequences holding it
  std::vector<int32_t> free_;  // free blocks (a stack)
  std::vector<Seq> seqs_;
};

}  // namespace tandem
