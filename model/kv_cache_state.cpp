// The sequence memory's recurrent state (model/kv_cache.h): the slot pool after the blocks, the
// live states and the checkpoints that truncation and prefix reuse restore.
#include <algorithm>

#include "core/error.h"
#include "model/kv_cache.h"

namespace tandem {

void KvCache::init_state() {
  slots_.assign(static_cast<size_t>(n_slots_), Slot{});
}

int64_t KvCache::state_slots_free() const {
  return std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.refs == 0; });
}

int64_t KvCache::state_slots_available() const {
  // A checkpoint's slot can be taken from it (evicted), a live sequence's cannot.
  return std::count_if(slots_.begin(), slots_.end(),
                       [](const Slot& s) { return s.refs == 0 || s.checkpoint; });
}

float* KvCache::state(int64_t state_layer, SeqId seq) const {
  const Seq& s = seq_ref(seq);
  TD_CHECK(has_state() && state_layer >= 0 && state_layer < layout_.state_layers,
           "KV cache: no recurrent layer {}", state_layer);
  return slot_state(s.slot, state_layer);
}

float* KvCache::slot_state(int32_t slot, int64_t state_layer) const {
  TD_CHECK(slot >= 0 && slot < n_slots_, "KV cache: no state slot {}", slot);
  return reinterpret_cast<float*>(slot_address(slot)) + state_layer * layout_.state_floats;
}

std::vector<int64_t> KvCache::checkpoints(SeqId seq) const {
  std::vector<int64_t> out;
  for (int32_t c : seq_ref(seq).checkpoints) out.push_back(slots_[static_cast<size_t>(c)].pos);
  return out;
}

// A free slot, else the least recently used checkpoint not in `keep`, evicted; -1: none.
int32_t KvCache::take_slot(const std::vector<int32_t>& keep) {
  int32_t best = -1;
  for (int32_t i = 0; i < static_cast<int32_t>(slots_.size()); ++i) {
    if (slots_[static_cast<size_t>(i)].refs == 0) return i;
  }
  for (int32_t i = 0; i < static_cast<int32_t>(slots_.size()); ++i) {
    const Slot& s = slots_[static_cast<size_t>(i)];
    if (!s.checkpoint || std::find(keep.begin(), keep.end(), i) != keep.end()) continue;
    if (best < 0 || s.used < slots_[static_cast<size_t>(best)].used) best = i;
  }
  if (best >= 0) evict_checkpoint(best);
  return best;
}

void KvCache::unref_slot(int32_t slot) {
  Slot& s = slots_[static_cast<size_t>(slot)];
  TD_CHECK(s.refs > 0, "KV cache: state slot {} released twice", slot);
  if (--s.refs == 0) s = Slot{};
}

// The checkpoint leaves every sequence holding it; its slot is free.
void KvCache::evict_checkpoint(int32_t slot) {
  for (Seq& q : seqs_) {
    if (!q.live) continue;
    std::erase(q.checkpoints, slot);
  }
  slots_[static_cast<size_t>(slot)] = Slot{};
}

void KvCache::drop_checkpoints_after(Seq& s, int64_t pos) {
  while (!s.checkpoints.empty() &&
         slots_[static_cast<size_t>(s.checkpoints.back())].pos > pos) {
    unref_slot(s.checkpoints.back());
    s.checkpoints.pop_back();
  }
}

void KvCache::copy_slot(int32_t dst, int32_t src) {
  copy_bytes(slot_address(dst), slot_address(src), slot_bytes_);
}

// The checkpoints of the writes' new positions: every checkpoint_interval positions and before
// the last token of a write that asks for one, each in a slot of its own (a free one or the least recently used
// checkpoint's, never one planned in this step); the forward fills them (pending_snapshots).
void KvCache::plan_snapshots(std::span<const Write> writes) {
  pending_.clear();
  std::vector<int32_t> planned;
  const int64_t every = options_.checkpoint_interval;
  for (const Write& w : writes) {
    const int64_t n = static_cast<int64_t>(w.tokens.size());
    if (n == 0) continue;
    Seq& s = seq_ref(w.seq);
    std::vector<int64_t> at;  // offsets into the write
    if (every > 0) {
      for (int64_t p = (w.pos0 / every + 1) * every; p <= w.pos0 + n; p += every) {
        at.push_back(p - w.pos0);
      }
    }
    // (Before the last token: a prompt fed again in full still has a token to compute its
    // logits from, and a longer one resumes one token earlier.)
    if (w.checkpoint_end) {
      at.push_back(n - 1);
      std::sort(at.begin(), at.end());
      at.erase(std::unique(at.begin(), at.end()), at.end());
    }
    for (int64_t offset : at) {
      const int32_t slot = take_slot(planned);
      if (slot < 0) break;  // (every slot holds a live state: no checkpoint this time)
      Slot& c = slots_[static_cast<size_t>(slot)];
      c.refs = 1;
      c.checkpoint = true;
      c.pos = w.pos0 + offset;
      c.used = ++tick_;
      s.checkpoints.push_back(slot);
      planned.push_back(slot);
      pending_.push_back(Snapshot{w.seq, offset, slot});
    }
  }
}

}  // namespace tandem
