"""Re-create the ext_proc v3 ``.proto`` files in ``proto/`` from the descriptors shipped in ``xds-protos``.

``xds-protos`` (Apache-2.0, from the gRPC project) ships Envoy's data-plane API compiled to ``_pb2`` modules, not
the ``.proto`` sources. Each module embeds its serialized ``FileDescriptorProto``; this script prints those back as
``.proto`` text for ``envoy/service/ext_proc/v3/external_processor.proto``, the EDS service and
``ClusterLoadAssignment`` (``envoy/service/endpoint/v3/eds.proto``, ``envoy/config/endpoint/v3/endpoint.proto``:
what :mod:`epp.envoy.xds` serves) and their transitive imports.

Annotation-only imports (``validate``, ``udpa.annotations``, ``xds.annotations``, ``envoy.annotations``,
``google.api``) and the
custom options they define are dropped: they carry validation rules and API-status markers, never wire format,
and EPP does not evaluate them. Messages, field numbers, enums, oneofs, maps, reserved ranges, standard options
and services are printed exactly. Comments are not in descriptors and are therefore absent.

Usage (run once when upgrading the API; the wheel is fetched with pip into a temporary directory)::

    python proto/extract.py [--version 1.85.0]
    python proto/generate.py
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from google.protobuf import descriptor_pb2

ROOT_MODULE = "envoy.service.ext_proc.v3.external_processor_pb2"
ROOT_MODULES = (ROOT_MODULE, "envoy.service.endpoint.v3.eds_pb2", "envoy.config.endpoint.v3.endpoint_pb2")
DROPPED_PREFIXES = ("validate/", "udpa/annotations/", "xds/annotations/", "envoy/annotations/", "google/api/")
PROTO_DIR = Path(__file__).resolve().parent

_FD = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    _FD.TYPE_DOUBLE: "double", _FD.TYPE_FLOAT: "float", _FD.TYPE_INT64: "int64", _FD.TYPE_UINT64: "uint64",
    _FD.TYPE_INT32: "int32", _FD.TYPE_FIXED64: "fixed64", _FD.TYPE_FIXED32: "fixed32", _FD.TYPE_BOOL: "bool",
    _FD.TYPE_STRING: "string", _FD.TYPE_BYTES: "bytes", _FD.TYPE_UINT32: "uint32", _FD.TYPE_SFIXED32: "sfixed32",
    _FD.TYPE_SFIXED64: "sfixed64", _FD.TYPE_SINT32: "sint32", _FD.TYPE_SINT64: "sint64",
}


def _fetch_wheel(version: str, dest: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", f"xds-protos=={version}", "--no-deps", "-q", "-d",
                    str(dest)], check=True)
    wheel = next(dest.glob("xds_protos-*.whl"))
    out = dest / "unpacked"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(out)
    return out


def _closure(root_module: str) -> list[descriptor_pb2.FileDescriptorProto]:
    """The root file and every import it reaches, as FileDescriptorProtos, dependencies first."""
    fd = importlib.import_module(root_module).DESCRIPTOR
    order: list = []
    seen: set[str] = set()

    def walk(f) -> None:  # type: ignore[no-untyped-def]
        if f.name in seen:
            return
        seen.add(f.name)
        for dep in f.dependencies:
            walk(dep)
        order.append(f)

    walk(fd)
    protos = []
    for f in order:
        p = descriptor_pb2.FileDescriptorProto()
        f.CopyToProto(p)
        protos.append(p)
    return protos


def _closures(root_modules: tuple[str, ...]) -> list[descriptor_pb2.FileDescriptorProto]:
    """:func:`_closure` of each root, each file once, dependencies first."""
    seen: set[str] = set()
    out = []
    for root in root_modules:
        for proto in _closure(root):
            if proto.name not in seen:
                seen.add(proto.name)
                out.append(proto)
    return out


def _standard_options(opts) -> list[tuple[str, object]]:  # type: ignore[no-untyped-def]
    """Set, non-extension option fields as (name, value); custom (annotation) options are dropped."""
    return [(fd.name, value) for fd, value in opts.ListFields() if not fd.is_extension]


def _literal(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(value)


def _camel(name: str) -> str:
    parts = name.split("_")
    return parts[0] + "".join(p[:1].upper() + p[1:] for p in parts[1:])


class _Printer:
    def __init__(self, fdp: descriptor_pb2.FileDescriptorProto) -> None:
        self.fdp = fdp
        self.lines: list[str] = []

    def emit(self, depth: int, text: str = "") -> None:
        self.lines.append(("  " * depth + text) if text else "")

    def file(self, header: str) -> str:
        f = self.fdp
        if f.syntax not in ("proto3", ""):
            raise ValueError(f"{f.name}: syntax {f.syntax!r} not supported")
        if f.extension:
            raise ValueError(f"{f.name}: defines extensions, which this printer does not handle")
        self.emit(0, header)
        self.emit(0, 'syntax = "proto3";')
        self.emit(0)
        self.emit(0, f"package {f.package};")
        self.emit(0)
        imports = [d for d in f.dependency if not d.startswith(DROPPED_PREFIXES)]
        for dep in imports:
            self.emit(0, f'import "{dep}";')
        if imports:
            self.emit(0)
        for name, value in _standard_options(f.options):
            self.emit(0, f"option {name} = {_literal(value)};")
        self.emit(0)
        for enum in f.enum_type:
            self.enum(0, enum)
        for msg in f.message_type:
            self.message(0, msg)
        for svc in f.service:
            self.service(svc)
        return "\n".join(self.lines).rstrip() + "\n"

    def enum(self, depth: int, enum: descriptor_pb2.EnumDescriptorProto) -> None:
        self.emit(depth, f"enum {enum.name} {{")
        for name, value in _standard_options(enum.options):
            self.emit(depth + 1, f"option {name} = {_literal(value)};")
        for v in enum.value:
            opts = _standard_options(v.options)
            suffix = " [" + ", ".join(f"{n} = {_literal(x)}" for n, x in opts) + "]" if opts else ""
            self.emit(depth + 1, f"{v.name} = {v.number}{suffix};")
        self.reserved(depth + 1, enum.reserved_range, enum.reserved_name, inclusive_end=True)
        self.emit(depth, "}")
        self.emit(depth)

    def reserved(self, depth: int, ranges, names, *, inclusive_end: bool) -> None:  # type: ignore[no-untyped-def]
        if ranges:
            parts = []
            for r in ranges:
                end = r.end if inclusive_end else r.end - 1
                parts.append(str(r.start) if end == r.start else f"{r.start} to {'max' if end >= 536870911 else end}")
            self.emit(depth, "reserved " + ", ".join(parts) + ";")
        if names:
            self.emit(depth, "reserved " + ", ".join(_literal(n) for n in names) + ";")

    def message(self, depth: int, msg: descriptor_pb2.DescriptorProto) -> None:
        if msg.extension or msg.extension_range:
            raise ValueError(f"{self.fdp.name}: message {msg.name} uses extensions")
        maps = {n.name: n for n in msg.nested_type if n.options.map_entry}
        self.emit(depth, f"message {msg.name} {{")
        for name, value in _standard_options(msg.options):
            self.emit(depth + 1, f"option {name} = {_literal(value)};")
        for enum in msg.enum_type:
            self.enum(depth + 1, enum)
        for nested in msg.nested_type:
            if not nested.options.map_entry:
                self.message(depth + 1, nested)
        self.reserved(depth + 1, msg.reserved_range, msg.reserved_name, inclusive_end=False)
        real_oneofs = {i for i, _ in enumerate(msg.oneof_decl)} - {
            f.oneof_index for f in msg.field if f.proto3_optional}
        emitted_oneofs: set[int] = set()
        for field in msg.field:
            if field.HasField("oneof_index") and field.oneof_index in real_oneofs:
                idx = field.oneof_index
                if idx in emitted_oneofs:
                    continue
                emitted_oneofs.add(idx)
                self.oneof(depth + 1, msg, idx, maps)
            else:
                self.field(depth + 1, field, maps)
        self.emit(depth, "}")
        self.emit(depth)

    def oneof(self, depth: int, msg: descriptor_pb2.DescriptorProto, idx: int, maps: dict) -> None:  # type: ignore[type-arg]
        decl = msg.oneof_decl[idx]
        self.emit(depth, f"oneof {decl.name} {{")
        for name, value in _standard_options(decl.options):
            self.emit(depth + 1, f"option {name} = {_literal(value)};")
        for field in msg.field:
            if field.HasField("oneof_index") and field.oneof_index == idx:
                self.field(depth + 1, field, maps, in_oneof=True)
        self.emit(depth, "}")

    def field(self, depth: int, field: descriptor_pb2.FieldDescriptorProto, maps: dict,  # type: ignore[type-arg]
              *, in_oneof: bool = False) -> None:
        entry = maps.get(field.type_name.rsplit(".", 1)[-1]) if field.type == _FD.TYPE_MESSAGE else None
        if entry is not None and field.label == _FD.LABEL_REPEATED:
            key, value = entry.field
            type_text = f"map<{self.type_of(key)}, {self.type_of(value)}>"
        else:
            type_text = self.type_of(field)
            if field.label == _FD.LABEL_REPEATED:
                type_text = "repeated " + type_text
            elif field.proto3_optional:
                type_text = "optional " + type_text
        opts = _standard_options(field.options)
        if field.HasField("json_name") and field.json_name != _camel(field.name):
            opts.append(("json_name", field.json_name))
        suffix = " [" + ", ".join(f"{n} = {_literal(x)}" for n, x in opts) + "]" if opts else ""
        self.emit(depth, f"{type_text} {field.name} = {field.number}{suffix};")

    @staticmethod
    def type_of(field: descriptor_pb2.FieldDescriptorProto) -> str:
        if field.type in (_FD.TYPE_MESSAGE, _FD.TYPE_ENUM):
            return field.type_name  # fully qualified with a leading dot: unambiguous
        return _SCALARS[field.type]

    def service(self, svc: descriptor_pb2.ServiceDescriptorProto) -> None:
        self.emit(0, f"service {svc.name} {{")
        for m in svc.method:
            cs = "stream " if m.client_streaming else ""
            ss = "stream " if m.server_streaming else ""
            self.emit(1, f"rpc {m.name}({cs}{m.input_type}) returns ({ss}{m.output_type});")
        self.emit(0, "}")
        self.emit(0)


def main(argv: list[str] | None = None) -> int:
    """Write the ``.proto`` closure of :data:`ROOT_MODULES` under ``proto/``; returns the process exit code."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--version", default="1.85.0", help="xds-protos version to read the descriptors from")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = _fetch_wheel(args.version, Path(tmp))
        sys.path.insert(0, str(wheel))
        import google  # a namespace package already holding google.protobuf: add the wheel's google.rpc

        google.__path__.append(str(wheel / "google"))
        protos = _closures(ROOT_MODULES)
    header = (f"// Printed by proto/extract.py from the descriptors in xds-protos=={args.version} (Envoy data-plane-api,"
              f" Apache-2.0).\n// Annotation-only options and imports are removed; wire format is unchanged.")
    for fdp in protos:
        if fdp.name.startswith("google/protobuf/") or fdp.name.startswith(DROPPED_PREFIXES):
            continue  # well-known types come with grpcio-tools
        out = PROTO_DIR / fdp.name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(_Printer(fdp).file(header))
        print(out.relative_to(PROTO_DIR))
    return 0


if __name__ == "__main__":
    sys.exit(main())
