"""The HF integration's attention calls read no mask on the host where the mask is known without reading
it: a causal mask transformers builds over a 2-D padding mask (training, prefill) is packed for the
varlen kernel on the device, from the 2-D mask (``rocmflash_mask``). Where a read decides the route, it is
one read per forward: any other 4-D mask (rocmflash or SDPA?) and a one-token step's mask (one run of keys
per row: the decode kernel, or not). Tiny random Llama, Triton's interpreter (CPU)."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

import rocmflash.integrations.hf as rf_hf  # noqa: E402
from test_varlen_no_sync import cpu_error_word, no_host_reads  # noqa: E402

pytestmark = [pytest.mark.usefixtures("interpret"), pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning"), pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]


def _tiny_llama(seed):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      attention_dropout=0.0)
    return LlamaForCausalLM(cfg).to(torch.bfloat16)


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.fixture
def spied_attention(monkeypatch):
    """Register rocmflash with its attention function run under the host-read spy; yields the list of the
    reads seen (the CPU error word, read where no GPU exists, is allowed). Re-registers the plain one after."""
    from transformers import AttentionInterface

    rf_hf.register()
    reads = []

    def spied(*args, **kwargs):
        with no_host_reads(monkeypatch, cpu_error_word(), record=reads):
            return rf_hf.rocmflash_attention_forward(*args, **kwargs)

    AttentionInterface.register(rf_hf.NAME, spied)
    yield reads
    rf_hf.register()


def _padding():
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[0, :4] = 0  # left padding
    mask[1, 9:] = 0  # right padding
    mask[2, [3, 4, 9]] = 0  # holes
    return mask


def test_padded_training_step_reads_no_mask_on_the_host(spied_attention, monkeypatch):
    """Forward and backward of a padded batch (left, right, holes) through rocmflash_mask: no host read in
    any attention call nor in the backward; logits on real tokens and every gradient match SDPA."""
    model = _tiny_llama(11)
    ids = torch.randint(0, 96, (3, 12))
    mask = _padding()
    # the loss reads the logits of position t for the label of t + 1: keep padded positions' logits out of it
    # (rocmflash gives a padded query 0; SDPA lets a hole's query attend the real keys before it)
    pad_before = torch.nn.functional.pad(mask[:, :-1] == 0, (1, 0))
    labels = ids.masked_fill((mask == 0) | pad_before, -100)

    def run(impl, spy_backward=False):
        model.set_attn_implementation(impl)
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        if spy_backward:
            with no_host_reads(monkeypatch, cpu_error_word()):
                out.loss.backward()
        else:
            out.loss.backward()
        return out.logits.detach().float(), {n: p.grad.clone() for n, p in model.named_parameters()
                                             if p.grad is not None}

    ref, ref_grads = run("sdpa")
    before = rf_hf.stats()
    out, grads = run("rocmflash", spy_backward=True)
    after = rf_hf.stats()
    assert spied_attention == []
    assert after["rocmflash"] - before["rocmflash"] == 2 and after["sdpa"] == before["sdpa"]
    real = mask.bool()
    assert _rel(out[real], ref[real]) < 2e-2
    for name in ref_grads:
        assert _rel(grads[name], ref_grads[name]) < 4e-2, name


def test_a_4d_mask_from_the_user_is_read_once_per_forward(spied_attention):
    """A 4-D padding mask rocmflash did not build is read once (is it padding + causal? that decides the
    route), by the first layer; the layers after it reuse the answer."""
    model = _tiny_llama(12)
    model.set_attn_implementation("rocmflash")
    ids = torch.randint(0, 96, (2, 10))
    pad = torch.ones(2, 10, dtype=torch.bool)
    pad[0, :3] = False
    mask4 = torch.ones(10, 10, dtype=torch.bool).tril()[None, None] & pad[:, None, None, :]
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask4).logits
        model.set_attn_implementation("sdpa")
        ref = model(input_ids=ids, attention_mask=mask4).logits
    assert len(spied_attention) == 1, spied_attention
    assert _rel(out[pad], ref[pad]) < 2e-2


def test_generate_reads_each_step_mask_once(spied_attention):
    """Left-padded generate(): the prefill reads nothing; each one-token step reads its mask once (one run
    of keys per row, or holes: which kernel computes the step), whatever the number of layers."""
    model = _tiny_llama(13)
    model.set_attn_implementation("rocmflash")
    ids = torch.randint(1, 96, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :3] = 0
    ids[1, :3] = 0
    before = rf_hf.stats()
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert rf_hf.stats()["decode"] - before["decode"] == 2 * 3
    assert len(spied_attention) == 3, spied_attention  # 3 one-token steps, one read each (2 layers)


def test_rocmflash_mask_is_sdpa_mask_bit_for_bit():
    """The mask function registered for "rocmflash" returns transformers' sdpa_mask answer unchanged
    (causal, sliding window, no padding -> None), and remembers a layout only for causal + 2-D padding."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask, sliding_window_causal_mask_function

    pad = _padding().bool()
    for fn in (causal_mask_function, sliding_window_causal_mask_function(4)):
        kw = dict(batch_size=3, q_length=12, kv_length=12, q_offset=0, kv_offset=0, mask_function=fn,
                  attention_mask=pad, allow_is_causal_skip=True)
        rf_hf._BUILT.clear()
        got, want = rf_hf.rocmflash_mask(**kw), sdpa_mask(**kw)
        assert torch.equal(got, want)
        assert ("mask" in rf_hf._BUILT and rf_hf._BUILT["mask"]() is got) == (fn is causal_mask_function)
    kw.update(attention_mask=torch.ones(3, 12, dtype=torch.bool), mask_function=causal_mask_function)
    assert rf_hf.rocmflash_mask(**kw) is None and sdpa_mask(**kw) is None
    layout = rf_hf.padded_layout(got, 12, 12, True, -1)  # the sliding-window mask: read and checked
    assert layout is None  # a window mask is not a causal one


def test_a_built_mask_changed_in_place_is_read_again(spied_attention):
    """The remembered layout is dropped when the mask tensor changes in place (its version moves)."""
    from transformers.masking_utils import causal_mask_function

    pad = _padding().bool()
    mask = rf_hf.rocmflash_mask(batch_size=3, q_length=12, kv_length=12, q_offset=0, kv_offset=0,
                                mask_function=causal_mask_function, attention_mask=pad)
    assert rf_hf._built_layout(mask, 12, 12, True, -1) is not None
    assert rf_hf._built_layout(mask, 12, 12, True, 3) is None  # a window: not served from the 2-D mask
    mask[0, 0, 5, 5] = False
    assert rf_hf._built_layout(mask, 12, 12, True, -1) is None
    assert rf_hf.padded_layout(mask, 12, 12, True, -1) is None  # read: no longer padding + causal


@pytest.mark.gpu
def test_gpu_padded_training_step_never_synchronises_in_attention(compiled, monkeypatch):
    """On the GPU: the attention calls and the backward of a padded training step run under
    torch.cuda.set_sync_debug_mode("error") (transformers' own mask creation, which reads the 2-D mask,
    runs outside it)."""
    from transformers import AttentionInterface

    rf_hf.register()
    model = _tiny_llama(14).cuda()
    model.set_attn_implementation("rocmflash")
    ids = torch.randint(0, 96, (3, 12), device="cuda")
    mask = _padding().cuda()

    def strict(*args, **kwargs):
        torch.cuda.set_sync_debug_mode("error")
        try:
            return rf_hf.rocmflash_attention_forward(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode(0)

    model(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()  # compiles
    torch.cuda.synchronize()
    AttentionInterface.register(rf_hf.NAME, strict)
    try:
        loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
        torch.cuda.set_sync_debug_mode("error")
        try:
            loss.backward()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    finally:
        rf_hf.register()
    assert torch.isfinite(loss)
