"""What a model's attention looks like: built-in presets and transformers ``config.json`` files.

``rocmflash tune --model PATH|NAME`` reads the attention geometry of a model -- head dim,
query and key/value heads, sliding window, logit softcap, context length -- from a local
``config.json`` (a file, or a folder holding one; nothing is downloaded) or from a built-in
preset. :mod:`rocmflash.tuning.plan` turns it into the attention problems to tune.

The preset values are those of each model's published ``config.json`` (the repository is
named in ``source``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Optional


class ModelConfigError(ValueError):
    """A ``--model`` that is neither a preset nor a readable transformers config."""


@dataclasses.dataclass(frozen=True)
class ModelAttention:
    """The attention geometry of a model (what the tuner needs of it)."""

    name: str
    head_dim: int
    heads_q: int
    heads_kv: int
    layers: int = 0
    sliding_window: Optional[int] = None  #: keys to the left each query sees on windowed layers
    softcap: float = 0.0  #: tanh logit cap (gemma-2); 0 = none
    max_positions: Optional[int] = None  #: the model's context length (caps the seqlen buckets)
    dtype: Optional[str] = None  #: the checkpoint's dtype, if the config names one
    source: str = ""

    @property
    def gqa_ratio(self) -> int:
        return self.heads_q // self.heads_kv

    def describe(self) -> str:
        extra = []
        if self.sliding_window:
            extra.append(f"sliding window {self.sliding_window}")
        if self.softcap:
            extra.append(f"softcap {self.softcap:g}")
        if self.max_positions:
            extra.append(f"context {self.max_positions}")
        return (f"{self.name}: head dim {self.head_dim}, {self.heads_q} query / {self.heads_kv} key-value heads "
                f"(GQA {self.gqa_ratio}:1)" + (f", {self.layers} layers" if self.layers else "")
                + ("".join(f", {e}" for e in extra)))


def _preset(name, source, D, hq, hkv, layers, window=None, softcap=0.0, ctx=None, dtype="bf16"):
    return ModelAttention(name=name, head_dim=D, heads_q=hq, heads_kv=hkv, layers=layers, sliding_window=window,
                          softcap=softcap, max_positions=ctx, dtype=dtype, source=source)


#: built-in presets (values from each model's published config.json)
PRESETS = {p.name: p for p in (
    _preset("llama-3-8b", "meta-llama/Meta-Llama-3-8B", 128, 32, 8, 32, ctx=8192),
    _preset("llama-3-70b", "meta-llama/Meta-Llama-3-70B", 128, 64, 8, 80, ctx=8192),
    _preset("llama-3.1-8b", "meta-llama/Llama-3.1-8B", 128, 32, 8, 32, ctx=131072),
    _preset("llama-3.2-1b", "meta-llama/Llama-3.2-1B", 64, 32, 8, 16, ctx=131072),
    _preset("qwen2.5-7b", "Qwen/Qwen2.5-7B", 128, 28, 4, 28, ctx=131072),
    _preset("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B", 64, 14, 2, 24, ctx=32768),
    _preset("mistral-7b", "mistralai/Mistral-7B-v0.1", 128, 32, 8, 32, window=4096, ctx=32768),
    _preset("gemma-2-9b", "google/gemma-2-9b", 256, 16, 8, 42, window=4096, softcap=50.0, ctx=8192),
)}


def _config_path(path: str) -> str:
    if os.path.isdir(path):
        inner = os.path.join(path, "config.json")
        if not os.path.isfile(inner):
            raise ModelConfigError(f"--model {path}: a folder without a config.json")
        return inner
    if not os.path.isfile(path):
        raise ModelConfigError(f"--model {path!r} is neither a preset ({', '.join(sorted(PRESETS))}) "
                               "nor a config.json file or a folder holding one")
    return path


def _positive_int(cfg: dict, key: str, path: str) -> Optional[int]:
    """``cfg[key]`` as a positive int, None when absent or null. ``type(...) is int`` refuses bools, floats
    (``4096.0``) and the ``NaN``/``Infinity`` literals Python's ``json`` reads as floats."""
    value = cfg.get(key)
    if value is None:
        return None
    if type(value) is not int or value < 1:
        raise ModelConfigError(f"{path}: {key} = {value!r}; expected a positive integer")
    return value


def _finite_number(cfg: dict, key: str, path: str) -> float:
    """``cfg[key]`` as a finite float >= 0, 0.0 when absent or null. Python's ``json`` reads ``NaN`` and
    ``Infinity`` as floats, and a bool is an int to ``isinstance``: all three are refused (a NaN cap would
    pass ``< 0`` and make every score NaN; ``true`` is no cap value)."""
    value = cfg.get(key)
    if value is None:
        return 0.0
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
        raise ModelConfigError(f"{path}: {key} = {value!r}; expected a finite number >= 0")
    return float(value)


def from_config(cfg: dict, name: str, path: str = "config.json") -> ModelAttention:
    """The attention geometry of a transformers config dict (a multimodal config's ``text_config`` if
    it has one)."""
    if isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg["text_config"], "torch_dtype": cfg.get("torch_dtype", cfg["text_config"].get("torch_dtype"))}
    heads = _positive_int(cfg, "num_attention_heads", path)
    if heads is None:
        raise ModelConfigError(f"{path}: no num_attention_heads; is this a transformers decoder config?")
    kv = _positive_int(cfg, "num_key_value_heads", path) or heads
    if heads % kv:
        raise ModelConfigError(f"{path}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
    head_dim = _positive_int(cfg, "head_dim", path)
    if head_dim is None:
        hidden = _positive_int(cfg, "hidden_size", path)
        if hidden is None or hidden % heads:
            raise ModelConfigError(f"{path}: no head_dim, and hidden_size {hidden!r} does not divide into "
                                   f"{heads} heads")
        head_dim = hidden // heads
    window = cfg.get("sliding_window")
    if cfg.get("use_sliding_window") is False:  # qwen2 writes a window it does not use
        window = None
    if window is not None and (type(window) is not int or window < 1):
        raise ModelConfigError(f"{path}: sliding_window = {window!r}; expected a positive integer or null")
    softcap = _finite_number(cfg, "attn_logit_softcapping", path)
    dtype = {"bfloat16": "bf16", "float16": "fp16"}.get(str(cfg.get("torch_dtype") or cfg.get("dtype")))
    return ModelAttention(name=name, head_dim=head_dim, heads_q=heads, heads_kv=kv,
                          layers=_positive_int(cfg, "num_hidden_layers", path) or 0, sliding_window=window,
                          softcap=softcap, max_positions=_positive_int(cfg, "max_position_embeddings", path),
                          dtype=dtype, source=path)


def load_model(spec: str) -> ModelAttention:
    """A preset by name (case-insensitive), else a local ``config.json`` (or a folder holding one)."""
    text = str(spec).strip()
    preset = PRESETS.get(text.lower())
    if preset is not None:
        return preset
    path = _config_path(text)
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, UnicodeDecodeError) as err:
        raise ModelConfigError(f"--model {path}: cannot read it ({err})") from None
    except ValueError as err:
        raise ModelConfigError(f"--model {path}: not valid JSON ({err})") from None
    if not isinstance(cfg, dict):
        raise ModelConfigError(f"--model {path}: expected a JSON object (a transformers config)")
    folder = os.path.basename(os.path.dirname(os.path.abspath(path)))
    return from_config(cfg, folder or path, path)


__all__ = ["ModelAttention", "ModelConfigError", "PRESETS", "from_config", "load_model"]
