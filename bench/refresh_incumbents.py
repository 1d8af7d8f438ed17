"""Time the platform's SDPA backends beside every measured forward entry of a GPU's database.

For each measured dense forward entry (``d128-bf16-causal-gqa1-s8192``...), the stored winner is timed
again and every SDPA backend this torch offers is gated and timed, forward and forward+backward (with
rocmflash's served forward+backward beside it), in one live-runner worker on this GPU -- both sides of
the comparison from one run. The entries get their ``incumbent`` field (:mod:`rocmflash.api.incumbent`),
which run-time dispatch reads. Writes a copy of the database (``--out-db``) and a table.

Usage (on a GPU)::

    python bench/refresh_incumbents.py --db configs/h100.json --out-db $OUT/h100.json --out $OUT
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", required=True, help="the database to refresh (read)")
    ap.add_argument("--out-db", required=True, help="where the refreshed copy is written")
    ap.add_argument("--out", default=".", help="directory for incumbents.md")
    ap.add_argument("--keys", default="", help="comma-separated entry keys (default: every forward entry)")
    args = ap.parse_args(argv)
    import torch
    import triton

    from rocmflash.db import ConfigDB, environment
    from rocmflash.tuning import incumbents
    from rocmflash.tuning.live import LiveRunner
    from rocmflash.tuning.live_worker import LiveSettings

    if not torch.cuda.is_available():
        print("bench/refresh_incumbents.py needs a GPU", file=sys.stderr)
        return 2
    if os.path.abspath(args.db) != os.path.abspath(args.out_db):
        shutil.copyfile(args.db, args.out_db)
    import json

    with open(args.out_db) as f:
        head = json.load(f)
    env = environment(torch.cuda.get_device_name())
    db = ConfigDB.open(args.out_db, head["gpu"], head["arch"], head.get("fingerprint") or env)
    lines = [f"# SDPA backends beside the shipped forward entries ({datetime.date.today()})", "",
             f"- device: {torch.cuda.get_device_name()}; torch {torch.__version__}; triton {triton.__version__}",
             f"- command: `python {' '.join(sys.argv)}`",
             "- one live-runner worker: the stored winner re-timed and each SDPA backend gated and timed on the same "
             "rotating inputs with the same cache flush (forward: the tuner's median; forward+backward: median of "
             "flushed steps, rocmflash's served step beside it)", ""]
    settings = LiveSettings()
    with LiveRunner(settings, device_index=0) as runner:
        n = incumbents.refresh(db, runner, settings.to_dict(), note=lambda s: (print(s, flush=True), lines.append(f"- {s}")),
                               keys=set(args.keys.split(",")) if args.keys else None)
    lines.append("")
    lines.append(f"{n} entries refreshed")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "incumbents.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
