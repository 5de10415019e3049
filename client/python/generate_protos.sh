#!/usr/bin/env bash
# Generates the Python stubs of the gradcomp protos into
# client/python/gradcomp/v1/ (*_pb2.py, *_pb2_grpc.py). They are build
# outputs: never edit or commit them; rerun this after changing proto/.
# Uses Debian's protoc and grpc_python_plugin (not python3-grpc-tools, whose
# bundled protoc is too old for proto3 `optional`).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"

for tool in protoc grpc_python_plugin; do
  if ! command -v "$tool" >/dev/null; then
    echo "generate_protos.sh: $tool not found; run tools/setup" >&2
    exit 1
  fi
done

protoc -Iproto \
  --python_out=client/python \
  --grpc_out=client/python \
  --plugin=protoc-gen-grpc="$(command -v grpc_python_plugin)" \
  proto/gradcomp/v1/*.proto
