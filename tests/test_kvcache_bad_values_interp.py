"""A bad value writes nothing (issue 46): ``flash_attn_with_kvcache`` with new ``k``/``v`` and a length, page or
int64 value out of range stores none of that sequence's new keys -- in every append (16-bit and fp8, contiguous
and paged) -- leaves every other byte of the cache (the other sequences' rows, unused pages of the shared pool,
guard memory around the cache) bit-identical to a torch append of the good sequences alone, reads nothing
outside the cache, and reports the value through the decode error word. Triton's interpreter (CPU).

The setting is the issue's: a pool of 24 pages shared by 3 sequences (18 pages used, 6 not), one sequence's
value made bad; the caches sit inside NaN-filled guard pages/rows (a read outside the cache would make the
output NaN, a write outside it would change a guard)."""

from __future__ import annotations

import math

import pytest
import torch

from varlen_reference import attention_fp64

B, HKV, GROUP, D, NEW = 3, 1, 2, 16, 2
PAGE, POOL, WIDTH = 4, 24, 6  # pages of 4 rows; 24 in the pool; 6 per sequence: 24 keys per sequence
CAP = PAGE * WIDTH
G = 2  # guard pages (paged) or rows (contiguous) on each side of the cache
LENS = (5, 9, 13)  # sequence 1's two new rows (9, 10) land in its block-table entry 2
FP8 = torch.float8_e4m3fn
NAN_BYTE = 0x7F  # e4m3fn's NaN; fp16's NaN is written as a float


pytestmark = pytest.mark.usefixtures("fresh_decode")  # no error bits or kept plans from another test


def _check_errors():
    from rocmflash.api.decode_errors import check_errors

    check_errors()


class Case:
    """Everything one call needs; ``bufs`` are the guarded storages the caches are views of."""

    def __init__(self, paged: bool, fp8: bool, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        self.paged, self.fp8 = paged, fp8
        shape = (POOL + 2 * G, PAGE, HKV, D) if paged else (B, CAP + 2 * G, HKV, D)
        if fp8:
            self.bufs = [torch.full(shape, NAN_BYTE, dtype=torch.uint8).view(FP8) for _ in range(2)]
        else:
            self.bufs = [torch.full(shape, float("nan"), dtype=torch.float16) for _ in range(2)]
        self.caches = [b[G:G + POOL] if paged else b[:, G:G + CAP] for b in self.bufs]
        for c in self.caches:  # every row of the cache random and finite (unused pages too)
            c.copy_(torch.randn(c.shape, generator=gen).to(c.dtype))
        self.table = torch.randperm(POOL, generator=gen)[:B * WIDTH].view(B, WIDTH).to(torch.int32) if paged else None
        self.lens = torch.tensor(LENS, dtype=torch.int32)
        self.q = torch.randn(B, 1, HKV * GROUP, D, generator=gen).half()
        self.k = torch.randn(B, NEW, HKV, D, generator=gen).half()
        self.v = torch.randn(B, NEW, HKV, D, generator=gen).half()
        self.descales = [torch.rand(B, HKV, generator=gen) * 0.02 + 0.002 for _ in range(2)] if fp8 else [None, None]

    def call(self, lens=None, table=None, **kw):
        from rocmflash import flash_attn_with_kvcache

        return flash_attn_with_kvcache(self.q, *self.caches, self.k, self.v,
                                       cache_seqlens=self.lens if lens is None else lens,
                                       block_table=self.table if table is None else table, causal=True,
                                       k_descale=self.descales[0], v_descale=self.descales[1], **kw)

    def stored(self, new, b: int) -> torch.Tensor:
        """Sequence ``b``'s new rows as the cache holds them (fp8: torch's quantisation)."""
        x = new[b]
        if not self.fp8:
            return x
        from rocmflash.hw.fp8 import fp8_max

        scale = self.descales[0 if new is self.k else 1][b]
        return (x.float() / scale[None, :, None]).clamp(-fp8_max(FP8), fp8_max(FP8)).to(FP8)

    def expected(self, sequences) -> list:
        """The guarded storages after a torch append of ``sequences`` only (the caller's good values) to what they
        hold now (call it before the call under test)."""
        out = []
        for buf, cache, new in zip(self.bufs, self.caches, (self.k, self.v)):
            want = buf.clone()
            view = want[G:G + POOL] if self.paged else want[:, G:G + CAP]
            for b in sequences:
                pos = torch.arange(LENS[b], LENS[b] + NEW)
                if self.paged:
                    view[self.table[b][pos // PAGE].long(), pos % PAGE] = self.stored(new, b)
                else:
                    view[b, pos] = self.stored(new, b)
            out.append(want)
        return out

    def bytes_equal(self, wants) -> bool:
        return all(torch.equal(got.view(torch.uint8), want.view(torch.uint8)) for got, want in zip(self.bufs, wants))


def _good_outputs(case: Case, out) -> None:
    """Sequences 0 and 2 attend to their own cache (the appended rows included) as an fp64 reference does."""
    for b in (0, 2):
        n = LENS[b] + NEW
        pos = torch.arange(n)
        rows = [c[case.table[b][pos // PAGE].long(), pos % PAGE] if case.paged else c[b, :n] for c in case.caches]
        keys, vals = (r.float() for r in rows)
        if case.fp8:
            keys, vals = keys * case.descales[0][b][None, :, None], vals * case.descales[1][b][None, :, None]
        ref, _ = attention_fp64(case.q[b], keys, vals, 1 / math.sqrt(D), True, (-1, -1), 0.0)
        err = (out[b].double() - ref).norm() / ref.norm()
        assert err < 1e-2, (b, float(err))


#: (name, paged only, how sequence 1's values go bad, words its report must hold)
CASES = [
    ("page past the pool", True, dict(entry=POOL + 5), "block_table pointing outside"),
    ("page far past the pool", True, dict(entry=10 ** 6), "block_table pointing outside"),
    ("negative page", True, dict(entry=-1), "block_table pointing outside"),
    ("most negative page", True, dict(entry=-(2 ** 31)), "block_table pointing outside"),
    ("second new row's page", True, dict(length=11, entry_of=12, entry=POOL), "block_table pointing outside"),
    ("negative length", False, dict(length=-1), "cache_seqlens plus the new keys outside the cache"),
    ("most negative length", False, dict(length=-(2 ** 31)), "cache_seqlens plus the new keys outside the cache"),
    ("length past capacity", False, dict(length=CAP + 3), "cache_seqlens plus the new keys outside the cache"),
    ("largest length", False, dict(length=2 ** 31 - 1), "cache_seqlens plus the new keys outside the cache"),
    ("more new keys than the cache holds", False, dict(length=CAP - NEW + 1),
     "cache_seqlens plus the new keys outside the cache"),
    ("int64 length 2**32 + 9", False, dict(length=2 ** 32 + 9, wide=True), "int64 cache_seqlens/cache_leftpad"),
    ("int64 length 2**31", False, dict(length=2 ** 31, wide=True), "int64 cache_seqlens/cache_leftpad"),
    ("int64 length -2**31 - 1", False, dict(length=-(2 ** 31) - 1, wide=True), "int64 cache_seqlens/cache_leftpad"),
]
PATHS = [(False, False), (True, False), (False, True), (True, True)]  # (paged, fp8)


def _cases():
    for paged, fp8 in PATHS:
        for name, paged_only, bad, words in CASES:
            if paged or not paged_only:
                yield pytest.param(paged, fp8, bad, words,
                                   id=f"{'paged' if paged else 'contiguous'}-{'fp8' if fp8 else '16bit'}-{name}")


@pytest.mark.parametrize("paged,fp8,bad,words", list(_cases()))
def test_a_bad_value_stores_nothing_and_is_reported(interpret, paged, fp8, bad, words):
    case = Case(paged, fp8)
    lens = torch.tensor(LENS, dtype=torch.int64 if bad.get("wide") else torch.int32)
    lens[1] = bad.get("length", LENS[1])
    table = case.table
    if "entry" in bad:
        table = table.clone()
        table[1, bad.get("entry_of", int(lens[1])) // PAGE] = bad["entry"]
    want = case.expected([0, 2])
    out = case.call(lens, table)  # returns: the default call reads no value on the host
    assert case.bytes_equal(want), "a byte outside the good sequences' new rows changed"
    assert torch.isfinite(out).all(), "read outside the cache"
    _good_outputs(case, out)
    with pytest.raises(ValueError) as info:
        _check_errors()
    message = str(info.value)
    assert words in message and "new k/v were not stored" in message and "outputs are undefined" in message, message
    _check_errors()  # reported once, then reset


@pytest.mark.parametrize("paged,fp8", PATHS)
def test_good_values_store_every_row_and_report_nothing(interpret, paged, fp8):
    """The same setting with every value good: every sequence's rows land (the reference the cases compare
    with is right), nothing is reported."""
    case = Case(paged, fp8)
    want = case.expected([0, 1, 2])
    out = case.call()
    assert case.bytes_equal(want)
    _good_outputs(case, out)
    _check_errors()


def test_the_issues_repro_leaves_the_other_sequences_pages_alone(interpret):
    """The issue's reproduction: sequence 0's first entry 29 in a pool of 24, one new token each. Sequence 1's row
    on page 23 (the page a clamped 29 became) and every other page but the good sequences' new rows stay."""
    from rocmflash import flash_attn_with_kvcache

    gen = torch.Generator().manual_seed(5)
    kc, vc = (torch.randn(POOL, PAGE, HKV, D, generator=gen).half() for _ in range(2))
    table = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7], [23, 8, 9, 10, 11, 12, 13, 14], [15, 16, 17, 18, 19, 20, 21, 22]],
                         dtype=torch.int32)
    table[0, 0] = 29
    lens = torch.tensor([2, 1, 3], dtype=torch.int32)  # sequence 1's row 1 is on page 23
    q = torch.randn(3, 1, 2, D, generator=gen).half()
    k, v = (torch.randn(3, 1, HKV, D, generator=gen).half() for _ in range(2))
    want_k, want_v = kc.clone(), vc.clone()
    for b in (1, 2):
        page, row = int(table[b, int(lens[b]) // PAGE]), int(lens[b]) % PAGE
        want_k[page, row], want_v[page, row] = k[b, 0], v[b, 0]
    flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=lens, block_table=table, causal=True)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
    with pytest.raises(ValueError, match="block_table pointing outside.*new k/v were not stored"):
        _check_errors()


@pytest.mark.parametrize("fp8", [False, True])
def test_int64_leftpad_outside_int32_is_reported_not_wrapped(interpret, fp8):
    """``cache_leftpad`` int64 ``2**32`` would wrap to 0, a valid start: it is reported, and the append, which
    does not read starts, stores every sequence's rows."""
    case = Case(True, fp8)
    starts = torch.tensor([0, 2 ** 32, 1])
    want = case.expected([0, 1, 2])
    out = case.call(cache_leftpad=starts)
    assert case.bytes_equal(want)
    assert torch.isfinite(out).all()
    with pytest.raises(ValueError, match="int64 cache_seqlens/cache_leftpad value outside int32") as info:
        _check_errors()
    assert "cache_leftpad outside its sequence" in str(info.value)  # the saturated start is out of range too
    _check_errors()


@pytest.mark.parametrize("name,lens,starts", [
    ("cache_seqlens", torch.tensor([5, 2 ** 32 + 9, 13]), None),
    ("cache_leftpad", torch.tensor([5, 9, 13]), torch.tensor([0, -(2 ** 33), 0])),
])
def test_int64_outside_int32_with_check_values_raises_before_writing(interpret, name, lens, starts):
    case = Case(True, False)
    before = [b.clone() for b in case.bufs]
    with pytest.raises(ValueError, match=rf"{name}\[1\]=-?\d+ does not fit int32"):
        case.call(lens, cache_leftpad=starts, check_values=True)
    assert case.bytes_equal(before)
    _check_errors()  # the host check raised; nothing was left in the error word


def test_int32_length_near_its_end_with_check_values_is_refused(interpret):
    """``cache_seqlens + Sk_new`` past int32 wraps negative: the host check compares without adding."""
    case = Case(False, False)
    before = [b.clone() for b in case.bufs]
    with pytest.raises(ValueError, match=r"cache_seqlens\[1\]=2147483647 plus 2 new key\(s\) is outside the cache"):
        case.call(torch.tensor([5, 2 ** 31 - 1, 13], dtype=torch.int32), check_values=True)
    assert case.bytes_equal(before)


@pytest.mark.parametrize("paged", [False, True])
def test_more_new_keys_than_the_cache_holds_is_refused_on_the_host(interpret, paged):
    from rocmflash import flash_attn_with_kvcache

    case = Case(paged, False)
    before = [b.clone() for b in case.bufs]
    big = torch.randn(B, CAP + 1, HKV, D).half()
    with pytest.raises(ValueError, match=f"k has {CAP + 1} new keys per sequence but the cache holds {CAP}"):
        flash_attn_with_kvcache(case.q, *case.caches, big, big, cache_seqlens=torch.zeros(B, dtype=torch.int32),
                                block_table=case.table)
    assert case.bytes_equal(before)


@pytest.mark.parametrize("paged", [False, True])
def test_the_append_kernel_masks_a_table_narrower_than_its_new_keys(interpret, paged):
    """Called directly (no host check), an append of more keys than the cache or block table holds stores nothing
    and reports every sequence."""
    from rocmflash.api.decode_errors import _REPORT
    from rocmflash.kernels.decode import append as kv_append
    from rocmflash.kernels.decode import host as KD
    from rocmflash.kernels.decode import checks as DC

    case = Case(paged, False)
    before = [b.clone() for b in case.bufs]
    table = case.table[:, :1] if paged else None  # one page: 4 rows per sequence
    rows = PAGE if paged else CAP
    big = torch.randn(B, rows + 1, HKV, D).half()
    err = torch.zeros(1, dtype=torch.int32)
    kv_append.append(*case.caches, big, big, torch.zeros(B, dtype=torch.int32), table, PAGE if paged else 0, "cuda",
                     err=err)
    assert case.bytes_equal(before)
    assert int(err[0]) == DC.BAD_LENGTH.value | DC.NOT_STORED.value, _REPORT.message(int(err[0]), "cpu", "")


def test_narrow_int32_saturates_and_reports(interpret):
    """The int64 -> int32 narrowing the default path runs instead of torch's (which wraps), on a strided view."""
    from rocmflash.kernels.decode import checks as KC

    values = torch.tensor([0, 7, -7, 2 ** 31 - 1, -(2 ** 31), 2 ** 31, 2 ** 32 + 3, -(2 ** 40)])
    strided = torch.stack([values, -values], 1)[:, 0]
    err = torch.zeros(1, dtype=torch.int32)
    got = KC.narrow_int32(strided, err, "cuda")
    want = values.clamp(-(2 ** 31), 2 ** 31 - 1).to(torch.int32)
    assert got.dtype == torch.int32 and torch.equal(got, want) and int(err[0]) == KC.BAD_WIDE.value
    err.zero_()
    fine = torch.tensor([3, -4, 2 ** 31 - 1, -(2 ** 31)])
    assert torch.equal(KC.narrow_int32(fine, err, "cuda"), fine.to(torch.int32)) and int(err[0]) == 0
    same = torch.tensor([1, 2], dtype=torch.int32)
    assert KC.narrow_int32(same, err, "cuda") is same
