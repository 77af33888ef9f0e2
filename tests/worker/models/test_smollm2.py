"""The real default model: answers, seeds, streaming text and stop strings."""

import pytest
import torch
from transformers import AutoTokenizer

from kernels import kernel_backend
from kernels.native.linear import bf16_linear_available
from worker import LLM, LLMEngine, SamplingParams
from worker.engine.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer


@pytest.fixture(scope="module")
def llm(smollm2_path) -> LLM:
    return LLM(str(smollm2_path))


def _chat(llm: LLM, question: str) -> str:
    messages = [{"role": "user", "content": question}]
    return llm.get_tokenizer().apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )


def test_knows_the_capital_of_france(llm) -> None:
    out = llm.generate(_chat(llm, "What is the capital of France?"), SamplingParams(temperature=0))
    assert "Paris" in out[0].outputs[0].text


@pytest.mark.skipif(
    kernel_backend(torch.device("cpu")) != "native" or not bf16_linear_available(),
    reason="needs the native kernels and a CPU with AVX512-BF16",
)
def test_bf16_answers_alike_alone_and_in_a_batch(smollm2_path) -> None:
    """bf16 is the fast CPU path (native bf16 linears and attention). Every row's
    arithmetic there is independent of the others in the step, so greedy tokens
    do not depend on what else shares the batch."""
    llm = LLM(str(smollm2_path), dtype="bfloat16")
    questions = ("What is the capital of France?", "Name a fruit.", "Count to five.")
    prompts = [_chat(llm, q) for q in questions]
    greedy = SamplingParams(temperature=0, max_tokens=24)
    together = llm.generate(prompts, greedy)
    assert "Paris" in together[0].outputs[0].text
    for prompt, out in zip(prompts, together, strict=True):
        assert llm.generate(prompt, greedy)[0].outputs[0].token_ids == out.outputs[0].token_ids


def test_seeded_sampling_is_the_same_alone_and_in_a_batch(llm) -> None:
    prompt = _chat(llm, "Tell me a story about a dragon.")
    seeded = SamplingParams(temperature=1.0, top_p=0.95, seed=1234, max_tokens=24)
    alone = llm.generate(prompt, seeded)[0].outputs[0].text
    others = [_chat(llm, q) for q in ("Name a fruit.", "Count to five.", "Describe rain.")]
    unseeded = SamplingParams(temperature=1.0, max_tokens=30)
    batch = llm.generate([others[0], prompt, *others[1:]], [unseeded, seeded, unseeded, unseeded])
    assert batch[1].outputs[0].text == alone
    other_seed = SamplingParams(temperature=1.0, top_p=0.95, seed=4321, max_tokens=24)
    assert llm.generate(prompt, other_seed)[0].outputs[0].text != alone


def test_streamed_deltas_add_up_to_the_full_decode(smollm2_path) -> None:
    engine = LLMEngine.from_kwargs(model=str(smollm2_path))
    engine.add_request(
        "a", "Les élèves écrivent: 東京は", SamplingParams(temperature=0, max_tokens=40)
    )
    pieces, tokens = [], []
    while engine.has_unfinished_requests():
        for delta in engine.step():
            pieces.append(delta.new_text)
            tokens += delta.new_token_ids
    # Only the final flush may hold a broken character: max_tokens can cut one in half.
    assert all(REPLACEMENT_CHAR not in piece for piece in pieces[:-1])
    assert "".join(pieces) == engine.tokenizer.decode(tokens, skip_special_tokens=True)


def test_detokenizer_never_splits_a_character(smollm2_path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    text = " naïve café — 東京タワー 🚀🎉 done"
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, prompt_token_ids=[], skip_special_tokens=True)
    pieces = [detok.push(token) for token in ids]
    pieces.append(detok.flush())
    assert all(REPLACEMENT_CHAR not in piece for piece in pieces)
    assert "".join(pieces) == tokenizer.decode(ids)
    # Some emoji span several tokens: at least one push had to wait.
    assert "" in pieces[:-1]


def test_stop_strings_are_cut_and_never_streamed(llm) -> None:
    prompt = _chat(llm, "Describe the ocean in one paragraph.")
    free = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=40))[0].outputs[0].text
    # Four characters from the middle of the text, likely straddling a token boundary.
    stop = free[21:25]
    engine = llm.engine
    engine.add_request("s", prompt, SamplingParams(temperature=0, max_tokens=40, stop=[stop]))
    pieces, last = [], None
    while engine.has_unfinished_requests():
        for delta in engine.step():
            pieces.append(delta.new_text)
            last = delta
    text = "".join(pieces)
    assert text == free[: free.index(stop)]
    assert (last.finish_reason, last.stop_reason) == ("stop", stop)
