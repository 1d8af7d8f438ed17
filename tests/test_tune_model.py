"""``rocmflash tune --model``: presets, transformers config.json files, the plan, and the CLI (no GPU)."""

import argparse
import json

import pytest

from rocmflash.cli.tune import add_tune_parsers, run_tune
from rocmflash.hw.gpus import get_gpu
from rocmflash import db as D
from rocmflash.tuning.models import PRESETS, ModelConfigError, from_config, load_model
from rocmflash.tuning.plan import DEFAULT_SEQLENS, make_plan


def cli(argv):
    parser = argparse.ArgumentParser(prog="rocmflash")
    sub = parser.add_subparsers(dest="command")
    add_tune_parsers(sub)
    return run_tune(parser.parse_args(argv))


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("ROCMFLASH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(D.CONFIG_DIR_ENV, str(tmp_path / "configs"))
    monkeypatch.setenv("COLUMNS", "200")
    return tmp_path


LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_attention_heads": 32,
         "num_key_value_heads": 8, "num_hidden_layers": 32, "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}


def test_config_json_geometry_and_preset_agree(tmp_path):
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps(LLAMA))
    m = load_model(str(tmp_path / "llama"))  # a folder holding config.json
    p = PRESETS["llama-3-8b"]
    assert (m.head_dim, m.heads_q, m.heads_kv, m.layers, m.max_positions, m.dtype) == \
        (p.head_dim, p.heads_q, p.heads_kv, p.layers, p.max_positions, "bf16") == (128, 32, 8, 32, 8192, "bf16")
    assert m.name == "llama" and m.gqa_ratio == 4
    assert load_model(str(tmp_path / "llama" / "config.json")) == m
    assert load_model("Gemma-2-9B").softcap == 50.0  # presets by name, any case


def test_config_variants_head_dim_window_softcap_text_config():
    gemma = from_config({"num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "hidden_size": 3584,
                         "sliding_window": 4096, "attn_logit_softcapping": 50.0}, "g")
    assert (gemma.head_dim, gemma.sliding_window, gemma.softcap) == (256, 4096, 50.0)
    qwen = from_config({"num_attention_heads": 28, "num_key_value_heads": 4, "hidden_size": 3584,
                        "sliding_window": 131072, "use_sliding_window": False}, "q")
    assert qwen.head_dim == 128 and qwen.sliding_window is None  # a window qwen2 does not use
    mm = from_config({"torch_dtype": "float16", "text_config": {"num_attention_heads": 8, "hidden_size": 512}}, "mm")
    assert (mm.head_dim, mm.heads_kv, mm.dtype) == (64, 8, "fp16")


@pytest.mark.parametrize("cfg, words", [
    ({"hidden_size": 4096}, "no num_attention_heads"),
    ({"num_attention_heads": 32, "num_key_value_heads": 5, "hidden_size": 4096}, "not a multiple"),
    ({"num_attention_heads": 32, "hidden_size": 4001}, "does not divide"),
    ({"num_attention_heads": 0, "hidden_size": 4096}, "positive integer"),
    ({"num_attention_heads": 32, "hidden_size": 4096, "sliding_window": -3}, "sliding_window"),
])
def test_bad_configs_name_the_field(cfg, words):
    with pytest.raises(ModelConfigError, match=words):
        from_config(cfg, "bad")


#: every numeric field from_config reads (hidden_size only without head_dim: the base config below has none)
NUMERIC_FIELDS = ("num_attention_heads", "num_key_value_heads", "hidden_size", "sliding_window",
                  "attn_logit_softcapping", "num_hidden_layers", "max_position_embeddings", "head_dim")


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "true"])
@pytest.mark.parametrize("field", NUMERIC_FIELDS)
def test_config_json_non_finite_or_bool_numbers_are_refused(tmp_path, field, literal):
    """Python's json reads NaN/Infinity literals as floats (a NaN softcap passed ``< 0`` and was tuned with);
    a bool is an int to isinstance. Each is one ModelConfigError line naming the field, for every numeric field."""
    base = json.dumps({**LLAMA, "sliding_window": 4096, "attn_logit_softcapping": 30.0})
    assert load_model(_write(tmp_path / "good.json", base)).softcap == 30.0  # the base itself is accepted
    text = base[:-1] + f', "{field}": {literal}}}'  # the last key wins in json
    with pytest.raises(ModelConfigError, match=f"{field} = ") as err:
        load_model(_write(tmp_path / "config.json", text))
    assert "\n" not in str(err.value)


def _write(path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_cli_nan_softcap_is_one_line(env, capsys):
    path = _write(env / "config.json", json.dumps(LLAMA)[:-1] + ', "attn_logit_softcapping": NaN}')
    assert cli(["tune", "--gpu", "mi300x", "--model", path, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "attn_logit_softcapping = nan; expected a finite number >= 0" in err and err.count("\n") == 1


def test_bad_model_paths_are_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[1, 2]")
    for arg, words in ((str(tmp_path / "empty"), "without a config.json"), (str(tmp_path / "bad.json"), "not valid JSON"),
                       (str(tmp_path / "list.json"), "expected a JSON object"), ("no-such-model", "neither a preset")):
        with pytest.raises(ModelConfigError, match=words):
            load_model(arg)


def test_plan_enumerates_every_problem_and_caps_buckets_at_the_context():
    model, gpu = PRESETS["llama-3-8b"], get_gpu("mi300x")
    plan = make_plan(model, gpu)
    assert plan.dtypes == ["fp16", "bf16"] and plan.seqlens == [1024, 2048, 4096, 8192]
    assert plan.dropped_seqlens == [16384, 32768] and any("context length 8192" in n for n in plan.notes)
    assert [plan.count(k) for k in ("fwd", "bwd", "decode")] == [8, 8, 8]
    keys = [p.key for p in plan.problems]
    assert "d128-bf16-causal-gqa4-s8192" in keys and "bwd-d128-fp16-causal-gqa4-s1024" in keys
    assert "decode-d128-bf16-gqa4-kv4096-b32" in keys and len(set(keys)) == len(keys)
    # the config counts are the spaces' own
    from rocmflash.tuning.backward import bwd_space
    from rocmflash.tuning.decode import decode_space

    assert {p.configs for p in plan.problems if p.kind == "bwd"} == {len(bwd_space("gfx942", 128))}
    assert {p.configs for p in plan.problems if p.kind == "decode"} == {len(decode_space("gfx942"))}
    two, one = plan.estimate_seconds(2, 8), plan.estimate_seconds(1, 8)
    assert two["live"] == pytest.approx(one["live"] / 2) and two["static"] == one["static"] > 0
    # a context-free model takes every default bucket; asked-for lengths are taken as given
    assert make_plan(PRESETS["qwen2.5-7b"], gpu).seqlens == list(DEFAULT_SEQLENS)
    explicit = make_plan(model, gpu, ["bf16"], [32768, 1000], passes=("fwd",), decode=False)
    assert [p.key for p in explicit.problems] == ["d128-bf16-causal-gqa4-s32768", "d128-bf16-causal-gqa4-s1024"]
    windowed = make_plan(PRESETS["mistral-7b"], gpu, ["bf16"], [4096])
    assert any("4096-key sliding window" in n for n in windowed.notes)


def test_cli_dry_run_prints_the_plan_only(env, capsys):
    assert cli(["tune", "--gpu", "mi300x", "--model", "llama-3-70b", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "llama-3-70b: head dim 128, 64 query / 8 key-value heads (GQA 8:1)" in out
    assert "forward (causal prefill)" in out and "decode (KV cache)" in out and "static phase only" in out
    assert not (env / "configs").exists()  # nothing written


@pytest.mark.parametrize("argv, words", [
    (["--model", "llama-3-8b", "--head-dim", "64"], "--head-dim does not go with --model"),
    (["--model", "nope"], "neither a preset"),
    (["--model", "llama-3-8b", "--mode", "decode", "--pass", "bwd"], "decode has no backward"),
    (["--model", "llama-3-8b", "--dtype", "fp8"], "fp8"),
    (["--model", "llama-3-8b", "--gpus", "all"], "no GPU is visible"),
    (["--head-dim", "64", "--dtype", "bf16"], "needs --seqlen"),
    (["--head-dim", "64", "--dtype", "bf16", "--seqlen", "1024", "--dry-run"], "--dry-run prints a --model plan"),
])
def test_cli_model_errors_are_one_line(env, capsys, argv, words):
    assert cli(["tune", "--gpu", "mi300x", "--dry-run", *argv] if "--dry-run" not in argv and "--gpus" not in argv
               else ["tune", "--gpu", "mi300x", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def test_cli_model_decode_tune_static_on_the_cpu(env, capsys):
    """End to end without a GPU: the decode space cross-compiled, a static entry written, unmeasured."""
    assert cli(["tune", "--gpu", "h100", "--model", "qwen2.5-0.5b", "--dtype", "bf16", "--seqlen", "1024",
                "--mode", "decode"]) == 0
    out = capsys.readouterr().out
    assert "decode-d64-bf16-gqa7-kv1024-b32" in out and "nothing was timed" in out
    data = D.ConfigDB.read(str(env / "configs" / "h100.json"))
    entry = data["entries"]["decode-d64-bf16-gqa7-kv1024-b32"]
    assert entry["measured"] is False and entry["best"]["BLOCK_N"] in (16, 32, 64, 128)
    assert set(data["entries"]) == {"decode-d64-bf16-gqa7-kv1024-b32"}
