"""Generate the Python code of the contracts: protos/strata/v1/*.proto -> strata/v1/*_pb2*.py(i).

Run by `make protos`; tests/strata/test_protos.py runs it into a temporary directory and fails when
the committed code differs (regenerate with `make protos`). Needs grpcio-tools (the `dev` extra),
pinned in pyproject.toml so that the output is byte-for-byte reproducible.
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

REPO = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO / "protos"


def generate(out_dir: Path) -> list[Path]:
    """Generate into ``out_dir`` (mirroring the package path strata/v1); return the files written."""
    protos = sorted(PROTO_ROOT.glob("strata/v1/*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files under {PROTO_ROOT}/strata/v1")
    out_dir.mkdir(parents=True, exist_ok=True)
    well_known = str(resources.files("grpc_tools") / "_proto")
    args = [
        "grpc_tools.protoc", f"-I{PROTO_ROOT}", f"-I{well_known}",
        f"--python_out={out_dir}", f"--pyi_out={out_dir}", f"--grpc_python_out={out_dir}",
        *[str(p.relative_to(PROTO_ROOT)) for p in protos],
    ]
    # protoc resolves the relative proto paths against -I; run from the proto root for stable names.
    code = protoc.main(args)
    if code != 0:
        raise SystemExit(f"protoc failed with exit code {code}")
    return sorted((out_dir / "strata" / "v1").glob("*_pb2*.py*"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO, help="output root (default: the repository)")
    args = parser.parse_args()
    written = generate(args.out)
    print(f"generated {len(written)} files under {args.out / 'strata' / 'v1'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
