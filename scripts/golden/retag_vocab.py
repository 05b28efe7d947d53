#!/usr/bin/python3
# A copy of a vocabulary-only GGUF with another tokenizer.ggml.pre: the same tokens and merges,
# split by another model family's pre-tokenizer (tests/data/vocab). Needs llama.cpp's gguf-py:
#   PYTHONPATH=LLAMA_CPP/gguf-py scripts/golden/retag_vocab.py IN.gguf OUT.gguf PRE
import sys

import gguf

src, dst, pre = sys.argv[1:4]
r = gguf.GGUFReader(src)
arch = r.fields["general.architecture"].contents()
w = gguf.GGUFWriter(dst, arch)
for name, field in r.fields.items():
    if name.startswith("GGUF.") or name == "general.architecture":
        continue
    value = pre if name == "tokenizer.ggml.pre" else field.contents()
    vtype = field.types[0]
    sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
    w.add_key_value(name, value, vtype, sub_type=sub)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
