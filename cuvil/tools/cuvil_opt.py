"""cuvil-opt: parse graph IR text, run a pass pipeline over it, print the result (like mlir-opt).

    cuvil-opt model.cvl -p canonicalize,cse{aggressive=true} --print-ir-after-change

The result goes to stdout (or -o); IR dumps, timing and errors go to stderr. Exit status: 0 on
success, 1 for bad IR (parse, verifier or pass errors), 2 for bad usage (unknown pass or option,
unreadable file).
"""
from __future__ import annotations

import argparse
import dataclasses
import re
import runpy
import sys
import traceback
from typing import TextIO

from ..compiler import compile_module
from ..errors import CuvilError, CuvilParseError, CuvilPipelineError
from ..explain import explain
from ..ir import parse, print_module
from ..ir.interpreter import random_constants
from ..passes import PassManager, PassTiming, PrintIR, VerifyEach, all_passes, all_pipelines, parse_pipeline
from ..passes.base import format_option_value, option_name
from ..passes.pipeline import type_name

SPLIT_MARKER = re.compile(r"^// -----\s*$", re.MULTILINE)
OUTPUT_SEPARATOR = "// -----\n"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="cuvil-opt", description="Run Cuvil passes over graph IR text.")
    ap.add_argument("input", nargs="?", default="-", help="input file ('-' or nothing for stdin)")
    ap.add_argument("-p", "--pipeline", default="", help="pass pipeline, e.g. 'canonicalize,cse{aggressive=true}'")
    ap.add_argument("-o", "--output", default="-", help="output file (default stdout)")
    ap.add_argument("--print-ir-before-all", action="store_true", help="print the IR before every pass (stderr)")
    ap.add_argument("--print-ir-after-all", action="store_true", help="print the IR after every pass (stderr)")
    ap.add_argument("--print-ir-after-change", action="store_true",
                    help="print the IR after every pass that changed it (stderr)")
    ap.add_argument("--pass-timing", action="store_true", help="print a pass timing report (stderr)")
    ap.add_argument("--verify-each", action="store_true", help="verify the IR after every pass that changed it")
    ap.add_argument("--verify-diagnostics", action="store_true",
                    help="print errors to stdout in place of the result and exit 0 (for negative tests)")
    ap.add_argument("--split-input-file", action="store_true",
                    help="treat each '// -----' separated chunk as its own input")
    ap.add_argument("--random-constants", action="store_true",
                    help="give every constant deterministic random data before the pipeline runs (parsed IR has "
                         "only the constants' names; passes such as fold-constants need their data)")
    ap.add_argument("--emit", choices=("ir", "program"), default="ir",
                    help="what to print: the graph IR after the pipeline (default), or the native program after "
                         "its program passes (schedule, plan-memory); 'program' compiles the IR natively, so its "
                         "constants need data (--random-constants)")
    ap.add_argument("--report", metavar="OUT.html",
                    help="also write the explorer's report (every pass, IR before/after) as one HTML file")
    ap.add_argument("--list-passes", action="store_true", help="list the passes and named pipelines, then exit")
    ap.add_argument("--load-pass-plugin", action="append", default=[], metavar="FILE.py",
                    help="run a Python file that registers passes (with @register_pass) before anything else")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for plugin in args.load_pass_plugin:
        if not _load_plugin(plugin):
            return 2
    if args.list_passes:
        sys.stdout.write(list_passes())
        return 0
    if args.report and args.split_input_file:
        sys.stderr.write("cuvil-opt: error: --report writes one report; it cannot be combined with --split-input-file\n")
        return 2
    try:
        pipeline = parse_pipeline(args.pipeline)
    except CuvilPipelineError as e:
        sys.stderr.write(f"cuvil-opt: error: {e}\n")
        return 2
    try:
        text = _read(args.input)
        out = _open_output(args.output)
    except OSError as e:
        sys.stderr.write(f"cuvil-opt: error: {e}\n")
        return 2
    filename = "<stdin>" if args.input == "-" else args.input
    status = 0
    try:
        for i, (first_line, chunk) in enumerate(_chunks(text, args.split_input_file)):
            if i:
                out.write(OUTPUT_SEPARATOR)
            status = max(status, _process(chunk, first_line, filename, pipeline, args, out))
            out.flush()
    finally:
        if out is not sys.stdout:
            out.close()
    return status


def _process(chunk: str, first_line: int, filename: str, pipeline, args, out: TextIO) -> int:
    """Parse (and verify), run the pipeline and print one input; an error is reported and gives status 1
    (with --verify-diagnostics it is printed to `out` instead and the status stays 0)."""
    try:
        # Leading newlines keep the parser's line numbers those of the whole file. `parse` also
        # verifies, reporting verifier errors at the op's line:column.
        module = parse("\n" * (first_line - 1) + chunk, filename)
        if args.random_constants:
            module.constants.update(random_constants(module))
        if args.emit == "program":
            native = compile_module(module, pipeline=pipeline, instruments=_instruments(args), cache=None).native
            out.write(native.draft.text())
            return 0
        if args.report:
            explain(module, pipeline=pipeline, instruments=_instruments(args), name=filename).save_html(args.report)
        else:
            PassManager(pipeline, _instruments(args), assume={"verified"}).run(module)
    except CuvilError as e:
        if args.verify_diagnostics:
            out.write(f"{e}\n")
            return 0
        sys.stdout.flush()
        # parse errors carry their own "file:line:col: error:" prefix
        sys.stderr.write(f"{e}\n" if isinstance(e, CuvilParseError) else f"{filename}: error: {e}\n")
        return 1
    out.write(print_module(module))
    return 0


def _load_plugin(path: str) -> bool:
    try:
        runpy.run_path(path, run_name="cuvil_pass_plugin")
    except OSError as e:
        sys.stderr.write(f"cuvil-opt: error: cannot read the pass plugin '{path}': {e.strerror}\n")
        return False
    except Exception:
        # the user's own code: show where it failed
        sys.stderr.write(traceback.format_exc())
        sys.stderr.write(f"cuvil-opt: error: loading the pass plugin '{path}' failed\n")
        return False
    return True


def _instruments(args) -> list:
    out = []
    if args.verify_each:
        out.append(VerifyEach())
    if args.print_ir_before_all or args.print_ir_after_all or args.print_ir_after_change:
        out.append(PrintIR(args.print_ir_before_all, args.print_ir_after_all, args.print_ir_after_change))
    if args.pass_timing:
        out.append(PassTiming())
    return out


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8") as f:
        return f.read()


def _open_output(path: str) -> TextIO:
    return sys.stdout if path == "-" else open(path, "w", encoding="utf-8")


def _chunks(text: str, split: bool) -> list[tuple[int, str]]:
    """(first line number, text) of every input chunk."""
    if not split:
        return [(1, text)]
    out, start, line = [], 0, 1
    for m in SPLIT_MARKER.finditer(text):
        out.append((line, text[start:m.start()]))
        line += text.count("\n", start, m.end())
        start = m.end()
    out.append((line, text[start:]))
    return out


def list_passes() -> str:
    lines = ["Passes:"]
    for name, cls in all_passes().items():
        stage = "  [program stage]" if cls.stage == "program" else ""
        lines.append(f"  {name}  {cls.summary()}{stage}")
        for f in cls.option_fields():
            hint = cls.option_types()[f.name]
            default = "" if f.default is dataclasses.MISSING else f" = {format_option_value(f.default)}"
            lines.append(f"      {option_name(f.name)}: {type_name(hint)}{default}")
    lines.append("Named pipelines:")
    for name, text in all_pipelines().items():
        lines.append(f"  {name} = {text}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
