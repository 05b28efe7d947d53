// Activation rows of a prefill batch converted in blocks of tokens on the pool (each row is
// independent: the same bytes whichever thread converts it); few tokens on this thread.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/thread_pool.h"

namespace tandem::kern::detail {

template <class Row>
void for_token_blocks(ThreadPool* pool, int64_t tokens, const Row& row) {
  constexpr int64_t kTokensPerTask = 16;
  if (pool != nullptr && tokens >= 2 * kTokensPerTask) {
    pool->run(static_cast<size_t>((tokens + kTokensPerTask - 1) / kTokensPerTask), [&](size_t i) {
      const int64_t t0 = static_cast<int64_t>(i) * kTokensPerTask;
      for (int64_t t = t0; t < std::min(tokens, t0 + kTokensPerTask); ++t) row(t);
    });
  } else {
    for (int64_t t = 0; t < tokens; ++t) row(t);
  }
}

}  // namespace tandem::kern::detail
