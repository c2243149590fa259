#!/bin/sh
# Build the documentation site the way `make test` and CI do: strict (a broken link, a missing
# page or a docstring that cannot be rendered is an error), into a temporary directory so no
# site is written into the repository, silent unless it fails.
# Not `mkdocs build -q`: under -q mkdocs drops warnings before --strict counts them, so a broken
# link would pass (mkdocs 1.6).
# Usage: scripts/check_docs.sh [path/to/mkdocs.yml]   (PYTHON picks the interpreter; default python)
set -u
config=${1:-mkdocs.yml}
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
if ! log=$(NO_MKDOCS_2_WARNING=1 "${PYTHON:-python}" -m mkdocs build --strict -f "$config" -d "$site" 2>&1); then
    printf '%s\n' "$log" >&2
    echo "docs: \`mkdocs build --strict -f $config\` failed (see above)" >&2
    exit 1
fi
