"""``graphfeed build-native``: compile the native sampling ops against the installed torch.

A plain ``pip install .`` builds in an isolated environment without torch, so it ships no
op library; graphfeed then builds it on first use into the per-user cache
(:func:`graphfeed.cuda_ext.cache_folder`).  This command runs that build now (for example
as the service user before the first ``graphfeed serve``) and reports which library a
sampler would load.  Exit code 0 when the native ops load, 1 when they cannot be built.
"""
from __future__ import annotations

import sys

HELP = "build the native sampling ops against the installed torch"


def add_arguments(parser) -> None:
    parser.add_argument("--force", action="store_true",
                        help="rebuild even when the cache holds a build (or a recorded failure)")
    parser.add_argument("--verbose", action="store_true", help="show the compiler's commands")


def run(args) -> int:
    from graphfeed import cuda_ext

    if cuda_ext.library_path() is not None and not args.force:
        print(f"native ops: installed with the package ({cuda_ext.library_path()})")
    else:
        try:
            path = cuda_ext.build_into_cache(force=args.force, verbose=args.verbose)
        except RuntimeError as exc:
            print(f"graphfeed build-native: error: {exc}", file=sys.stderr)
            return 1
        print(f"native ops: built in {path}")
    if cuda_ext.load_ops() is None:
        print(f"graphfeed build-native: error: the library does not load: {cuda_ext.load_error()}", file=sys.stderr)
        return 1
    origin, loaded = cuda_ext.library_origin()
    print(f"native ops loaded ({origin}: {loaded}); CUDA kernels: {'yes' if cuda_ext.has_cuda_kernels() else 'no'}")
    return 0
