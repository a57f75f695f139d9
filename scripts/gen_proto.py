"""Generate (or check) the gRPC stubs in ``plugin/_pb`` from ``plugin/proto/*.proto``.

``make proto`` writes them; ``make check-proto`` (and a test) regenerates into
a temporary directory and fails if the committed files differ, so the stubs
can never drift from the protos or from the pinned grpcio-tools.

The protos are mapped to the virtual path ``plugin/_pb/`` (protoc's
``-I VIRTUAL=PHYSICAL``), so the generated ``*_pb2_grpc.py`` files import
``from plugin._pb import x_pb2`` instead of a bare ``import x_pb2`` that only
works with ``plugin/_pb`` on ``sys.path``.
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "plugin" / "proto"
OUT_PACKAGE = "plugin/_pb"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generate(out_root: Path) -> list[Path]:
    """Compile every proto into ``out_root/plugin/_pb``; returns the files written."""
    protos = sorted(PROTO_DIR.glob("*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files in {PROTO_DIR}")
    (out_root / OUT_PACKAGE).mkdir(parents=True, exist_ok=True)
    for proto in protos:
        args = [
            "grpc_tools.protoc",
            f"-I{OUT_PACKAGE}={PROTO_DIR}",
            f"--python_out={out_root}",
            f"--pyi_out={out_root}",
            f"--grpc_python_out={out_root}",
            f"{OUT_PACKAGE}/{proto.name}",
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {proto}")
    return sorted(
        p for p in (out_root / OUT_PACKAGE).iterdir() if p.name.endswith(GENERATED_SUFFIXES)
    )


def check() -> list[str]:
    """Names of generated files that are missing, stale or extra in the tree."""
    committed = ROOT / OUT_PACKAGE
    with tempfile.TemporaryDirectory() as tmp:
        fresh = {p.name: p for p in generate(Path(tmp))}
        have = {p.name: p for p in committed.iterdir() if p.name.endswith(GENERATED_SUFFIXES)}
        problems = [f"missing: {n}" for n in sorted(fresh.keys() - have.keys())]
        problems += [f"extra: {n}" for n in sorted(have.keys() - fresh.keys())]
        problems += [
            f"stale: {n}"
            for n in sorted(fresh.keys() & have.keys())
            if not filecmp.cmp(fresh[n], have[n], shallow=False)
        ]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if committed stubs are stale")
    args = parser.parse_args(argv)
    if args.check:
        problems = check()
        for p in problems:
            print(f"{OUT_PACKAGE}/{p}", file=sys.stderr)
        if problems:
            print("stubs are out of date: run `make proto` and commit", file=sys.stderr)
        return 1 if problems else 0
    written = generate(ROOT)
    (ROOT / OUT_PACKAGE / "__init__.py").touch()
    for path in written:
        print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
