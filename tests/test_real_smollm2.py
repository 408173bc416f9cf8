"""The registry's real chat model, `smollm2-135m` (SmolLM2-135M-Instruct, llama, ChatML), by
name: answers that read right through the server (official `openai` client), the Responses
API, `Session` and the CLI, and exact restores on a second real architecture.

Slow (a load is seconds; the first use converts the GGUF). Skipped unless the file is on the
machine (`forkv pull smollm2-135m`, which .ci/run and the README's test command run): tests
never download.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from forkv.engine.models.named import NAMED_MODELS

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not NAMED_MODELS["smollm2-135m"].is_local(),
    reason="smollm2-135m is not fetched here: run `forkv pull smollm2-135m`")]

NAME = "smollm2-135m"
# Questions whose first answer token leads by more than a nat on every path (the kernels,
# float32 dequantized): SmolLM2-135M is at a near tie on many others ("What is the capital of
# France?" after "You are a concise assistant." leads by 0.00 nats in float32, and int8
# activations flip it to French), so those would test luck, not forkv.
FACTS = [("What is the capital of Japan?", "Tokyo"),
         ("What is the capital of Germany?", "Berlin")]


@pytest.fixture(scope="module")
def url():
    from server_proc import shared_server

    return shared_server("--model", NAME)


@pytest.fixture(scope="module")
def client(url):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused")


@pytest.mark.parametrize("question, answer", FACTS)
def test_the_server_answers_factual_questions(client, question, answer):
    chat = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": question}], max_tokens=32,
        temperature=0)
    text = chat.choices[0].message.content
    assert answer in text and "<|im_" not in text and "<think>" not in text, text
    assert chat.choices[0].finish_reason == "stop"  # <|im_end|> ends the turn


def test_the_next_turn_reuses_the_conversation(client):
    messages = [{"role": "system", "content": "You are a concise assistant."},
                {"role": "user", "content": "What is the capital of Japan?"}]
    first = client.chat.completions.create(model=NAME, messages=messages, max_tokens=32,
                                           temperature=0)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And the capital of Germany?"}]
    second = client.chat.completions.create(model=NAME, messages=messages, max_tokens=32,
                                            temperature=0)
    assert "Berlin" in second.choices[0].message.content
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens


def test_the_responses_api_answers(client):
    out = client.responses.create(model=NAME, input="What is the capital of Japan?",
                                  max_output_tokens=32, temperature=0)
    assert "Tokyo" in out.output_text, out.output_text
    assert not [item for item in out.output if item.type == "reasoning"]


def test_models_lists_both_real_models_as_available():
    """A server without --model lists what it can load here: both real models, by name."""
    from server_proc import http, running_server

    with running_server() as url:
        status, body = http("GET", f"{url}/v1/models")
    assert status == 200
    listed = {m["id"]: m.get("status") for m in body["data"]}
    assert listed.get(NAME) == "available", listed
    if NAMED_MODELS["gemma3-270m"].is_local():
        assert listed.get("gemma3-270m") == "available", listed


def test_a_session_answers_and_follows_up():
    import forkv

    with forkv.Session(NAME) as session:
        user = session.system("You are a concise assistant.").user(
            "What is the capital of Japan?")
        answer = user.final({"max_tokens": 32})
        session.run(answer)
        assert "Tokyo" in answer.text, answer.text
        follow = answer.user("And of Germany?").final({"max_tokens": 32})
        session.run(follow)
        assert "Berlin" in follow.text, follow.text
        assert follow.result.stats.tokens_reused >= answer.result.stats.tokens_computed


def test_restores_are_bit_exact_on_smollm2():
    import mlx.core as mx

    from forkv.engine import Engine, load_model
    from forkv.engine.cache.recordstore import RecordStore
    from helpers import MemoryDisk, fresh_logits
    from test_real_gemma import _long_text, _restore_logits

    lm = load_model(NAME)
    engine = Engine(lm, store=RecordStore(0, MemoryDisk()))
    prompt = engine.encode(_long_text(700, lm))[:700]
    engine.generate(prompt, max_tokens=4)
    follow = engine.encode(" And then the riders went home.")
    for cut in (256, 512):
        tokens = prompt[:cut] + follow
        position, got = _restore_logits(engine, tokens)
        assert position == cut
        assert mx.array_equal(got, fresh_logits(lm, tokens)).item(), cut
    engine.close()


def test_the_streaming_detokenizer_decodes_as_the_tokenizer():
    import random

    from forkv.engine import load_model
    from forkv.engine.request.textstream import plain_decode

    tok = load_model(NAME).tokenizer
    decode, rng = plain_decode(tok), random.Random(3)
    assert decode is not tok.decode  # the tokenizers backend's own decode
    for n in (1, 3, 30):
        for _ in range(50):
            ids = [rng.randrange(len(tok.get_vocab())) for _ in range(n)]
            assert decode(ids) == tok.decode(ids), ids


README = (__import__("pathlib").Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_the_readme_server_example_runs(url, capsys):
    import re

    (code,) = re.findall(r"```py\n(.*?)```", README, flags=re.S)
    exec(compile(code.replace("http://127.0.0.1:8000", url), "README.md", "exec"),  # noqa: S102
         {"__name__": "__readme__"})
    assert "Tokyo" in capsys.readouterr().out


def test_the_readme_cli_example_runs():
    import re
    import shlex

    (line,) = [ln for ln in re.findall(r"```bash\n(.*?)```", README, flags=re.S)
               if "--model smollm2-135m" in ln]
    args = shlex.split(line.strip())
    assert args[:2] == ["forkv", "generate"]
    out = subprocess.run([sys.executable, "-m", "forkv.cli", *args[1:]], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and "Tokyo" in out.stdout, out.stdout + out.stderr


def test_chat_completions_encode_a_growing_chat_as_the_engine_does():
    """The server's chat encodings (sdk/server/chat_encode.py) on SmolLM2's tokenizer: every
    request of a growing chat gets the engine's own tokens, extended from the last render,
    and so do rewinds."""
    from forkv.engine import load_model
    from test_server_chat_encode import matches_the_engine

    matches_the_engine(load_model(NAME))
