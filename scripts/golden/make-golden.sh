#!/usr/bin/env bash
# Writes the golden data of the architectures tandem synthesizes itself (tests/data/golden):
#   scripts/golden/make-golden.sh LLAMA_CPP_DIR LLAMA_CPP_BUILD_DIR [ARCH ...]
# For each arch (default: glm4moe minimax-m2 gpt-oss): `tandem synth` writes the tiny model as F32 GGUF,
# BF16 HF, Q8_0, Q4_K_M and MXFP4_MOE GGUF (seed 1234, the golden vocabulary of qwen3moe.gguf), and
# llama.cpp (scripts/golden/llama_ref.cpp, compiled here against LLAMA_CPP_BUILD_DIR) computes
# the logits of every position of the two golden prompts, the 16 greedy tokens after them, the
# experts every position selects and their counts for the 40-token prompt, into NAME.json /
# NAME[-TYPE].pK.f32. The hybrid architectures (qwen3next, qwen35moe) get a third prompt of 300
# tokens: past four chunks of the Gated DeltaNet's chunked form.
set -euo pipefail
llama=${1:?llama.cpp source directory}
build=${2:?llama.cpp build directory (holding bin/libllama.so)}
shift 2
arches=("$@")
[ ${#arches[@]} -gt 0 ] || arches=(glm4moe minimax-m2 gpt-oss)
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$root/tests/data/golden
tandem=${TANDEM:-$root/build/tandem}
ref=$(mktemp -d)/llama_ref
g++ -O1 -std=c++17 "$root/scripts/golden/llama_ref.cpp" -I"$llama/include" -I"$llama/ggml/include" \
  -L"$build/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$build/bin" -o "$ref"
commit=$(git -C "$llama" rev-parse HEAD)
vocab=$out/qwen3moe.gguf
p0=497,425,443,388,483,63,116
p1=497,22,229,7,426,424,133,290,71,422,434,442,347,105,213,104,478,223,318,484,306,441,140,393,55,44,117,110,462,55,110,70,326,406,381,250,117,268,225,495
# BOS, then 299 ids of an LCG in [0, 497).
p2=$(/usr/bin/python3 -c 'x=12345
ids=[497]
for _ in range(299):
    x=(1103515245*x+12345)%2**31; ids.append(x//65536%497)
print(",".join(map(str,ids)))')
for arch in "${arches[@]}"; do
  prompts=("$p0" "$p1")
  case $arch in qwen3next|qwen35moe) prompts+=("$p2") ;; esac
  "$tandem" synth --arch "$arch" --vocab "$vocab" --seed 1234 -o "$out/$arch.gguf" >/dev/null
  rm -rf "$out/$arch-hf"
  "$tandem" synth --arch "$arch" --vocab "$vocab" --seed 1234 --format hf -o "$out/$arch-hf" >/dev/null
  # The tokenizer is in the GGUF; the HF directory keeps config.json and the weights.
  rm -f "$out/$arch-hf"/tokenizer*.json "$out/$arch-hf"/generation_config.json
  for type in q8_0 q4_k_m mxfp4_moe; do
    "$tandem" synth --arch "$arch" --vocab "$vocab" --seed 1234 --type $type -o "$out/$arch-$type.gguf" >/dev/null
  done
  for suffix in "" -q8_0 -q4_k_m -mxfp4_moe; do
    for k in "${!prompts[@]}"; do
      "$ref" logits "$out/$arch$suffix.gguf" "$out/$arch$suffix.p$k.f32" "${prompts[$k]}" \
        > "$out/.$arch$suffix.p$k.json" 2>/dev/null
    done
  done
  /usr/bin/python3 - "$out" "$arch" "$commit" "${prompts[@]}" <<'PY'
import json, os, sys
out, arch, commit = sys.argv[1:4]
prompts = [[int(t) for t in p.split(",")] for p in sys.argv[4:]]
def runs(suffix):
    res = []
    for k, toks in enumerate(prompts):
        path = f"{out}/.{arch}{suffix}.p{k}.json"
        r = json.load(open(path)); os.remove(path)
        res.append((toks, r))
    return res
def prompt_list(suffix):
    return [{"tokens": toks, "n_tokens": len(toks), "logits_file": f"{arch}{suffix}.p{k}.f32",
             "greedy": r["greedy"], "experts": r["experts"]}
            for k, (toks, r) in enumerate(runs(suffix))]
f32 = runs("")
cfg = json.load(open(f"{out}/{arch}-hf/config.json"))
meta = {"arch": arch, "hf_architecture": cfg["architectures"][0], "gguf_arch": arch,
        "n_vocab": 512, "bos_token_id": 497, "add_bos": True, "bos_prepended_in_tokens": True,
        "gguf": f"{arch}.gguf", "hf_dir": f"{arch}-hf", "llama_cpp_commit": commit,
        "generator_args": ["tandem", "synth", "--arch", arch, "--vocab", "golden/qwen3moe.gguf",
                           "--seed", "1234"],
        "llama_cpp_context": {"kv_cache_type": "f32", "flash_attn": False, "n_threads": 1,
                              "n_ubatch": 512},
        "expert_usage_prompt1": f32[1][1]["expert_usage"],
        "prompts": [{"tokens": t, "n_tokens": len(t), "logits_file": f"{arch}.p{k}.f32",
                     "greedy": r["greedy"], "experts": r["experts"]}
                    for k, (t, r) in enumerate(f32)],
        "quantized": {q: {"gguf": f"{arch}-{q}.gguf", "prompts": prompt_list("-" + q)}
                      for q in ("q8_0", "q4_k_m", "mxfp4_moe")}}
json.dump(meta, open(f"{out}/{arch}.json", "w"), indent=1)
PY
  echo "golden: $arch (llama.cpp $commit)"
done
