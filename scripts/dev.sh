#!/usr/bin/env bash
# One entry point for a fresh clone: creates .venv (CPU torch 2.13.0 + graphfeed with its
# native ops) if it is missing or stale, then runs the requested job.
#
#   bash scripts/dev.sh demo [ARGS]   # the main job: local 2-server cluster + 2-rank DDP training
#   bash scripts/dev.sh test [ARGS]   # the test suite (what CI runs)
#   bash scripts/dev.sh lint          # ruff and mypy (CI runs them before the tests)
#   bash scripts/dev.sh docs          # the documentation site, built with --strict into site/ (CI runs it)
#   bash scripts/dev.sh setup         # only the set-up
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.graphfeed-setup

setup() {
  local want
  # the package folders count too: the editable install maps each top-level folder it saw
  want=$( (cat pyproject.toml setup.py; ls -d -- */__init__.py) | sha256sum | cut -c1-16)
  if [[ -f $STAMP && $(cat "$STAMP") == "$want" ]]; then
    return
  fi
  echo "== setting up $VENV (one time)" >&2
  [[ -x $VENV/bin/python ]] || "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip "setuptools>=77" wheel
  # CPU build of torch (a plain `torch` requirement would pull a multi-GB CUDA build).
  "$VENV/bin/pip" install -q "torch==${GRAPHFEED_TORCH_VERSION:-2.13.0}" numpy
  # No build isolation: the native ops compile against the torch installed above.
  "$VENV/bin/pip" install -q --no-build-isolation -e '.[dev]'
  echo "$want" > "$STAMP"
}

# The graphfeed.* namespace as a folder of links in $1 (core/ -> $1/graphfeed/core, ...: every top-level
# folder with an __init__.py, as setup.py maps them), for tools that resolve modules by path.
namespace_view() {
  local root=$PWD view=$1
  mkdir -p "$view/graphfeed"
  for init in */__init__.py; do
    ln -sfn "$root/${init%/__init__.py}" "$view/graphfeed/${init%/__init__.py}"
  done
}

lint() {
  "$VENV/bin/ruff" check .
  local root=$PWD view
  view=$(mktemp -d)
  namespace_view "$view"
  local rc=0
  (cd "$view" && "$root/$VENV/bin/mypy" --config-file "$root/pyproject.toml" -p graphfeed) || rc=$?
  rm -rf "$view"
  return $rc
}

# The documentation site (mkdocs.yml): --strict makes a broken link or anchor, a page left out of the nav
# and a docstring mkdocstrings cannot read fail the build.  mkdocstrings reads graphfeed.* from the view
# .docs-view/ (git-ignored; mkdocs.yml names it), remade each time so a renamed folder leaves no link.
docs() {
  rm -rf .docs-view
  namespace_view .docs-view
  NO_MKDOCS_2_WARNING=1 "$VENV/bin/mkdocs" build --strict --site-dir site "$@"
}

# Test processes: GRAPHFEED_TEST_WORKERS (default: the CPU count, at most 4) pytest-xdist workers, each taking
# whole files (--dist loadfile: a file's module-scoped partitions and clusters are made once); 0 or 1 runs the
# suite in this one process.  Half the suite waits on daemons and workers, so 2 workers on 2 cores pay.
test_workers() {
  local n=${GRAPHFEED_TEST_WORKERS:-$(nproc 2>/dev/null || echo 1)}
  (( n > 4 && ${GRAPHFEED_TEST_WORKERS:-0} == 0 )) && n=4
  if (( n > 1 )); then
    echo "-n $n --dist loadfile"
  fi
}

cmd=${1:-test}
shift || true
case $cmd in
  setup) setup ;;
  demo) setup; exec "$VENV/bin/graphfeed" demo "$@" ;;
  # shellcheck disable=SC2046 # the worker flags are words
  test) setup; exec "$VENV/bin/python" -m pytest -q -ra $(test_workers) "$@" ;;
  lint) setup; lint ;;
  docs) setup; docs "$@" ;;
  *) echo "usage: bash scripts/dev.sh demo|test|lint|docs|setup [ARGS]" >&2; exit 2 ;;
esac
