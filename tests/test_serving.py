"""``t5xl serve`` through the official ``openai`` client: a Qwen2 checkpoint (random
weights, moved off transformers' zero biases) with a ChatML tokenizer is imported, served
on a loopback port, and every answer is checked against transformers running the same
model: greedy completions against ``generate``, log-probabilities against its forward
pass, chat against ``apply_chat_template``. Streaming, seeds, concurrent clients and the
refusals of bad requests (4xx, one line, the server still answering) too."""

import concurrent.futures
import json
import threading
import time

import httpx
import numpy as np
import openai
import pytest
import torch
import transformers
from test_chat_sft import CONVERSATIONS, make_tokenizer
from test_convert_open_decoders import SMALL, perturbed

from t5x_like import serve, train
from t5x_like.convert import __main__ as convert_cli
from t5x_like.serving import server

PROMPTS = ["What is the capital of France?", "Say hello", "Paris. And of Spain? Madrid,",
           "Bonjour", "user: You answer briefly."]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The server on a free loopback port, with the transformers model it was imported
    from and that model's tokenizer."""
    import uvicorn

    folder = tmp_path_factory.mktemp("serving")
    hf = make_tokenizer(folder / "hf")
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf)
    torch.manual_seed(0)
    settings = dict(SMALL, vocab_size=400, max_position_embeddings=128,
                    tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                    pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    model = perturbed(transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**settings)))
    model.save_pretrained(hf)
    convert_cli.import_hf(str(hf), str(folder / "qwen"))
    checkpoint = str(folder / "qwen")
    app, name = server.app_for(checkpoint, model_name=serve.model_name(checkpoint))
    running = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not running.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    port = running.servers[0].sockets[0].getsockname()[1]
    base = f"http://127.0.0.1:{port}/v1"
    yield {"base": base, "name": name, "model": model, "tokenizer": tokenizer,
           "checkpoint": checkpoint, "app": app,
           "client": openai.OpenAI(base_url=base, api_key="unused", max_retries=0,
                                   timeout=120)}
    running.should_exit = True
    thread.join(timeout=30)


def hf_greedy(served, ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy continuation of ``ids``, cut before EOS."""
    with torch.no_grad():
        out = served["model"].generate(
            input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
            eos_token_id=served["tokenizer"].eos_token_id,
            pad_token_id=served["tokenizer"].pad_token_id)[0, len(ids):].tolist()
    eos = served["tokenizer"].eos_token_id
    return out[:out.index(eos)] if eos in out else out


def encode(served, text: str) -> list[int]:
    return served["tokenizer"](text, add_special_tokens=False)["input_ids"]


def test_the_server_lists_its_model(served):
    assert [m.id for m in served["client"].models.list().data] == [served["name"]] == ["qwen"]


@pytest.mark.parametrize("prompt", PROMPTS[:3])
def test_greedy_completions_are_transformers_generate(served, prompt):
    ids = encode(served, prompt)
    theirs = hf_greedy(served, ids, 12)
    answer = served["client"].completions.create(model=served["name"], prompt=prompt,
                                                 max_tokens=12, temperature=0)
    choice = answer.choices[0]
    assert choice.text == served["tokenizer"].decode(theirs)
    assert answer.usage.prompt_tokens == len(ids)
    assert answer.usage.completion_tokens == len(theirs)
    assert choice.finish_reason == ("length" if len(theirs) == 12 else "stop")
    # the same prompt as token ids answers the same
    by_ids = served["client"].completions.create(model=served["name"], prompt=ids, max_tokens=12,
                                                 temperature=0)
    assert by_ids.choices[0].text == choice.text


def test_echo_and_logprobs_are_transformers_log_probabilities(served):
    """What lm-eval's local-completions model asks to score a continuation: the prompt
    echoed with each token's log-probability and the most likely alternatives."""
    ids = encode(served, PROMPTS[2])
    answer = served["client"].completions.create(model=served["name"], prompt=ids, max_tokens=1,
                                                 temperature=0, logprobs=3, echo=True)
    logprobs = answer.choices[0].logprobs
    with torch.no_grad():
        logits = served["model"](input_ids=torch.tensor([ids + [hf_greedy(served, ids, 1)[0]]])
                                 ).logits[0].double()
    table = torch.log_softmax(logits, dim=-1).numpy()
    tokens = ids + hf_greedy(served, ids, 1)
    expected = [table[i - 1, tokens[i]] for i in range(1, len(tokens))]
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    np.testing.assert_allclose(logprobs.token_logprobs[1:], expected, atol=2e-4)
    for i, top in enumerate(logprobs.top_logprobs[1:], 1):
        best = np.sort(table[i - 1])[::-1][:3]
        np.testing.assert_allclose(sorted(top.values(), reverse=True), best[:len(top)], atol=2e-4)
    assert len(logprobs.tokens) == len(tokens)
    assert logprobs.text_offset[0] == 0 and logprobs.text_offset == sorted(logprobs.text_offset)
    # the greedy token is the best alternative where it was generated
    assert logprobs.token_logprobs[-1] == pytest.approx(max(logprobs.top_logprobs[-1].values()))


def test_chat_renders_the_tokenizers_template_as_transformers_does(served):
    messages = CONVERSATIONS[0][:4]
    ids = served["tokenizer"].apply_chat_template(messages, add_generation_prompt=True,
                                                  tokenize=True, return_dict=False)
    ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)
    theirs = hf_greedy(served, ids, 10)
    answer = served["client"].chat.completions.create(model=served["name"], messages=messages,
                                                      max_tokens=10, temperature=0)
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content == served["tokenizer"].decode(theirs)
    assert answer.usage.prompt_tokens == len(ids)


def test_streams_carry_the_same_text_as_whole_answers(served):
    client, name = served["client"], served["name"]
    whole = client.completions.create(model=name, prompt=PROMPTS[0], max_tokens=10, temperature=0)
    chunks = list(client.completions.create(model=name, prompt=PROMPTS[0], max_tokens=10,
                                            temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    messages = CONVERSATIONS[1][:1]
    reply = client.chat.completions.create(model=name, messages=messages, max_tokens=8,
                                           temperature=0)
    deltas = list(client.chat.completions.create(model=name, messages=messages, max_tokens=8,
                                                 temperature=0, stream=True))
    assert deltas[0].choices[0].delta.role == "assistant"
    assert "".join(d.choices[0].delta.content or "" for d in deltas) == \
        reply.choices[0].message.content
    assert deltas[-1].choices[0].finish_reason == reply.choices[0].finish_reason


def test_a_stream_its_client_abandons_stops_decoding(served):
    """A client that closes its stream after the first piece: the engine ends the request
    at a next token (its slot and pages go to the next request), far short of the 100
    tokens the same request decodes when answered whole."""
    import httpx
    client, name = served["client"], served["name"]
    engine = served["app"].state.completer.engine
    whole = client.completions.create(model=name, prompt=PROMPTS[0], max_tokens=100,
                                      temperature=0)
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 100
    before = engine.stats.steps
    body = {"model": name, "prompt": PROMPTS[0], "max_tokens": 100, "temperature": 0,
            "stream": True}
    with httpx.stream("POST", f"{served['base']}/completions", json=body, timeout=60) as response:
        first = next(line for line in response.iter_lines() if line.startswith("data: "))
    assert json.loads(first[len("data: "):])["choices"][0]["text"]
    deadline = time.monotonic() + 30
    while engine.busy():
        assert time.monotonic() < deadline, "the abandoned request still decodes"
        time.sleep(0.01)
    assert engine.stats.steps - before < 50, engine.stats.steps - before


def test_a_sampled_request_is_its_seeds_and_stop_sequences_cut_it(served):
    """A seed gives the same sample twice, other seeds others; a stop sequence cuts the
    text before it; ``n`` samples are those of consecutive seeds."""
    client, name = served["client"], served["name"]

    def sample(seed):
        return client.completions.create(model=name, prompt=PROMPTS[1], max_tokens=16,
                                         temperature=1.0, seed=seed).choices[0].text
    first = sample(7)
    assert sample(7) == first
    assert len({first, sample(8), sample(9)}) > 1
    greedy = client.completions.create(model=name, prompt=PROMPTS[1], max_tokens=16,
                                       temperature=0).choices[0].text
    stop = greedy[-2:]  # its first occurrence is well into the text
    cut = client.completions.create(model=name, prompt=PROMPTS[1], max_tokens=16, temperature=0,
                                    stop=["<never>", stop])
    assert cut.choices[0].text == greedy[:greedy.index(stop)] != ""
    assert cut.choices[0].finish_reason == "stop"
    # n completions of one prompt: the j-th is the request seeded seed + j; the prompt is
    # counted once.
    three = client.completions.create(model=name, prompt=PROMPTS[1], max_tokens=16,
                                      temperature=1.0, seed=7, n=3)
    assert [c.text for c in three.choices] == [first, sample(8), sample(9)]
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert three.usage.prompt_tokens == len(encode(served, PROMPTS[1]))


def test_concurrent_clients_each_get_their_own_answer(served):
    """64 clients at once, prompts and lengths mixed: every request is answered, each as
    it is answered alone, and the server serves on."""
    client, name = served["client"], served["name"]
    requests = [(PROMPTS[i % len(PROMPTS)], 1 + (i * 7) % 13, None if i % 3 else i)
                for i in range(64)]

    def ask(request):
        prompt, max_tokens, seed = request
        return client.completions.create(
            model=name, prompt=prompt, max_tokens=max_tokens,
            temperature=0 if seed is None else 1.0, seed=seed).choices[0].text

    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        together = list(pool.map(ask, requests))
    alone = {r: ask(r) for r in set(requests)}
    assert together == [alone[r] for r in requests]
    assert client.models.list().data


@pytest.mark.parametrize(("body", "status", "fragment"), [
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON list; send a JSON object"),
    ({"model": "gpt-4", "prompt": "hi"}, 404, "'gpt-4' does not exist here; this server serves "
                                              "'qwen'"),
    ({"model": "qwen", "prompt": "hi", "max_tokens": -1}, 400,
     "'max_tokens' must be an integer of at least 0, got -1"),
    ({"model": "qwen", "prompt": "hi", "temperature": -0.5}, 400,
     "'temperature' must be a number from 0 to 2, got -0.5"),
    ({"model": "qwen", "prompt": "hi " * 200, "max_tokens": 4}, 400,
     "This model's context is 128 tokens; the prompt has"),
    ({"model": "qwen", "prompt": "hi", "max_tokens": 200}, 400,
     "max_tokens is 200: shorten the prompt or lower max_tokens"),
    ({"model": "qwen", "prompt": [[1, 2], "x"]}, 400, "'prompt' must be a string"),
    ({"model": "qwen", "prompt": "hi", "n": 17}, 400, "'n' must be an integer from 1 to 16"),
    ({"model": "qwen", "prompt": "hi", "n": 2, "stream": True}, 400, "Streaming takes n=1"),
    ({"model": "qwen", "prompt": [5000]}, 400, "token id 5000; this model's vocabulary has"),
    ({"model": "qwen", "messages": [{"role": "wizard", "content": "hi"}]}, 400,
     "message 1 has role 'wizard'"),
])
def test_a_bad_request_is_a_4xx_with_one_line_and_the_server_serves_on(served, body, status,
                                                                       fragment):
    route = "/chat/completions" if isinstance(body, dict) and "messages" in body else \
        "/completions"
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(served["base"] + route, content=content,
                          headers={"content-type": "application/json"}, timeout=60)
    assert response.status_code == status, response.text
    message = response.json()["error"]["message"]
    assert fragment in message and "\n" not in message
    assert served["client"].completions.create(model=served["name"], prompt="hi", max_tokens=1,
                                               temperature=0).choices


def test_the_openai_client_raises_its_own_errors_for_refusals(served):
    with pytest.raises(openai.BadRequestError, match="'max_tokens' must be an integer"):
        served["client"].completions.create(model=served["name"], prompt="hi", max_tokens=-3)
    with pytest.raises(openai.NotFoundError, match="does not exist here"):
        served["client"].chat.completions.create(model="other", messages=[
            {"role": "user", "content": "hi"}])


def test_serve_refuses_what_it_cannot_serve_in_one_line(tmp_path, capsys, tiny):
    """A missing checkpoint, a bad port and an encoder-decoder run: exit 2, one line each,
    before anything listens."""
    train.run(tiny(num_train_steps=2, checkpoint_every_steps=2, eval_every_steps=0),
              str(tmp_path / "t5"), quiet=True)
    capsys.readouterr()
    assert serve.main([f"--checkpoint={tmp_path / 'missing'}"]) == 2
    assert serve.main(["--checkpoint=x", "--port=70000"]) == 2
    assert serve.main([f"--checkpoint={tmp_path / 't5'}", "--port=0"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("serve: ") for line in lines)
    assert "--port=70000: give a port from 0 to 65535" in lines[1]
    assert "model; serve takes decoder language models" in lines[2]


def test_our_lm_eval_model_generates_through_the_engine_as_through_static_batches(served):
    """``model_args`` ``sampler=engine``: lm-eval's generate_until requests (two groups of
    options, prompts of different lengths, stop strings) decode through the
    continuous-batching engine on the imported checkpoint, to the static batches' text."""
    from lm_eval.api.instance import Instance

    from t5x_like.evaluation import harness_model

    prompts = ["What is the capital of France?", "Say hello", "And of Spain? Name it, then "
               "say when it became the capital and why.", "1, 2, 3,", "Q: 7 + 5 = ?\nA:"]
    requests = [Instance("generate_until", {}, (prompt, options), i)
                for i, prompt in enumerate(prompts)
                for options in ({"until": ["\n"], "max_gen_toks": 12},
                                {"until": ["."], "max_gen_toks": 5})]
    static = harness_model.T5xLikeLM(checkpoint=served["checkpoint"], batch_size=8)
    engine = harness_model.T5xLikeLM(checkpoint=served["checkpoint"], batch_size=8,
                                     sampler="engine")
    generated = static.generate_until(requests)
    assert len(set(generated)) > 5  # the prompts and options are answered apart
    assert engine.generate_until(requests) == generated
    assert engine.loaded.runner.engine.stats.steps > 0 and static.loaded.runner.engine is None


def test_the_pages_client_example_runs_as_printed(served, monkeypatch, capsys):
    """docs/serving.md's Python block, run as printed against the served checkpoint (its
    address through the variables the page exports)."""
    import pathlib
    import re
    page = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "serving.md").read_text()
    exported = re.search(r"^export OPENAI_BASE_URL=(\S+) OPENAI_API_KEY=(\S+)$", page, re.M)
    assert exported and exported.group(1) == "http://127.0.0.1:8000/v1"
    block = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    monkeypatch.setenv("OPENAI_BASE_URL", served["base"])
    monkeypatch.setenv("OPENAI_API_KEY", exported.group(2))
    exec(compile(block, "docs/serving.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "qwen" and lines[1].endswith((" stop", " length")) and len(lines) >= 3


def test_lm_evals_local_completions_model_scores_as_our_lm_eval_model(served):
    """lm-evaluation-harness's own ``local-completions`` model pointed at the server
    answers loglikelihood and generate_until requests as our ``t5x_like`` lm-eval model
    does on the same checkpoint (lm-eval's code on both sides: its request encoding, its
    parsing of the server's log-probabilities)."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    from t5x_like.evaluation import harness_model

    # The imported folder's tokenizer: transformers reads the Hugging Face folder's as
    # Qwen2's (config.json names the model), which splits digits as this tiny BPE does not.
    remote = LocalCompletionsAPI(base_url=served["base"] + "/completions", model=served["name"],
                                 tokenizer_backend="huggingface",
                                 tokenizer=served["checkpoint"] + "/tokenizer",
                                 max_length=128, max_retries=1, max_gen_toks=12)
    ours = harness_model.T5xLikeLM(checkpoint=served["checkpoint"], max_gen_toks=12)
    pairs = [("What is the capital of France?", " Paris."), ("Say hello", " in French."),
             ("And of Spain?", " Madrid, since 1561.")]
    scored = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
    theirs_scores, our_scores = remote.loglikelihood(scored), ours.loglikelihood(scored)
    np.testing.assert_allclose([s for s, _ in theirs_scores], [s for s, _ in our_scores],
                               atol=2e-4)
    assert [g for _, g in theirs_scores] == [g for _, g in our_scores]
    generated = [Instance("generate_until", {}, (prompt, {"until": ["\n"], "max_gen_toks": 12}), i)
                 for i, (prompt, _) in enumerate(pairs)]
    assert remote.generate_until(generated) == ours.generate_until(generated)
