"""``strata tls init DIR`` and ``strata token new NAME``: credentials for the gRPC edge (docs/security.md)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from strata.errors import CliError
from strata.rpc_auth import new_token, token_line
from strata_tools.tlsgen import DEFAULT_HOSTS, init_dev_pki


def register(subparsers: argparse._SubParsersAction) -> None:
    tls = subparsers.add_parser("tls", help="a private CA and certificates for the gRPC edge")
    tls_sub = tls.add_subparsers(dest="tls_command", metavar="ACTION", required=True)
    init = tls_sub.add_parser("init", help="write ca.pem, server.pem/.key and client.pem/.key into DIR")
    init.add_argument("directory", type=Path)
    init.add_argument("--host", action="append", dest="hosts", metavar="NAME",
                      help="a name or address the server certificate is for (repeat; default: localhost, "
                           "127.0.0.1, ::1)")
    init.add_argument("--client-name", default="strata-client", help="common name of the client certificate")
    init.add_argument("--days", type=int, default=365, help="validity in days")
    init.add_argument("--force", action="store_true", help="overwrite certificates already in DIR")
    init.set_defaults(func=run_tls_init)

    token = subparsers.add_parser("token", help="bearer tokens for the gRPC edge")
    token_sub = token.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    new = token_sub.add_parser("new", help="make a token for NAME; append its line to the tokens file")
    new.add_argument("name", help="the client's name (letters, digits, - _ .)")
    new.add_argument("--tokens-file", type=Path,
                     help="append '<name> sha256:<digest>' to this file (the servers' STRATA_GRPC_TOKENS_FILE)")
    new.set_defaults(func=run_token_new)


def run_tls_init(args: argparse.Namespace) -> int:
    if (args.directory / "ca.pem").exists() and not args.force:
        raise CliError(f"{args.directory}/ca.pem exists; pass --force to replace the certificates")
    if args.days < 1:
        raise CliError("--days must be at least 1")
    pki = init_dev_pki(args.directory, tuple(args.hosts or DEFAULT_HOSTS), args.client_name, args.days)
    print(f"wrote {pki.ca}, {pki.server_cert}, {pki.server_key}, {pki.client_cert}, {pki.client_key}")
    print("servers: STRATA_GRPC_TLS_CERT, STRATA_GRPC_TLS_KEY (+ STRATA_GRPC_TLS_CLIENT_CA for mutual TLS);")
    print("clients: STRATA_GRPC_TLS_CA (+ STRATA_GRPC_TLS_CLIENT_CERT / _KEY)")
    return 0


def run_token_new(args: argparse.Namespace) -> int:
    if not args.name or not all(c.isalnum() or c in "-_." for c in args.name):
        raise CliError("the client name must be letters, digits, '-', '_' or '.'")
    token = new_token()
    line = token_line(args.name, token)
    if args.tokens_file is not None:
        existing = args.tokens_file.read_text().split("\n") if args.tokens_file.exists() else []
        if any(row.split()[:1] == [args.name] for row in existing):
            raise CliError(f"{args.tokens_file} already has a client named {args.name!r}")
        fd = os.open(args.tokens_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a") as out:
            out.write(line + "\n")
        print(f"added {args.name} to {args.tokens_file} (its digest only)")
    else:
        print(f"tokens-file line: {line}")
    print(f"token for {args.name} (shown once; the client's STRATA_GRPC_TOKEN): {token}")
    return 0
