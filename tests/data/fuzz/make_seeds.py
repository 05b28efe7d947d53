#!/usr/bin/env python3
"""Writes the fuzzing seed corpora (small valid files) into tests/data/fuzz/<target>/.

Independent of tandem's writers on purpose (plain struct/json), so the seeds also check that the
readers accept files tandem did not write. Run from anywhere: python3 tests/data/fuzz/make_seeds.py
"""
import json
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "..", "golden")

# --- GGUF ---
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
FMT = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32: "f", BOOL: "?",
       U64: "Q", I64: "q", F64: "d"}


def gstr(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def gval(t, v):
    if t == STR:
        return gstr(v)
    if t == ARR:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(gval(et, x) for x in items)
    return struct.pack("<" + FMT[t], v)


def gguf(kvs, tensors, align=32):
    """kvs: [(key, type, value)], tensors: [(name, ne list, ggml type, data bytes)]."""
    out = struct.pack("<4sIQQ", b"GGUF", 3, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += gstr(k) + struct.pack("<I", t) + gval(t, v)
    off = 0
    offsets = []
    for name, ne, gt, data in tensors:
        offsets.append(off)
        out += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        out += struct.pack("<IQ", gt, off)
        off = (off + len(data) + align - 1) // align * align
    if tensors:
        out += b"\0" * (-len(out) % align)
        for _, _, _, data in tensors:
            out += data + b"\0" * (-len(data) % align)
    return out


def write(target, name, data):
    d = os.path.join(HERE, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode("utf-8"))


def q8_0_block():
    return struct.pack("<e", 0.5) + bytes(range(32))


def seeds_gguf():
    write("gguf", "small.gguf", gguf(
        [("general.architecture", STR, "llama"), ("llama.block_count", U32, 2),
         ("llama.rope.freq_base", F32, 10000.0), ("tokenizer.ggml.add_bos_token", BOOL, True),
         ("tokenizer.ggml.tokens", ARR, (STR, ["<s>", "</s>", "a", "\u00e9"])),
         ("tokenizer.ggml.token_type", ARR, (I32, [3, 3, 1, 1]))],
        [("token_embd.weight", [4, 2], 0, struct.pack("<8f", *range(8))),
         ("blk.0.ffn_up.weight", [32, 1], 8, q8_0_block())]))
    write("gguf", "types.gguf", gguf(
        [("u8", U8, 200), ("i8", I8, -3), ("u16", U16, 60000), ("i16", I16, -300),
         ("u32", U32, 1 << 31), ("i32", I32, -1), ("f32", F32, 1.5), ("bool", BOOL, False),
         ("str", STR, "x"), ("u64", U64, 1 << 63), ("i64", I64, -(1 << 62)), ("f64", F64, 2.5),
         ("nested", ARR, (ARR, [(I8, [1, 2]), (STR, ["y"]), (F64, [])]))], []))
    write("gguf", "align64.gguf", gguf(
        [("general.alignment", U32, 64)],
        [("a", [4, 2], 1, bytes(16)), ("b", [3, 1, 2], 24, bytes(6)), ("c", [256], 12, bytes(144))],
        align=64))
    write("gguf", "empty.gguf", gguf([], []))


def safetensors(tensors, metadata=None):
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def seeds_safetensors():
    write("safetensors", "dtypes.safetensors", safetensors(
        [("bf16", "BF16", [2, 2], bytes(8)), ("f16", "F16", [3], bytes(6)),
         ("f32", "F32", [1, 2], struct.pack("<2f", 1, 2)), ("f64", "F64", [1], bytes(8)),
         ("fp8", "F8_E4M3", [4], bytes(4)), ("i8", "I8", [2], bytes(2)), ("u8", "U8", [2], bytes(2)),
         ("i16", "I16", [1], bytes(2)), ("i32", "I32", [1], bytes(4)), ("i64", "I64", [1], bytes(8))],
        {"format": "pt"}))
    write("safetensors", "edge.safetensors", safetensors(
        [("scalar", "F32", [], bytes(4)), ("empty", "F32", [0, 3], b""),
         ("w", "BF16", [1, 1, 1, 2], bytes(4))]))
    write("safetensors", "empty.safetensors", safetensors([]))


def seeds_index():
    write("safetensors_index", "index.json", json.dumps(
        {"metadata": {"total_size": 1234},
         "weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors",
                        "model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}, indent=2))
    write("safetensors_index", "minimal.json", '{"weight_map":{}}')


def seeds_hf_config():
    for model in ["deepseek2", "deepseek3", "mixtral", "qwen2moe", "qwen3moe", "glm4moe",
                  "gpt-oss", "minimax-m2", "deepseek32", "glm-dsa"]:
        d = os.path.join(HERE, "hf_config")
        os.makedirs(d, exist_ok=True)
        shutil.copyfile(os.path.join(GOLDEN, model + "-hf", "config.json"), os.path.join(d, model + ".json"))


# --- routing traces (docs/traces.md, runtime/trace.cpp) ---
SCORES, GATE_PRED, RESIDUAL_PRED, F16, IDS16 = 1, 2, 4, 8, 16


def trace(flags, n_layers, n_experts, top_k, records, model="seed"):
    """records: [(token, batch, phase)]; ids / weights / scores made up from the indices."""
    name = model.encode()
    out = b"TDTRACE1" + struct.pack("<IIIIIQI", 1, flags, n_layers, n_experts, top_k, len(records),
                                    len(name)) + name
    fl = "e" if flags & F16 else "f"
    for r, (token, batch, phase) in enumerate(records):
        out += struct.pack("<iiB3x", token, batch, phase)
        ids = [(r + l + i * 3) % n_experts for l in range(n_layers) for i in range(top_k)]
        out += struct.pack("<%d%s" % (len(ids), "H" if flags & IDS16 else "B"), *ids)
        out += struct.pack("<%d%s" % (len(ids), fl), *[1.0 / (i + 1) for i in range(len(ids))])
        for f in (SCORES, GATE_PRED, RESIDUAL_PRED):
            if flags & f:
                le = n_layers * n_experts
                out += struct.pack("<%d%s" % (le, fl), *[(e % 7) / 7 for e in range(le)])
    return out


def seeds_trace():
    recs = [(0, 0, 0), (1, 0, 0), (2, 0, 0), (3, 1, 1), (4, 2, 1)]
    write("trace", "plain.trace", trace(0, 2, 8, 2, recs))
    write("trace", "scores.trace", trace(SCORES | GATE_PRED | RESIDUAL_PRED, 3, 4, 1, recs))
    write("trace", "f16_ids16.trace", trace(F16 | IDS16 | SCORES, 1, 300, 4, recs[:2]))


def seeds_residuals():
    write("residuals", "r.json", json.dumps(
        {"format": "tandem-residuals", "version": 1, "model": "m", "hidden_size": 3,
         "moe_layers": [1, 2, 4], "tokens": 12, "vectors": [[0.5, -1, 2], [0, 0.25, -3.5]]}))


def seeds_placement():
    write("placement", "rules.yaml", "# pin layer 1's experts, the rest of the MoE on the CPU\n"
          "- match:\n    name: 'layers\\.1\\.experts'\n  device: accel\n  op: fused\n"
          "- match: {module: moe}\n  device: cpu\n  cpu_experts: int4\n"
          "- match: {name: '(embed|lm_head)', module: embedding}\n  dtype: bf16\n")
    write("placement", "empty.yaml", "")


def seeds_openai_request():
    """A selector byte (bit 0: chat; the rest: the template) and a request body."""
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "d",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                              "days": {"type": "integer"}}}}}]
    call = {"id": "call_0", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}
    chats = {
        "plain": {"messages": [{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": "Hi"}], "max_tokens": 8},
        "tools": {"messages": [{"role": "user", "content": "Weather?"},
                               {"role": "assistant", "content": None, "tool_calls": [call]},
                               {"role": "tool", "tool_call_id": "call_0", "content": "sunny"}],
                  "tools": tools, "tool_choice": "auto", "stream": True,
                  "stream_options": {"include_usage": True}},
        "kwargs": {"messages": [{"role": "developer", "content": [{"type": "text", "text": "x"}]},
                                {"role": "user", "content": "y"}],
                   "chat_template_kwargs": {"enable_thinking": False, "reasoning_effort": "low"},
                   "logprobs": True, "top_logprobs": 3, "n": 2, "seed": 7, "stop": ["\n"],
                   "logit_bias": {"5": -100, "6": 2.5}},
        "named_tool": {"messages": [{"role": "user", "content": "w"}], "tools": tools,
                       "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    }
    completions = {
        "text": {"prompt": "And God said", "max_tokens": 4, "temperature": 0.7, "top_p": 0.9,
                 "top_k": 40, "min_p": 0.05, "echo": True, "logprobs": 2},
        "ids": {"prompt": [1, 2, 3, 4], "max_tokens": 2, "repeat_penalty": 1.1,
                "repeat_last_n": 16, "presence_penalty": 0.5, "frequency_penalty": -0.5},
    }
    for t in range(8):
        for name, body in chats.items():
            write("openai_request", f"chat_{name}_{t}.bin",
                  bytes([2 * t + 1]) + json.dumps(body).encode())
    for name, body in completions.items():
        write("openai_request", f"completion_{name}.bin", bytes([0]) + json.dumps(body).encode())


def seeds_chat_output():
    """A selector byte (the tool-call syntax, mod 12: none, hermes, qwen3-coder, glm,
    deepseek-v3, deepseek-r1, kimi, mistral list, mistral args, minimax, harmony, deepseek-dsml)
    and an answer
    written as each family's template writes one."""
    answers = {
        0: "<think>\nplan\n</think>\n\nIt is 7.",
        1: "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
           "{\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"f\", "
           "\"arguments\": {\"n\": 3}}\n</tool_call>",
        2: "<tool_call>\n<function=f>\n<parameter=code>\nprint(\"hi\")\n</parameter>\n"
           "<parameter=n>\n3\n</parameter>\n</function>\n</tool_call>",
        3: "<tool_call>f\n<arg_key>code</arg_key>\n<arg_value>x</arg_value>\n<arg_key>n"
           "</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
        4: "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": "
           "\"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        5: "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
           "{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        6: "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
           "<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|>"
           "<|tool_calls_section_end|>",
        7: "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, "
           "\"id\": \"abcdefghi\"}]",
        8: "[TOOL_CALLS]get_weather[CALL_ID]abcdefghi[ARGS]{\"city\": \"Paris\"}",
        9: "<minimax:tool_call>\n<invoke name=\"f\">\n<parameter name=\"code\">x</parameter>\n"
           "<parameter name=\"n\">3</parameter>\n</invoke>\n</minimax:tool_call>",
        10: "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
            "{\"city\": \"Paris\"}",
        11: "\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter "
            "name=\"code\" string=\"true\">x</｜DSML｜parameter>\n<｜DSML｜parameter name=\"n\" "
            "string=\"false\">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
    }
    for syntax, text in answers.items():
        write("chat_output", f"answer_{syntax}.bin", bytes([syntax]) + text.encode("utf-8"))


if __name__ == "__main__":
    seeds_chat_output()
    seeds_openai_request()
    seeds_gguf()
    seeds_safetensors()
    seeds_index()
    seeds_hf_config()
    seeds_trace()
    seeds_residuals()
    seeds_placement()
