"""``--metrics-cert-dir`` and ``--metrics-client-ca-file``: the metrics port over HTTPS and mutual TLS, scraped by a
real aiohttp client with certificates made here; the pair reloads when replaced on disk; the reference's start-up
checks (``pkg/epp/server/options.go``) are usage errors."""

from __future__ import annotations

import datetime
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from epp.cli.main import build_parser
from epp.cli.serve import options_from_args, run
from epp.extproc.tls import KeyPair, self_signed
from epp.framework.endpoint import EndpointSpec
from epp.runtime.app import EppApp, ServeOptions

from ..conftest import Servers, eventually

# -- certificates ---------------------------------------------------------------------------------------------


def _pem(key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> KeyPair:
    return KeyPair(key_pem=key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption()),
                   cert_pem=cert.public_bytes(serialization.Encoding.PEM))


def _cert(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name, signer: ec.EllipticCurvePrivateKey,
          *, ca: bool) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])).issuer_name(issuer)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
            .sign(signer, hashes.SHA256()))


class Ca:
    """A certificate authority that signs client certificates (Prometheus's, in a cluster)."""

    def __init__(self, name: str) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.pair = _pem(self.key, _cert(name, self.key, self.name, self.key, ca=True))

    def issue(self, subject: str) -> KeyPair:
        key = ec.generate_private_key(ec.SECP256R1())
        return _pem(key, _cert(subject, key, self.name, self.key, ca=False))


def write_dir(directory: Path, pair: KeyPair) -> Path:
    """``pair`` as a mounted Secret holds it: ``tls.crt`` and ``tls.key``, each replaced atomically."""
    directory.mkdir(exist_ok=True)
    for name, data in (("tls.crt", pair.cert_pem), ("tls.key", pair.key_pem)):
        (directory / f".{name}.tmp").write_bytes(data)
        (directory / f".{name}.tmp").replace(directory / name)
    return directory


def client_context(trusted: bytes, cert: KeyPair | None = None, tmp: Path | None = None) -> ssl.SSLContext:
    """A client trusting only ``trusted``, presenting ``cert`` if given (written under ``tmp``)."""
    ctx = ssl.create_default_context(cadata=trusted.decode())
    if cert is not None:
        assert tmp is not None
        (tmp / "client.crt").write_bytes(cert.cert_pem)
        (tmp / "client.key").write_bytes(cert.key_pem)
        ctx.load_cert_chain(tmp / "client.crt", tmp / "client.key")
    return ctx


# -- the metrics port ------------------------------------------------------------------------------------------

@pytest.fixture
def serve_metrics(servers: Servers) -> Callable[..., Awaitable[EppApp]]:
    """``await serve_metrics(**ServeOptions fields)`` -> a started EppApp serving only its metrics port."""

    async def factory(**fields: object) -> EppApp:
        options = ServeOptions(endpoints=[EndpointSpec(name="a", address="127.0.0.1", port=9)], host="127.0.0.1",
                               grpc_port=None, health_port=None, metrics_port=0, **fields)  # type: ignore[arg-type]
        return await servers.start(EppApp(options))

    return factory


async def scrape(app: EppApp, ctx: ssl.SSLContext, path: str = "/metrics",
                 headers: dict[str, str] | None = None) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"https://127.0.0.1:{app.metrics_port}{path}", ssl=ctx, headers=headers) as resp:
            return resp.status, await resp.text()


async def test_metrics_over_https_with_the_certificate_in_the_directory(serve_metrics, tmp_path: Path) -> None:
    pair = self_signed()
    app = await serve_metrics(metrics_cert_dir=str(write_dir(tmp_path / "tls", pair)), metrics_auth=False)
    status, text = await scrape(app, client_context(pair.cert_pem))
    assert status == 200 and "inference_pool_ready_pods" in text
    with pytest.raises(aiohttp.ClientError):  # plain HTTP is not served any more
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{app.metrics_port}/metrics") as resp:
                await resp.read()


async def test_mutual_tls_accepts_only_clients_with_a_certificate_the_ca_signed(serve_metrics,
                                                                                 tmp_path: Path) -> None:
    server, ca, other = self_signed(), Ca("prometheus-ca"), Ca("someone-else")
    (tmp_path / "ca.crt").write_bytes(ca.pair.cert_pem)
    app = await serve_metrics(metrics_cert_dir=str(write_dir(tmp_path / "tls", server)),
                              metrics_client_ca_file=str(tmp_path / "ca.crt"))
    status, text = await scrape(app, client_context(server.cert_pem, ca.issue("prometheus"), tmp_path))
    assert status == 200 and "inference_pool_ready_pods" in text
    assert (await scrape(app, client_context(server.cert_pem, ca.issue("prometheus"), tmp_path),
                         "/debug/tenants"))[0] == 200  # every path of the port is behind the same TLS
    for refused in (client_context(server.cert_pem), client_context(server.cert_pem, other.issue("x"), tmp_path)):
        with pytest.raises((aiohttp.ClientError, ssl.SSLError)):
            await scrape(app, refused)


async def test_tls_with_bearer_token_auth_still_asks_for_the_token(serve_metrics, tmp_path: Path) -> None:
    # No token: refused before the API server is asked, so an unreachable one is enough here
    # (tests/datalayer/test_metrics_auth.py covers the reviews).
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text('{"apiVersion": "v1", "kind": "Config", "current-context": "x", "clusters": [{"name": '
                          '"x", "cluster": {"server": "http://127.0.0.1:9"}}], "users": [{"name": "x", "user": '
                          '{"token": "t"}}], "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}]}')
    pair = self_signed()
    app = await serve_metrics(metrics_cert_dir=str(write_dir(tmp_path / "tls", pair)), metrics_auth=True,
                              kubeconfig=str(kubeconfig))
    status, text = await scrape(app, client_context(pair.cert_pem))
    assert status == 401 and "Unauthorized" in text


async def test_a_pair_replaced_on_disk_serves_new_connections(serve_metrics, tmp_path: Path) -> None:
    old, new = self_signed(), self_signed()
    directory = write_dir(tmp_path / "tls", old)
    app = await serve_metrics(metrics_cert_dir=str(directory), metrics_auth=False)
    assert (await scrape(app, client_context(old.cert_pem)))[0] == 200
    (directory / "tls.key").write_bytes(b"half-written")  # a pair that does not load is skipped, not fatal
    write_dir(directory, new)

    async def status_with_the_new_certificate() -> int | None:
        try:
            return (await scrape(app, client_context(new.cert_pem)))[0]
        except (aiohttp.ClientError, ssl.SSLError):
            return None

    assert await eventually(status_with_the_new_certificate, "the new certificate served", interval=0.1) == 200

    with pytest.raises((aiohttp.ClientError, ssl.SSLError)):
        await scrape(app, client_context(old.cert_pem))  # the old certificate is no longer presented


async def test_a_client_ca_file_without_certificates_fails_the_start(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text("not a certificate\n")
    options = ServeOptions(endpoints=[], host="127.0.0.1", grpc_port=None, health_port=None, metrics_port=0,
                           metrics_cert_dir=str(write_dir(tmp_path / "tls", self_signed())),
                           metrics_client_ca_file=str(tmp_path / "ca.crt"))
    app = EppApp(options)
    with pytest.raises(ValueError, match="no valid CA certs in metrics client CA file: .*ca.crt"):
        await app.start()
    assert app.metrics_port is None


# -- the flags, checked as the reference's Complete and Validate check them ---------------------------------------

def parse(*args: str):  # type: ignore[no-untyped-def]
    return build_parser().parse_args(["serve", *args])


def test_the_flags_set_the_options(tmp_path: Path) -> None:
    tls = write_dir(tmp_path / "tls", self_signed())
    (tmp_path / "ca.crt").write_bytes(Ca("ca").pair.cert_pem)
    options = options_from_args(parse("--endpoints", "e.yaml", "--metrics-cert-dir", str(tls),
                                      "--metrics-client-ca-file", str(tmp_path / "ca.crt")))
    assert (options.metrics_cert_dir, options.metrics_client_ca_file) == (str(tls), str(tmp_path / "ca.crt"))
    # With Kubernetes discovery the token auth is on by default, which is enough for TLS alone.
    options = options_from_args(parse("--pool-name", "p", "--metrics-cert-dir", str(tls)))
    assert options.metrics_auth and options.metrics_client_ca_file is None
    options = options_from_args(parse("--endpoints", "e.yaml"))
    assert options.metrics_cert_dir is None and options.metrics_client_ca_file is None


@pytest.mark.parametrize(("args", "error"), [
    (["--pool-name", "p", "--metrics-client-ca-file", "{ca}"],
     "--metrics-client-ca-file requires --metrics-cert-dir"),
    (["--pool-name", "p", "--metrics-endpoint-auth=false", "--metrics-cert-dir", "{tls}"],
     "--metrics-cert-dir enables metrics TLS without authentication; set --metrics-client-ca-file or "
     "--metrics-endpoint-auth"),
    (["--endpoints", "e.yaml", "--metrics-cert-dir", "{tls}"],
     "--metrics-cert-dir enables metrics TLS without authentication; set --metrics-client-ca-file or "
     "--metrics-endpoint-auth (it is on by default only with Kubernetes discovery)"),
    (["--pool-name", "p", "--metrics-cert-dir", "{missing}"], "metrics TLS cert file unreadable: {missing}/tls.crt"),
    (["--pool-name", "p", "--metrics-cert-dir", "{tls}", "--metrics-client-ca-file", "{missing}"],
     "metrics TLS cert file unreadable: {missing}"),
], ids=["ca-without-dir", "tls-without-auth", "tls-without-auth-defaulted-off", "missing-pair", "missing-ca"])
def test_unusable_metrics_tls_flags_are_usage_errors(args: list[str], error: str, tmp_path: Path, capsys) -> None:
    paths = {"tls": str(write_dir(tmp_path / "tls", self_signed())), "ca": str(tmp_path / "ca.crt"),
             "missing": str(tmp_path / "missing")}
    (tmp_path / "ca.crt").write_bytes(Ca("ca").pair.cert_pem)
    assert run(parse(*(a.format(**paths) for a in args))) == 2  # fails before anything starts
    assert capsys.readouterr().err.startswith("error: " + error.format(**paths))


def test_the_stream_metrics_flag_is_a_go_bool() -> None:
    assert not options_from_args(parse("--endpoints", "e.yaml")).grpc_stream_metrics
    assert options_from_args(parse("--endpoints", "e.yaml", "--enable-grpc-stream-metrics")).grpc_stream_metrics
    assert not options_from_args(parse("--endpoints", "e.yaml",
                                       "--enable-grpc-stream-metrics=false")).grpc_stream_metrics
