#!/usr/bin/env bash
# Regenerate the Python flatbuffers code for MNN's Net from
# mnnllm_core/schema/mnn.fbs (flatc 2.0.8, object API).
#
# flatc writes absolute imports of a top-level package `MNN`
# (`import MNN.Blob`, `from MNN.Blob import Blob`); we ship the code as
# `mnnllm_core.schema.MNN`, so a fixed sed pass rewrites those imports.
# The committed files are exactly this script's output: running it twice
# leaves no git diff.
#
# usage: scripts/regen_schema.sh [OUT_DIR]
#   OUT_DIR defaults to mnnllm_core/schema; the package lands in OUT_DIR/MNN.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
schema="$repo_root/mnnllm_core/schema/mnn.fbs"
out_dir="${1:-$repo_root/mnnllm_core/schema}"
want_flatc="2.0.8"

command -v flatc >/dev/null || { echo "flatc not found on PATH" >&2; exit 1; }
have_flatc="$(flatc --version | awk '{print $NF}')"
if [ "$have_flatc" != "$want_flatc" ]; then
    echo "flatc $want_flatc expected, found $have_flatc" >&2
    exit 1
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

flatc --python --gen-object-api --no-warnings -o "$tmp" "$schema"

# `import MNN.X` inside generated code binds the name MNN and loads X; keep
# both effects under the real package path.
# `from MNN.X import X` simply moves under the package.
# Strings come back as str, not bytes: MNN names are text (tensor and op
# names are compared and used as keys everywhere); bad UTF-8 is replaced,
# never raised.
find "$tmp/MNN" -name '*.py' -print0 | LC_ALL=C sort -z | xargs -0 sed -i -E \
    -e 's/^([[:space:]]*)import MNN\.([A-Za-z0-9_]+)$/\1import mnnllm_core.schema.MNN.\2; from mnnllm_core.schema import MNN/' \
    -e 's/^([[:space:]]*)from MNN\.([A-Za-z0-9_]+) import /\1from mnnllm_core.schema.MNN.\2 import /' \
    -e 's/^([[:space:]]*)return self\._tab\.String\((.*)\)$/\1return self._tab.String(\2).decode("utf-8", "replace")/'

if grep -rnE '^[[:space:]]*(import|from) MNN[. ]' "$tmp/MNN"; then
    echo "unrewritten MNN imports left in generated code" >&2
    exit 1
fi
if grep -rn '_tab\.String(' "$tmp/MNN" | grep -v '\.decode("utf-8", "replace")$'; then
    echo "string accessors left returning bytes in generated code" >&2
    exit 1
fi

mkdir -p "$out_dir"
rm -rf "$out_dir/MNN"
cp -r "$tmp/MNN" "$out_dir/MNN"
