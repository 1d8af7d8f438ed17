"""transformers 5 causal-LM families with ``attn_implementation="rocmfa"`` (CPU, Triton's interpreter), each a tiny
random model built from its config class: logits and input gradients against ``"eager"`` in fp32, greedy
``generate()`` tokens (with and without left padding), and a packed batch -- transformers' packing kwargs, and
position_ids alone -- against the same sequences run one by one. Every case also checks that rocmflash's kernels
served the calls (``rocmflash.integrations.hf.stats()``): a silent fallback to SDPA fails it.

rocmflash runs fp16 (it computes fp16/bf16); the reference is the same weights in fp32 through eager. Tolerances
(relative Frobenius error): :data:`TOL_LOGITS`, :data:`TOL_GRAD` -- fp16 rounding of a 2-layer model is ~1e-3;
a dropped window, soft-cap or packing moves these models' logits by more than 1e-2 (the weights are drawn with a
large ``initializer_range`` and Gemma 2's cap is set low so that each feature matters).

:data:`FAMILIES` is the one list of families: add one with its config class, model class and the config values
that give it its features.
"""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import rocmflash.integrations.hf as rf_hf  # noqa: E402

pytestmark = [pytest.mark.usefixtures("interpret"), pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning"), pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]

TOL_LOGITS = 5e-3
TOL_GRAD = 1e-2
VOCAB, SEQ = 128, 12
#: the packed batch's sequence lengths (one row of SEQ tokens); the first is longer than the sliding window
PACKED = (7, 3, 2)

#: name -> (config class, model class, config values beyond :data:`COMMON`)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 5}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"sliding_window": 5, "attn_logit_softcapping": 0.5,
                                                     "query_pre_attn_scalar": 16, "final_logit_softcapping": None}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    # attention sinks (s_aux, one learned logit per head) + a sliding window on alternate layers, MoE
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2,
                                                      "sliding_window": 5}),
}
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=64, attention_dropout=0.0,
              initializer_range=0.2, pad_token_id=0, bos_token_id=1, eos_token_id=2)
LAYERS = COMMON["num_hidden_layers"]


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    """``(name, eager fp32 model, rocmfa fp16 model)``: the same random weights, built once per family."""
    config_name, model_name, extra = FAMILIES[request.param]
    cfg = getattr(transformers, config_name)(**COMMON, **extra)
    torch.manual_seed(sum(map(ord, request.param)))
    name = rf_hf.register()
    eager = getattr(transformers, model_name)._from_config(cfg, attn_implementation="eager").eval()
    ours = copy.deepcopy(eager).half()
    ours.set_attn_implementation(name)
    return request.param, eager, ours


def _served(before, layers_calls, key="rocmflash"):
    after = rf_hf.stats()
    assert after[key] - before[key] == layers_calls, (key, before, after)
    assert after["sdpa"] == before["sdpa"]  # no call fell back to transformers' SDPA


def _forward_backward(model, embeds, weights, **kwargs):
    """Logits and d(sum(logits * weights))/d(inputs_embeds) of ``model``, in fp32."""
    embeds = embeds.detach().to(next(model.parameters()).dtype).requires_grad_()
    logits = model(inputs_embeds=embeds, use_cache=False, **kwargs).logits
    (logits.float() * weights).sum().backward()
    return logits.detach().float(), embeds.grad.float()


def test_logits_and_input_gradients_match_eager(family):
    """Two sequences of SEQ tokens: logits and inputs_embeds.grad within the fp16 tolerance of eager fp32."""
    name, eager, ours = family
    torch.manual_seed(1)
    embeds = torch.randn(2, SEQ, COMMON["hidden_size"])
    weights = torch.randn(2, SEQ, VOCAB)
    ref, ref_grad = _forward_backward(eager, embeds, weights)
    before = rf_hf.stats()
    out, grad = _forward_backward(ours, embeds, weights)
    _served(before, LAYERS)
    assert torch.isfinite(out).all() and torch.isfinite(grad).all()
    assert _rel(out, ref) < TOL_LOGITS, name
    assert _rel(grad, ref_grad) < TOL_GRAD, name


@pytest.mark.parametrize("left_pad", [0, 3], ids=["unpadded", "left-padded"])
def test_greedy_generate_matches_eager(family, left_pad):
    """Greedy generate() of 2 prompts (the second left-padded): eager fp32's tokens; every step on rocmflash."""
    name, eager, ours = family
    torch.manual_seed(2)
    ids = torch.randint(3, VOCAB, (2, 8))
    mask = torch.ones_like(ids)
    mask[1, :left_pad] = 0
    ids[1, :left_pad] = 0
    new = 4

    def gen(model):
        with torch.no_grad():
            return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                                  do_sample=False, pad_token_id=0)

    ref = gen(eager)
    before = rf_hf.stats()
    out = gen(ours)
    _served(before, LAYERS * new)
    assert torch.equal(out, ref), name


def _packing_kwargs():
    cu = torch.tensor([0, *torch.tensor(PACKED).cumsum(0).tolist()], dtype=torch.int32)
    return dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(PACKED), max_length_k=max(PACKED))


@pytest.mark.parametrize("form", ["kwargs", "position_ids"])
@pytest.mark.parametrize("use_cache", [False, True], ids=["mask", "no-mask"])
def test_packed_batch_matches_sequences_one_by_one(family, form, use_cache):
    """PACKED sequences in one row (DataCollatorWithFlattening's forms): logits and input gradients equal eager's
    on each sequence alone. Without a cache transformers builds a block-diagonal mask (checked, then the varlen
    kernel); with one (``use_cache=True``) it builds none and only the kwargs or position_ids tell the sequences."""
    name, eager, ours = family
    torch.manual_seed(3)
    embeds = torch.randn(1, SEQ, COMMON["hidden_size"])
    weights = torch.randn(1, SEQ, VOCAB)
    refs, ref_grads, start = [], [], 0
    for n in PACKED:  # the reference: each sequence alone, through eager fp32
        out, grad = _forward_backward(eager, embeds[:, start:start + n], weights[:, start:start + n])
        refs.append(out)
        ref_grads.append(grad)
        start += n
    ref, ref_grad = torch.cat(refs, 1), torch.cat(ref_grads, 1)
    position_ids = torch.cat([torch.arange(n) for n in PACKED])[None]
    kwargs = dict(position_ids=position_ids, **(_packing_kwargs() if form == "kwargs" else {}))
    x = embeds.detach().half().requires_grad_()
    before = rf_hf.stats()
    logits = ours(inputs_embeds=x, use_cache=use_cache, **kwargs).logits
    (logits.float() * weights).sum().backward()
    _served(before, LAYERS, key="packed")
    assert _rel(logits.float(), ref) < TOL_LOGITS, name
    assert _rel(x.grad.float(), ref_grad) < TOL_GRAD, name


def test_an_unpacked_batch_with_position_ids_keeps_its_route(family):
    """position_ids that do not restart (one sequence per row) leave the call on its usual route (not packed)."""
    _, _, ours = family
    before = rf_hf.stats()
    with torch.no_grad():
        ours(input_ids=torch.randint(3, VOCAB, (2, SEQ)), position_ids=torch.arange(SEQ)[None].expand(2, -1),
             use_cache=True)
    assert rf_hf.stats()["packed"] == before["packed"]
    _served(before, LAYERS)
