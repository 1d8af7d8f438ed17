"""The vgpr-report plot: one distinct, colour-blind-safe style per verdict, and a PNG written from rows."""

from rocmflash.static.prune import HARMLESS_SPILL, KEPT_ANYWAY, REASONS
from rocmflash.static.report import OKABE_ITO, VERDICT_STYLES, plot_vgprs, verdict_kind


def _row(variant, m, n, warps, vgprs, verdict, reason):
    return {"variant": variant, "BLOCK_M": m, "BLOCK_N": n, "num_warps": warps, "num_stages": 1, "waves_per_eu": 0,
            "PRE_LOAD_V": False, "allocated_vgprs": vgprs, "verdict": verdict, "reason": reason, "arch": "gfx90a",
            "matrix_instr_nonkdim": 16, "kpack": 1, "schedule_hint": None}


def test_every_verdict_has_its_own_colour_and_marker():
    kinds = {verdict_kind({"verdict": "pruned", "reason": r}) for r in REASONS}
    kinds |= {verdict_kind({"verdict": "kept", "reason": r}) for r in (None, KEPT_ANYWAY, HARMLESS_SPILL)}
    assert kinds == set(VERDICT_STYLES)  # every verdict a row can carry is styled, and no style is unused
    styles = list(VERDICT_STYLES.values())
    for field in ("colour", "marker", "label"):
        values = [getattr(s, field) for s in styles]
        assert len(set(values)) == len(values), field
    assert {s.colour for s in styles} <= set(OKABE_ITO.values())
    assert {"spill", "LDS over budget", "below occupancy floor", "cliff victim", "kept, harmless spill",
            "kept"} <= {s.label for s in styles}


def test_plot_writes_a_png(tmp_path):
    rows = [_row("online", 64, 32, 4, 96, "kept", None), _row("online", 128, 64, 8, 264, "pruned", "spills"),
            _row("online", 128, 64, 4, 176, "kept", HARMLESS_SPILL),
            _row("split_d", 64, 32, 4, 130, "pruned", "cliff_victim"),
            _row("split_d", 128, 64, 8, 200, "pruned", "below_occupancy_floor"),
            _row("online", 64, 32, 8, None, "pruned", "compile_failed")]
    path = tmp_path / "vgprs.png"
    plot_vgprs(rows, "gfx90a", str(path), "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
