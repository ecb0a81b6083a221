"""Helpers for the explorer tests: an in-process IPython shell with the extension loaded, and a way
to run a `%%cuvil` cell and catch what it displays."""
from __future__ import annotations

from dataclasses import dataclass
from unittest import mock

import pytest
from IPython.core.interactiveshell import InteractiveShell

import cuvil_explorer.magic as magic_module
from cuvil_explorer.magic import BOUND


@dataclass
class CellOutcome:
    shown: list          # what the magic displayed
    bound: dict          # the names the magic bound, as it left them
    ns: dict             # the user namespace (shared by every cell)

    @property
    def explorer(self):
        assert self.bound["_cuvil_error"] is None, self.bound["_cuvil_error"]
        return self.bound["_cuvil_explorer"]

    @property
    def error(self):
        assert self.bound["_cuvil_error"] is not None, "the cell did not fail"
        return self.bound["_cuvil_error"]


@pytest.fixture(scope="session")
def shell():
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "cuvil_explorer")
    return ip


@pytest.fixture(scope="session")
def cuvil_cell(shell):
    """`cuvil_cell(line, body)` runs a `%%cuvil` cell in the shell."""
    def run(line: str, body: str) -> CellOutcome:
        shown = []
        with mock.patch.object(magic_module, "display", shown.append):
            shell.run_cell_magic("cuvil", line, body)
        return CellOutcome(shown, {n: shell.user_ns[n] for n in BOUND}, shell.user_ns)
    return run
