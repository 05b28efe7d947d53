# tandem.Model: the engine from Python, against the `tandem` CLI on the demo model.
import subprocess

import pytest

import tandem
from conftest import data_path

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def demo():
    return str(data_path("demo", "tandem-demo-moe-Q4_K_M.gguf"))


@pytest.fixture(scope="module")
def model(demo):
    return tandem.Model(demo, threads=2, ctx=256, max_sequences=4)


PROMPTS = ["Once upon a time", "The capital of France", "1, 2, 3, 4,"]


def interleaved(m, prompts, **params):
    """The prompts' streams read a piece at a time in turn (decoded together), joined."""
    streams = [m.generate(p, stream=True, **params) for p in prompts]
    got = [""] * len(prompts)
    live = set(range(len(prompts)))
    while live:
        for i in sorted(live):
            try:
                got[i] += next(streams[i])
            except StopIteration:
                live.discard(i)
    return got


def run_cli(tandem_bin, *args):
    r = subprocess.run([tandem_bin, "run", *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_generate_equals_the_cli(model, demo, tandem_bin):
    cli = run_cli(tandem_bin, "-m", demo, "-p", PROMPT, "-n", "24", "--threads", "2")
    got = model.generate(PROMPT, max_tokens=24)
    assert cli == PROMPT + got + "\n"
    assert len(got) > 0


def test_accelerator_gives_the_same_text(model, demo):
    # accel="host": the dense part on the emulated accelerator, the experts through the hybrid
    # backend; greedy text equal to the CPU's, for one request and for three at once.
    accel = tandem.Model(demo, threads=2, ctx=256, max_sequences=4, accel="host",
                         vram_budget="64M", link="none")
    assert "dense part on the accelerator" in repr(accel)
    assert accel.generate(PROMPT, max_tokens=16, temperature=0) == \
        model.generate(PROMPT, max_tokens=16, temperature=0)
    got = interleaved(accel, PROMPTS, max_tokens=10, temperature=0)
    assert got == [model.generate(p, max_tokens=10, temperature=0) for p in PROMPTS]


def test_chat_equals_the_cli(model, demo, tandem_bin):
    q = "What is the capital of France?"
    cli = run_cli(tandem_bin, "-m", demo, "--chat", "-p", q, "-n", "20", "--threads", "2")
    assert cli == model.chat([{"role": "user", "content": q}], max_tokens=20) + "\n"


def test_stream_pieces_join_to_the_whole(model):
    pieces = list(model.generate(PROMPT, max_tokens=16, stream=True))
    assert len(pieces) > 1
    assert "".join(pieces) == model.generate(PROMPT, max_tokens=16)


def test_interleaved_streams_equal_their_solo_runs(model):
    solo = [model.generate(p, max_tokens=12) for p in PROMPTS]
    assert interleaved(model, PROMPTS, max_tokens=12) == solo


def test_abandoned_stream_is_cancelled(model):
    it = model.generate(PROMPT, max_tokens=50, stream=True, ignore_eos=True)
    next(it)
    it.close()  # cancels the request
    # The engine ends it at its next step (without the cancel it would run its 49 tokens more).
    steps = 0
    while not model._m.idle():
        model._m.step()
        steps += 1
        assert steps <= 2, "the abandoned request kept running"
    assert model.generate(PROMPT, max_tokens=5) == model.generate(PROMPT, max_tokens=5)


def test_sampling_seed_repeats(model):
    a = model.generate(PROMPT, max_tokens=12, temperature=0.9, top_k=40, seed=7)
    b = model.generate(PROMPT, max_tokens=12, temperature=0.9, top_k=40, seed=7)
    assert a == b
    # The temperature and the seed are used: sampled answers differ across seeds and from the
    # greedy one (which a temperature of 0 gives, whatever the seed).
    greedy = model.generate(PROMPT, max_tokens=12, temperature=0, ignore_eos=True)
    assert model.generate(PROMPT, max_tokens=12, temperature=0, seed=3, ignore_eos=True) == greedy
    sampled = {model.generate(PROMPT, max_tokens=12, temperature=1.5, seed=s, ignore_eos=True)
               for s in range(6)}
    assert len(sampled) > 1, sampled
    assert sampled != {greedy}


def test_token_ids_and_stop(model):
    ids = model.tokenize(PROMPT)
    assert model.generate(ids, max_tokens=10) == model.generate(PROMPT, max_tokens=10)
    whole = model.generate(PROMPT, max_tokens=24)
    starts = [i for i in range(len(whole) // 2, len(whole) - 3) if whole[i:i + 3].strip()]
    assert starts, f"no stop string to cut {whole!r} at"
    stop = whole[starts[0]:starts[0] + 3]
    assert model.generate(PROMPT, max_tokens=24, stop=[stop]) == whole[:whole.index(stop)]


def test_bad_input_raises_and_the_model_keeps_working(model, demo):
    with pytest.raises(ValueError, match="temperature"):
        model.generate(PROMPT, temperature=-1)
    with pytest.raises(ValueError, match="token id"):
        model.generate([10 ** 9], max_tokens=2)
    with pytest.raises(ValueError, match="context"):
        model.generate([1] * 300, max_tokens=2)
    with pytest.raises(ValueError, match="cpu-experts|cpu_experts"):
        tandem.Model(demo, cpu_experts="int3")
    with pytest.raises(ValueError, match="no-such-flag"):
        tandem.Model(demo, no_such_flag=1)
    with pytest.raises(OSError):
        tandem.Model("/nonexistent.gguf")
    assert model.generate(PROMPT, max_tokens=3)


def test_detokenize_replaces_split_characters(model):
    """A character split across the ids' ends is U+FFFD, as the server and the streams write it
    (it raised UnicodeDecodeError)."""
    ids = model.tokenize("\u00e9t\u00e9 \U0001F600", add_special=False)
    assert model.detokenize(ids) == "\u00e9t\u00e9 \U0001F600"
    pieces = [model.detokenize([i]) for i in ids]
    assert any("\ufffd" in p for p in pieces), pieces  # byte tokens: halves of characters
    for cut in range(1, len(ids)):
        text = model.detokenize(ids[:cut])
        assert isinstance(text, str)
        assert text.replace("\ufffd", "") in "\u00e9t\u00e9 \U0001F600"


def test_bench_serve_fails_when_requests_fail(tandem_bin):
    """bench-serve against nothing: every request fails, the exit status says so."""
    r = subprocess.run([tandem_bin, "bench-serve", "--url", "http://127.0.0.1:9", "--clients", "1",
                        "--requests", "2"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0, r.stdout
    assert "2 of 2 requests failed" in r.stderr, r.stderr


def test_python_threads_share_the_model(model):
    import threading
    prompts = ["Once upon a time", "The capital of France", "1, 2, 3, 4,"]
    solo = [model.generate(p, max_tokens=10) for p in prompts]
    got = [None] * 3

    def run(i):
        got[i] = model.generate(prompts[i], max_tokens=10)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert got == solo


def test_hybrid_model_equals_the_cli_alone_together_and_on_the_accelerator(tandem_bin):
    # Qwen3.5-MoE (DeltaNet layers with a recurrent state, gated attention): greedy text equals
    # the CLI's; three requests at once each equal their solo runs; a turn that extends the last
    # one resumes from its checkpoints and still gives the CLI's text; accel="host" gives the same.
    path = str(data_path("golden", "qwen35moe.gguf"))
    m = tandem.Model(path, threads=2, ctx=512, max_sequences=4, checkpoints=2,
                     checkpoint_every=16)
    cli = run_cli(tandem_bin, "-m", path, "-p", PROMPT, "-n", "12", "--threads", "2")
    got = m.generate(PROMPT, max_tokens=12, temperature=0, ignore_eos=True)
    assert cli == PROMPT + got + "\n"
    solo = [m.generate(p, max_tokens=10, temperature=0, ignore_eos=True) for p in PROMPTS]
    assert interleaved(m, PROMPTS, max_tokens=10, temperature=0, ignore_eos=True) == solo
    longer = PROMPT + got + " and then"
    cli = run_cli(tandem_bin, "-m", path, "-p", longer, "-n", "8", "--threads", "2")
    assert cli == longer + m.generate(longer, max_tokens=8, temperature=0, ignore_eos=True) + "\n"
    accel = tandem.Model(path, threads=2, ctx=512, max_sequences=4, accel="host",
                         vram_budget="64M", link="none")
    assert interleaved(accel, PROMPTS, max_tokens=10, temperature=0, ignore_eos=True) == solo
    with pytest.raises(ValueError, match="checkpoints"):
        tandem.Model(path, checkpoints=-1)


@pytest.mark.parametrize("name", ["deepseek32", "glm-dsa"])
def test_sparse_attention_model_continues_as_llama_cpp(name):
    # DeepSeek-V3.2 / GLM-5 (the lightning indexer: the 40-token golden prompt attends to 16
    # selected positions from position 16 on): the greedy continuation of the prompt's token ids
    # is llama.cpp's (tests/data/golden), on the CPU and with the dense part on the host device,
    # alone and beside other requests.
    import json
    meta = json.loads(data_path("golden", name + ".json").read_text())
    prompt = meta["prompts"][1]
    path = str(data_path("golden", name + ".gguf"))
    m = tandem.Model(path, threads=2, ctx=128, max_sequences=4)
    want = m.detokenize(prompt["greedy"])
    assert m.generate(prompt["tokens"], max_tokens=16, temperature=0, ignore_eos=True) == want
    accel = tandem.Model(path, threads=2, ctx=128, max_sequences=4, accel="host",
                         vram_budget="64M", link="none")
    got = interleaved(accel, [prompt["tokens"], PROMPT, prompt["tokens"][:20]], max_tokens=16,
                      temperature=0, ignore_eos=True)
    assert got[0] == want
    assert got[1] == m.generate(PROMPT, max_tokens=16, temperature=0, ignore_eos=True)
