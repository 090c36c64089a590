"""The Spark ``url`` option over (mutual) TLS (issue 15 §1): ``tlsCa``, ``tlsCert``, ``tlsKey``.

Spark's Python workers open the certificate files themselves and talk TLS to a real stream
server on loopback; the service's permissions apply to them like to any client.
"""

from __future__ import annotations

import pytest

from loglake.pipeline.errors import BadOption
from loglake.pipeline.options import TlsFiles, TlsUrlSource, parse_options
from loglake.pipeline.read import read, read_options
from loglake.pipeline.write import write
from loglake.streams.client import StreamClient
from loglake.streams.permissions import AccessPolicy
from loglake.streams.server import BackgroundServer
from loglake.streams.service import StreamService
from loglake.streams.tls import client_context, server_context, write_test_pki
from tests.pipeline.conftest import spark as spark  # the session fixture, here too

ACCESS = {
    "grant": [
        {"identities": ["cn:etl"], "streams": ["*"], "allow": ["admin"]},
        {"identities": ["cn:reader"], "streams": ["*"], "allow": ["read"]},
    ]
}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return write_test_pki(tmp_path_factory.mktemp("pki"), ("etl", "reader"))


def tls_options(pki, who: str) -> dict[str, str]:
    return tls_files(pki, who).as_options()


def tls_files(pki, who: str) -> TlsFiles:
    cert, key = pki.clients[who]
    return TlsFiles(ca=str(pki.ca), cert=str(cert), key=str(key))


def test_tls_files_name_their_options():
    files = TlsFiles(ca="ca.pem", cert="c.pem", key="k.pem", server_name="streams")
    assert files.as_options() == {
        "tlsCa": "ca.pem",
        "tlsCert": "c.pem",
        "tlsKey": "k.pem",
        "tlsServerName": "streams",
    }
    assert TlsFiles().as_options() == {"tls": "true"}  # the system's CAs


def test_tls_options_are_checked_on_the_driver(pki, tmp_path):
    url = "loglake://127.0.0.1:4000"
    opts = parse_options({"stream": "s", "url": url, **tls_options(pki, "etl")})
    assert isinstance(opts.url_source(), TlsUrlSource)
    assert parse_options({"stream": "s", "url": url}).tls is None
    with pytest.raises(BadOption, match="TLS options go with url"):
        parse_options({"stream": "s", "data_dir": str(tmp_path), "tlsCa": str(pki.ca)})
    with pytest.raises(BadOption, match="tlsCert and tlsKey go together"):
        parse_options({"stream": "s", "url": url, "tlsCert": str(pki.clients["etl"][0])})
    with pytest.raises(BadOption, match="no such file"):
        parse_options({"stream": "s", "url": url, "tlsCa": str(tmp_path / "nope.pem")})
    with pytest.raises(BadOption, match="true or false"):
        parse_options({"stream": "s", "url": url, "tls": "yes"})


@pytest.mark.spark
@pytest.mark.slow
def test_spark_reads_and_writes_over_mutual_tls(spark, pki, memory_log):
    service = StreamService(memory_log, access=AccessPolicy.from_dict(ACCESS))
    ctx = server_context(pki.server_cert, pki.server_key, client_ca=pki.ca)
    with BackgroundServer(service, tls=ctx) as srv:
        url = f"loglake://127.0.0.1:{srv.port}"
        cert, key = pki.clients["etl"]
        with StreamClient(port=srv.port, tls=client_context(pki.ca, cert, key)) as c:
            c.create_stream("remote", partitions=2)
            c.push_many("remote", [b"a%d" % i for i in range(20)], partition=0)
            c.push_many("remote", [b"b%d" % i for i in range(3)], partition=1)
        df = read(spark, stream="remote", url=url, tls=tls_files(pki, "reader"))
        got = sorted((r["partition"], r["index"], bytes(r["data"])) for r in df.collect())
        assert got == [(0, i, b"a%d" % i) for i in range(20)] + [
            (1, i, b"b%d" % i) for i in range(3)
        ]
        new = spark.createDataFrame([(b"x", 1), (b"y", 1)], "data binary, partition int")
        write(new, stream="remote", url=url, tls=tls_files(pki, "etl"))
        assert sorted(r[1] for r in memory_log.read_payloads("remote", 3, 10, partition=1)) == [
            b"x",
            b"y",
        ]
        # the reader may read but not write: the executor's push is refused
        opts = {"url": url, "stream": "remote", **tls_options(pki, "reader")}
        with pytest.raises(Exception, match="permission denied: cn:reader may not push"):
            new.write.format("loglake").options(**opts).mode("append").save()
        # no client certificate: the handshake is refused, a typed error names TLS
        with pytest.raises(Exception, match="TLS handshake"):
            read_options(spark, {"url": url, "stream": "remote", "tlsCa": str(pki.ca)}).collect()
