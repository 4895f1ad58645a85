"""Chat SFT data (``data/chat.py``): conversations rendered as transformers' chat
templates render them, the loss on the assistant's tokens only, packing, truncation
and the refusals of bad rows."""

import json

import numpy as np
import pytest

import t5x_like.data as td
from t5x_like import structures
from t5x_like.data import chat, hf_tokenizers
from t5x_like.data import preprocessors as pp

CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
          "{{ message['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# The same template marking the assistant's turns, for transformers' own mask.
CHATML_GENERATION = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] }}"
    "<|im_end|>\n{% endgeneration %}{% else %}{{ message['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

CONVERSATIONS = [
    [{"role": "system", "content": "You answer briefly."},
     {"role": "user", "content": "What is the capital of France?"},
     {"role": "assistant", "content": "Paris."},
     {"role": "user", "content": "And of Spain?"},
     {"role": "assistant", "content": "Madrid, since 1561."}],
    [{"role": "user", "content": "Say hello in French."},
     {"role": "assistant", "content": "Bonjour !"}],
]


def make_tokenizer(folder, template=CHATML):
    """A small byte-level BPE with ChatML's special tokens, saved as a Hugging Face
    tokenizer folder that transformers' AutoTokenizer loads."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    texts = [m["content"] for c in CONVERSATIONS for m in c] * 20 + ["user assistant system"]
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "chat_template": template}))
    return folder


def render_with_step(folder, conversation, length=256):
    vocabulary = hf_tokenizers.HfTokenizerVocabulary(folder)
    ctx = pp.Context("chat", "train", {"targets": length},
                     {"targets": td.Feature(vocabulary)})
    step = chat.RenderChat()
    step.check(ctx)
    return step.map({"messages": conversation}, None, ctx)


@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
def test_tokens_and_mask_equal_transformers_apply_chat_template(tmp_path, index):
    from transformers import AutoTokenizer
    conversation = CONVERSATIONS[index]
    ours = render_with_step(make_tokenizer(tmp_path / "tok"), conversation)
    theirs = AutoTokenizer.from_pretrained(str(tmp_path / "tok")).apply_chat_template(
        conversation, tokenize=True, return_dict=True)
    assert ours["targets"].tolist() == list(theirs["input_ids"])
    # transformers marks the assistant's tokens itself with a {% generation %} template;
    # ours, found by rendering prefixes of the plain template, is the same mask.
    marked = AutoTokenizer.from_pretrained(str(make_tokenizer(tmp_path / "gen",
                                                              CHATML_GENERATION)))
    theirs_mask = marked.apply_chat_template(conversation, tokenize=True, return_dict=True,
                                             return_assistant_tokens_mask=True)
    assert ours["loss_mask"].tolist() == list(theirs_mask["assistant_masks"])


def test_the_mask_covers_exactly_each_assistant_turn_and_its_end_marker(tmp_path):
    folder = make_tokenizer(tmp_path / "tok")
    out = render_with_step(folder, CONVERSATIONS[0])
    vocabulary = hf_tokenizers.HfTokenizerVocabulary(folder)
    ids, offsets = vocabulary.encode_with_offsets(out["targets_pretokenized"])
    text = out["targets_pretokenized"]
    masked = "".join(text[s:e] for (s, e), m in zip(offsets, out["loss_mask"], strict=True) if m)
    assert masked == "Paris.<|im_end|>\nMadrid, since 1561.<|im_end|>\n"
    unmasked = "".join(text[s:e] for (s, e), m in zip(offsets, out["loss_mask"], strict=True)
                       if not m)
    assert "Paris" not in unmasked and "capital of France" in unmasked


def test_packed_sft_rows_carry_the_same_tokens_and_loss_as_unpacked(tmp_path):
    folder = make_tokenizer(tmp_path / "tok")
    examples = [render_with_step(folder, c, length=128) for c in CONVERSATIONS]
    lengths = {"targets": 128}
    assert sum(len(e["targets"]) for e in examples) <= 128
    plain = td.DecoderFeatureConverter(pack=False)(examples, lengths)
    packed = td.DecoderFeatureConverter(pack=True)(examples, lengths)
    assert len(packed) == 1  # both conversations in one row
    row = packed[0]
    for segment, alone in enumerate(plain, 1):
        where = row["decoder_segment_ids"] == segment
        n = int(where.sum())
        for key in ("decoder_target_tokens", "decoder_input_tokens", "decoder_loss_weights"):
            assert row[key][where].tolist() == alone[key][:n].tolist(), key
        assert alone["decoder_loss_weights"][n:].sum() == 0
    # The loss weights are the assistant masks, packed or not.
    assert row["decoder_loss_weights"].sum() == sum(e["loss_mask"].sum() for e in examples)


def test_a_long_conversation_loses_whole_turns_from_its_end(tmp_path):
    folder = make_tokenizer(tmp_path / "tok")
    whole = render_with_step(folder, CONVERSATIONS[0])
    first_turn = render_with_step(folder, CONVERSATIONS[0][:3])
    window = len(first_turn["targets"]) + 2  # room for the first exchange, not the second
    assert len(whole["targets"]) > window
    cut = render_with_step(folder, CONVERSATIONS[0], length=window)
    assert cut["targets"].tolist() == first_turn["targets"].tolist()
    assert cut["loss_mask"].tolist() == first_turn["loss_mask"].tolist()
    with pytest.raises(ValueError, match="first assistant turn ends at token"):
        render_with_step(folder, CONVERSATIONS[0], length=len(first_turn["targets"]) - 1)


def test_a_template_that_rewrites_earlier_turns_is_refused(tmp_path):
    # Shows only the last user message: a prefix of the conversation renders otherwise.
    rewriting = ("{% for message in messages %}{% if loop.last or message['role'] == "
                 "'assistant' %}{{ message['role'] }}: {{ message['content'] }}\n{% endif %}"
                 "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")
    folder = make_tokenizer(tmp_path / "tok", rewriting)
    with pytest.raises(ValueError, match="rewrites earlier turns"):
        render_with_step(folder, CONVERSATIONS[0])


@pytest.mark.parametrize("line, message", [
    ('{"text": "hello"}', "needs 'messages'"),
    ('{"messages": [{"role": "narrator", "content": "x"}]}', "role 'narrator'"),
    ('{"messages": [{"role": "user", "content": "hi"}]}', "no assistant message"),
    ('{"messages": "hi"}', "non-empty list"),
])
def test_bad_rows_are_refused_with_the_file_and_line(tmp_path, line, message):
    path = tmp_path / "chats.jsonl"
    good = json.dumps({"messages": CONVERSATIONS[1]})
    path.write_text(f"{good}\n{line}\n")
    source = chat.ConversationSource((str(path),), holdout_every=0)
    with pytest.raises(ValueError, match=rf"chats.jsonl:2: .*{message}"):
        source.get("train")


def test_prompt_response_pairs_are_a_user_and_an_assistant_turn(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"prompt": "2+2?", "response": "4"}) + "\n")
    (record,) = chat.ConversationSource((str(path),), holdout_every=0).get("train")
    assert record["messages"] == [{"role": "user", "content": "2+2?"},
                                  {"role": "assistant", "content": "4"}]


def test_a_packed_chat_row_gives_the_loss_of_its_conversations_apart(tmp_path):
    """A tiny decoder's loss on the packed row equals the token-weighted loss of each
    conversation in a row of its own: examples never attend across, and only the
    assistant's tokens count."""
    import flax.linen as nn
    import jax
    from conftest import structure_loss

    from t5x_like import config_lib, models
    folder = make_tokenizer(tmp_path / "tok")
    examples = [render_with_step(folder, c, length=128) for c in CONVERSATIONS]
    cfg = config_lib.model_defaults("decoder")
    cfg.update(vocab_size=400, d_model=16, num_heads=2, head_dim=8, d_ff=32, num_layers=1,
               max_length=128)
    model = structures.build_model(cfg)
    params = nn.unbox(model.init(jax.random.key(0), *models.example_inputs(model, {}, 1))
                      ["params"])
    loss_fn = structure_loss("decoder", model)
    packed = td.DecoderFeatureConverter(pack=True)(examples, {"targets": 128})[0]
    _, packed_metrics = loss_fn(params, {k: v[None] for k, v in packed.items()})
    total = tokens = 0.0
    for alone in td.DecoderFeatureConverter(pack=False)(examples, {"targets": 128}):
        _, metrics = loss_fn(params, {k: v[None] for k, v in alone.items()})
        total += float(metrics["loss"]) * float(metrics["num_target_tokens"])
        tokens += float(metrics["num_target_tokens"])
    assert tokens == float(packed_metrics["num_target_tokens"]) == sum(
        e["loss_mask"].sum() for e in examples)
    np.testing.assert_allclose(float(packed_metrics["loss"]), total / tokens, rtol=2e-4)


def test_the_docs_chat_task_runs_as_printed(tmp_path):
    """docs/instruction_tuning.md's chat task, with its two paths pointed at a test
    tokenizer and a test file."""
    import re
    from pathlib import Path
    page = (Path(__file__).resolve().parent.parent / "docs" / "instruction_tuning.md").read_text()
    code = re.search(r"```python\n(from t5x_like.data import Feature, TaskRegistry, chat.*?)```",
                     page, flags=re.S).group(1)
    folder = make_tokenizer(tmp_path / "tok")
    (tmp_path / "chats.jsonl").write_text("".join(json.dumps({"messages": c}) + "\n"
                                                  for c in CONVERSATIONS * 3))
    code = code.replace("converted/my_chat_model", str(folder)).replace(
        "data/my_chats.jsonl", str(tmp_path / "chats.jsonl"))
    td.TaskRegistry.remove("my_chats")
    try:
        exec(code, {})
        example = next(iter(td.get_dataset("my_chats", {"targets": 128}, shuffle=False)))
        assert example["loss_mask"].sum() > 0
        assert len(example["targets"]) == len(example["loss_mask"])
    finally:
        td.TaskRegistry.remove("my_chats")


def test_encoder_decoders_read_conversations_as_input_target_pairs():
    from t5x_like.builtin_tasks import pretraining
    vocabulary = pretraining.embedded_vocabulary()
    features = {"inputs": td.Feature(vocabulary), "targets": td.Feature(vocabulary)}
    step = chat.ConversationToPairs()
    roomy = pp.Context("chat", "train", {"inputs": 256, "targets": 32}, features)
    out = step.map({"messages": CONVERSATIONS[0]}, None, roomy)
    assert out["inputs"] == ("system: You answer briefly.\nuser: What is the capital of "
                             "France?\nassistant: Paris.\nuser: And of Spain?")
    assert out["targets"] == "Madrid, since 1561."
    # A short window drops the earliest turns but keeps the system message and the question.
    tight = pp.Context("chat", "train", {"inputs": 16, "targets": 32}, features)
    out = step.map({"messages": CONVERSATIONS[0]}, None, tight)
    assert out["inputs"] == "system: You answer briefly.\nuser: And of Spain?"


def test_a_chat_task_fine_tunes_an_imported_qwen2_on_assistant_tokens(tmp_path):
    """The recipe end to end: a Qwen2 checkpoint with a ChatML tokenizer is imported,
    a conversation file becomes a task through its chat template, and ``train`` fine-tunes
    the imported weights on the assistant's tokens (the loss falls; the held-out
    evaluation counts only the assistant tokens of the validation conversations)."""
    import importlib.util
    import pathlib

    import torch
    import transformers

    from t5x_like import train
    from t5x_like.convert import __main__ as convert_cli

    hf = make_tokenizer(tmp_path / "hf")
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=400, hidden_size=32, intermediate_size=48, num_attention_heads=4,
        num_key_value_heads=2, num_hidden_layers=2, max_position_embeddings=128,
        tie_word_embeddings=True)).save_pretrained(hf)
    convert_cli.import_hf(str(hf), str(tmp_path / "qwen"))
    (tmp_path / "chats.jsonl").write_text("".join(
        json.dumps({"messages": CONVERSATIONS[1]}) + "\n" for _ in range(40)))
    td.TaskRegistry.remove("qwen_chats")
    vocabulary = hf_tokenizers.HfTokenizerVocabulary(tmp_path / "qwen" / "tokenizer")
    td.TaskRegistry.add(
        "qwen_chats", chat.ConversationSource((str(tmp_path / "chats.jsonl"),), holdout_every=4),
        [chat.RenderChat()], {"targets": td.Feature(vocabulary, add_eos=False)})
    try:
        spec = importlib.util.spec_from_file_location(
            "pretrained_folder", pathlib.Path(__file__).resolve().parent.parent
            / "configs" / "finetune" / "pretrained_folder.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        config = module.get_config(str(tmp_path / "qwen"))
        config.update(task="qwen_chats", num_train_steps=12, batch_size=8, log_every_steps=1,
                      eval_every_steps=12, checkpoint_every_steps=12, eval_batches=1)
        config.task_feature_lengths = {"targets": 64}
        config.optimizer.update(learning_rate=1e-2, warmup_steps=0, schedule="constant")
        config.evals.benchmark.mixture = ""  # the benchmark evaluator off
        result = train.run(config, str(tmp_path / "run"), quiet=True)
    finally:
        td.TaskRegistry.remove("qwen_chats")
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert records[-1]["loss"] < records[0]["loss"] - 0.5
    assert result["step"] == 12 and np.isfinite(result["eval"]["eval_loss"])
    # Every row holds whole copies of the one conversation; the loss counts the
    # assistant's tokens of each copy and nothing else.
    one = render_with_step(hf, CONVERSATIONS[1], 64)
    assistant, whole = int(one["loss_mask"].sum()), len(one["targets"])
    for record in records:
        counted = int(record["num_target_tokens"])
        copies = counted // assistant
        assert counted == copies * assistant and copies * whole <= 8 * 64
        assert copies >= 8  # at least one conversation in each of the 8 rows
