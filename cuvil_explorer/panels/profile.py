"""The profile panel: icicle flame charts of the compile phases and of the profiled native run (one
lane per thread; click a frame to zoom, the top bar to zoom out: in the browser, no kernel round
trip), the kernels by run time (pick one to see its code), and the profiles as Chrome trace JSON,
speedscope JSON and folded stacks: download links, and buttons that save the files next to the
notebook."""
from __future__ import annotations

import html
from pathlib import Path

import ipywidgets as W

from cuvil import profiler
from cuvil.profiler.flame import flame_html
from cuvil.report_html import download_links_html, kernel_times_html, provenance

from . import Panel, register_panel

SUFFIXES = {"chrome": "trace.json", "speedscope": "speedscope.json", "folded": "folded.txt"}


@register_panel
class ProfilePanel(Panel):
    name, title, order = "profile", "Profile", 26

    @classmethod
    def available(cls, run) -> bool:
        return bool(run.report.phases)

    def build(self) -> W.Widget:
        report = self.run.report
        self.profiles = {p.name: p for p in profiler.profiles(report)}
        self.which = W.ToggleButtons(options=[("Run (per thread)" if n == "run" else "Compile phases", n)
                                              for n in self.profiles],
                                     value="run" if "run" in self.profiles else "compile")
        self.flame = W.HTML(layout=W.Layout(width="100%"))
        self.which.observe(lambda _: self._draw(), "value")
        self._draw()
        prov = provenance(report)
        by_time = sorted(prov.kernels.values(), key=lambda k: -k.time_ns)
        self.kernel = W.Dropdown(options=[(prov.kernel_label(k), k.name) for k in by_time], description="kernel")
        self.show_code = W.Button(description="show its code", tooltip="open the kernel in the Code tab",
                                  disabled=not by_time)
        self.show_code.on_click(lambda _: self.open_kernel(self.kernel.value))
        stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in report.name) or "cuvil"
        self.path = W.Text(value=f"cuvil-{stem}", description="save as", layout=W.Layout(width="320px"))
        self.saves = {fmt: W.Button(description=f"save {label}", layout=W.Layout(width="150px"))
                      for fmt, label in (("chrome", "Chrome trace"), ("speedscope", "speedscope"),
                                         ("folded", "folded stacks"))}
        for fmt, button in self.saves.items():
            button.on_click(lambda _, fmt=fmt: self.save(fmt))
        self.saved = W.HTML()
        parts = [self.which, self.flame,
                 W.HTML(download_links_html(list(self.profiles.values()), report.name)),
                 W.HBox([self.path, *self.saves.values()]), self.saved]
        if prov.run_ns:
            parts += [W.HTML('<h4 class="cv-h">Kernels by time in the profiled run</h4>' + kernel_times_html(prov)),
                      W.HBox([self.kernel, self.show_code])]
        return W.VBox(parts)

    def _draw(self) -> None:
        self.flame.value = flame_html(self.profiles[self.which.value])

    def save(self, fmt: str) -> Path:
        """Write the profiles in format `fmt` to `<save as>.<suffix>` (relative to the kernel's directory)."""
        path = Path(f"{self.path.value}.{SUFFIXES[fmt]}")
        profiler.save(path, fmt, *self.profiles.values(), name=self.run.report.name)
        self.saved.value = f'<p class="cv-note">saved <code>{html.escape(str(path.resolve()))}</code></p>'
        return path

    def open_kernel(self, name: str) -> None:
        self.state.kernel = name
        self.state.show = "code"
