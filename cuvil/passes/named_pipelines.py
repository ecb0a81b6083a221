"""The named pipelines. Other parts of Cuvil re-register O1/O2 with their passes added
(`register_pipeline("O1", ..., replace=True)`)."""
from .registry import register_pipeline

register_pipeline("O0", "verify,shape-infer")
register_pipeline("O1", "verify,shape-infer,canonicalize,cse,dce")
