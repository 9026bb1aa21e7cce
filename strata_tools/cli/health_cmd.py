"""``strata health HOST:PORT``: exit 0 when the gRPC health service says SERVING (container checks)."""

from __future__ import annotations

import argparse

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from strata import rpc


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("health", help="gRPC health check of one service (exit 0 = SERVING)")
    parser.add_argument("address", help="host:port, e.g. 127.0.0.1:50052")
    parser.add_argument("--service", default="", help="service name to check (default: the server)")
    parser.add_argument("--timeout", type=float, default=3.0)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        with rpc.channel(args.address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout
            )
    except grpc.RpcError as exc:
        print(f"{args.address}: {exc.code().name}")
        return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{args.address}: {status}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1
