"""The Cuvil explorer for Jupyter. `%load_ext cuvil_explorer` registers the `%%cuvil` cell magic,
which compiles the cell, shows what every pass did (ipywidgets panels, no side server) and runs
the compiled model in the kernel. See docs/explorer.md."""
from .explorer import Explorer
from .magic import CuvilMagics
from .panels import ExplorerState, Panel, register_panel

__all__ = ["CuvilMagics", "Explorer", "ExplorerState", "Panel", "register_panel", "load_ipython_extension"]


def load_ipython_extension(ipython) -> None:
    ipython.register_magics(CuvilMagics)
