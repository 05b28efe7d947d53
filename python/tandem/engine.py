"""The engine from Python: a model loaded on tandem's engine, generating and chatting."""

from __future__ import annotations

import codecs
import json
import os
import threading
from typing import Iterator, Sequence, Union

from . import _tandem


def _flag_args(flags: dict) -> list:
    args = []
    for key, value in flags.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value is False:
            args.append("--no-" + key.replace("_", "-"))
        elif value is not None:
            args += [flag, str(value)]
    return args


class Model:
    """A model on tandem's engine. path: a .gguf file or an HF directory; backend_flags: the
    CLI's backend flags as keywords (cpu_experts="int8", accel="host", gpu_experts=8,
    expert_cache=False, ...); ctx: positions per sequence (0: the trained context, at most
    4096); max_sequences: requests decoded
    together (generate / chat calls iterated at the same time share each forward); checkpoints,
    checkpoint_every: hybrid models' (Qwen3.5, Qwen3-Next) recurrent-state checkpoints per
    sequence the cache has room for and their interval, where a prompt sharing a prefix resumes (the CLI's
    --checkpoints / --checkpoint-every)."""

    def __init__(self, path: str, *, threads: int = 0, ctx: int = 0, cache_type: str = "f32",
                 max_sequences: int = 4, checkpoints: int = 4, checkpoint_every: int = 1024,
                 **backend_flags):
        self._m = _tandem.Model(os.fspath(path), int(threads), int(ctx), cache_type,
                                int(max_sequences), int(checkpoints), int(checkpoint_every),
                                _flag_args(backend_flags))
        self._queues = {}
        self._lock = threading.RLock()

    @property
    def context_size(self) -> int:
        return self._m.context_size

    def __repr__(self):
        return f"tandem.Model({self._m.summary})"

    def tokenize(self, text: str, add_special: bool = True) -> list:
        return self._m.encode(text, add_special)

    def detokenize(self, ids: Sequence[int]) -> str:
        """The text of token ids; bytes that are not UTF-8 (a character split across the ids'
        ends) are U+FFFD."""
        return self._m.decode([int(i) for i in ids]).decode("utf-8", "replace")

    def generate(self, prompt: Union[str, Sequence[int]], *, stream: bool = False, **params):
        """The continuation of a prompt (text, or token ids). params: max_tokens (default 128),
        temperature (0: greedy), top_k, top_p, min_p, seed, repeat_penalty, presence_penalty,
        frequency_penalty, stop (strings), ignore_eos. stream=True: an iterator of text pieces."""
        ids = self.tokenize(prompt) if isinstance(prompt, str) else [int(i) for i in prompt]
        it = self._run(ids, True, **params)
        return it if stream else "".join(it)

    def chat(self, messages: Sequence[dict], *, stream: bool = False, **params):
        """The assistant's answer to messages ([{"role": ..., "content": ...}]) rendered with the
        model's chat template; params and stream as generate()."""
        ids = self._m.chat_prompt(json.dumps(list(messages)))
        it = self._run(ids, False, **params)
        return it if stream else "".join(it)

    def _run(self, ids, continues, max_tokens=128, temperature=0.0, top_k=0, top_p=1.0,
             min_p=0.0, seed=0, repeat_penalty=1.0, presence_penalty=0.0,
             frequency_penalty=0.0, stop=None, ignore_eos=False) -> Iterator[str]:
        if isinstance(stop, str):
            stop = [stop]
        checks = (("max_tokens", max_tokens, max_tokens >= 0),
                  ("temperature", temperature, 0 <= temperature < float("inf")),
                  ("top_k", top_k, top_k >= 0), ("top_p", top_p, 0 < top_p <= 1),
                  ("min_p", min_p, 0 <= min_p <= 1),
                  ("repeat_penalty", repeat_penalty, 0 < repeat_penalty < float("inf")))
        for name, value, ok in checks:
            if not ok:
                raise ValueError(f"{name} {value!r} is out of range")
        with self._lock:  # (the generator is one thread's at a time; step() holds this lock)
            rid = self._m.submit(ids, continues, int(max_tokens), float(temperature), int(top_k),
                                 float(top_p), float(min_p), int(seed), float(repeat_penalty),
                                 float(presence_penalty), float(frequency_penalty),
                                 list(stop or []), bool(ignore_eos))
            queue = self._queues[rid] = []
        return self._events(rid, queue)

    def _events(self, rid, queue) -> Iterator[str]:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        done = False
        try:
            while not done:
                while not queue:
                    with self._lock:  # one step at a time; it feeds every request's queue
                        if not queue:
                            if self._m.idle():  # (never: every request ends with an event)
                                raise RuntimeError(f"request {rid} ended without a final event")
                            for r, text, _, finish, error in self._m.step():
                                q = self._queues.get(r)
                                if q is not None:
                                    q.append((text, finish, error))
                text, finish, error = queue.pop(0)
                if finish == "error":
                    raise RuntimeError(f"generation failed: {error}")
                piece = decoder.decode(text, final=bool(finish))
                if piece:
                    yield piece
                done = bool(finish)
        finally:
            with self._lock:
                self._queues.pop(rid, None)
                if not done:
                    self._m.cancel(rid)
