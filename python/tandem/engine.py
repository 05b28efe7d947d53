"""The engine from Python: a model loaded on tandem's engine, generating and chatting."""

from __future__ import annotations

import codecs
import json
import os
import threading
from typing import Iterator, Sequence, Union

from . import _tandem


def _flag_args(flags: dict) -> list:
    """Keywords as the CLI's flags: True a bare --flag, False its --no- form, None left out."""
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
    """A model on tandem's engine: its weights, KV cache and generator, generating and chatting
    from Python.

    Args:
        path: a .gguf file (split files: the first) or a Hugging Face directory.
        threads: compute threads (0: one per physical core).
        ctx: positions per sequence (0: the trained context, at most 4096; the CLI's --ctx).
        cache_type: the KV cache's element type, as the CLI's --cache-type: "f32", "bf16",
            "f16" or "q8_0".
        max_sequences: requests decoded together (generate / chat calls iterated at the same
            time share each forward).
        checkpoints, checkpoint_every: hybrid models' (Qwen3.5, Qwen3-Next) recurrent-state
            checkpoints per sequence the cache has room for and their interval, where a prompt
            sharing a prefix resumes (the CLI's --checkpoints / --checkpoint-every).
        **backend_flags: the CLI's backend flags as keywords (cpu_experts="int8",
            accel="host", gpu_experts=8, expert_cache=False, ...): --flag value, True a bare
            flag, False its --no- form; checked as the CLI checks them.

    Returns:
        The loaded model. A bad flag or value raises ValueError, an unreadable file OSError.

    Example:
        >>> model = tandem.Model("model.gguf", threads=16, ctx=8192, cpu_experts="repack")
        >>> model.generate("The capital of France is", max_tokens=8)
    """

    def __init__(self, path: str, *, threads: int = 0, ctx: int = 0, cache_type: str = "f32",
                 max_sequences: int = 4, checkpoints: int = 4, checkpoint_every: int = 1024,
                 **backend_flags):
        self._m = _tandem.Model(path=os.fspath(path), threads=int(threads), ctx=int(ctx),
                                cache_type=cache_type, max_sequences=int(max_sequences),
                                checkpoints=int(checkpoints),
                                checkpoint_every=int(checkpoint_every),
                                backend_args=_flag_args(backend_flags))
        self._queues = {}
        self._lock = threading.RLock()

    @property
    def context_size(self) -> int:
        """Positions per sequence: a prompt and its continuation fit in this many tokens.

        Returns:
            int.

        Example:
            >>> tandem.Model("model.gguf", ctx=4096).context_size
            4096
        """
        return self._m.context_size

    def __repr__(self):
        return f"tandem.Model({self._m.summary})"

    def tokenize(self, text: str, add_special: bool = True) -> list:
        """The model's token ids of a text.

        Args:
            text: the text (str).
            add_special: with the tokens the model puts around a text (BOS), as the CLI does.

        Returns:
            A list of int token ids.

        Example:
            >>> ids = model.tokenize("Hello")
        """
        return self._m.encode(text, add_special)

    def detokenize(self, ids: Sequence[int]) -> str:
        """The text of token ids.

        Args:
            ids: token ids (ints).

        Returns:
            str; bytes that are not UTF-8 (a character split across the ids' ends) are U+FFFD.

        Example:
            >>> model.detokenize(model.tokenize("Hello", add_special=False))
            'Hello'
        """
        return self._m.decode([int(i) for i in ids]).decode("utf-8", "replace")

    def generate(self, prompt: Union[str, Sequence[int]], *, stream: bool = False, **params):
        """The continuation of a prompt.

        Args:
            prompt: text (tokenized with add_special) or token ids.
            stream: True: an iterator of text pieces as they are decoded (closing it early
                cancels the request); False: the whole text.
            **params: max_tokens (default 128), temperature (0: greedy), top_k (0: off), top_p,
                min_p, seed, repeat_penalty, presence_penalty, frequency_penalty, stop (a string
                or strings that end the generation), ignore_eos.

        Returns:
            str, or an iterator of str with stream=True. A parameter out of range raises
            ValueError; a failed generation RuntimeError.

        Example:
            >>> model.generate("The capital of France is", max_tokens=8, temperature=0)
        """
        ids = self.tokenize(prompt) if isinstance(prompt, str) else [int(i) for i in prompt]
        it = self._run(ids, True, **params)
        return it if stream else "".join(it)

    def chat(self, messages: Sequence[dict], *, stream: bool = False, **params):
        """The assistant's answer to a conversation, rendered with the model's chat template.

        Args:
            messages: [{"role": ..., "content": ...}, ...] (JSON-serializable dicts; tool calls
                as the template reads them).
            stream, **params: as generate()'s.

        Returns:
            str, or an iterator of str with stream=True.

        Example:
            >>> for piece in model.chat([{"role": "user", "content": "Hi"}], stream=True):
            ...     print(piece, end="")
        """
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
            rid = self._m.submit(prompt=ids, continues_prompt=continues,
                                 max_tokens=int(max_tokens), temperature=float(temperature),
                                 top_k=int(top_k), top_p=float(top_p), min_p=float(min_p),
                                 seed=int(seed), repeat_penalty=float(repeat_penalty),
                                 presence_penalty=float(presence_penalty),
                                 frequency_penalty=float(frequency_penalty),
                                 stop=list(stop or []), ignore_eos=bool(ignore_eos))
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
