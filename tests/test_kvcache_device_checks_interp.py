"""The default ``flash_attn_with_kvcache`` call reads no value back from the GPU: out-of-range
``cache_seqlens``, ``cache_leftpad`` and ``block_table`` values are replaced by safe ones in the kernels (never an
address outside the cache; the append stores nothing for that sequence: ``test_kvcache_bad_values_interp.py``) and
reported through the device's error word -- by ``rocmflash.api.decode.check_errors()`` and by the next call on
that device. Triton's interpreter (CPU).

The caches are views into larger NaN-filled buffers: a read outside the cache would put NaN into the
output, a write outside it would overwrite a guard row."""

import pytest
import torch

from rocmflash import flash_attn_with_kvcache

G = 8  # guard rows (contiguous) or pages (paged) on each side of the cache


@pytest.fixture(autouse=True)
def _clean_error_words():
    from rocmflash.kernels.decode import host as KD
    from rocmflash.kernels.decode import checks as DC

    DC._ERROR_WORDS.clear()
    yield
    DC._ERROR_WORDS.clear()


def _guarded(B=3, S=64, Hkv=2, D=32, page=0, seed=0):
    """(k_cache, v_cache, block_table, k_buf, v_buf): random caches inside NaN guards."""
    gen = torch.Generator().manual_seed(seed)
    if page:
        blocks = B * S // page
        shape = (blocks + 2 * G, page, Hkv, D)
    else:
        shape = (B, S + 2 * G, Hkv, D)
    bufs = [torch.full(shape, float("nan")).half() for _ in range(2)]
    views = [b[G:G + blocks] if page else b[:, G:G + S] for b in bufs]
    for v in views:
        v.copy_(torch.randn(v.shape, generator=gen).half())
    table = torch.randperm(blocks, generator=gen).view(B, S // page).int() if page else None
    return views[0], views[1], table, bufs[0], bufs[1]


def _guards_intact(buf, page):
    lo, hi = (buf[:G], buf[-G:]) if page else (buf[:, :G], buf[:, -G:])
    return torch.isnan(lo).all().item() and torch.isnan(hi).all().item()


def _step(kc, vc, table, lens, starts=None, seed=1, **kw):
    gen = torch.Generator().manual_seed(seed)
    B, Hkv, D = lens.shape[0], kc.shape[2], kc.shape[3]
    q = torch.randn(B, 1, 4 * Hkv, D, generator=gen).half()
    k, v = (torch.randn(B, 1, Hkv, D, generator=gen).half() for _ in range(2))
    return flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, block_table=table, causal=True,
                                   cache_leftpad=starts, **kw)


@pytest.mark.parametrize("page", [0, 16, 64])
@pytest.mark.parametrize("bad_len,words", [(200, "cache_seqlens"), (-5, "cache_seqlens"), (64, "cache_seqlens")])
def test_out_of_range_lengths_stay_inside_the_cache_and_are_reported(interpret, page, bad_len, words):
    from rocmflash.api.decode import check_errors

    kc, vc, table, kb, vb = _guarded(page=page)
    good = torch.tensor([10, 30, 50], dtype=torch.int32)
    ref = _step(kc.clone(), vc.clone(), table, good)  # the same step with every length valid
    check_errors()  # nothing to report
    bad = good.clone()
    bad[1] = bad_len
    out = _step(kc, vc, table, bad)  # returns without raising: the values are never read on the host
    assert torch.isfinite(out).all(), "read outside the cache"
    assert _guards_intact(kb, page) and _guards_intact(vb, page), "wrote outside the cache"
    assert torch.equal(out[[0, 2]], ref[[0, 2]])  # other sequences are untouched
    with pytest.raises(ValueError, match=words):
        check_errors()
    check_errors()  # reported once, then reset


@pytest.mark.parametrize("page", [16, 64])
@pytest.mark.parametrize("entry", [10 ** 6, -1, -(2 ** 31)])
def test_pages_outside_the_pool_stay_inside_and_are_reported(interpret, page, entry):
    from rocmflash.api.decode import check_errors

    kc, vc, table, kb, vb = _guarded(page=page)
    lens = torch.tensor([10, 30, 50], dtype=torch.int32)
    table[1, 0] = entry  # a page sequence 1 uses (and appends into when its length is in it)
    out = _step(kc, vc, table, lens)
    assert torch.isfinite(out).all()
    assert _guards_intact(kb, page) and _guards_intact(vb, page)
    with pytest.raises(ValueError, match="block_table"):
        check_errors()


def test_leftpad_outside_its_sequence_is_reported(interpret):
    from rocmflash.api.decode import check_errors

    kc, vc, table, kb, vb = _guarded(page=16)
    lens = torch.tensor([10, 30, 50], dtype=torch.int32)
    out = _step(kc, vc, table, lens, starts=torch.tensor([0, 40, -3], dtype=torch.int32))
    assert torch.isfinite(out).all() and _guards_intact(kb, 16)
    with pytest.raises(ValueError, match="cache_leftpad"):
        check_errors()


def test_the_next_call_reports_an_earlier_bad_call(interpret):
    """Without an explicit check, the next call on the device raises (on a GPU: within ERROR_POLL_CALLS
    calls, from a copy that was started without waiting), before it writes anything."""
    kc, vc, table, _, _ = _guarded()
    _step(kc, vc, table, torch.tensor([10, 999, 50], dtype=torch.int32))
    before = kc.clone()
    with pytest.raises(ValueError, match="an earlier call"):
        _step(kc, vc, table, torch.tensor([10, 30, 50], dtype=torch.int32))
    assert torch.equal(kc, before)
    _step(kc, vc, table, torch.tensor([11, 31, 51], dtype=torch.int32))  # reported once: the next call runs


def test_check_values_true_raises_before_anything_runs(interpret):
    kc, vc, table, _, _ = _guarded(page=16)
    before = kc.clone()
    with pytest.raises(ValueError, match=r"cache_seqlens\[1\]=999"):
        _step(kc, vc, table, torch.tensor([10, 999, 50], dtype=torch.int32), check_values=True)
    assert torch.equal(kc, before)


def test_default_call_reads_nothing_back(interpret, monkeypatch):
    """No ``.tolist()``/``.item()``/``int(tensor)`` of the lengths, table or starts on the default path."""
    kc, vc, table, _, _ = _guarded(page=16)
    lens = torch.tensor([10, 30, 50], dtype=torch.int32)
    reads = []
    for name in ("tolist", "item", "__int__", "__bool__", "nonzero"):
        real = getattr(torch.Tensor, name)

        def spy(self, *a, _real=real, _name=name, **kw):
            if self.dtype in (torch.int32, torch.int64) and self.numel() == 3:
                reads.append(_name)
            return _real(self, *a, **kw)
        monkeypatch.setattr(torch.Tensor, name, spy)
    _step(kc, vc, table, lens)
    assert reads == []
