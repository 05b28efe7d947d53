#!/usr/bin/env bash
# Mutations the tests must catch (`make test-slow`, ctest slow.mutations): each one is a bug a test
# exists for, put into a copy of the tree; the test is rebuilt and run there, and must fail. The
# script prints each mutation and whether it was caught, and exits non-zero when one survives or no
# longer applies (the code it mutates moved: update the mutation).
#
#   scripts/mutation-check.sh [name ...]     (default: all)
#   env: TANDEM_MUTATION_DIR (default <repo>/build-mutation: the copy and its build)
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
work="${TANDEM_MUTATION_DIR:-$repo/build-mutation}"
src="$work/src"
build="$work/build"

selected=("$@")
mkdir -p "$work"
echo "== copying the tree to $src"
mkdir -p "$src"
# Files that differ from the copy's are copied (new times: they rebuild); the rest are left as
# they are, so only what changed since the last run builds again.
(cd "$repo" && git ls-files -co --exclude-standard) | grep -v '^tests/data/' |
  while IFS= read -r f; do
    [[ -f "$repo/$f" ]] || continue
    if ! cmp -s "$repo/$f" "$src/$f" 2>/dev/null; then
      mkdir -p "$(dirname "$src/$f")"
      cp "$repo/$f" "$src/$f"
    fi
  done
mkdir -p "$src/tests"
ln -sfn "$repo/tests/data" "$src/tests/data"
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=OFF >/dev/null

status=0
# mutation NAME FILE PERL-SUBSTITUTION TEST-BINARY GTEST-FILTER: FILE mutated (the substitution must
# change it), the test rebuilt and run, and it must fail.
mutation() {
  local name=$1 file=$2 subst=$3 binary=$4 filter=$5
  if [[ ${#selected[@]} -gt 0 && ! " ${selected[*]} " == *" $name "* ]]; then return; fi
  cp "$src/$file" "$src/$file.orig"
  perl -0pi -e "$subst" "$src/$file"
  if cmp -s "$src/$file" "$src/$file.orig"; then
    echo "!! $name: the mutation no longer applies to $file"
    status=1
  else
    echo "== $name ($file): building"
    if ! ninja -C "$build" tandem "$binary" >"$work/$name.build.log" 2>&1; then
      echo "!! $name: the mutated tree does not build (see $work/$name.build.log)"
      status=1
    elif TANDEM_BIN="$build/tandem" "$build/tests/$binary" --gtest_filter="$filter" \
        >"$work/$name.test.log" 2>&1; then
      echo "!! $name: SURVIVED ($binary $filter passed)"
      status=1
    else
      echo "ok $name: caught by $binary ($filter)"
    fi
  fi
  mv "$src/$file.orig" "$src/$file"
  touch "$src/$file"
}

# A request's integer field checked only against its upper bound (n = 0 killed the server).
mutation integer-lower-bound server/request_fields.cpp \
  's/if \(!fits \|\| x < lo \|\| x > hi\)/if (!fits || x > hi)/' \
  test_server_hostile_test '*EveryNumberIsChecked*'
# The stream passing whitespace on as it comes (streamed != whole).
mutation stream-keeps-trailing-space engine/chat_output.cpp \
  's/(void ChatStreamParser::hold_space\(std::string\* out, int k\) \{)/$1\n  return;/' \
  test_unit_engine_chat_output_test '*StreamedPiecesAddUp*'
# Tool-call turns with "content": null handed to the templates as null.
mutation null-content-not-rendered server/openai_request.cpp \
  's/if \(m\["content"\]\.is_null\(\) && msg\.contains\("tool_calls"\)\) m\["content"\] = "";//' \
  test_server_hostile_test '*NullContent*'
# No deadline on a request's bytes (a trickling client holds a thread for ever).
mutation no-request-deadline server/http_connection.cpp \
  's/deadline_ = Clock::now\(\) \+ limits_\.request_timeout;/deadline_ = Clock::now() + std::chrono::hours(1);/' \
  test_server_hostile_test '*SlowClients*'
# A cached block other than the smallest that fits.
mutation not-the-smallest-cached-block runtime/block_pool.cpp \
  's/cached_\.lower_bound\(need\)/cached_.lower_bound(need + need \/ 8)/' \
  test_unit_runtime_block_pool_test '*FreedBlocksServe*'
# A step graph kept when the KV cache changes (stale on a GPU; the host device binds the cache
# into its graphs as CUDA binds pointers, so the replay computes on the old cache).
mutation stale-graph-on-cache-change model/model.cpp \
  's/if \(g\.id >= 0 && \(g\.epoch != ops_->memory_epoch\(\) \|\| !\(g\.cache == key\)\)\)/if (g.id >= 0 \&\& (g.epoch != ops_->memory_epoch()))/' \
  test_model_step_graph_test '*'
# A drift in batched steps only, far below the F32 tolerance (batch == solo is bit for bit).
mutation batch-only-drift model/model.cpp \
  's/(    ops_->lm_head\(rows_, x, logits\);\n)/$1    if (batch.size() > 1) logits[0] += 1e-6f * (1.0f + std::fabs(logits[0]));\n/' \
  test_model_batch_forward_test '*StaggeredSequences*golden_qwen3moe_gguf_reference*'

# Logprobs relative to the largest logit, not normalized (still <= 0, the top one still first).
mutation logprobs-not-normalized engine/generator.cpp \
  's/const float log_z = mx \+ static_cast<float>\(std::log\(sum\)\);/const float log_z = mx;/' \
  test_server_server_test '*LogprobsAreLogSoftmax*'
# Tool calls held until the answer ends (their arguments sent whole, not as they are read).
mutation tool-calls-sent-whole engine/chat_output.cpp \
  's/(  const ToolCallsRead r = read_tool_calls\(tool_text_, syntax_, tools_, final\);\n)/$1  if (!r.ended \&\& !final) return;\n/' \
  test_unit_engine_chat_output_test '*ToolCallsStreamAsTheyAreRead*'
# DeepSeek Sparse Attention's selection ignored: every query attends to all positions before it.
mutation sparse-attention-ignored model/cpu_forward_ops.cpp \
  's/  if \(indexer_\) \{\n    split_by_selection/  if (false \&\& indexer_) {\n    split_by_selection/' \
  test_model_model_golden_test 'Models/Golden.F32Gguf/1?'
# GLM-5's indexer keys and queries rotated as DeepSeek-V3.2's (NeoX halves, not adjacent pairs).
mutation indexer-rope-form model/sparse_attention.cpp \
  's/form_\(c\.index_rope_interleaved \? ops::RopeForm::kInterleaved : ops::RopeForm::kNeox\)/form_(ops::RopeForm::kNeox)/' \
  test_model_model_golden_test 'Models/Golden.F32Gguf/11'

# (the copy's build is left for the next run: only the mutated files rebuild)
ninja -C "$build" tandem >/dev/null 2>&1 || true
exit $status
