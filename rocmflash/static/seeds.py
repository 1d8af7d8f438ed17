"""Seeds: AMD-published configs that a tune on an AMD GPU always compiles and times.

The static score and pruner decide from compiler truth; the configs AMD's engineers
shipped after measuring on the hardware (:mod:`rocmflash.static.reference`) are measurements we
cannot make here. A live tune on an AMD GPU therefore always times the published
forward configs of its arch whose head-dim scope admits the problem -- added to the
space when it lacks them, and timed even when the pruner rejects them (unless they do
not compile) -- and says which they were.
"""

from __future__ import annotations

from typing import Optional

from rocmflash.config import KernelConfig, Problem


def reference_seeds(gpu, problem: Problem, variants: Optional[list] = None,
                    path: Optional[str] = None) -> list[tuple[str, KernelConfig]]:
    """``[(reference id, config), ...]``: the forward configs AMD publishes for ``gpu``'s arch that
    admit ``problem``'s head dim, one per distinct config (first id wins); none for other vendors."""
    if getattr(gpu, "vendor", None) != "amd":
        return []
    from rocmflash.static import reference

    refs = reference.select(reference.load(path), arch=gpu.arch, pass_="fwd", problem=problem, strict=False)
    seeds, seen = [], set()
    for ref in refs:
        cfg = ref.rocmflash
        if cfg is None or (variants and cfg.variant not in variants) or cfg in seen:
            continue
        seen.add(cfg)
        seeds.append((ref.id, cfg))
    return seeds


__all__ = ["reference_seeds"]
