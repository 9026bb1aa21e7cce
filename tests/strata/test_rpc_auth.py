"""The gRPC edge's credentials: bearer tokens per client, TLS and mutual TLS, for Python and grpcurl."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from strata import rpc
from strata.config import StrataSettings
from strata.rpc import RunningServer, ServiceBinding, start_server
from strata.rpc_auth import TokenFileError, TokenTable, new_token, token_line
from strata.v1 import learner_pb2, learner_pb2_grpc
from strata_tools.tlsgen import DevPki, init_dev_pki

LEARNER = learner_pb2.DESCRIPTOR.services_by_name["Learner"].full_name
ROOT = Path(__file__).resolve().parents[2]


class _Learner(learner_pb2_grpc.LearnerServicer):
    def Status(self, request, context):
        return learner_pb2.LearnerStatus(policy_version=4, step=40)


def serve(settings: StrataSettings) -> RunningServer:
    return start_server([ServiceBinding(learner_pb2_grpc.add_LearnerServicer_to_server, _Learner(), LEARNER)],
                        port=0, settings=settings)


def status(channel: grpc.Channel) -> int:
    return learner_pb2_grpc.LearnerStub(channel).Status(learner_pb2.LearnerStatusRequest(), timeout=5).policy_version


def code_of(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DevPki:
    return init_dev_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    token = new_token()
    path = tmp_path_factory.mktemp("tokens") / "tokens"
    path.write_text(f"# clients\n{token_line('alice', token)}\nbob {new_token()}\n")
    return path, token


def test_token_file_errors_name_the_line() -> None:
    with pytest.raises(TokenFileError, match="tokens:2: expected"):
        TokenTable.parse(["alice " + "a" * 20, "bob"])
    with pytest.raises(TokenFileError, match="shorter than 16"):
        TokenTable.parse(["alice short"])
    with pytest.raises(TokenFileError, match="appears twice"):
        TokenTable.parse(["a " + "x" * 20, "a " + "y" * 20])
    with pytest.raises(TokenFileError, match="64 hex digits"):
        TokenTable.parse(["a sha256:abcd"])
    with pytest.raises(TokenFileError, match="no clients"):
        TokenTable.parse(["# nobody"])
    table = TokenTable.parse([token_line("alice", "t" * 20), "bob " + "u" * 20])
    assert (table.client_of("t" * 20), table.client_of("u" * 20), table.client_of("v" * 20)) == ("alice", "bob", None)


def test_strata_token_new_appends_a_digest_the_server_accepts(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from strata_tools.cli.main import main

    path = tmp_path / "tokens"
    assert main(["token", "new", "carol", "--tokens-file", str(path)]) == 0
    token = capsys.readouterr().out.rsplit(": ", 1)[1].strip()
    assert token not in path.read_text()  # the server's file holds the digest only
    assert TokenTable.load(path).client_of(token) == "carol"
    assert path.stat().st_mode & 0o077 == 0
    assert main(["token", "new", "carol", "--tokens-file", str(path)]) != 0  # a second carol is refused


def test_tokens_without_tls(tokens: tuple[Path, str]) -> None:
    path, token = tokens
    server = serve(StrataSettings(grpc_tokens_file=path))
    target = f"127.0.0.1:{server.port}"
    try:
        with rpc.channel(target, StrataSettings()) as anonymous:
            assert code_of(lambda: status(anonymous)) == grpc.StatusCode.UNAUTHENTICATED
            health = health_pb2_grpc.HealthStub(anonymous).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert health.status == health_pb2.HealthCheckResponse.SERVING  # health needs no token by default
        with rpc.channel(target, StrataSettings(grpc_token="x" * 32)) as stranger:
            assert code_of(lambda: status(stranger)) == grpc.StatusCode.UNAUTHENTICATED
        with rpc.channel(target, StrataSettings(grpc_token=token)) as alice:
            assert status(alice) == 4
    finally:
        server.stop(0)


def test_health_can_require_a_token(tokens: tuple[Path, str]) -> None:
    path, _ = tokens
    server = serve(StrataSettings(grpc_tokens_file=path, grpc_auth_health=True))
    try:
        with rpc.channel(f"127.0.0.1:{server.port}", StrataSettings()) as anonymous:
            check = health_pb2_grpc.HealthStub(anonymous).Check
            assert code_of(lambda: check(health_pb2.HealthCheckRequest(), timeout=5)) == \
                grpc.StatusCode.UNAUTHENTICATED
    finally:
        server.stop(0)


def test_tls_and_tokens(pki: DevPki, tokens: tuple[Path, str]) -> None:
    path, token = tokens
    server = serve(StrataSettings(grpc_tls_cert=pki.server_cert, grpc_tls_key=pki.server_key, grpc_tokens_file=path))
    target = f"localhost:{server.port}"
    try:
        with rpc.channel(target, StrataSettings(grpc_tls_ca=pki.ca, grpc_token=token)) as alice:
            assert status(alice) == 4
        with rpc.channel(target, StrataSettings(grpc_tls_ca=pki.ca)) as anonymous:
            assert code_of(lambda: status(anonymous)) == grpc.StatusCode.UNAUTHENTICATED
        with rpc.channel(target, StrataSettings(grpc_token=token)) as plaintext:  # no TLS: no handshake
            assert code_of(lambda: status(plaintext)) == grpc.StatusCode.UNAVAILABLE
        with rpc.channel(target, StrataSettings(grpc_tls_ca=pki.ca, grpc_token=token,
                                                grpc_tls_server_name="elsewhere.example")) as wrong_name:
            assert code_of(lambda: status(wrong_name)) == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(0)


def test_mutual_tls_refuses_a_client_without_a_certificate(pki: DevPki) -> None:
    server = serve(StrataSettings(grpc_tls_cert=pki.server_cert, grpc_tls_key=pki.server_key,
                                  grpc_tls_client_ca=pki.ca))
    target = f"localhost:{server.port}"
    try:
        with rpc.channel(target, StrataSettings(grpc_tls_ca=pki.ca, grpc_tls_client_cert=pki.client_cert,
                                                grpc_tls_client_key=pki.client_key)) as with_cert:
            assert status(with_cert) == 4
        with rpc.channel(target, StrataSettings(grpc_tls_ca=pki.ca)) as without:
            assert code_of(lambda: status(without)) == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(0)


def test_reflection_is_a_setting() -> None:
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    server = serve(StrataSettings(grpc_reflection=False))
    try:
        with rpc.channel(f"127.0.0.1:{server.port}") as channel:
            stub = reflection_pb2_grpc.ServerReflectionStub(channel)
            request = iter([reflection_pb2.ServerReflectionRequest(list_services="")])
            assert code_of(lambda: list(stub.ServerReflectionInfo(request, timeout=5))) == \
                grpc.StatusCode.UNIMPLEMENTED
    finally:
        server.stop(0)


def test_tls_settings_go_in_pairs() -> None:
    with pytest.raises(ValueError, match="go together"):
        StrataSettings(grpc_tls_cert=Path("a.pem"))
    with pytest.raises(ValueError, match="needs grpc_tls_cert"):
        StrataSettings(grpc_tls_client_ca=Path("ca.pem"))


def grpcurl_binary() -> str:
    found = shutil.which("grpcurl") or str(Path.home() / "go" / "bin" / "grpcurl")
    if not Path(found).exists():
        pytest.skip("grpcurl is not installed (scripts/install-grpcurl; .ci/run installs it)")
    return found


def test_grpcurl_with_and_without_credentials(pki: DevPki, tokens: tuple[Path, str]) -> None:
    grpcurl = grpcurl_binary()
    path, token = tokens
    server = serve(StrataSettings(grpc_tls_cert=pki.server_cert, grpc_tls_key=pki.server_key, grpc_tokens_file=path,
                                  grpc_reflection=False))
    protos = ["-import-path", str(ROOT / "protos"), "-proto", "strata/v1/learner.proto", "-cacert", str(pki.ca)]
    target = f"localhost:{server.port}"
    try:
        ok = subprocess.run([grpcurl, *protos, "-H", f"authorization: Bearer {token}", target,
                             "strata.v1.Learner/Status"], capture_output=True, text=True, timeout=30)
        assert ok.returncode == 0, ok.stderr
        assert int(json.loads(ok.stdout)["policyVersion"]) == 4  # JSON carries int64 as a string
        refused = subprocess.run([grpcurl, *protos, target, "strata.v1.Learner/Status"], capture_output=True,
                                 text=True, timeout=30)
        assert refused.returncode != 0
        assert "Unauthenticated" in refused.stderr
    finally:
        server.stop(0)
