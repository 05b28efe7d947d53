// The sequence memory's recurrent state (model/kv_cache.h) without a model: state slots taken by
// create and fork (a copy of the state) and given back by release; the checkpoints a write plans
// (every interval, one before a marked write's end), shared by forks, restored by truncation
// (the length kept is the checkpoint's), evicted least recently used when a slot is needed, never
// a live sequence's; prefix matches that resume at a checkpoint; the errors.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "model/kv_cache.h"

namespace tandem {
namespace {

KvLayout hybrid_layout() {
  KvLayout l;
  l.layers = 1;
  l.k_heads = l.v_heads = 2;
  l.k_dim = l.v_dim = 8;
  l.state_layers = 3;
  l.state_floats = 10;
  return l;
}

KvCache make(int64_t slots, int64_t interval) {
  KvCacheOptions o;
  o.positions = 64 * 8;
  o.state_slots = slots;
  o.checkpoint_interval = interval;
  return KvCache(hybrid_layout(), o);
}

std::vector<int32_t> tokens(int n, int first = 0) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

// Writes n tokens at the sequence's end (as a forward would), each state layer's values set to
// `value` (standing in for the forward's update), the planned checkpoints filled with
// value + offset / 1000 (the state "after offset tokens").
void feed(KvCache& c, SeqId s, int n, float value, bool end_checkpoint = false, int first = 0) {
  const std::vector<int32_t> t = tokens(n, first);
  const KvCache::Write w{s, c.length(s), t, end_checkpoint};
  c.make_writable(std::span<const KvCache::Write>(&w, 1));
  for (const KvCache::Snapshot& snap : c.pending_snapshots()) {
    for (int64_t l = 0; l < 3; ++l) {
      float* dst = c.slot_state(snap.slot, l);
      for (int i = 0; i < 10; ++i) dst[i] = value + static_cast<float>(snap.offset) / 1000.0f;
    }
  }
  for (int64_t l = 0; l < 3; ++l) {
    float* st = c.state(l, s);
    for (int i = 0; i < 10; ++i) st[i] = value + static_cast<float>(n) / 1000.0f;
  }
}

TEST(KvCacheState, SlotsFollowTheLiveSequencesAndStatesStartEmpty) {
  KvCache c = make(3, 0);
  EXPECT_TRUE(c.has_state());
  EXPECT_EQ(c.state_slots(), 3);
  EXPECT_GE(c.bytes(), c.state_bytes() + static_cast<uint64_t>(c.blocks_total()) *
                                              static_cast<uint64_t>(c.block_positions()) *
                                              c.position_bytes());
  const SeqId a = c.create();
  for (int64_t l = 0; l < 3; ++l) {
    for (int i = 0; i < 10; ++i) EXPECT_EQ(c.state(l, a)[i], 0.0f);
  }
  feed(c, a, 5, 7.0f);
  const SeqId b = c.fork(a);
  EXPECT_EQ(c.state(2, b)[9], c.state(2, a)[9]);  // a copy
  EXPECT_NE(c.state(0, b), c.state(0, a));        // in a slot of its own
  c.state(0, b)[0] = -1.0f;
  EXPECT_NE(c.state(0, a)[0], -1.0f);
  EXPECT_EQ(c.state_slots_free(), 1);
  c.release(a);
  const SeqId d = c.create();  // a's slot again, empty
  EXPECT_EQ(c.state(1, d)[3], 0.0f);
  EXPECT_EQ(c.state_slots_free(), 1);
  const SeqId e = c.create();
  EXPECT_EQ(c.state_slots_free(), 0);
  EXPECT_THROW(c.create(), Error);
  EXPECT_THROW(c.fork(b), Error);
  c.release(b);
  c.release(d);
  c.release(e);
  EXPECT_EQ(c.state_slots_free(), 3);
}

TEST(KvCacheState, CheckpointsEveryIntervalAndBeforeAMarkedEnd) {
  KvCache c = make(12, 32);
  const SeqId a = c.create();
  feed(c, a, 70, 1.0f);
  EXPECT_EQ(c.checkpoints(a), (std::vector<int64_t>{32, 64}));
  feed(c, a, 10, 2.0f, true, 70);  // positions 70..79: none at an interval, one at 79
  EXPECT_EQ(c.checkpoints(a), (std::vector<int64_t>{32, 64, 79}));
  feed(c, a, 1, 3.0f, true, 80);  // a one-token write: its checkpoint at offset 0
  EXPECT_EQ(c.checkpoints(a), (std::vector<int64_t>{32, 64, 79, 80}));
  // Truncated between checkpoints: the latest at or before, restored, the rest dropped.
  EXPECT_EQ(c.truncate(a, 70), 64);
  EXPECT_EQ(c.length(a), 64);
  EXPECT_EQ(c.tokens(a).size(), 64u);
  EXPECT_FLOAT_EQ(c.state(1, a)[4], 1.0f + 64 / 1000.0f);  // the checkpoint at 64's values
  EXPECT_EQ(c.checkpoints(a), (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(c.truncate(a, 64), 64);  // at a checkpoint: kept as it is
  EXPECT_EQ(c.truncate(a, 100), 64);  // past the end: nothing
  EXPECT_EQ(c.truncate(a, 10), 0);   // before the first: the empty state
  EXPECT_EQ(c.state(0, a)[0], 0.0f);
  EXPECT_TRUE(c.checkpoints(a).empty());
  EXPECT_EQ(c.state_slots_free(), 11);
}

TEST(KvCacheState, ForksShareCheckpointsAndPrefixesResumeAtThem) {
  KvCache c = make(8, 32);
  const SeqId a = c.create();
  feed(c, a, 100, 1.0f);  // checkpoints 32, 64, 96
  const SeqId b = c.fork(a);
  EXPECT_EQ(c.checkpoints(b), (std::vector<int64_t>{32, 64, 96}));
  EXPECT_EQ(c.state_slots_free(), 8 - 2 - 3);  // shared, not copied
  // A prompt matching 70 tokens resumes at 64; one matching all of a at a's end (live state).
  std::vector<int32_t> q = tokens(70);
  q.push_back(999);
  KvCache::PrefixMatch m = c.longest_prefix(q);
  EXPECT_EQ(m.length, 64);
  m = c.longest_prefix(tokens(120));
  EXPECT_EQ(m.length, 100);
  std::vector<int32_t> short_q = tokens(20);
  short_q.push_back(999);
  EXPECT_EQ(c.longest_prefix(short_q).length, 0);
  // b cut to 40 drops its references to 64 and 96; a keeps them.
  EXPECT_EQ(c.truncate(b, 40), 32);
  EXPECT_EQ(c.checkpoints(a), (std::vector<int64_t>{32, 64, 96}));
  c.release(a);  // 64 and 96 go with it, 32 stays for b
  EXPECT_EQ(c.checkpoints(b), (std::vector<int64_t>{32}));
  EXPECT_EQ(c.state_slots_free(), 8 - 1 - 1);
}

TEST(KvCacheState, LeastRecentlyUsedCheckpointsMakeRoom) {
  KvCache c = make(4, 16);
  const SeqId a = c.create();
  feed(c, a, 50, 1.0f);  // checkpoints 16, 32, 48: every slot taken
  EXPECT_EQ(c.checkpoints(a), (std::vector<int64_t>{16, 32, 48}));
  EXPECT_EQ(c.state_slots_free(), 0);
  feed(c, a, 20, 2.0f, false, 50);  // 64 evicts the oldest, 16
  EXPECT_EQ(c.checkpoints(a), (std::vector<int64_t>{32, 48, 64}));
  // Restoring 48 uses it again (and drops 64): the next eviction takes 32.
  EXPECT_EQ(c.truncate(a, 50), 48);
  EXPECT_EQ(c.checkpoints(a), (std::vector<int64_t>{32, 48}));
  const SeqId b = c.create();  // the free slot
  EXPECT_EQ(c.checkpoints(a), (std::vector<int64_t>{32, 48}));
  const SeqId d = c.create();  // evicts 32
  EXPECT_EQ(c.checkpoints(a), (std::vector<int64_t>{48}));
  // A new checkpoint takes an old one's slot; one that finds none is skipped.
  feed(c, b, 40, 3.0f);  // 16 takes 48's slot, 32 finds none
  EXPECT_EQ(c.checkpoints(b), (std::vector<int64_t>{16}));
  EXPECT_TRUE(c.checkpoints(a).empty());
  // Live states are never evicted: the last checkpoint goes, then creating fails.
  const SeqId e = c.create();
  EXPECT_TRUE(c.checkpoints(b).empty());
  EXPECT_EQ(c.state_slots_available(), 0);
  EXPECT_THROW(c.create(), Error);
  for (SeqId s2 : {a, b, d, e}) c.release(s2);
  EXPECT_EQ(c.state_slots_free(), 4);
}

TEST(KvCacheState, ErrorsNameTheProblem) {
  KvCache c = make(2, 0);
  const SeqId a = c.create();
  feed(c, a, 10, 1.0f);
  const std::vector<int32_t> t = tokens(3);
  const KvCache::Write rewind{a, 5, t};
  try {
    c.make_writable(std::span<const KvCache::Write>(&rewind, 1));
    FAIL() << "a write before the end of a recurrent state was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("truncate it first"), std::string::npos);
  }
  EXPECT_EQ(c.length(a), 10);
  KvCacheOptions o;
  o.state_slots = -1;
  EXPECT_THROW(KvCache(hybrid_layout(), o), Error);
  o.state_slots = 2;
  o.checkpoint_interval = -5;
  EXPECT_THROW(KvCache(hybrid_layout(), o), Error);
  KvLayout bad = hybrid_layout();
  bad.state_floats = 0;  // state layers without state
  EXPECT_THROW(KvCache(bad, KvCacheOptions{}), Error);
  // A layout without recurrent layers has no state, and truncation cuts exactly.
  KvLayout plain = hybrid_layout();
  plain.state_layers = plain.state_floats = 0;
  KvCache p(plain, KvCacheOptions{});
  EXPECT_FALSE(p.has_state());
  const SeqId s = p.create();
  const std::vector<int32_t> ten = tokens(10);
  const KvCache::Write w{s, 0, ten};
  p.make_writable(std::span<const KvCache::Write>(&w, 1));
  EXPECT_EQ(p.truncate(s, 7), 7);
}

}  // namespace
}  // namespace tandem
