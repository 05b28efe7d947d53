# A reader of .safetensors files for the tests (the format: an 8-byte little-endian header size,
# a JSON header of name -> dtype, shape, data_offsets, then the raw bytes), independent of tandem's.
import json
import struct

import torch

_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I32": torch.int32, "I64": torch.int64, "U8": torch.uint8,
           "F8_E4M3": torch.uint8}  # (FP8 as its bytes: fp8_e4m3_values decodes them)


def fp8_e4m3_values(raw: torch.Tensor) -> torch.Tensor:
    """FP8 E4M3 (OCP's e4m3fn: bias 7, no infinities, S.1111.111 NaN) bytes as float32."""
    table = []
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e, m = (b >> 3) & 15, b & 7
        if e == 15 and m == 7:
            table.append(float("nan"))
        elif e == 0:
            table.append(sign * m / 8 * 2.0 ** -6)
        else:
            table.append(sign * (1 + m / 8) * 2.0 ** (e - 7))
    return torch.tensor(table, dtype=torch.float32)[raw.long()]


def read_safetensors(path) -> dict:
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        t = torch.frombuffer(bytearray(blob[base + b:base + e]), dtype=_DTYPES[info["dtype"]])
        out[name] = t.reshape(info["shape"])
    return out
