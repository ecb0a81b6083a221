"""The explicit skip list of the OpInfo tests: every entry says why.

`REFUSALS`: CuvilErrors that are Cuvil's legitimate answer for some samples of an OpInfo (an
argument or a form a row does not support). A refusal counts only if an entry here matches the
OpInfo, the dtype, and the error's text; an unlisted refusal fails the test, and an entry that
no sample needs any more fails `test_every_skip_entry_is_used`.

`UNMAPPED`: rows of `ATEN_TABLE` that no OpInfo exercises, and why they are covered elsewhere or
cannot be.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Refusal:
    op: str                        # OpInfo key: `name` or `name[variant]`
    message: str                   # regex searched in the CuvilError's text
    reason: str                    # why this refusal is right (or which missing feature it is)
    dtypes: tuple[torch.dtype, ...] = ()    # empty: every dtype the OpInfo is tested in

    def matches(self, key: str, dtype: torch.dtype, text: str) -> bool:
        return self.op == key and (not self.dtypes or dtype in self.dtypes) and re.search(self.message, text) is not None


REFUSALS: list[Refusal] = [
]

UNMAPPED: dict[str, str] = {
}


def matching_refusal(key: str, dtype: torch.dtype, text: str) -> Refusal | None:
    return next((r for r in REFUSALS if r.matches(key, dtype, text)), None)
