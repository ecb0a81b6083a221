"""The oracle of the parser fuzz tests.

For every input, `parse` either returns a module, which must then print, parse back and print the
same, or raises `CuvilParseError` with a line and column >= 1. Any other exception fails the test,
and so does a parse that runs longer than `PARSE_BUDGET_S` of CPU time (a watchdog timer raises
inside it; CPU time rather than wall time, so that a loaded CI machine cannot cause a false alarm).
"""
from __future__ import annotations

import contextlib
import os
import signal

import pytest
from hypothesis import HealthCheck, settings

from cuvil.errors import CuvilParseError
from cuvil.ir import Module, parse, print_module

PARSE_BUDGET_S = 2.0

# Reproducible in CI: a fixed derandomised search, no example database, our own per-parse watchdog.
# Test modules use it as `@settings.get_profile("cuvil-fuzz")`, some with a multiple of its
# max_examples. CUVIL_FUZZ_SCALE=N runs N times as many examples (a longer, nightly search).
SCALE = int(os.environ.get("CUVIL_FUZZ_SCALE", "1"))
settings.register_profile("cuvil-fuzz", derandomize=True, database=None, deadline=None, print_blob=False,
                          max_examples=200 * SCALE, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.data_too_large,
                                                                   HealthCheck.filter_too_much])


class ParseTimeout(Exception):
    """A parse exceeded its time budget (raised by the watchdog inside the parser)."""


@contextlib.contextmanager
def watchdog(seconds: float = PARSE_BUDGET_S):
    def on_timer(signum, frame):
        raise ParseTimeout(f"parse took more than {seconds} s of CPU time")
    previous = signal.signal(signal.SIGPROF, on_timer)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


class ParseOracle:
    def __init__(self):
        self.inputs = self.modules = self.errors = 0

    def check(self, text: str | bytes) -> Module | None:
        """Parse `text` under the oracle; return the module, or None after a clean parse error."""
        self.inputs += 1
        try:
            with watchdog():
                module = parse(text)
        except CuvilParseError as e:
            assert e.line >= 1 and e.col >= 1, f"error without a position: {e}"
            assert e.message, "error without a message"
            str(e).encode("utf-8")   # the report can be shown (no lone surrogates from the input)
            self.errors += 1
            return None
        printed = print_module(module)
        with watchdog():
            again = parse(printed)
        assert print_module(again) == printed, f"round trip changed the text of:\n{printed}"
        self.modules += 1
        return module


STATS = ParseOracle()


@pytest.fixture(scope="session")
def oracle() -> ParseOracle:
    return STATS


def pytest_terminal_summary(terminalreporter):
    if STATS.inputs:
        terminalreporter.write_line(
            f"parser fuzz: {STATS.inputs} inputs; {STATS.modules} parsed and round-tripped, "
            f"{STATS.errors} rejected with a positioned CuvilParseError")
