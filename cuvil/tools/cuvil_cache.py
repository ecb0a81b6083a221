"""`cuvil-cache` (or `python -m cuvil.tools.cuvil_cache`): what Cuvil's caches under
`$CUVIL_CACHE_DIR` hold, or remove it: the compiled-model cache's entries (`cuvil/model_cache.py`)
and the object cache's modules and model indexes (`cuvil/codegen/cache.py`).

    cuvil-cache            # each model entry: model, size, when written, file; then the totals
    cuvil-cache --clear    # remove both caches' files
"""
from __future__ import annotations

import argparse
import time

from .. import model_cache
from ..codegen.cache import ObjectCache


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="cuvil-cache", description="list (or remove) what Cuvil's caches hold")
    ap.add_argument("--clear", action="store_true", help="remove the compiled-model cache and the object cache")
    args = ap.parse_args(argv)
    objects = ObjectCache()
    if args.clear:
        models, files = model_cache.clear(), objects.clear()
        print(f"removed {models} model {_entries(models)} from {model_cache.cache_root()} "
              f"and {files} object cache {'file' if files == 1 else 'files'} from {objects.root}")
        return
    listed = model_cache.entries()
    for e in listed:
        written = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.written))
        print(f"{e.model:24s} {e.bytes / 2**20:9.2f} MiB  {written}  {e.path.name}")
    print(f"{len(listed)} model {_entries(len(listed))}, {sum(e.bytes for e in listed) / 2**20:.2f} MiB "
          f"in {model_cache.cache_root()}")
    files = objects.files()
    modules, indexes = (sum(f.suffixes == [suffix] for f in files) for suffix in (".o", ".units"))
    print(f"object cache: {modules} compiled modules, {indexes} model indexes, "
          f"{sum(f.stat().st_size for f in files) / 2**20:.2f} MiB in {objects.root}")


def _entries(n: int) -> str:
    return "entry" if n == 1 else "entries"


if __name__ == "__main__":
    main()
