"""GPU: the transformers family matrix of :mod:`tests.test_hf_families_interp` in bf16 on 2-layer models with
``attn_implementation="rocmfa"``: logits and input gradients against eager fp32 (same weights) and beside
``"sdpa"`` bf16 (rocmfa's error must be within 2x of SDPA's own, plus a floor), a packed row against each sequence
alone, and greedy ``generate()`` tokens against eager (first new token exact, >= 90 % equal: bf16 rounding may
flip a near tie later). Every case checks that rocmflash's kernels served the calls."""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import rocmflash.integrations.hf as rf_hf  # noqa: E402
from test_hf_families_interp import COMMON, FAMILIES, LAYERS, PACKED, VOCAB, _packing_kwargs  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("compiled"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.filterwarnings("ignore::FutureWarning")]

SEQ = 64
#: bf16 against eager fp32 on a 2-layer model with a large initializer range
FLOOR_LOGITS, FLOOR_GRAD = 2e-2, 4e-2


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.fixture(scope="module", params=list(FAMILIES))
def models(request):
    """``(name, eager fp32, rocmfa bf16, sdpa bf16)`` on the GPU, the same random weights."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA or ROCm GPU")
    config_name, model_name, extra = FAMILIES[request.param]
    cfg = getattr(transformers, config_name)(**COMMON, **extra)
    torch.manual_seed(sum(map(ord, request.param)))
    name = rf_hf.register()
    eager = getattr(transformers, model_name)._from_config(cfg, attn_implementation="eager").cuda().eval()
    ours = copy.deepcopy(eager).to(torch.bfloat16)
    ours.set_attn_implementation(name)
    sdpa = None
    if request.param not in ("gpt_oss",):  # SDPA has no sinks: transformers runs gpt-oss's sinks eagerly only
        sdpa = copy.deepcopy(eager).to(torch.bfloat16)
        sdpa.set_attn_implementation("sdpa")
    return request.param, eager, ours, sdpa


def _forward_backward(model, embeds, weights, **kwargs):
    embeds = embeds.detach().to(next(model.parameters()).dtype).requires_grad_()
    logits = model(inputs_embeds=embeds, use_cache=False, **kwargs).logits
    (logits.float() * weights).sum().backward()
    return logits.detach().float(), embeds.grad.float()


def test_gpu_family_logits_and_grads(models):
    name, eager, ours, sdpa = models
    torch.manual_seed(1)
    embeds = torch.randn(2, SEQ, COMMON["hidden_size"], device="cuda")
    weights = torch.randn(2, SEQ, VOCAB, device="cuda")
    ref, ref_grad = _forward_backward(eager, embeds, weights)
    before = rf_hf.stats()
    out, grad = _forward_backward(ours, embeds, weights)
    assert rf_hf.stats()["rocmflash"] - before["rocmflash"] == LAYERS and rf_hf.stats()["sdpa"] == before["sdpa"]
    bound_logits, bound_grad = FLOOR_LOGITS, FLOOR_GRAD
    if sdpa is not None:
        s_out, s_grad = _forward_backward(sdpa, embeds, weights)
        bound_logits = max(bound_logits, 2 * _rel(s_out, ref))
        bound_grad = max(bound_grad, 2 * _rel(s_grad, ref_grad))
    assert _rel(out, ref) < bound_logits, (name, _rel(out, ref))
    assert _rel(grad, ref_grad) < bound_grad, (name, _rel(grad, ref_grad))


def test_gpu_family_packed_row(models):
    name, eager, ours, _ = models
    torch.manual_seed(3)
    total = sum(PACKED)
    embeds = torch.randn(1, total, COMMON["hidden_size"], device="cuda")
    weights = torch.randn(1, total, VOCAB, device="cuda")
    refs, start = [], 0
    for n in PACKED:
        refs.append(_forward_backward(eager, embeds[:, start:start + n], weights[:, start:start + n])[0])
        start += n
    position_ids = torch.cat([torch.arange(n) for n in PACKED])[None].cuda()
    kwargs = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in _packing_kwargs().items()}
    before = rf_hf.stats()
    out, _ = _forward_backward(ours, embeds, weights, position_ids=position_ids, **kwargs)
    assert rf_hf.stats()["packed"] - before["packed"] == LAYERS
    assert _rel(out, torch.cat(refs, 1)) < FLOOR_LOGITS, name


@pytest.mark.parametrize("left_pad", [0, 5], ids=["unpadded", "left-padded"])
def test_gpu_family_generate(models, left_pad):
    name, eager, ours, _ = models
    torch.manual_seed(2)
    ids = torch.randint(3, VOCAB, (2, 16), device="cuda")
    mask = torch.ones_like(ids)
    mask[1, :left_pad] = 0
    ids[1, :left_pad] = 0
    new = 8

    def gen(model):
        with torch.no_grad():
            return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                                  do_sample=False, pad_token_id=0)[:, ids.shape[1]:]

    ref = gen(eager)
    before = rf_hf.stats()
    out = gen(ours)
    assert rf_hf.stats()["sdpa"] == before["sdpa"]
    assert torch.equal(out[:, 0], ref[:, 0]), name
    assert (out == ref).float().mean().item() >= 0.9, (name, out, ref)
