"""An icicle flame chart of a Profile as inline SVG: time left to right, nesting top down, one lane
per track (thread). Clicking a frame zooms the time axis to it; clicking the top bar zooms out.

The zoom is a few lines of JavaScript in the SVG's `onclick` attribute, so the same markup works in
the static HTML report (no kernel) and in an ipywidgets HTML widget (which does not run `<script>`
elements but keeps event attributes).
"""
from __future__ import annotations

import html
import zlib

from .export import Profile, Span

WIDTH = 960           # viewBox units; the SVG scales to its container's width (about 1:1 in a notebook)
ROW = 18
LANE_LABEL = 14
CHAR = 6.6            # width of one character of the 11px label, in viewBox units

# `this` is the <svg>. Frames keep their time span in data-s/data-e and their label in data-n.
ZOOM_JS = (
    "var g=event.target.closest('g.cv-fl');if(!g)return;"
    "var W=+this.dataset.w,s=+g.dataset.s,e=+g.dataset.e,k=W/Math.max(e-s,1);"
    "this.querySelectorAll('g.cv-fl').forEach(function(f){"
    "var a=Math.max((+f.dataset.s-s)*k,0),b=Math.min((+f.dataset.e-s)*k,W);"
    "if(b-a<0.5){f.style.display='none';return;}f.style.display='';"
    "var r=f.querySelector('rect'),t=f.querySelector('text'),n=Math.floor((b-a-6)/" + str(CHAR) + "),L=f.dataset.n;"
    "r.setAttribute('x',a);r.setAttribute('width',b-a);t.setAttribute('x',a+3);"
    "t.textContent=n<2?'':(L.length>n?L.slice(0,n-1)+'\u2026':L);});"
    "this.querySelectorAll('g.cv-fl').forEach(function(f){f.classList.toggle('cv-fl-on',f===g);});"
    "var i=this.parentNode.querySelector('.cv-fl-info');"
    "if(i)i.textContent=g.querySelector('title').textContent.replace(/\\n/g,' \u00b7 ');"
)


def fmt_ns(ns: float) -> str:
    if ns < 1e3:
        return f"{ns:.0f} ns"
    if ns < 1e6:
        return f"{ns / 1e3:.1f} µs"
    if ns < 1e9:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e9:.2f} s"


def _label(text: str, width: float) -> str:
    n = int((width - 6) // CHAR)
    if n < 2:
        return ""
    return text if len(text) <= n else text[:n - 1] + "…"


def _colour(key: str) -> str:
    hue = zlib.crc32(key.encode()) % 50    # flame-graph warm colours: red to yellow
    return f"hsl({hue}, 75%, {62 + zlib.crc32(key[::-1].encode()) % 14}%)"


def _frame(s: Span, x0: float, x1: float, y: float, title: str, fill: str) -> str:
    label = s.name
    return (f'<g class="cv-fl" data-s="{s.start_ns}" data-e="{s.end_ns}" data-n="{html.escape(label)}">'
            f"<title>{html.escape(title)}</title>"
            f'<rect x="{x0:.2f}" y="{y}" width="{max(x1 - x0, 0):.2f}" height="{ROW - 1}" rx="2" fill="{fill}"/>'
            f'<text x="{x0 + 3:.2f}" y="{y + ROW - 5}">{html.escape(_label(label, x1 - x0))}</text></g>')


def flame_svg(profile: Profile) -> str:
    """The chart: a top bar for the whole profile (click: zoom out), then each track's frames."""
    t0, t1 = profile.start_ns, profile.end_ns
    span = max(t1 - t0, 1)
    total = profile.total_ns()
    lanes = profile.tracks
    labelled = profile.per_thread

    def x(t: int) -> float:
        return (t - t0) / span * WIDTH

    whole = Span(profile.name, (profile.name,), t0, t1, "")
    what = f"{len(lanes)} thread{'s' if len(lanes) != 1 else ''}, busy {fmt_ns(total)}" if labelled else fmt_ns(total)
    parts = [_frame(whole, 0, WIDTH, 0, f"{profile.name}: {fmt_ns(t1 - t0)} ({what}); click a frame to zoom, "
                                         f"this bar to zoom out", "#c8ccd1")]
    y = ROW + 2
    for track in lanes:
        spans = [s for s in profile.spans if s.track == track]
        if labelled:
            busy = sum(s.dur_ns for s in spans if s.depth == 0)
            parts.append(f'<text class="cv-fl-lane" x="2" y="{y + LANE_LABEL - 3}">{html.escape(track)} · busy '
                         f'{fmt_ns(busy)}</text>')
            y += LANE_LABEL
        for s in spans:
            pct = 100 * s.dur_ns / total if total else 0.0
            lines = [s.name, f"{fmt_ns(s.dur_ns)} ({pct:.1f}% of {profile.name})"]
            lines += [f"{k}: {v}" for k, v in s.args.items()]
            if s.name in profile.sources:
                file, line = profile.sources[s.name]
                lines.append(f"from {file.rsplit('/', 1)[-1]}:{line}")
            if labelled:
                lines.append(track)
            key = s.stack[0] if not labelled else s.name
            parts.append(_frame(s, x(s.start_ns), x(s.end_ns), y + s.depth * ROW, "\n".join(lines), _colour(key)))
        y += (max((s.depth for s in spans), default=0) + 1) * ROW + 4
    return (f'<svg class="cv-flamesvg" data-w="{WIDTH}" viewBox="0 0 {WIDTH} {y}" width="100%" '
            f'preserveAspectRatio="xMinYMin meet" onclick="{html.escape(ZOOM_JS)}">{"".join(parts)}</svg>')


def flame_html(profile: Profile) -> str:
    """The chart with its info line (the clicked frame's details)."""
    return (f'<div class="cv-flame"><div class="cv-fl-info cv-note">click a frame to zoom in, the top bar to '
            f'zoom out</div>{flame_svg(profile)}</div>')
