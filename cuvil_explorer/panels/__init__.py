"""The panel framework. A panel is one small module: a `Panel` subclass, decorated with
`@register_panel`, that builds an ipywidget from a `CellRun` (its `.report` is the CompileReport).

    @register_panel
    class KernelsPanel(Panel):
        name, title, order = "kernels", "Kernels", 40

        @classmethod
        def available(cls, run):            # shown only when the report has kernels
            return bool(run.report.kernels)

        def build(self):
            return widgets.HTML(...)

Built-in panels load lazily from the modules in `BUILTIN_PANELS` (add the new module there).
Panels share an `ExplorerState`: `state.stage` is the pipeline point the user looks at (0: the
input IR, k: the IR after pass k), so stepping in one panel moves the others; `state.kernel` is
the kernel the user looks at (the code panel shows it); setting `state.show` to a panel's name
opens that panel's tab.
"""
from __future__ import annotations

import importlib
from typing import ClassVar

import ipywidgets as W
import traitlets
from IPython.core.error import UsageError

from ..run import CellRun

BUILTIN_PANELS: dict[str, str] = {
    "pipeline": "cuvil_explorer.panels.pipeline",
    "graph": "cuvil_explorer.panels.graph",
    "fusion": "cuvil_explorer.panels.fusion",
    "summary": "cuvil_explorer.panels.summary",
    "code": "cuvil_explorer.panels.code",
    "memory": "cuvil_explorer.panels.memory",
    "profile": "cuvil_explorer.panels.profile",
}

_PANELS: dict[str, type["Panel"]] = {}


class ExplorerState(traitlets.HasTraits):
    stage = traitlets.Int(0)         # the pipeline point: 0 the input IR, k after pass k
    kernel = traitlets.Unicode("")   # the kernel the user looks at
    show = traitlets.Unicode("")     # set to a panel's name to open its tab


class Panel:
    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    order: ClassVar[int] = 100      # tab position, lower first

    def __init__(self, run: CellRun, state: ExplorerState):
        self.run, self.state = run, state
        self.active = False          # the explorer sets it while the panel's tab is selected
        self.widget = self.build()

    @classmethod
    def available(cls, run: CellRun) -> bool:
        """Whether the compilation produced what this panel shows."""
        return True

    def build(self) -> W.Widget:
        raise NotImplementedError(f"panel '{self.name}' does not implement build()")

    def shown(self) -> None:
        """Called when the panel's tab is selected: draw expensive content here, lazily."""


def register_panel(cls: type[Panel]) -> type[Panel]:
    if not cls.name or not cls.title:
        raise ValueError(f"panel class {cls.__name__} needs a `name` and a `title`")
    _PANELS[cls.name] = cls
    return cls


def panel_names() -> list[str]:
    return sorted(set(_PANELS) | set(BUILTIN_PANELS))


def get_panel(name: str) -> type[Panel] | None:
    if name not in _PANELS and name in BUILTIN_PANELS:
        importlib.import_module(BUILTIN_PANELS[name])
    return _PANELS.get(name)


def panel_classes(names: list[str] | None = None) -> list[type[Panel]]:
    """The panels to show, in tab order: the named ones, or every registered one."""
    wanted = names if names else panel_names()
    unknown = [n for n in wanted if get_panel(n) is None]
    if unknown:
        raise UsageError(f"unknown panel(s) {', '.join(unknown)}; known: {', '.join(panel_names())}")
    return sorted((get_panel(n) for n in dict.fromkeys(wanted)), key=lambda c: c.order)
