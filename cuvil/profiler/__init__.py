"""Profiles of a compilation and of a native run, exported for the usual viewers, no Jupyter needed.

    from cuvil import profiler
    compiled = cuvil.compile(model)
    compiled.profile(x)                                  # fills report.profile["run"]
    profs = profiler.profiles(compiled.report)           # [compile, run]
    profiler.save("trace.json", "chrome", *profs)        # Perfetto / chrome://tracing
    profiler.save("cuvil.speedscope.json", "speedscope", *profs)
    profiler.save("cuvil.folded", "folded", *profs)      # flamegraph.pl, speedscope, inferno
"""
from .export import (FORMATS, SPEEDSCOPE_SCHEMA, Profile, Span, chrome_trace, compile_profile, folded_stacks,
                     profiles, render, run_profile, save, speedscope)

__all__ = ["FORMATS", "SPEEDSCOPE_SCHEMA", "Profile", "Span", "chrome_trace", "compile_profile", "folded_stacks",
           "profiles", "render", "run_profile", "save", "speedscope"]
