"""The named pipelines, one per optimisation level. A pipeline string can name them
(`O1,my-pass`), and `cuvil.compile(..., disable_passes=[...])` switches any of their passes off.

- O0: checks only; every op the results depend on gets a kernel of its own.
- O1: graph clean-up (canonicalize, cse, dce) and fusion.
- O2: O1 plus compile-time folding of weights (batch norm into convolutions, weight-only
  subgraphs), attention written out as one op, and stacking of linears that share an input, then
  the program passes: latency-aware schedule and arena planning.
- O3: O2 plus `layout`: convolutions and pools in NHWC where it pays, with pre-packed weights. The default.
"""
from .registry import register_pipeline

register_pipeline("O0", "verify,shape-infer")
register_pipeline("O1", "verify,shape-infer,canonicalize,cse,dce,fuse")
register_pipeline("O2", "verify,shape-infer,fold-constants,fold-batchnorm,fuse-attention,concat-linears,"
                        "canonicalize{fold-constants=false},"
                        "cse,dce,fuse,schedule,plan-memory")
register_pipeline("O3", "verify,shape-infer,fold-constants,fold-batchnorm,fuse-attention,concat-linears,layout,"
                        "canonicalize{fold-constants=false},cse,dce,fuse,schedule,plan-memory")
