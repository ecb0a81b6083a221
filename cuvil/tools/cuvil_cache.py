"""`cuvil-cache` (or `python -m cuvil.tools.cuvil_cache`): the compiled-model cache's entries
(`cuvil/model_cache.py`), listed or removed.

    cuvil-cache            # model, size, when written, file; the total
    cuvil-cache --clear    # remove every entry
"""
from __future__ import annotations

import argparse
import time

from .. import model_cache


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="cuvil-cache", description="list (or remove) the compiled-model cache's entries")
    ap.add_argument("--clear", action="store_true", help="remove every entry")
    args = ap.parse_args(argv)
    root = model_cache.cache_root()
    if args.clear:
        n = model_cache.clear()
        print(f"removed {n} {'entry' if n == 1 else 'entries'} from {root}")
        return
    listed = model_cache.entries()
    for e in listed:
        written = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.written))
        print(f"{e.model:24s} {e.bytes / 2**20:9.2f} MiB  {written}  {e.path.name}")
    print(f"{len(listed)} {'entry' if len(listed) == 1 else 'entries'}, "
          f"{sum(e.bytes for e in listed) / 2**20:.2f} MiB in {root}")


if __name__ == "__main__":
    main()
