"""The torch references against independent formulations: dense SDPA and transformers' layers."""

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from kernels import reference
from tests.kernels.paged_cases import dense_attention, make_case, poison_before_window

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}

# (new tokens, context): decodes, a full prefill, a chunk on top of a cached
# prefix, a context ending exactly on a block boundary, a context of one token.
SHAPES = [(1, 37), (19, 19), (5, 48), (1, 32), (1, 1), (16, 16), (7, 23)]
DECODES_ONLY = [(1, 37), (1, 32), (1, 1), (1, 90)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (6, 2), (8, 2)])
@pytest.mark.parametrize("block_size", [8, 16])
@pytest.mark.parametrize("shapes", [SHAPES, DECODES_ONLY], ids=["mixed", "decodes"])
def test_paged_attention_matches_dense(dtype, heads, kv_heads, block_size, shapes) -> None:
    case = make_case(shapes, heads, kv_heads, 64, block_size, dtype)
    out = reference.paged_attention(*case.kernel_tensors(), case.scale)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.float(), dense_attention(case).float(), atol=tol, rtol=tol)


# (new tokens, context) with contexts past the windows below: a long prefill, chunks
# over a cached prefix that straddle the window, decodes far past it.
WINDOW_SHAPES = [(1, 70), (40, 40), (9, 61), (1, 33), (1, 5), (20, 50)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("sliding_window", "logit_softcap"), [(13, 0.0), (0, 5.0), (16, 3.0)])
def test_sliding_windows_and_soft_caps_match_dense(dtype, sliding_window, logit_softcap) -> None:
    """Blocks wholly before a sequence's window hold NaN (given back to the pool): the
    window's tokens must never read them."""
    case = make_case(WINDOW_SHAPES, 6, 2, 64, 8, dtype, seed=3)
    expected = dense_attention(case, sliding_window, logit_softcap)
    if sliding_window:
        poison_before_window(case, sliding_window)
    out = reference.paged_attention(
        *case.kernel_tensors(), case.scale, sliding_window, logit_softcap
    )
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.float(), expected.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shapes", [SHAPES, DECODES_ONLY], ids=["mixed", "decodes"])
def test_values_read_from_the_keys_own_rows_match_dense(dtype, shapes) -> None:
    """Multi-head latent attention: one KV head, each row's first 32 features its value."""
    case = make_case(shapes, 4, 1, 40, 8, dtype, values_in_keys=32)
    out = reference.paged_attention(*case.kernel_tensors(), case.scale)
    assert out.shape == (*case.query.shape[:2], 32)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.float(), dense_attention(case).float(), atol=tol, rtol=tol)


def test_the_window_and_the_cap_change_the_answer() -> None:
    case = make_case(WINDOW_SHAPES, 6, 2, 64, 8, torch.float32, seed=3)
    plain = reference.paged_attention(*case.kernel_tensors(), case.scale)
    for window, cap in ((13, 0.0), (0, 0.5)):
        other = reference.paged_attention(*case.kernel_tensors(), case.scale, window, cap)
        assert not torch.allclose(plain, other, atol=1e-3)


def test_write_kv_cache_skips_padding_slots() -> None:
    key_cache = torch.zeros(3, 4, 2, 8)
    value_cache = torch.zeros(3, 4, 2, 8)
    key = torch.randn(4, 2, 8)
    value = torch.randn(4, 2, 8)
    slots = torch.tensor([5, -1, 0, 11])
    reference.write_kv_cache(key, value, key_cache, value_cache, slots)
    flat_k = key_cache.view(-1, 2, 8)
    assert torch.equal(flat_k[5], key[0]) and torch.equal(flat_k[0], key[2])
    assert torch.equal(flat_k[11], key[3])
    assert torch.equal(value_cache.view(-1, 2, 8)[11], value[3])
    written = {0, 5, 11}
    assert all(not flat_k[i].any() for i in range(12) if i not in written)


@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_transformers(with_residual: bool) -> None:
    x, residual = torch.randn(5, 32), torch.randn(5, 32)
    hf = LlamaRMSNorm(32, eps=1e-6)
    hf.weight.data = torch.randn(32)
    out, new_residual = reference.rms_norm(
        x, hf.weight.data, 1e-6, residual if with_residual else None
    )
    expected_input = x + residual if with_residual else x
    torch.testing.assert_close(out, hf(expected_input))
    if with_residual:
        torch.testing.assert_close(new_residual, expected_input)
    else:
        assert new_residual is None


def test_rotary_neox_matches_transformers() -> None:
    head, heads, kv_heads = 16, 4, 2
    positions = torch.tensor([0, 1, 7, 3, 100])
    q = torch.randn(5, heads * head)
    k = torch.randn(5, kv_heads * head)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head, 2).float() / head))
    freqs = torch.arange(128).float()[:, None] * inv_freq[None, :]
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    emb = torch.cat((freqs, freqs), dim=-1)[positions]
    hf_q, hf_k = apply_rotary_pos_emb(
        q.view(1, 5, heads, head).transpose(1, 2),
        k.view(1, 5, kv_heads, head).transpose(1, 2),
        emb.cos()[None],
        emb.sin()[None],
    )
    reference.rotary_embedding(positions, q, k, cache, head, is_neox=True)
    torch.testing.assert_close(q.view(5, heads, head), hf_q.transpose(1, 2)[0])
    torch.testing.assert_close(k.view(5, kv_heads, head), hf_k.transpose(1, 2)[0])


def test_rotary_gptj_rotates_interleaved_pairs() -> None:
    head = 8
    positions = torch.tensor([3])
    q = torch.randn(1, head)
    k = torch.randn(1, head)
    theta = torch.tensor([0.3, 0.2, 0.1, 0.05])
    cache = torch.zeros(4, head)
    cache[3] = torch.cat((theta.cos(), theta.sin()))
    expected = q.clone().view(4, 2)
    x, y = expected[:, 0].clone(), expected[:, 1].clone()
    expected[:, 0] = x * theta.cos() - y * theta.sin()
    expected[:, 1] = y * theta.cos() + x * theta.sin()
    reference.rotary_embedding(positions, q, k, cache, head, is_neox=False)
    torch.testing.assert_close(q.view(4, 2), expected)


def test_the_gated_activations() -> None:
    x = torch.randn(3, 10)
    torch.testing.assert_close(reference.silu_and_mul(x), F.silu(x[:, :5]) * x[:, 5:])
    gelu = F.gelu(x[:, :5], approximate="tanh") * x[:, 5:]
    torch.testing.assert_close(reference.gelu_tanh_and_mul(x), gelu)


def test_rope_scaling_configs_build(tmp_path) -> None:
    from worker.models.rotary import cos_sin_cache

    config = LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    )
    scaled = cos_sin_cache(config, 16, 256)
    plain = cos_sin_cache(LlamaConfig(hidden_size=64, num_attention_heads=4), 16, 256)
    assert scaled.shape == plain.shape == (256, 16)
    assert not torch.allclose(scaled, plain)
