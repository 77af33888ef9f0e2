"""Sampling rules on hand-made logits."""

import pytest
import torch

from worker.engine.sequence import Sequence
from worker.sampling.sampler import apply_penalties, sample
from worker.sampling_params import SamplingParams


def _seq(params: SamplingParams, prompt=(1, 2), output=(), seed: int | None = None) -> Sequence:
    seq = Sequence("r", list(prompt), params, arrival_index=0)
    seq.token_ids.extend(output)
    if seed is not None:
        seq.generator = torch.Generator().manual_seed(seed)
    return seq


def _draws(logits: torch.Tensor, params: SamplingParams, n: int = 400) -> set[int]:
    torch.manual_seed(0)
    seqs = [_seq(params) for _ in range(n)]
    return set(sample(logits.expand(n, -1).clone(), seqs).token_ids)


LOGITS = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.05, 0.05]]))


def test_greedy_takes_the_argmax() -> None:
    assert sample(LOGITS.clone(), [_seq(SamplingParams(temperature=0))]).token_ids == [0]


def test_top_k_keeps_the_k_most_likely() -> None:
    assert _draws(LOGITS, SamplingParams(top_k=2)) == {0, 1}


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    assert _draws(LOGITS, SamplingParams(top_p=0.65)) == {0, 1}
    assert _draws(LOGITS, SamplingParams(top_p=0.1)) == {0}


def test_min_p_drops_tokens_far_below_the_best() -> None:
    # 0.2 / 0.4 = 0.5 stays, 0.05 / 0.4 = 0.125 goes.
    assert _draws(LOGITS, SamplingParams(min_p=0.3)) == {0, 1, 2}


def test_unfiltered_sampling_reaches_every_token() -> None:
    assert _draws(LOGITS, SamplingParams(), n=2000) == {0, 1, 2, 3, 4}


def test_penalties_follow_their_definitions() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0, 1.0]])
    params = SamplingParams(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25)
    seq = _seq(params, prompt=(0,), output=(1, 2, 2))
    out = apply_penalties(logits.clone(), [seq])
    # token 0: prompt only -> repetition only; 1: once in output; 2: twice; 3: unseen.
    expected = torch.tensor([[1.0, -4.0 - 0.5 - 0.25, 0.5 - 0.5 - 0.5, 1.0]])
    assert torch.allclose(out, expected)


def test_seeded_rows_draw_the_same_whatever_the_batch() -> None:
    params = SamplingParams(temperature=1.0)
    logits = torch.randn(1, 50)
    alone = sample(logits.clone(), [_seq(params, seed=42)]).token_ids[0]
    batch = torch.cat([torch.randn(3, 50), logits, torch.randn(2, 50)])
    seqs = [_seq(params) for _ in range(3)] + [_seq(params, seed=42)] + [_seq(params)] * 2
    assert sample(batch, seqs).token_ids[3] == alone


def test_logprobs_of_the_sampled_token_and_top_alternatives() -> None:
    result = sample(LOGITS.clone(), [_seq(SamplingParams(temperature=0, logprobs=2))])
    entry = result.logprobs[0]
    assert set(entry) == {0, 1}
    assert entry[0] == pytest.approx(torch.log(torch.tensor(0.4)).item(), abs=1e-5)
    assert sample(LOGITS.clone(), [_seq(SamplingParams(temperature=0))]).logprobs == [None]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_tokens", 0, "max_tokens"),
        ("top_p", 0.0, "top_p"),
        ("top_p", 1.5, "top_p"),
        ("temperature", -1.0, "temperature"),
        ("top_k", -3, "top_k"),
        ("min_p", 2.0, "min_p"),
        ("repetition_penalty", 0.0, "repetition_penalty"),
    ],
)
def test_bad_sampling_params_name_the_field(field: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**{field: value})


def test_a_row_short_of_min_tokens_picks_no_stop_token_and_no_eos() -> None:
    """vLLM's rule: below ``min_tokens`` the stop ids (and EOS, unless ignore_eos) are
    out of reach; at it, they are back."""
    logits = torch.tensor([[0.0, 5.0, 4.0, 3.0, 1.0]] * 3)  # 1 leads, then 2, then 3
    eos = {1}
    rows = [
        _seq(SamplingParams(temperature=0, min_tokens=3, stop_token_ids=[2]), output=(4,)),
        _seq(SamplingParams(temperature=0, min_tokens=3, ignore_eos=True), output=(4,)),
        _seq(SamplingParams(temperature=0, min_tokens=1, stop_token_ids=[2]), output=(4,)),
    ]
    assert sample(logits, rows, eos).token_ids == [3, 1, 1]
