#!/usr/bin/env bash
# Regenerates src/loglake/wire/pb/*_pb2.py from src/loglake/wire/proto/*.proto with the protoc
# bundled in grpcio-tools (a dev dependency). The generated modules are committed so the runtime
# needs only `protobuf`; run `make proto` after editing a .proto.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
mkdir -p src/loglake/wire/pb
"$py" -m grpc_tools.protoc -I src/loglake/wire/proto --python_out=src/loglake/wire/pb --pyi_out=src/loglake/wire/pb src/loglake/wire/proto/*.proto
# protoc emits top-level imports between generated modules; make them package-relative.
sed -i -E 's/^import ([a-z0-9_]+_pb2) as/from loglake.wire.pb import \1 as/' src/loglake/wire/pb/*_pb2.py
touch src/loglake/wire/pb/__init__.py
