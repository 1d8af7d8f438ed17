"""A named SDPA backend is served only where it clearly beat SDPA's own choice (``incumbent.NAMED_BACKEND_MARGIN``):
pinning one kernel gives up SDPA's per-shape choice for every call the entry serves."""

from rocmflash.api import host_bound, incumbent

BACKENDS = {"default": {"status": "ok", "time_ms": 0.3568, "train_ms": 1.50},
            "flash": {"status": "ok", "time_ms": 0.3540, "train_ms": 1.20},
            "cudnn": {"status": "ok", "time_ms": 0.3000, "train_ms": 1.49}}


def _field(backend, time_ms, train_backend="flash", train_ms=1.20):
    return {"backend": backend, "time_ms": time_ms, "triton_ms": 0.5, "backends": BACKENDS,
            "train": {"backend": train_backend, "time_ms": train_ms, "triton_ms": 2.0}}


def test_a_named_backend_within_the_margin_gives_way_to_default():
    # flash 0.8 % faster than default forward: default serves; 20 % faster in training: flash serves
    f = _field("flash", 0.3540)
    assert incumbent.winner(f, False) == "default" and incumbent.winner(f, True) == "flash"
    # cudnn 16 % faster forward: cudnn serves; 0.7 % faster in training: default serves
    g = _field("cudnn", 0.3000, "cudnn", 1.49)
    assert incumbent.winner(g, False) == "cudnn" and incumbent.winner(g, True) == "default"


def test_without_a_gated_default_the_named_backend_stands():
    failed = dict(BACKENDS, default={"status": "failed", "error": "no kernel"})
    f = dict(_field("flash", 0.3540), backends=failed)
    assert incumbent.winner(f, False) == "flash"
    assert incumbent.winner({"backend": "cudnn", "time_ms": 0.41, "triton_ms": 0.52}, False) == "cudnn"  # no backends
    assert incumbent.preferred_backend(_field("flash", 0.354), None, False) is None  # rocmflash's kernel: unchanged


def test_the_host_bound_rule_applies_the_same_preference():
    shape = {"batch": 8, "heads_q": 32, "seqlen_q": 2048, "seqlen_k": 2048}
    floors = {"backend": "default", "time_ms": 0.01, "triton_ms": 0.02,
              "train": {"backend": "default", "time_ms": 0.03, "triton_ms": 0.06}}
    f = _field("flash", 0.3540)
    # the entry's own shape (kernel-bound): SDPA wins, and within the margin its own choice serves
    assert host_bound.side_winner(f, shape, floors, False, 8, 32, 2048, 2048, False) == "default"
    assert host_bound.side_winner(f, shape, floors, True, 8, 32, 2048, 2048, False) == "flash"


def test_default_replaces_a_named_backend_only_where_it_also_beats_rocmflash():
    # cudnn 1.00 beat rocmflash's 1.01; SDPA's own choice (1.015) is within the margin of cudnn but slower than
    # rocmflash: cudnn, what won, serves
    backends = {"default": {"status": "ok", "time_ms": 1.015}, "cudnn": {"status": "ok", "time_ms": 1.00}}
    f = {"backend": "cudnn", "time_ms": 1.00, "triton_ms": 1.01, "backends": backends}
    assert incumbent.winner(f, False) == "cudnn"
    assert incumbent.winner(dict(f, triton_ms=1.02), False) == "default"
