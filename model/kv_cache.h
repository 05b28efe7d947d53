// The sequence memory, apart from the model that fills it: one pool of fixed-size blocks of
// positions for the keys and values of the attention layers, shared by any number of sequences
// (vLLM's PagedAttention; llama.cpp's seq_rm / seq_cp / seq_keep), and -- for models with
// recurrent layers (Qwen3-Next / Qwen3.5's Gated DeltaNet) -- a pool of state slots, one per
// sequence, holding every recurrent layer's fixed-size state (llama.cpp's llama_memory_hybrid).
// A sequence is a block table (block i holds its positions [i B, (i + 1) B)) and, with recurrent
// layers, a state slot. Sequences are created, forked (the fork shares every block, counted by
// reference, and gets a copy of the state), truncated and released; a block shared by several
// sequences is copied for the one that writes into it (copy-on-write at the first differing
// block), so a common prefix is stored once.
//
// A recurrent state cannot be cut back to an earlier position: it is the whole prefix folded
// into a few matrices. Truncation and prefix reuse go through checkpoints instead: copies of a
// sequence's state at chosen positions (every checkpoint_interval positions, and where a write
// asks for one -- just before the end of a prompt), kept in the same slot pool, shared by forks, evicted
// least recently used when a slot is needed. Truncating such a sequence to position p restores
// the latest checkpoint at or before p (or the empty state) and cuts the keys and values there:
// its length becomes that checkpoint's position, and the caller feeds the tokens after it again.
// The forward writes the checkpoints of a write's positions while it computes them
// (pending_snapshots()).
//
// Who owns which positions is the cache's business; the model only writes the rows of the
// positions a batch feeds (after make_writable) and reads a sequence's rows through its block
// table (attention_args) and its state through state(). Not thread-safe: one forward, or one
// scheduler, at a time.
//
// Not here: eviction of live data. A full pool is an Error(kResource) from make_writable (or
// create / fork without a free state slot) before anything changes (or blocks_needed /
// blocks_free / state_slots_available ahead of it: back-pressure to the caller); a live
// sequence's blocks and state are never taken from it.
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
// The keys or the values of an attention layer in the cache (KvCache::write_row / read_row).
enum class KvPart { kKey, kValue };
// "f32" | "bf16" | "f16" | "q8_0"; anything else: Error(kInvalidArgument) naming the choices.
KvType parse_kv_type(const std::string& name);
const char* kv_type_name(KvType type);

// What a model caches per layer and position: k_heads rows of k_dim values (the keys), and
// v_heads rows of v_dim (the values); v_heads 0: the values are the first v_dim values of the key
// rows (DeepSeek MLA's latent cache: the latent, then the rope key).
// state_layers, state_floats: the recurrent layers (counted apart from the attention `layers`)
// each keep state_floats F32 values per sequence (ModelConfig::linear_state_floats); 0: none.
// index_layers, index_dim: DeepSeek Sparse Attention's indexer keys, one row of index_dim values
// per position in each of index_layers layers (ModelConfig::num_index_layers), paged with the
// keys and values in the cache's element type; 0: none.
struct KvLayout {
  int64_t layers = 0;
  int64_t k_heads = 0, k_dim = 0;
  int64_t v_heads = 0, v_dim = 0;
  int64_t state_layers = 0, state_floats = 0;
  int64_t index_layers = 0, index_dim = 0;
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
  // With alloc: copies bytes within the pool (a copy-on-write block, a state restored from a
  // checkpoint; a GPU's device-to-device copy) and zeroes bytes of it (a new sequence's state);
  // unset: memcpy, memset.
  std::function<void(void* dst, const void* src, uint64_t bytes)> copy;
  std::function<void(void* dst, uint64_t bytes)> zero;
  // Recurrent state (layouts with state_layers): slots of one sequence's state, shared by the
  // live sequences (one each) and the checkpoints (evicted when a live sequence needs a slot).
  // 0: 4 (one sequence, its checkpoints).
  int64_t state_slots = 0;
  // A checkpoint every this many positions of a sequence (0: only where a write asks for one).
  int64_t checkpoint_interval = 0;
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
  // The pool's bytes: the blocks, then the state slots.
  uint64_t bytes() const {
    return n_slots_ > 0 ? state_base_ + slot_bytes_ * static_cast<uint64_t>(n_slots_)
                        : static_cast<uint64_t>(n_blocks_) * block_bytes_;
  }
  // Bytes of one position of one layer (keys and values): what attention reads per position.
  uint64_t position_bytes() const;
  // Bytes of one position's indexer key in one index layer (0: none).
  uint64_t index_position_bytes() const { return static_cast<uint64_t>(i_row_bytes_); }
  // The pool's first byte (bytes() of them).
  const void* memory() const { return base_; }

  // ---- Recurrent state (layout().state_layers > 0) ----
  bool has_state() const { return layout_.state_layers > 0; }
  int64_t state_slots() const { return n_slots_; }
  // Slots free now, and slots a create / fork can have (free ones and evictable checkpoints).
  int64_t state_slots_free() const;
  int64_t state_slots_available() const;
  uint64_t state_bytes() const { return slot_bytes_ * static_cast<uint64_t>(n_slots_); }
  // Recurrent layer `state_layer`'s state of the sequence: state_floats F32 values in the pool.
  float* state(int64_t state_layer, SeqId seq) const;
  // The same in a slot (a checkpoint being written by the forward).
  float* slot_state(int32_t slot, int64_t state_layer) const;
  // Positions of the sequence's checkpoints, ascending.
  std::vector<int64_t> checkpoints(SeqId seq) const;
  // The checkpoints the last make_writable planned: after `offset` (0 .. n) of a write's tokens
  // (position pos0 + offset) the forward copies the sequence's state into `slot`.
  struct Snapshot {
    SeqId seq = -1;
    int64_t offset = 0;
    int32_t slot = -1;
  };
  const std::vector<Snapshot>& pending_snapshots() const { return pending_; }

  // Sequences. Ids of released sequences are reused. Every call on a sequence that does not
  // exist throws Error(kInvalidArgument) naming it.
  SeqId create();
  // Both take a state slot with recurrent state (Error(kResource) when none is available).
  SeqId fork(SeqId src);  // the same positions; blocks shared until one of them writes
  // Keeps positions [0, length); with recurrent state [0, c) for c the latest checkpoint at or
  // before length (0: none), whose state is restored. Returns the length kept.
  int64_t truncate(SeqId seq, int64_t length);
  void release(SeqId seq);
  bool contains(SeqId seq) const;
  int64_t length(SeqId seq) const;
  int64_t positions_used() const;  // the live sequences' lengths together
  // The token ids written at the sequence's positions, in order.
  std::span<const int32_t> tokens(SeqId seq) const;

  // The live sequence sharing the longest prefix with `tokens` (length 0, seq -1: none), for a
  // new sequence to fork and truncate to it. With recurrent state the length is where a fork
  // can resume: the whole sequence when all of it matches, else its latest checkpoint within
  // the match.
  struct PrefixMatch {
    SeqId seq = -1;
    int64_t length = 0;
  };
  PrefixMatch longest_prefix(std::span<const int32_t> tokens) const;

  // Tokens written at positions [pos0, pos0 + tokens.size()) of seq (pos0 <= its length: the
  // positions from pos0 on are replaced).
  // checkpoint_end: keep a checkpoint of the state before the write's last token (a prompt's end:
  // the same prompt again resumes there and still computes its last token's logits).
  struct Write {
    SeqId seq = -1;
    int64_t pos0 = 0;
    std::span<const int32_t> tokens;
    bool checkpoint_end = false;
  };
  // Blocks make_writable would take from the free list for these writes.
  int64_t blocks_needed(std::span<const Write> writes) const;
  // Makes the writes' positions writable: each sequence truncated to its pos0, given new blocks
  // past its last and a private copy of a shared block the write reaches into; records the
  // tokens; plans the checkpoints of the written positions (pending_snapshots(); a checkpoint
  // that finds no slot is skipped). All or nothing: throws Error(kOutOfRange) for a write past
  // max_sequence_positions or a pos0 past the sequence's length, Error(kInvalidArgument) for an
  // unknown or repeated sequence or, with recurrent state, a pos0 before the sequence's end
  // (truncate it first), Error(kResource) when the free blocks are too few, before changing
  // anything.
  void make_writable(std::span<const Write> writes);

  // The model's side. Row `head` of position pos (writable, or < length) of layer's keys or
  // values, converted from / to F32.
  void write_row(int64_t layer, KvPart part, SeqId seq, int64_t pos, int64_t head,
                 const float* src);
  void read_row(int64_t layer, KvPart part, SeqId seq, int64_t pos, int64_t head,
                float* dst) const;
  // The cache fields of AttentionArgs for seq's rows of layer: k / v (k16 / v16, k8 / v8), the
  // strides, heads and its block table (valid until the sequence's blocks change).
  void attention_args(int64_t layer, SeqId seq, ops::AttentionArgs* a) const;
  // The indexer's keys (layout().index_layers > 0): position pos's row of index layer
  // `index_layer`, written from F32; and the key fields of AttentionArgs (k / k16 / k8, k_stride,
  // the block table, k_block) for seq's rows of it (the value fields unset).
  void write_index_row(int64_t index_layer, SeqId seq, int64_t pos, const float* src);
  void index_args(int64_t index_layer, SeqId seq, ops::AttentionArgs* a) const;

 private:
  struct Seq {
    bool live = false;
    int64_t length = 0;
    std::vector<int32_t> blocks;
    std::vector<int32_t> tokens;
    int32_t slot = -1;                 // the live state's slot
    std::vector<int32_t> checkpoints;  // slots, ascending by position
  };
  // A state slot: free, a live sequence's, or a checkpoint at `pos` held by `refs` sequences
  // (forks share them), last used at tick `used`.
  struct Slot {
    int32_t refs = 0;
    bool checkpoint = false;
    int64_t pos = 0;
    uint64_t used = 0;
  };
  void init_state();
  SeqId create_seq(bool zero_state);  // create(); fork() overwrites the state instead
  int32_t take_slot(const std::vector<int32_t>& keep);  // -1: none (free or evictable)
  void unref_slot(int32_t slot);
  void evict_checkpoint(int32_t slot);
  void drop_checkpoints_after(Seq& s, int64_t pos);
  void copy_slot(int32_t dst, int32_t src);
  void plan_snapshots(std::span<const Write> writes);
  const Seq& seq_ref(SeqId seq) const;
  Seq& seq_ref(SeqId seq);
  void drop_blocks(Seq& s, size_t keep);  // unreferences blocks [keep, end)
  int32_t take_block();
  void copy_bytes(void* dst, const void* src, uint64_t bytes);  // within the pool
  void zero_bytes(void* dst, uint64_t bytes);
  uint8_t* slot_address(int32_t slot) const {
    return base_ + state_base_ + static_cast<uint64_t>(slot) * slot_bytes_;
  }
  // Address of the row (layer, value, block b, row r within the block, head) in the pool.
  uint8_t* row_at(int64_t layer, KvPart part, int32_t block, int64_t r, int64_t head) const;
  // The same for an indexer key (index layer il).
  uint8_t* index_row_at(int64_t il, int32_t block, int64_t r) const;
  // d F32 values into / out of a row in the cache's element type.
  void store_row(uint8_t* row, const float* src, int64_t d) const;
  void load_row(const uint8_t* row, float* dst, int64_t d) const;
  // The cache fields of AttentionArgs for rows at `base` (k and v both, values_in_keys).
  void set_row_pointers(const uint8_t* k, const uint8_t* v, int64_t k_dim, int64_t v_dim,
                        ops::AttentionArgs* a) const;

  KvLayout layout_;
  KvCacheOptions options_;
  int64_t block_ = 0, n_blocks_ = 0, max_seq_ = 0;
  // Per row: elements (bytes for Q8_0) and bytes; per block of one layer: K, V and indexer-key
  // bytes.
  int64_t k_row_ = 0, v_row_ = 0, k_row_bytes_ = 0, v_row_bytes_ = 0;
  int64_t i_row_ = 0, i_row_bytes_ = 0;
  uint64_t k_block_bytes_ = 0, v_block_bytes_ = 0, i_block_bytes_ = 0, block_bytes_ = 0;
  // The pool, layer-major: layer l's key blocks, then its value blocks; after the last layer the
  // index layers' blocks. In pool_, or in the
  // memory of options.alloc (owned by external_, which releases it).
  AlignedBuffer pool_;
  std::shared_ptr<void> external_;
  uint8_t* base_ = nullptr;
  std::vector<int32_t> refs_;  // per block: sequences holding it
  std::vector<int32_t> free_;  // free blocks (a stack)
  std::vector<Seq> seqs_;
  // The state pool: n_slots_ slots of state_layers x state_floats F32, after the blocks.
  int64_t n_slots_ = 0;
  uint64_t slot_bytes_ = 0, state_base_ = 0;  // state_base_: the slots' offset in the pool
  std::vector<Slot> slots_;
  uint64_t tick_ = 0;
  std::vector<Snapshot> pending_;
};

}  // namespace tandem
