"""The `%%cuvil` cell magic: compile the cell's model (or IR) to native code (`cuvil.compile`; the
interpreter when that fails), show the explorer, run and profile the compiled model in this kernel
and bind what it produced to names.

Bound after every cell (None where not produced): `_cuvil_result` (the compiled model's output on
the example inputs), `_cuvil_compiled` (the compiled model: call it like the original),
`_cuvil_report` (the CompileReport), `_cuvil_explorer` (the panels), `_cuvil_error` (an ErrorInfo
when the cell failed).
"""
from __future__ import annotations

import shlex

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.display import HTML, display

import cuvil
from cuvil.codegen.target import CROSS_TARGETS
from cuvil.compiler import PRECISIONS, pipeline_for
from cuvil.explain import DEFAULT_PIPELINE

from .cache import CellCache, cell_key
from .cell import discover, evaluate, is_ir_text
from .errors import describe_error
from .explorer import Explorer
from .panels import panel_classes
from .run import CellRun, compile_target

BOUND = ("_cuvil_result", "_cuvil_compiled", "_cuvil_report", "_cuvil_explorer", "_cuvil_error")


@magics_class
class CuvilMagics(Magics):
    def __init__(self, shell):
        super().__init__(shell)
        self.cache = CellCache()

    @magic_arguments()
    @argument("--passes", default=DEFAULT_PIPELINE, metavar="PIPELINE",
              help=f"the pass pipeline, e.g. 'canonicalize,cse' (default: {DEFAULT_PIPELINE})")
    @argument("--precision", default="fp32", choices=tuple(PRECISIONS), metavar="P",
              help="fp32 (default), or bf16 or fp16: torch.autocast's numerics (the mixed-precision pass)")
    @argument("--panels", default="", metavar="LIST", help="panels to show, e.g. 'pipeline,graph' (default: all)")
    @argument("--no-run", action="store_true", help="compile only; do not run the compiled model")
    @argument("--target", default="host", choices=("host", *CROSS_TARGETS), metavar="ARCH",
              help="the machine to generate code for: host (default), or aarch64, riscv64 or x86_64 (AVX2), "
                   "whose code is shown but not run")
    @argument("--ir", action="store_true", help="the cell is textual Cuvil IR (detected when it starts with cuvil.func)")
    @argument("--name", default=None, metavar="EXPR", help="the model or function to compile")
    @argument("--inputs", default=None, metavar="EXPR", help="example inputs: a tensor, a tuple or a dict")
    @argument("--dynamic", default=None, metavar="EXPR",
              help="dynamic dims, as for cuvil.compile: e.g. '[{0: \"batch\"}]', or True (every dim it can)")
    @argument("--ranges", default=None, metavar="EXPR", help="ranges of the dynamic dims: e.g. '{\"batch\": (1, 64)}'")
    @argument("--html", default=None, metavar="PATH", help="also write the static HTML report to PATH")
    @argument("--force", action="store_true", help="recompile even when the cell cache has this cell")
    @cell_magic
    def cuvil(self, line: str, cell: str) -> None:
        """Compile the cell with Cuvil and explore what every pass did."""
        ns = self.shell.user_ns
        ns.update(dict.fromkeys(BOUND))
        filename = self.shell.compile.cache(cell, self.shell.execution_count)
        try:
            run, panels = self._compile(line, cell, filename)
            explorer = Explorer(run, panels)
        except Exception as e:   # whatever the cell did wrong is shown as a panel, not a traceback
            info = describe_error(e, cell, filename)
            ns["_cuvil_error"] = info
            display(HTML(info.to_html()))
            return
        ns.update(_cuvil_result=run.result, _cuvil_compiled=run.compiled, _cuvil_report=run.report,
                  _cuvil_explorer=explorer)
        display(explorer.widget)

    def _parse_options(self, line: str):
        # POSIX quoting (IPython's own splitting keeps the quotes): --dynamic '[{0: "batch"}]'
        try:
            argv = shlex.split(line)
        except ValueError as e:
            raise UsageError(f"cannot read the options: {e}") from None
        return self.cuvil.parser.parse_args(argv)

    def _compile(self, line: str, cell: str, filename: str) -> tuple[CellRun, list[str]]:
        args = self._parse_options(line)
        panels = [p.strip() for p in args.panels.split(",") if p.strip()]
        panel_classes(panels)   # unknown names fail before the (slow) compilation
        pipeline = pipeline_for(args.passes, precision=args.precision)
        ns = self.shell.user_ns
        key, keepalive = cell_key(cell, line, pipeline, ns, args.ir or is_ir_text(cell))
        run = None if args.force else self.cache.get(key)
        if run is not None:
            run.cached = True
        else:
            target = discover(cell, ns, filename, name=args.name, inputs=args.inputs, ranges=args.ranges,
                              force_ir=args.ir)
            dynamic = evaluate(args.dynamic, ns, "--dynamic") if args.dynamic else None
            run = compile_target(target, str(pipeline), dynamic, run=not args.no_run, machine=args.target)
            self.cache.put(key, run, keepalive)
        if args.html:
            run.report.save_html(args.html)
        return run, panels
